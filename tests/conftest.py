"""Make the repository root importable (`planner`, `cost_models`, `layers3d`) when pytest is run as `pytest`
rather than `python -m pytest`: the project is used from a checkout, not installed."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
