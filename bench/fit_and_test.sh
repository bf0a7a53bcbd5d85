#!/bin/bash
# One configuration, measured as docs/RESULTS.md's IMDB table is: `train.py fit` on one core (time and the peak
# resident memory of the training process), then its best-validation checkpoint scored once on the test split.
#
#   bash bench/fit_and_test.sh runs/imdb/local --config configs/imdb.yaml --config configs/imdb_local.yaml
#   bash bench/fit_and_test.sh runs/imdb/local-s1 --config configs/imdb.yaml --config configs/imdb_local.yaml \
#       --seed_everything 1
#
# Prints FIT_SECONDS, PEAK_RSS_MIB, the run's best checkpoint and test/acc. Threads: OMP_NUM_THREADS (default 1).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n 2,10p "$0"; exit 2; fi
root=$1; shift
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -d ../shared/data ] && export ATTENTION_DATA_ROOT=${ATTENTION_DATA_ROOT:-$(cd ../shared/data && pwd)}
echo "START $(date -Is) $root: train.py fit $*"
"$PY" - "$PY" train.py fit "$@" --trainer.default_root_dir "$root" --trainer.enable_progress_bar false <<'PYTHON'
import resource, subprocess, sys, time
start = time.time()
code = subprocess.call(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"FIT_SECONDS {time.time() - start:.0f}\nPEAK_RSS_MIB {peak:.0f}", flush=True)
sys.exit(code)
PYTHON
version=$(ls -d "$root"/lightning_logs/version_* | sort -V | tail -1)
best=$("$PY" -m bench.common best-checkpoint "$version")  # by the val/acc recorded inside each file
echo "BEST $best"
"$PY" train.py test --config "$version/config.yaml" --ckpt_path "$best" --trainer.enable_progress_bar false \
    --trainer.logger false 2>&1 | grep -E "test/acc|error"
