"""The reproductions of the reliability issue (round two), one test each: what a hostile user gives the
command line ends in one `error:` line (or a one-line warning and a correct result), never a traceback,
a hang or a silent wrong answer. The disagreeing ranks are in test_agree.py, device and FIFO outputs in
test_output_files.py, mutated plan files in test_plan_mutations.py, `explain`'s width in test_cli.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from plan_examples import make_plan

from cost_models.hardware import ProfileError, load_profile
from cost_models.mesh import MAX_WORLD_SIZE, MeshError, candidate_meshes, prime_factors
from planner.apply.rewrite import PlanMismatchError, check_inputs
from planner.cli.app import main
from planner.models import get_example
from planner.plans.format import InputInfo

MODELS = '''\
import sys
import torch


class Half(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x).float().pow(2).mean()


def half():
    return Half(), (torch.randn(8, 16, dtype=torch.float16),)


def no_loss():
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), (torch.randn(8, 16),)


def exits():
    sys.exit(3)
'''
EXITS_AT_IMPORT = "import sys\nsys.exit(3)\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "exit_at_import.py").write_text(EXITS_AT_IMPORT)
    path = folder / "models.py"
    path.write_text(MODELS)
    return path


def _run(argv: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def _one_error_line(err: str, *parts: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err


PLAN = ["--budget", "1GiB", "--world-size", "2"]


# --- 4. a plan for another model -----------------------------------------------------------------------
def test_a_plan_for_another_model_is_the_mismatch_error_naming_both() -> None:
    gpt = get_example("gpt-tiny")
    plan = make_plan()
    plan.model.name = "mlp"
    plan.model.inputs = [InputInfo("x", [32, 64], "float32"), InputInfo("targets", [32], "int64")]
    with pytest.raises(PlanMismatchError) as info:
        check_inputs(gpt.model, plan, gpt.example_inputs)
    text = str(info.value)
    assert "made for model 'mlp' with inputs x [32, 64] float32, targets [32] int64" in text
    assert "this model (GPT) takes (idx, targets), not x" in text and "capture" not in text
    plan.model.inputs = [InputInfo("idx", [4, 16], "int64"), InputInfo("targets", [8, 16], "int64")]
    with pytest.raises(PlanMismatchError, match=r"is called with idx \[8, 16\] int64, targets \[8, 16\] int64"):
        check_inputs(gpt.model, plan, gpt.example_inputs)  # the right names, another batch size
    plan.model.inputs = [InputInfo("idx", [8, 16], "int64"), InputInfo("targets", [8, 16], "int64")]
    check_inputs(gpt.model, plan, gpt.example_inputs)  # the model it was made for


# --- 5. world sizes without bound ----------------------------------------------------------------------
def test_a_huge_world_size_is_one_line_naming_the_bound(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", "mlp", "--budget", "1GiB", "--world-size", "4611686018427387904"], capfd)
    assert code == 2
    _one_error_line(err, "--world-size", f"at most {MAX_WORLD_SIZE}", "2**24")
    with pytest.raises(MeshError, match="more ranks than the planner supports"):
        candidate_meshes(MAX_WORLD_SIZE + 1)
    assert candidate_meshes(MAX_WORLD_SIZE)[-1].shape == (256, 256, 256)


def _meshes_by_search(n: int) -> list[tuple[int, ...]]:
    """The loop the factorisation replaced: the largest q with q**k dividing n, found by trying every q."""
    shapes = [(n,)]
    for dims in (2, 3):
        best = max((q for q in range(2, int(round(n ** (1 / dims))) + 2) if q**dims <= n and n % q**dims == 0),
                   default=None)
        if best is not None:
            rest = n // best**dims
            shape = ((rest,) if rest > 1 else ()) + (best,) * dims
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def test_mesh_enumeration_by_factorisation_equals_the_search() -> None:
    for n in list(range(1, 1200)) + [2**20, 3**12, 2**10 * 3**5, 7**3 * 11**2, 1_000_000]:
        assert [m.shape for m in candidate_meshes(n)] == _meshes_by_search(n), n
    for n in (1, 2, 97, 360, 2**23, 3 * 5 * 7 * 11 * 13 * 17):
        assert math.prod(p**e for p, e in prime_factors(n).items()) == n


# --- 6. the smaller points -----------------------------------------------------------------------------
def test_a_deeply_nested_profile_is_one_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ProfileError, match="nested too deeply"):
        load_profile(str(path))
    code, _, err = _run(["plan", "mlp", *PLAN, "--hardware", str(path)], capfd)
    assert code == 2
    _one_error_line(err, "nested too deeply")


def test_profile_numbers_below_any_device_are_refused(tmp_path: Path) -> None:
    data = load_profile("a100-80gb").to_json()
    for field, value, message in (("efficiency", 1e-300, "efficiency must be in"),
                                  ("mem_bandwidth", 1e-300, "below any device"),
                                  ("peak_flops", {"fp32": 1e-300}, "below any device")):
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps({**data, field: value}))
        with pytest.raises(ProfileError, match=message):
            load_profile(str(path))
    path = tmp_path / "long.json"
    path.write_text(json.dumps(data).replace('"gpus_per_node": 8', '"gpus_per_node": ' + "9" * 5000))
    with pytest.raises(ProfileError, match="number too long"):
        load_profile(str(path))


def test_a_model_calling_sys_exit_is_one_error(models: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", f"{models.parent / 'exit_at_import.py'}:f", *PLAN], capfd)
    assert code == 2  # not the model's 3 ("no plan fits"), and a message
    _one_error_line(err, "called sys.exit(3)", "__main__")
    code, _, err = _run(["plan", f"{models}:exits", *PLAN], capfd)
    assert code == 2
    _one_error_line(err, "called sys.exit(3)")


def test_explain_on_an_endless_file_is_one_error(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["explain", "/dev/zero"], capfd)
    assert code == 2
    _one_error_line(err, "/dev/zero", "larger than any plan")


def test_a_negative_budget_is_the_budget_message_not_a_usage_block(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", "mlp", "--budget", "-1GiB", "--world-size", "2"], capfd)
    assert code == 2
    _one_error_line(err, "invalid memory size '-1GiB'", "positive")
    assert "usage:" not in err


def test_an_input_dtype_other_than_the_parameters_is_a_warning(models: Path, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", f"{models}:half", *PLAN, "--out", str(tmp_path / "p.json")], capfd)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "input 'x' is float16 but the parameters of models:half are float32" in lines[0]


def test_a_model_without_a_loss_is_a_warning(models: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["plan", f"{models}:no_loss", *PLAN, "--out", str(tmp_path / "p.json")], capfd)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and "returns no loss" in lines[0] and "[8, 4] float32" in lines[0]
    code, _, err = _run(["plan", "mlp", *PLAN, "--out", str(tmp_path / "q.json")], capfd)
    assert code == 0 and "warning:" not in err  # a model that returns its loss: no warning


def test_inputs_renamed_by_tracing_still_match() -> None:
    """torch.fx names the input of `nn.Sequential.forward(input)` `input_1` and `*args` `args_0`: the plan's
    recorded names match those forwards (no false mismatch), and only another shape is refused."""
    import torch

    from planner.api import plan

    class VarArgs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return self.fc(args[0]).pow(2).mean()

    x = torch.randn(8, 16)
    for model in (torch.nn.Sequential(torch.nn.Linear(16, 16)), VarArgs()):
        with pytest.warns(UserWarning) if isinstance(model, torch.nn.Sequential) else _nothing():
            p = plan(model, "1GiB", world_size=2, example_inputs=(x,), workers=1)
        check_inputs(model, p, (x,))
        check_inputs(model, p)
        with pytest.raises(PlanMismatchError, match=r"\[4, 16\] float32"):
            check_inputs(model, p, (torch.randn(4, 16),))


def _nothing():
    import contextlib

    return contextlib.nullcontext()
