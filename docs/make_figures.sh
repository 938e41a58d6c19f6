#!/usr/bin/env bash
# Regenerate the README's example pictures and table with the project's own commands:
#   docs/img/frontier.png, docs/img/frontier.csv   `planner frontier` (a budget sweep against uniform schemes)
#   docs/img/explain.txt                           `planner plan` at one budget, then `planner explain`
# Run from anywhere inside the project's virtual environment (`planner` on PATH). Takes several minutes on
# 2 CPU cores: the frontier plans gpt-tiny at 10 budgets for the planner and for 12 baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/img
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

planner frontier gpt-tiny --world-size 8 --out-prefix docs/img/frontier
planner plan gpt-tiny --world-size 8 --budget 600KiB --out "$work/plan.json"
planner explain "$work/plan.json" > docs/img/explain.txt
echo "wrote docs/img/frontier.png, docs/img/frontier.csv and docs/img/explain.txt"
