"""The test run itself: pytest-timeout is installed, configured and stops a hung test (a hang fails CI
instead of blocking it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HANGING = '''
import time

import pytest


@pytest.mark.timeout(2)
def test_hangs():
    time.sleep(120)
'''


def test_pytest_timeout_is_configured(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.hasplugin("timeout")
    assert float(request.config.getini("timeout")) == 300  # pyproject.toml: every test, unless it says more


def test_a_hung_test_is_stopped_by_the_timeout(tmp_path: Path) -> None:
    (tmp_path / "test_hang.py").write_text(HANGING)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_hang.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout" in done.stdout and "1 failed" in done.stdout
