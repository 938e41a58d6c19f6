"""The plan file: what the planner decided, as plain dataclasses and versioned JSON.

A `Plan` records the mesh, one `Assignment` per planned op (its scheme, strategy, layouts and costs), the
redistributions between ops, the checkpointed blocks, the predicted memory and time, and how the solver
did. JSON keys are exactly the dataclass field names, plus `world_size` (derived from the mesh) at the top
level. The JSON is deterministic (sorted keys, floats written by `repr`), so one plan always gives the same
bytes and golden plans can be diffed.

Accounting contract (what `planner explain` adds up; per rank, one training step):
* `predicted.model_state_bytes` = sum of `assignments[].cost.state_bytes`;
* `predicted.activation_bytes` = sum of `cost.saved_bytes` (each op's activations as kept *in this plan*:
  0 inside a checkpointed block, whose kept input is charged to the op that reads it);
* `predicted.optimizer_bytes` = what the optimizer step holds beside every state: its temporaries, from
  `cost.optimizer_bytes` (what each op's parameters make it hold) by `options.optimizer`'s rule (the
  largest for single_tensor, the sum for foreach), and the caller's `model.inputs` in the caller's layout
  (`cost_models.optimizer.optimizer_step_bytes`); 0 in plans without `options.optimizer`;
* `predicted.transient_bytes` = max of `cost.transient_bytes` (a checkpointed block's recomputed
  activations count as transient memory of its ops);
* `predicted.bound_bytes` (derived, not stored) = model states + max(activations + transient, optimizer):
  the backward with every gradient and saved activation alive together, or the optimizer step; the
  budget is checked against it;
* `predicted.released_bytes` = what the bound counts that is not alive at the step's peak (gradients not
  yet computed and activations already freed when the backward reaches the op where memory peaks), by
  `cost_models.memory.step_peak` over the assignments in order;
* `predicted.peak_memory_bytes` = bound - released (checked on load);
* `predicted.compute_s` = sum of `cost.compute_s`; `predicted.comm_s` = sum of `cost.comm_s` + sum of
  `redistributions[].seconds`; `predicted.comm_bytes` likewise with bytes;
* `predicted.recompute_s` = sum of `cost.recompute_s` (0 for ops outside checkpointed blocks; includes the
  re-run of redistributions into the op); `predicted.step_time_s` = compute + comm + recompute.

Loading runs `json.loads` and nothing else: no pickle, no imports named by the file. Every problem is a
`PlanError` naming the field (`assignments[3].cost.saved_bytes`) and what to do about it. `to_json` runs
the same checks, so a plan that saves also loads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Any

from cost_models.errors import one_line
from cost_models.files import write_atomic
from cost_models.layout import Layout, LayoutError
from cost_models.memory import DEVICE_KINDS
from cost_models.mesh import Mesh
from cost_models.ops import DTYPE_BYTES
from cost_models.optimizer import OPTIMIZER_IMPLS
from cost_models.strategy import SCHEMES, Strategy
from planner.plans.json_io import REPLAN, JsonReader, PlanError, describe, format_json, read_mesh, to_data

__all__ = [
    "SCHEMA_VERSION", "INPUT_MODES", "MAX_DIMS", "MAX_DIM_SIZE", "MAX_NUMEL", "SOLVER_STATUSES", "DEVICE_KINDS", "PlanError", "InputInfo", "ModelInfo", "AssignmentCost",
    "Assignment", "Redistribution", "OpPrediction", "Predicted", "SolverInfo", "PlanOptions", "Plan",
]

SCHEMA_VERSION = 1
# Bounds of the shapes a plan may record (model inputs, redistributed tensors): generous beyond any model.
MAX_DIMS = 16
MAX_DIM_SIZE = 2**40
MAX_NUMEL = 2**50
MAX_PLAN_BYTES = 256 * 2**20  # the most a plan file may hold
SOLVER_STATUSES = ("optimal", "feasible", "infeasible", "error")
# How the caller passes inputs and gets outputs back: "full" (the whole batch on every rank, outputs whole)
# or "sharded" (each rank its block of the batch dim, in and out).
INPUT_MODES = ("full", "sharded")
# Scheme names a user may ask for: every strategy scheme plus "1d" (1d_col and 1d_row together).
_OPTION_SCHEMES = SCHEMES + ("1d",)


@dataclass
class InputInfo:
    """One tensor input of the traced model: its forward argument name, global shape and dtype (torch's
    short name), so that `apply_plan` can capture the model again without example inputs."""

    name: str
    shape: list[int]
    dtype: str


@dataclass
class ModelInfo:
    """The model a plan is for. fingerprint: hash of the traced graph, so a plan is not applied elsewhere;
    inputs: the tensor inputs it was traced with."""

    name: str
    fingerprint: str
    inputs: list[InputInfo] = field(default_factory=list)


@dataclass
class AssignmentCost:
    """What one op costs one rank in this plan (see the accounting contract in the module docstring)."""

    state_bytes: int
    saved_bytes: int
    transient_bytes: int
    compute_s: float
    comm_s: float
    comm_bytes: int
    recompute_s: float
    optimizer_bytes: int = 0  # what its parameters make the optimizer step hold (absent in older plans: 0)


@dataclass
class Assignment:
    """The strategy chosen for one op. inputs: one layout per argument (None for non-tensors); params:
    storage layout by state-dict name; options: scheme details (roles, save_input...); not_offered: why
    other schemes were not candidates for this op (for `planner explain`)."""

    node: str
    target: str
    kind: str
    scheme: str
    strategy: str
    inputs: list[Layout | None]
    outputs: list[Layout]
    params: dict[str, Layout]
    options: dict[str, Any]
    block: str | None
    module_path: str
    cost: AssignmentCost
    not_offered: list[str] = field(default_factory=list)

    def to_strategy(self) -> Strategy:
        """The cost model's `Strategy` value for this assignment (JSON lists back to tuples)."""
        def tup(v: Any) -> Any:
            return tuple(tup(x) for x in v) if isinstance(v, list | tuple) else v
        return Strategy(self.scheme, tuple(self.inputs), tuple(self.outputs), tuple(self.params.items()),
                        tuple(sorted((k, tup(v)) for k, v in self.options.items())))


