"""Every file the package writes goes through `cost_models.files.write_atomic`: an existing path that is not
a regular file (a character device, a FIFO, a folder) is refused with one error line and left as it was;
a symbolic link is followed (the file it points to is written) and stays a link (README, Troubleshooting)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from plan_examples import make_plan

from cost_models.errors import PlannerError
from cost_models.files import OutputFileError, write_atomic
from cost_models.hardware import load_profile
from planner.cli.app import main
from planner.cli.frontier import Curve, plot_frontier, write_csv
from planner.plans.format import Plan


def _char_device(path: Path) -> Path:
    """A character device node with /dev/null's numbers (1, 3), or skip where mknod is not allowed."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot create a device node here: {e}")
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_plan_out_onto_a_character_device_is_refused_and_the_device_kept(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    dev = _char_device(tmp_path / "null")
    before = os.stat(dev)
    code = main(["plan", "mlp", "--budget", "1GiB", "--world-size", "2", "--out", str(dev)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: refusing to write the plan to") and "a character device" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    after = os.stat(dev)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def test_plan_save_refuses_a_fifo_and_a_folder(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "pipe")
    with pytest.raises(OutputFileError, match="a FIFO"):
        make_plan().save(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    (tmp_path / "dir").mkdir()
    with pytest.raises(OutputFileError, match="a folder") as info:
        make_plan().save(tmp_path / "dir")
    assert isinstance(info.value, PlannerError) and isinstance(info.value, ValueError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "pipe"]  # no temporary file left behind


def test_a_symbolic_link_is_followed_and_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real" / "plan.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    plan = make_plan()
    plan.save(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert Plan.load(real).to_json() == plan.to_json()
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "real" / "new.json")
    plan.save(dangling)
    assert dangling.is_symlink() and (tmp_path / "real" / "new.json").read_text() == plan.to_json()


def test_a_link_to_a_fifo_is_refused_naming_both(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "pipe")
    link = tmp_path / "out.json"
    link.symlink_to(fifo)
    with pytest.raises(OutputFileError, match="points to") as info:
        write_atomic(link, "x", "the plan")
    assert str(fifo) in str(info.value) and link.is_symlink() and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_profiles_csv_and_png_are_refused_on_a_fifo(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "pipe")
    with pytest.raises(OutputFileError, match="hardware profile"):
        load_profile("a100-80gb").save(fifo)
    curve = Curve("planner", [(2**30, make_plan())])
    with pytest.raises(OutputFileError, match="frontier CSV"):
        write_csv(str(fifo), [curve])
    with pytest.raises(OutputFileError, match="frontier plot"):
        plot_frontier(str(fifo), "t", curve, [])
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    write_csv(str(tmp_path / "f.csv"), [curve])  # regular files are written as before
    assert (tmp_path / "f.csv").read_text().startswith("series,budget_bytes")


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("x")
    path.chmod(0o600)
    write_atomic(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
