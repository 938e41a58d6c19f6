"""Make the repository root importable (`planner`, `cost_models`, `layers3d`) when pytest is run as `pytest`
rather than `python -m pytest` (the project is used from a checkout, not installed), and this folder's
shared helpers (`distributed`, `apply_checks`, `zoo`, ...) importable from the tests in its sub-folders,
which mirror the packages (tests/test_cost_models, tests/test_layers3d, tests/test_planner/<stage>; named so
that no folder shadows the package it tests when tests/ is on sys.path)."""

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent)
ROOT = str(Path(__file__).resolve().parents[1])
for path in (TESTS, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)


import os  # noqa: E402

import pytest  # noqa: E402

# Test worker processes for `-n auto` (pytest-xdist): one per core, at most 4, since a distributed test
# forks 8 ranks of its own and a worker each could oversubscribe a small machine many times over.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The cores this process may run on (its affinity, which a container's cpuset limits; the machine's
    count elsewhere), at most MAX_WORKERS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


@pytest.fixture
def full_enumeration(monkeypatch):
    """Enumerate every axis assignment (no symmetry reduction) for the duration of a test."""
    from cost_models.strategies import base, clear_caches

    monkeypatch.setattr(base, "REDUCE_SYMMETRY", False)
    clear_caches()
    yield
    monkeypatch.undo()
    clear_caches()