@dataclass
class Redistribution:
    """A layout conversion on the edge src -> dst: the tensor's global shape, both layouts, the steps of
    `plan_redistribution` as text, their collective bytes and alpha-beta seconds (forward + backward)."""

    src: str
    dst: str
    shape: list[int]
    src_layout: Layout
    dst_layout: Layout
    steps: list[str]
    comm_bytes: int
    seconds: float


@dataclass
class OpPrediction:
    """One op's share of the prediction: time_s = compute + comm + recompute seconds."""

    node: str
    scheme: str
    time_s: float
    comm_bytes: int
    state_bytes: int
    saved_bytes: int


@dataclass
class Predicted:
    """Predicted per-rank peak memory (= `bound_bytes` - released) and step time."""

    peak_memory_bytes: int
    model_state_bytes: int
    activation_bytes: int
    transient_bytes: int
    step_time_s: float
    compute_s: float
    comm_s: float
    comm_bytes: int
    recompute_s: float
    released_bytes: int = 0  # absent in plans written before it existed, whose peak was the bound
    optimizer_bytes: int = 0  # the optimizer step's beyond the states (absent in plans written before it was counted)
    per_op: list[OpPrediction] = field(default_factory=list, repr=False)

    def __repr__(self) -> str:
        """The totals only: the per-op rows (one per op, 200,000 characters for a 32-layer model) are
        counted, not printed; `planner explain` shows them."""
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"Predicted({shown}, per_op=[{len(self.per_op)} ops])"

    @property
    def bound_bytes(self) -> int:
        """What the budget is checked against: model states + activations + transient, every gradient and
        saved activation counted alive together (the solver's memory model, >= the peak), or model states +
        what the optimizer step holds beside them where that is more. The planner keeps plans whose bound
        fits, so a budget that the reported minimum meets can be planned again."""
        return self.model_state_bytes + max(self.activation_bytes + self.transient_bytes, self.optimizer_bytes)

    @property
    def step_sets_bound(self) -> bool:
        """Whether the optimizer step, not the backward, is the larger term of `bound_bytes`."""
        return self.optimizer_bytes > self.activation_bytes + self.transient_bytes


