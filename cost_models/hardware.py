"""Hardware profiles: the numbers the cost model turns bytes and FLOPs into seconds with.

A `HardwareProfile` names one kind of machine: compute peaks per dtype and the achievable fraction of
them, device-memory capacity and bandwidth, and the alpha (latency, seconds per ring step) and beta
(seconds per byte) of collectives inside a node and across nodes. Every built-in number is taken from a
public source cited next to it; `planner calibrate` measures the real cluster and writes a profile file
(`HardwareProfile.save`), optionally with per-(link, collective) alpha/beta overrides.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost_models.errors import PlannerError
from cost_models.files import write_atomic

__all__ = ["HardwareProfile", "ProfileError", "load_profile", "BUILTIN_PROFILES", "LINKS", "PEAK_DTYPES",
           "BROADCAST_ALGORITHMS"]

LINKS = ("intra", "inter")
PEAK_DTYPES = ("bf16", "fp16", "fp32", "tf32")
_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
_DEVICES = ("cuda", "cpu")
# How the backend broadcasts (the cost formulas are in cost_models.comm.ring_seconds): "pipelined" sends the
# buffer in chunks down a tree or ring, so every rank receives it about once (NCCL); "binomial" forwards the
# whole buffer along a binomial tree, ceil(log2 n) full hops on the critical path (gloo, gloo/broadcast.cc).
BROADCAST_ALGORITHMS = ("pipelined", "binomial")
# torch dtype short names -> the peak a matmul in that dtype runs at.
_DTYPE_PEAK = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# Upper limits of a plausible profile, orders of magnitude beyond any device of today: a value past one is a
# typo or a unit mistake (bits for bytes, GB/s for B/s), refused so that it cannot silently skew every plan.
_MAX_GPUS_PER_NODE = 4096        # the largest NVLink domains hold 72-576 GPUs (GB200 NVL72, NVL576)
_MAX_MEMORY_BYTES = 2**50        # 1 PiB per rank (a B200 has 192 GB, the largest CPU hosts tens of TB)
_MAX_PEAK_FLOPS = 1e17           # 100 PFLOP/s per rank (a B200 runs about 2.25e15 dense bf16)
_MAX_MEM_BANDWIDTH = 1e15        # 1 PB/s per rank (a B200 has 8e12 B/s)
_MAX_ALPHA_S = 1.0               # one ring step's latency: microseconds on real links
_BETA_RANGE = (1e-15, 1e-3)      # seconds per byte: links from 1 PB/s down to 1 KB/s
# Lower limits likewise: below them a step time is astronomically long (a typo such as efficiency 1e-300).
_MIN_EFFICIENCY = 1e-3           # 0.1 % of peak; real large matmuls reach 30-80 %
_MIN_PEAK_FLOPS = 1e6            # 1 MFLOP/s per rank (a CPU core runs about 1e10)
_MIN_MEM_BANDWIDTH = 1e3         # 1 KB/s, as the slowest link of _BETA_RANGE
_MAX_PROFILE_BYTES = 16 * 2**20  # a profile file is a few KB; more is not a profile


class ProfileError(PlannerError, ValueError):
    """A hardware profile that is missing, malformed or physically impossible (says which field)."""


@dataclass(frozen=True, eq=False)
class HardwareProfile:
    """One machine kind.

    name: short identifier ("a100-80gb").
    source: where the numbers come from (citations, or "measured by planner calibrate on ...").
    device: "cuda" or "cpu": the device kind whose memory semantics the cost model should use.
    gpus_per_node: ranks sharing the fast intra-node link (the mesh's ranks_per_node).
    memory_bytes: device memory per rank.
    peak_flops: dense peak FLOP/s per dtype, keys among PEAK_DTYPES ("bf16", "fp16", "fp32", "tf32").
    efficiency: achievable fraction of peak for large matmuls (0 < efficiency <= 1).
    mem_bandwidth: device-memory bandwidth in bytes/s (the roofline's memory roof).
    intra_alpha / intra_beta: per-step latency (s) and seconds per byte of one ring step inside a node.
    inter_alpha / inter_beta: the same for groups that cross nodes.
    overrides: {(link, collective kind): (alpha, beta)} measured per collective; they win over the
        per-link defaults.
    group_overrides: {(link, collective kind, group size): (alpha, beta)} measured for one group size
        (`planner calibrate` fits each group size it timed); they win over `overrides` for that size.
    broadcast_algorithm: one of BROADCAST_ALGORITHMS, the formula broadcasts are priced with; alpha and
        beta mean the same (one hop's latency, seconds per byte) under either.
    """

    name: str
    source: str
    device: str
    gpus_per_node: int
    memory_bytes: int
    peak_flops: dict[str, float]
    efficiency: float
    mem_bandwidth: float
    intra_alpha: float
    intra_beta: float
    inter_alpha: float
    inter_beta: float
    overrides: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    group_overrides: dict[tuple[str, str, int], tuple[float, float]] = field(default_factory=dict)
    broadcast_algorithm: str = "pipelined"

    def __post_init__(self) -> None:
        _validate(self)
        # Canonical form, computed once: profiles key memo tables, so hashing must be cheap.
        object.__setattr__(self, "_canonical", json.dumps(self.to_json(), sort_keys=True))

    # --- queries -------------------------------------------------------------------------------
    def alpha_beta(self, link: str, kind: str, n: int | None = None) -> tuple[float, float]:
        """(alpha, beta) of collective `kind` over a group of `n` ranks on `link` ("intra" or "inter")."""
        if link not in LINKS:
            raise ProfileError(f"link must be one of {LINKS}, got {link!r}")
        if n is not None and (link, kind, n) in self.group_overrides:
            return self.group_overrides[(link, kind, n)]
        if (link, kind) in self.overrides:
            return self.overrides[(link, kind)]
        return (self.intra_alpha, self.intra_beta) if link == "intra" else (self.inter_alpha, self.inter_beta)

    def peak(self, dtype: str) -> float:
        """Achievable FLOP/s of a matmul in torch dtype `dtype` (peak x efficiency). Float types without
        their own entry (float64, ...) use the fp32 peak."""
        key = _DTYPE_PEAK.get(dtype, "fp32")
        if key not in self.peak_flops:
            key = "fp32"
        return self.peak_flops[key] * self.efficiency

    # --- identity (dict fields: hash a canonical form so profiles can key memo tables) ---------
    def _key(self) -> str:
        return self._canonical  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HardwareProfile) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # --- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name, "source": self.source, "device": self.device,
            "gpus_per_node": self.gpus_per_node, "memory_bytes": self.memory_bytes,
            "peak_flops": dict(self.peak_flops), "efficiency": self.efficiency,
            "mem_bandwidth": self.mem_bandwidth,
            "intra_alpha": self.intra_alpha, "intra_beta": self.intra_beta,
            "inter_alpha": self.inter_alpha, "inter_beta": self.inter_beta,
            "overrides": {f"{link}:{kind}": [a, b] for (link, kind), (a, b) in sorted(self.overrides.items())},
        }
        if self.group_overrides:  # only when present, so profiles without them keep their exact JSON
            out["group_overrides"] = {f"{link}:{kind}:{n}": [a, b]
                                      for (link, kind, n), (a, b) in sorted(self.group_overrides.items())}
        if self.broadcast_algorithm != "pipelined":  # likewise only when not the default
            out["broadcast_algorithm"] = self.broadcast_algorithm
        return out

    @classmethod
    def from_json(cls, data: Any) -> HardwareProfile:
        """Build a profile from `to_json`'s dict; raises ProfileError naming a missing or bad field."""
        if not isinstance(data, dict):
            raise ProfileError(f"a hardware profile must be a JSON object, got {type(data).__name__}")
        required = ("name", "source", "device", "gpus_per_node", "memory_bytes", "peak_flops", "efficiency",
                    "mem_bandwidth", "intra_alpha", "intra_beta", "inter_alpha", "inter_beta")
        missing = [k for k in required if k not in data]
        if missing:
            raise ProfileError(f"hardware profile {data.get('name', '?')!r} is missing field(s) {missing}; "
                               f"a profile needs {list(required)} (see HardwareProfile)")
        unknown = sorted(set(data) - set(required) - {"overrides", "group_overrides", "broadcast_algorithm"})
        if unknown:
            raise ProfileError(f"hardware profile {data.get('name', '?')!r} has unknown field(s) {unknown}; the "
                               f"fields are {list(required)} plus optional 'overrides', 'group_overrides' and "
                               "'broadcast_algorithm'")
        overrides: dict[tuple[str, str], tuple[float, float]] = {}
        raw = data.get("overrides", {}) or {}
        if not isinstance(raw, dict):
            raise ProfileError("'overrides' must be an object like {\"intra:all_reduce\": [alpha, beta]}")
        for key, value in raw.items():
            link, _, kind = str(key).partition(":")
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise ProfileError(f"override {key!r} must be [alpha, beta], got {value!r}")
            overrides[(link, kind)] = (_num(value[0], f"overrides[{key}][0]"), _num(value[1], f"overrides[{key}][1]"))
        group_overrides: dict[tuple[str, str, int], tuple[float, float]] = {}
        raw = data.get("group_overrides", {}) or {}
        if not isinstance(raw, dict):
            raise ProfileError("'group_overrides' must be an object like {\"intra:all_reduce:8\": [alpha, beta]}")
        for key, value in raw.items():
            link, kind, size = (str(key).split(":") + ["", ""])[:3]
            if not size.isdigit():
                raise ProfileError(f"group override {key!r} must be named <link>:<kind>:<group size>")
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise ProfileError(f"group override {key!r} must be [alpha, beta], got {value!r}")
            group_overrides[(link, kind, int(size))] = (_num(value[0], f"group_overrides[{key}][0]"),
                                                        _num(value[1], f"group_overrides[{key}][1]"))
        if not isinstance(data["peak_flops"], dict):
            raise ProfileError("'peak_flops' must be an object like {\"bf16\": 3.12e14, \"fp32\": 1.95e13}")
        try:
            return cls(
                name=str(data["name"]), source=str(data["source"]), device=str(data["device"]),
                gpus_per_node=_int(data["gpus_per_node"], "gpus_per_node"),
                memory_bytes=_int(data["memory_bytes"], "memory_bytes"),
                peak_flops={str(k): _num(v, f"peak_flops[{k}]") for k, v in data["peak_flops"].items()},
                efficiency=_num(data["efficiency"], "efficiency"),
                mem_bandwidth=_num(data["mem_bandwidth"], "mem_bandwidth"),
                intra_alpha=_num(data["intra_alpha"], "intra_alpha"), intra_beta=_num(data["intra_beta"], "intra_beta"),
                inter_alpha=_num(data["inter_alpha"], "inter_alpha"), inter_beta=_num(data["inter_beta"], "inter_beta"),
                overrides=overrides, group_overrides=group_overrides,
                broadcast_algorithm=str(data.get("broadcast_algorithm", "pipelined")),
            )
        except TypeError as e:  # pragma: no cover - every field is passed explicitly above
            raise ProfileError(f"malformed hardware profile: {e}") from None

    def save(self, path: str | os.PathLike, atomic: bool = True) -> None:
        """Write the profile as JSON through `cost_models.files.write_atomic` (a reader never sees a
        half-written file; a path that is not a regular file is refused). `atomic` is kept for callers
        that pass it; every write is atomic."""
        write_atomic(path, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n", "the hardware profile")


def _num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"hardware profile field {what} must be a number, got {value!r}")
    return float(value)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"hardware profile field {what} must be an integer, got {value!r}")
    return value


def _validate(p: HardwareProfile) -> None:
    if p.device not in _DEVICES:
        raise ProfileError(f"profile {p.name!r}: device must be one of {_DEVICES}, got {p.device!r}")
    if p.broadcast_algorithm not in BROADCAST_ALGORITHMS:
        raise ProfileError(f"profile {p.name!r}: broadcast_algorithm must be one of {BROADCAST_ALGORITHMS} "
                           f"(\"binomial\" for gloo, \"pipelined\" for NCCL), got {p.broadcast_algorithm!r}")
    if not 1 <= p.gpus_per_node <= _MAX_GPUS_PER_NODE:
        raise ProfileError(f"profile {p.name!r}: gpus_per_node must be in [1, {_MAX_GPUS_PER_NODE}], got "
                           f"{p.gpus_per_node}")
    if not 0 < p.memory_bytes <= _MAX_MEMORY_BYTES:
        raise ProfileError(f"profile {p.name!r}: memory_bytes must be positive bytes per rank, at most "
                           f"{_MAX_MEMORY_BYTES} (1 PiB), got {p.memory_bytes}")
    if "fp32" not in p.peak_flops:
        raise ProfileError(f"profile {p.name!r}: peak_flops needs at least an 'fp32' entry, got {sorted(p.peak_flops)}")
    for k, v in p.peak_flops.items():
        if k not in PEAK_DTYPES:
            raise ProfileError(f"profile {p.name!r}: unknown peak_flops dtype {k!r}; use {PEAK_DTYPES}")
        if not (v > 0 and math.isfinite(v)):
            raise ProfileError(f"profile {p.name!r}: peak_flops[{k}] must be positive, got {v}")
        if v < _MIN_PEAK_FLOPS:
            raise ProfileError(f"profile {p.name!r}: peak_flops[{k}] = {v:g} FLOP/s per rank is below any device "
                               f"(at least {_MIN_PEAK_FLOPS:g}); give FLOP/s, e.g. 3.12e14 for 312 TFLOP/s")
        if v > _MAX_PEAK_FLOPS:
            raise ProfileError(f"profile {p.name!r}: peak_flops[{k}] = {v:g} FLOP/s per rank is beyond any device "
                               f"(at most {_MAX_PEAK_FLOPS:g}); give FLOP/s, e.g. 3.12e14 for 312 TFLOP/s")
    if not (_MIN_EFFICIENCY <= p.efficiency <= 1):
        raise ProfileError(f"profile {p.name!r}: efficiency must be in [{_MIN_EFFICIENCY:g}, 1] (the achieved "
                           f"fraction of peak; 0.3-0.8 for large matmuls), got {p.efficiency:g}")
    if not (p.mem_bandwidth > 0 and math.isfinite(p.mem_bandwidth)):
        raise ProfileError(f"profile {p.name!r}: mem_bandwidth must be positive bytes/s, got {p.mem_bandwidth}")
    if p.mem_bandwidth < _MIN_MEM_BANDWIDTH:
        raise ProfileError(f"profile {p.name!r}: mem_bandwidth = {p.mem_bandwidth:g} bytes/s is below any device "
                           f"(at least {_MIN_MEM_BANDWIDTH:g}); give bytes per second, e.g. 2.039e12 for 2,039 GB/s")
    if p.mem_bandwidth > _MAX_MEM_BANDWIDTH:
        raise ProfileError(f"profile {p.name!r}: mem_bandwidth = {p.mem_bandwidth:g} bytes/s is beyond any device "
                           f"(at most {_MAX_MEM_BANDWIDTH:g}); give bytes per second, e.g. 2.039e12 for 2,039 GB/s")
    pairs = {"intra": (p.intra_alpha, p.intra_beta), "inter": (p.inter_alpha, p.inter_beta)}
    pairs.update({f"{link}:{kind}": ab for (link, kind), ab in p.overrides.items()})
    pairs.update({f"{link}:{kind}:{n}": ab for (link, kind, n), ab in p.group_overrides.items()})
    for (link, kind) in p.overrides:
        if link not in LINKS or kind not in _COLLECTIVES:
            raise ProfileError(f"profile {p.name!r}: override key {link}:{kind} must be <link>:<kind> with link in "
                               f"{LINKS} and kind in {_COLLECTIVES}")
    for (link, kind, n) in p.group_overrides:
        if link not in LINKS or kind not in _COLLECTIVES or isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ProfileError(f"profile {p.name!r}: group override key {link}:{kind}:{n} must be "
                               f"<link>:<kind>:<group size >= 2> with link in {LINKS} and kind in {_COLLECTIVES}")
    for what, (alpha, beta) in pairs.items():
        if not (alpha >= 0 and math.isfinite(alpha)):
            raise ProfileError(f"profile {p.name!r}: alpha of {what} must be >= 0 seconds, got {alpha}")
        if alpha > _MAX_ALPHA_S:
            raise ProfileError(f"profile {p.name!r}: alpha of {what} = {alpha:g} s per ring step is absurd (at most "
                               f"{_MAX_ALPHA_S:g}); give seconds, e.g. 3.4e-06 for 3.4 us")
        if not (beta > 0 and math.isfinite(beta)):
            raise ProfileError(f"profile {p.name!r}: beta of {what} must be positive seconds/byte "
                               f"(1 / bandwidth), got {beta}")
        if not _BETA_RANGE[0] <= beta <= _BETA_RANGE[1]:
            raise ProfileError(f"profile {p.name!r}: beta of {what} = {beta:g} s/byte is a link of {1 / beta:g} bytes/s,"
                               f" outside [{1 / _BETA_RANGE[1]:g}, {1 / _BETA_RANGE[0]:g}]; beta is seconds per byte, "
                               "1 / bandwidth, e.g. 4e-11 for 25 GB/s")


# --- built-in profiles ---------------------------------------------------------------------------
# alpha: NCCL's own cost model (NVIDIA/nccl, src/graph/tuning.cc, table hwLat) charges a ring step with
# the Simple protocol 3.4 us on NVLink and 9.6 us over the network; we use those per-step latencies.
_NCCL_RING_SIMPLE_NVLINK_S = 3.4e-6
_NCCL_RING_SIMPLE_NET_S = 9.6e-6
# efficiency: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM" (SC'21) sustain 52% of the A100's theoretical peak per GPU on GPT models.
_MEGATRON_A100_EFFICIENCY = 0.52

_A100 = HardwareProfile(
    name="a100-80gb",
    source=("NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 312 TFLOPS BF16/FP16 dense, 156 TFLOPS TF32 "
            "dense, 19.5 TFLOPS FP32, 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (300 GB/s per direction); "
            "NVIDIA DGX A100 datasheet: 8 GPUs per node, 8x 200 Gb/s HDR InfiniBand (25 GB/s per GPU); "
            "alpha from NCCL src/graph/tuning.cc hwLat (ring, Simple); efficiency 0.52 from Narayanan et al. "
            "SC'21 (Megatron-LM)"),
    device="cuda",
    gpus_per_node=8,                         # DGX A100: 8 GPUs per node
    memory_bytes=80 * 10**9,                 # A100 SXM4: 80 GB HBM2e
    peak_flops={"bf16": 312e12,              # A100 datasheet: BF16 Tensor Core, dense
                "fp16": 312e12,              # A100 datasheet: FP16 Tensor Core, dense
                "tf32": 156e12,              # A100 datasheet: TF32 Tensor Core, dense
                "fp32": 19.5e12},            # A100 datasheet: FP32
    efficiency=_MEGATRON_A100_EFFICIENCY,
    mem_bandwidth=2039e9,                    # A100 80GB SXM datasheet: 2,039 GB/s
    intra_alpha=_NCCL_RING_SIMPLE_NVLINK_S,
    intra_beta=1 / 300e9,                    # NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction
    inter_alpha=_NCCL_RING_SIMPLE_NET_S,
    inter_beta=1 / 25e9,                     # HDR InfiniBand 200 Gb/s = 25 GB/s per GPU (one HCA per GPU)
)

_H100 = HardwareProfile(
    name="h100-80gb",
    source=("NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOPS BF16/FP16 dense (1,979 with sparsity), "
            "494 TFLOPS TF32 dense, 67 TFLOPS FP32, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (450 GB/s per "
            "direction); NVIDIA DGX H100 datasheet: 8 GPUs per node, 8x 400 Gb/s NDR InfiniBand (50 GB/s per "
            "GPU); alpha from NCCL src/graph/tuning.cc hwLat (ring, Simple); efficiency assumed equal to the "
            "A100 figure of Narayanan et al. SC'21 (no public H100 figure used)"),
    device="cuda",
    gpus_per_node=8,                         # DGX H100: 8 GPUs per node
    memory_bytes=80 * 10**9,                 # H100 SXM5: 80 GB HBM3
    peak_flops={"bf16": 989e12,              # H100 SXM datasheet: BF16 Tensor Core, dense (half of 1,979 sparse)
                "fp16": 989e12,              # H100 SXM datasheet: FP16 Tensor Core, dense
                "tf32": 494e12,              # H100 SXM datasheet: TF32 Tensor Core, dense (half of 989 sparse)
                "fp32": 67e12},              # H100 SXM datasheet: FP32
    efficiency=_MEGATRON_A100_EFFICIENCY,
    mem_bandwidth=3.35e12,                   # H100 SXM datasheet: 3.35 TB/s
    intra_alpha=_NCCL_RING_SIMPLE_NVLINK_S,
    intra_beta=1 / 450e9,                    # NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction
    inter_alpha=_NCCL_RING_SIMPLE_NET_S,
    inter_beta=1 / 50e9,                     # NDR InfiniBand 400 Gb/s = 50 GB/s per GPU (one HCA per GPU)
)

_CPU_GLOO = HardwareProfile(
    name="cpu-gloo",
    source=("measured on the project's 2-core development VM (AMD EPYC, torch 2.13 CPU build): 1024^3 matmul "
            "25 GFLOP/s fp32, 97 GFLOP/s bf16, 0.55 GFLOP/s fp16; tensor copy 14.9 GB/s (read + write); "
            "gloo over loopback TCP with 2-8 forked ranks on 2 cores: about 1 ms per ring step when "
            "oversubscribed and about 0.7 GB/s per link (rough fit; run `planner calibrate` to refine)"),
    device="cpu",
    gpus_per_node=8,                         # every rank on one machine: the whole mesh is one "node"
    memory_bytes=24 * 2**30,                 # the VM's 24 GiB of RAM
    peak_flops={"fp32": 25e9, "tf32": 25e9,  # measured: 1024^3 fp32 matmul (no TF32 on CPU)
                "bf16": 97e9,                # measured: 1024^3 bf16 matmul (AVX512-BF16)
                "fp16": 0.55e9},             # measured: 1024^3 fp16 matmul (no fast CPU kernel)
    efficiency=1.0,                          # the peaks above are already measured throughputs
    mem_bandwidth=14.9e9,                    # measured: copy of a 64 MiB tensor, bytes read + written
    intra_alpha=1e-3,                        # measured: gloo, small all-gather, per ring step
    intra_beta=1 / 0.7e9,                    # measured: gloo, 16 MiB all-gather / all-reduce
    inter_alpha=1e-3,                        # one machine: no inter-node link; same as intra
    inter_beta=1 / 0.7e9,
    broadcast_algorithm="binomial",          # gloo/broadcast.cc: whole buffer along a binomial tree
)

BUILTIN_PROFILES: dict[str, HardwareProfile] = {p.name: p for p in (_A100, _H100, _CPU_GLOO)}


def load_profile(name_or_path: str | os.PathLike | HardwareProfile) -> HardwareProfile:
    """A built-in profile by name, or a profile JSON file written by `HardwareProfile.save` /
    `planner calibrate`. Raises ProfileError for an unknown name (listing the known ones), a file that is
    not JSON, or a profile with a missing or impossible field."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    key = str(name_or_path)
    if key in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[key]
    path = Path(key)
    if not path.is_file():
        raise ProfileError(f"unknown hardware profile {key!r}: not a built-in name (known: "
                           f"{sorted(BUILTIN_PROFILES)}) and no such file")
    fix = "write it with HardwareProfile.save or `planner calibrate --out`"
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_PROFILE_BYTES + 1)
    except OSError as e:
        raise ProfileError(f"cannot read hardware profile file {key!r}: {e.strerror or e}") from None
    if len(raw) > _MAX_PROFILE_BYTES:
        raise ProfileError(f"hardware profile file {key!r} is larger than {_MAX_PROFILE_BYTES // 2**20} MiB: not a "
                           f"profile; {fix}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"hardware profile file {key!r} is not valid JSON ({e}); {fix}") from None
    except RecursionError:
        raise ProfileError(f"hardware profile file {key!r} is nested too deeply to be a profile; {fix}") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise ProfileError(f"hardware profile file {key!r} holds a number too long for a profile ({e}); {fix}") from None
    return HardwareProfile.from_json(data)
