"""Alpha-beta collective costs: formulas, latency- vs bandwidth-bound regimes, intra vs inter node."""

from __future__ import annotations

import math

import pytest

from cost_models.comm import CommError, collective_seconds, ring_seconds
from cost_models.compute import roofline_seconds
from cost_models.hardware import load_profile
from cost_models.mesh import Mesh
from cost_models.strategy import Collective

A100 = load_profile("a100-80gb")
KIB, MIB, GIB = 2**10, 2**20, 2**30


def test_ring_formulas():
    a, bt, n, nb = 2e-6, 1e-9, 4, 1000
    assert ring_seconds("all_gather", n, nb, a, bt) == pytest.approx(3 * a + bt * nb * 3 / 4)
    assert ring_seconds("reduce_scatter", n, nb, a, bt) == pytest.approx(3 * a + bt * nb * 3 / 4)
    assert ring_seconds("all_to_all", n, nb, a, bt) == pytest.approx(3 * a + bt * nb * 3 / 4)
    assert ring_seconds("all_reduce", n, nb, a, bt) == pytest.approx(6 * a + 2 * bt * nb * 3 / 4)
    assert ring_seconds("broadcast", 5, nb, a, bt) == pytest.approx(math.ceil(math.log2(5)) * a + bt * nb)
    assert ring_seconds("all_reduce", 1, GIB, a, bt) == 0.0
    with pytest.raises(CommError, match="unknown collective kind"):
        ring_seconds("gossip", 4, 1, a, bt)


def test_binomial_broadcast_pays_every_hop_in_full():
    # gloo's binomial tree: ceil(log2 n) sequential whole-buffer hops; the pipelined one pays the bytes once.
    a, bt, nb = 1e-3, 1e-9, 2**24
    for n in (2, 4, 5, 8):
        hops = math.ceil(math.log2(n))
        assert ring_seconds("broadcast", n, nb, a, bt, "binomial") == pytest.approx(hops * (a + bt * nb))
        assert ring_seconds("broadcast", n, nb, a, bt, "pipelined") == pytest.approx(hops * a + bt * nb)
    gloo = load_profile("cpu-gloo")
    c = Collective("broadcast", ("x",), nb, "forward")
    assert collective_seconds(c, Mesh((8,)), gloo) == pytest.approx(3 * (gloo.intra_alpha + gloo.intra_beta * nb))
    with pytest.raises(CommError, match="unknown broadcast algorithm 'ring'"):
        ring_seconds("broadcast", 4, nb, a, bt, "ring")


def _ar(nbytes: int, mesh: Mesh, axes=("x",)) -> float:
    return collective_seconds(Collective("all_reduce", axes, nbytes, "forward"), mesh, A100)


def test_small_messages_are_latency_bound_large_ones_bandwidth_bound():
    mesh = Mesh((8,))
    assert _ar(8 * KIB, mesh) / _ar(4 * KIB, mesh) == pytest.approx(1.0, abs=0.01)
    assert _ar(2 * GIB, mesh) / _ar(1 * GIB, mesh) == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
@pytest.mark.parametrize("nbytes", [1, 4 * KIB, MIB, GIB])
def test_all_reduce_never_beats_nothing_and_equals_all_gather_plus_reduce_scatter(n, nbytes):
    # A ring all-reduce is a reduce-scatter then an all-gather of the same full buffer.
    mesh = Mesh((n,))
    ag = collective_seconds(Collective("all_gather", ("x",), nbytes, "forward"), mesh, A100)
    rs = collective_seconds(Collective("reduce_scatter", ("x",), nbytes, "forward"), mesh, A100)
    assert _ar(nbytes, mesh) <= ag + rs * (1 + 1e-12)
    assert _ar(nbytes, mesh) == pytest.approx(ag + rs)


def test_inter_node_groups_pay_the_network():
    mesh = Mesh((4, 8))  # y (8 ranks, stride 1) stays inside a node of 8; x spans 4 nodes
    intra, inter = _ar(64 * MIB, Mesh((8,))), _ar(64 * MIB, Mesh((4, 8)), ("x",))
    assert mesh.is_intra_node(("y",)) and not mesh.is_intra_node(("x",))
    # Same bytes, fewer ranks on x, but 25 GB/s InfiniBand instead of 300 GB/s NVLink.
    assert inter > intra
    assert inter == pytest.approx(2 * 3 * A100.inter_alpha + 2 * 64 * MIB * 3 / 4 * A100.inter_beta)
    assert _ar(64 * MIB, mesh, ("y",)) == pytest.approx(intra)


def test_profile_overrides_win():
    data = A100.to_json()
    data["overrides"] = {"intra:all_reduce": [1e-3, 1e-12]}
    from cost_models.hardware import HardwareProfile

    hw = HardwareProfile.from_json(data)
    c = Collective("all_reduce", ("x",), 1000, "forward")
    assert collective_seconds(c, Mesh((2,)), hw) == pytest.approx(2 * 1e-3 + 2 * 1e-12 * 500)
    ag = Collective("all_gather", ("x",), 1000, "forward")
    assert collective_seconds(ag, Mesh((2,)), hw) == collective_seconds(ag, Mesh((2,)), A100)


def test_roofline_takes_the_larger_roof():
    peak = A100.peak_flops["bf16"] * A100.efficiency
    assert roofline_seconds(1e12, 0, "bfloat16", A100) == pytest.approx(1e12 / peak)
    assert roofline_seconds(1, 2039e9, "bfloat16", A100) == pytest.approx(1.0)
    assert roofline_seconds(1e12, 0, "float32", A100) == pytest.approx(1e12 / (19.5e12 * A100.efficiency))


def test_collective_vocabularies_are_closed() -> None:
    """A collective's kind, phase and tag come from one closed vocabulary each; a misspelt one is refused when
    the Collective is made, not silently priced at zero or left unmatched against a measurement."""
    import pytest

    from cost_models.strategy import COLLECTIVE_KINDS, PHASES, Collective

    assert COLLECTIVE_KINDS == ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
    assert PHASES == ("forward", "backward", "recompute")
    Collective("all_to_all", ("x",), 8, "recompute", "edge")
    with pytest.raises(ValueError, match="kind 'allgather'"):
        Collective("allgather", ("x",), 8, "forward")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="phase 'fwd'"):
        Collective("all_gather", ("x",), 8, "fwd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tag 'grad_weights'"):
        Collective("all_gather", ("x",), 8, "backward", "grad_weights")  # type: ignore[arg-type]