@dataclass
class SolverInfo:
    """How the solve went. status: one of SOLVER_STATUSES ("optimal" only when proven); objective, gap and
    bound (a proven lower bound on the objective, seconds) are None when unknown (a NaN is written as
    null); method: e.g. "flat", "priced" or "two_level"; message: why the answer is not proven optimal
    (the gap, or which limit stopped the solver), empty otherwise. Every field but `seconds` is a
    function of the solver's inputs (its limits are counted in work) unless the message says a time
    limit stopped it."""

    name: str
    status: str
    objective: float | None
    gap: float | None
    seconds: float
    method: str
    bound: float | None = None
    message: str = ""


@dataclass
class PlanOptions:
    """The settings the plan was made with. device: the device kind the costs assume ("cuda" or "cpu");
    schemes: the schemes the heavy ops were restricted to, None when every scheme was allowed; inputs: how
    the caller passes inputs and receives outputs (one of INPUT_MODES; `apply_plan` runs it that way), which
    the memory model prices: "full" gathers every output whole on every rank (e.g. a language model's
    logits), "sharded" leaves each rank its block of the batch; optimizer: the torch AdamW implementation
    whose step temporaries were priced (`cost_models.optimizer.OPTIMIZER_IMPLS`; `optimizer_kwargs` builds
    it), None in plans written before they were counted."""

    bytes_per_param: int
    device: str
    checkpointing: bool
    schemes: list[str] | None
    inputs: str = "full"  # absent in plans written before it existed, which were priced for "full"
    optimizer: str | None = None


@dataclass
class Plan:
    """A complete plan; `world_size` is derived from the mesh. See the module docstring."""

    model: ModelInfo
    mesh: Mesh
    budget_bytes: int
    hardware: dict[str, Any]
    assignments: list[Assignment]
    redistributions: list[Redistribution]
    checkpoint: list[str]
    predicted: Predicted
    solver: SolverInfo
    options: PlanOptions
    schema_version: int = SCHEMA_VERSION

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    @property
    def feasible(self) -> bool:
        """Whether the plan fits its budget: the predicted bound (everything alive together) is within it.
        Derived, never stored apart from what it is derived from; the plan file writes it for readers."""
        return self.predicted.bound_bytes <= self.budget_bytes

    # --- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON data (dicts, lists, numbers, strings), without checking it."""
        data = to_data(self, Plan, "")
        data["world_size"] = self.world_size
        data["feasible"] = self.feasible
        return data

    def to_json(self) -> str:
        """Deterministic JSON text; raises PlanError if the plan would not load back."""
        data = self.to_dict()
        Plan.from_dict(data)
        return format_json(data) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Build and check a plan from JSON data; raises PlanError naming the first bad field."""
        if not isinstance(data, dict):
            raise PlanError(f"a plan is a JSON object, got {describe(data)}; is this a plan file?")
        _check_version(data)
        mesh = read_mesh(data.get("mesh"), "mesh") if "mesh" in data else None
        body = {k: v for k, v in data.items() if k not in ("world_size", "feasible")}
        for key in ("world_size", "feasible"):
            if key not in data:
                raise PlanError(f"missing key {key!r} at the top level; {REPLAN}")
        plan = JsonReader(mesh).dataclass(Plan, body, "")
        world = data["world_size"]
        if not isinstance(world, int) or isinstance(world, bool) or world != plan.world_size:
            raise PlanError(f"world_size: {world!r} does not match the mesh {plan.mesh} "
                            f"({plan.world_size} ranks); {REPLAN}")
        _check_plan(plan)
        if not isinstance(data["feasible"], bool):
            raise PlanError(f"feasible: expected true or false, got {describe(data['feasible'])}; {REPLAN}")
        if data["feasible"] is not plan.feasible:
            raise PlanError(f"feasible: {data['feasible']!r} does not match the plan (predicted bound "
                            f"{plan.predicted.bound_bytes} B against budget_bytes {plan.budget_bytes} B); {REPLAN}")
        return plan

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Parse plan JSON text (json.loads only: nothing in the file is executed)."""
        def reject(constant: str) -> None:
            raise PlanError(f"the JSON holds {constant}, which is not a number a plan may contain; {REPLAN}")
        try:
            data = json.loads(text, parse_constant=reject)
        except json.JSONDecodeError as e:
            raise PlanError(f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}): the file is "
                            f"truncated or is not a plan; {REPLAN}") from None
        except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
            raise PlanError(f"the JSON holds a number too long to be in a plan ({one_line(e)}); {REPLAN}") from None
        except RecursionError:
            raise PlanError(f"the JSON is nested too deeply to be a plan; {REPLAN}") from None
        return cls.from_dict(data)

    # --- files ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan atomically (`cost_models.files.write_atomic`): an existing file at `path` is left
        as it was if anything fails; a path that is not a regular file (a device, a FIFO) is refused
        (OutputFileError); a symbolic link is followed."""
        write_atomic(path, self.to_json(), "the plan")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read and check a plan file; raises PlanError (with the path) for anything wrong with it."""
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_PLAN_BYTES + 1)  # bounded: `planner explain /dev/zero` must not read forever
        except OSError as e:
            raise PlanError(f"cannot read plan file {str(path)!r}: {e.strerror or e}") from None
        if len(raw) > MAX_PLAN_BYTES:
            raise PlanError(f"{path}: more than {MAX_PLAN_BYTES // 2**20} MiB, larger than any plan (a 96-layer model's "
                            "is a few MiB); is this a plan written by `planner plan`?")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"{path}: not a text file; is this a plan written by `planner plan`?") from None
        try:
            return cls.from_json(text)
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None


