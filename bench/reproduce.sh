#!/bin/bash
# One dataset's headline figure end to end, with its shipped recipe (bench/pretraining.py RECIPES): the pretraining
# or word-vector run if the recipe uses one (reused when one with the same data and settings is already in
# runs/pretraining), fine-tuning with the given seed, and the best-validation checkpoint scored once. The last line
# is `test_acc <float>` (`val_acc <float>` for SST-2, which has no labelled test split).
#
#   bash bench/reproduce.sh imdb 0                                   # seed 0
#   bash bench/reproduce.sh imdb 0 --trainer.max_epochs 1            # more train.py fit arguments after the seed
#
# Threads per run: OMP_NUM_THREADS (default 1). The runs use Lightning's accelerator "auto": the GPU where CUDA is
# present (the word vectors are made on the CPU, the same for the same seed and threads).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n 2,11p "$0"; exit 2; fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if ! "$PY" -c "import torch, lightning" 2>/dev/null; then
    echo "error: $PY cannot import torch and lightning: run \`make setup\` first (or set PYTHON to a Python that has them)" >&2
    exit 2
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -d ../shared/data ] && export ATTENTION_DATA_ROOT=${ATTENTION_DATA_ROOT:-$(cd ../shared/data && pwd)}
exec "$PY" -m bench.pretraining --reproduce "$1" --seed "${2:-0}" --threads "$OMP_NUM_THREADS" -- "${@:3}"
