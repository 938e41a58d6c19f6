"""cost_models.grad_buffers: the activation gradients autograd holds beside an op's working set."""

from __future__ import annotations

from cost_models.grad_buffers import gradient_buffers
from cost_models.ops import OpNode


def _ops(*spec: tuple[str, list[str]]) -> list[OpNode]:
    return [OpNode(name, "other", name, inputs=inputs) for name, inputs in spec]


def test_three_selects_of_one_tensor_accumulate_and_wait() -> None:
    """x[0], x[1], x[2] of a packed q/k/v (300 B; parts 100 B, each select's own working set 400 B: its
    output's gradient and the zero-filled gradient of x). At x[1]: x's gradient buffer (from x[2]),
    x[1]'s contribution and their sum (3 x 300), and the gradient of x[0] waiting for it (100)."""
    ops = _ops(("x", []), ("s0", ["x"]), ("s1", ["x"]), ("s2", ["x"]),
               ("v0", ["s0"]), ("v1", ["s1"]), ("v2", ["s2"]))
    grads = {n.name: (300 if n.name == "x" else 100) for n in ops}
    own = [0, 400, 400, 400, 0, 0, 0]
    got = gradient_buffers(ops, grads, own)
    assert got[2] == 3 * 300 + 100
    assert got[3] == 400 + 2 * 100   # the last select: x has no open buffer yet; s0, s1 wait
    assert got[1] == 3 * 300         # the first: the buffer holds the sum of s1's and s2's; nothing waits
    assert got[0] == 0 and got[4:] == [100 + 100, 100, 0]  # v0: s1, s2 wait; v1: s2 waits


def test_residual_gradient_waits_beside_the_branch_unless_it_is_the_branch_output_gradient() -> None:
    """h = r + f(g(r)): while g and f are differentiated the add's output gradient (r's first
    contribution, the same storage: an add hands it on unchanged) waits, except at f, whose own output
    gradient it is (f's working set prices it)."""
    ops = _ops(("r", []), ("g", ["r"]), ("f", ["g"]), ("add", ["r", "f"]))
    grads = {n.name: 100 for n in ops}
    own = [0, 50, 50, 0]
    assert gradient_buffers(ops, grads, own, {"r": "add", "f": "add"}) == [0, max(50 + 100, 100 + 200), 50, 0]
    # without the shared storage (e.g. a dropout between f and the add makes a new gradient) it waits at f
    assert gradient_buffers(ops, grads, own, {"r": "add"})[2] == 50 + 100