def _check_version(data: dict[str, Any]) -> None:
    version = data.get("schema_version")
    if version is None:
        raise PlanError("missing key 'schema_version': this is not a plan written by `planner plan`")
    if not isinstance(version, int) or isinstance(version, bool):
        raise PlanError(f"schema_version: expected an integer, got {describe(version)}; {REPLAN}")
    if version > SCHEMA_VERSION:
        raise PlanError(f"schema_version {version}: this plan was made by a newer planner (this one reads "
                        f"version {SCHEMA_VERSION}); upgrade planner to read it")
    if version < SCHEMA_VERSION:
        raise PlanError(f"schema_version {version}: this plan was made by an older planner (this one reads "
                        f"version {SCHEMA_VERSION}); re-plan with `planner plan`")


def _check_shape(shape: list[int], path: str) -> None:
    """A tensor shape a plan may hold: at most MAX_DIMS dims of at most MAX_DIM_SIZE each, at most
    MAX_NUMEL elements in all (far beyond any real tensor; an edited file cannot make the runtime build one)."""
    if len(shape) > MAX_DIMS:
        raise PlanError(f"{path}: {len(shape)} dims; a plan's tensors have at most {MAX_DIMS}; {REPLAN}")
    numel = 1
    for k, size in enumerate(shape):
        if size > MAX_DIM_SIZE:
            raise PlanError(f"{path}[{k}]: {size} is larger than any tensor dim (at most "
                            f"2**{MAX_DIM_SIZE.bit_length() - 1}); {REPLAN}")
        numel *= size
    if numel > MAX_NUMEL:
        raise PlanError(f"{path}: {shape} has more elements than any tensor (at most "
                        f"2**{MAX_NUMEL.bit_length() - 1}); {REPLAN}")


