"""Where things are, for tests in any folder of tests/: the repository root and the test data."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
