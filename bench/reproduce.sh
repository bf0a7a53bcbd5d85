#!/bin/bash
# One dataset's headline figure end to end, with its shipped recipe (bench/pretraining.py RECIPES): pretraining if
# the recipe uses it (reused when a run with the same data and settings is already in runs/pretraining), fine-tuning
# with the given seed, and the best-validation checkpoint scored once. The last line is `test_acc <float>`
# (`val_acc <float>` for SST-2, which has no labelled test split).
#
#   bash bench/reproduce.sh chnsenticorp_htl 0
#
# Threads per run: OMP_NUM_THREADS (default 1). GPU users: add trainer flags to RECIPES, or run the two train.py
# commands of README "Pretraining on unlabeled text" with --trainer.accelerator gpu --trainer.precision bf16-mixed.
set -euo pipefail
if [ $# -lt 1 ]; then sed -n 2,10p "$0"; exit 2; fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -d ../shared/data ] && export ATTENTION_DATA_ROOT=${ATTENTION_DATA_ROOT:-$(cd ../shared/data && pwd)}
exec "$PY" -m bench.pretraining --reproduce "$1" --seed "${2:-0}" --threads "$OMP_NUM_THREADS"