def _check_plan(plan: Plan) -> None:
    """Checks that span fields: names that must exist, the peak identity, layouts that fit shapes; and
    the closed vocabularies (dtype names, schemes, statuses) and bounded shapes of every field that reaches
    torch (nothing in a plan is looked up by name on a module)."""
    for i, inp in enumerate(plan.model.inputs):
        if inp.dtype not in DTYPE_BYTES:
            raise PlanError(f"model.inputs[{i}].dtype: {inp.dtype!r} is not a tensor dtype a plan may name (one of "
                            f"{', '.join(DTYPE_BYTES)}); {REPLAN}")
        _check_shape(inp.shape, f"model.inputs[{i}].shape")
        if not inp.name.isidentifier():
            raise PlanError(f"model.inputs[{i}].name: {inp.name!r} is not an argument name; {REPLAN}")
    for i, r in enumerate(plan.redistributions):
        _check_shape(r.shape, f"redistributions[{i}].shape")
    nodes: set[str] = set()
    for i, a in enumerate(plan.assignments):
        if a.scheme not in SCHEMES:
            raise PlanError(f"assignments[{i}].scheme: unknown scheme {a.scheme!r} (known: {', '.join(SCHEMES)});"
                            f" {REPLAN} with this planner")
        if a.node in nodes:
            raise PlanError(f"assignments[{i}].node: node {a.node!r} is assigned twice; {REPLAN}")
        nodes.add(a.node)
    for i, op in enumerate(plan.predicted.per_op):
        if op.node not in nodes:
            raise PlanError(f"predicted.per_op[{i}].node: {op.node!r} has no assignment; {REPLAN}")
        if op.scheme not in SCHEMES:
            raise PlanError(f"predicted.per_op[{i}].scheme: unknown scheme {op.scheme!r}; {REPLAN}")
    blocks = {a.block for a in plan.assignments if a.block is not None}
    for i, b in enumerate(plan.checkpoint):
        if b not in blocks:
            raise PlanError(f"checkpoint[{i}]: block {b!r} holds no planned op; {REPLAN}")
    for i, r in enumerate(plan.redistributions):
        for key in ("src_layout", "dst_layout"):
            try:
                getattr(r, key).local_shape(r.shape, plan.mesh)
            except LayoutError as e:
                raise PlanError(f"redistributions[{i}].{key}: {e}; {REPLAN}") from None
    for i, s in enumerate(plan.options.schemes or []):
        if s not in _OPTION_SCHEMES:
            raise PlanError(f"options.schemes[{i}]: unknown scheme {s!r} (known: {', '.join(_OPTION_SCHEMES)})")
    if plan.options.device not in DEVICE_KINDS:
        raise PlanError(f"options.device: {plan.options.device!r} is not one of {', '.join(DEVICE_KINDS)}")
    if plan.options.inputs not in INPUT_MODES:
        raise PlanError(f"options.inputs: {plan.options.inputs!r} is not one of {', '.join(INPUT_MODES)}")
    if plan.options.optimizer is not None and plan.options.optimizer not in OPTIMIZER_IMPLS:
        raise PlanError(f"options.optimizer: {plan.options.optimizer!r} is not one of {', '.join(OPTIMIZER_IMPLS)}")
    if plan.options.bytes_per_param <= 0:
        raise PlanError("options.bytes_per_param: must be positive (16 for fp32 Adam, 18 for bf16 mixed)")
    if plan.solver.status not in SOLVER_STATUSES:
        raise PlanError(f"solver.status: {plan.solver.status!r} is not one of {', '.join(SOLVER_STATUSES)}")
    if plan.budget_bytes < 1:
        raise PlanError("budget_bytes: must be at least 1 byte")
    p = plan.predicted
    if p.peak_memory_bytes != p.bound_bytes - p.released_bytes:
        raise PlanError(f"predicted.peak_memory_bytes: {p.peak_memory_bytes} is not model_state_bytes + "
                        f"max(activation_bytes + transient_bytes, optimizer_bytes) - released_bytes = "
                        f"{p.model_state_bytes} + max({p.activation_bytes} + {p.transient_bytes}, {p.optimizer_bytes})"
                        f" - {p.released_bytes}; {REPLAN}")
