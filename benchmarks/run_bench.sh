#!/usr/bin/env bash
# The standard `gpen-tune bench` run on one CUDA GPU: GPEN-BFR-512 and GPEN-BFR-256, then --face-crop on vs off.
# Each model is one process that finishes within ~8 minutes (--max-minutes skips rows left after 6.5 min and says
# so in the results); run them as two separate commands if a command may only take 10 minutes:
#   benchmarks/run_bench.sh 512        benchmarks/run_bench.sh 256        benchmarks/run_bench.sh facecrop
# (no argument: all three). facecrop = --face-crop on vs off on a >= 12 MP photo (needs gpen_tune.face).
# Results: $OUT if set, else benchmarks/results: bench-<model>-<gpu>.{json,md,png}.
# Inputs: --inputs DIR if FACES_DIR is set, else the faces detected in the bundled photos (gpen_tune.face).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
DEST=${OUT:-benchmarks/results}
INPUTS=()
if [[ -n "${FACES_DIR:-}" ]]; then INPUTS=(--inputs "$FACES_DIR"); fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

run() {  # model, batch sizes
  "$PY" -m gpen_tune bench --model "$1" --device cuda --batch-sizes "$2" --repeats 10 --warmup 2 \
    --max-faces 16 --max-minutes 6.5 ${INPUTS[@]+"${INPUTS[@]}"} -o "$DEST"
}

case "${1:-all}" in
  512) run GPEN-BFR-512 1,4,16,32 ;;
  256) run GPEN-BFR-256 1,4,16,64 ;;
  facecrop) "$PY" benchmarks/face_crop_bench.py --device cuda --model GPEN-BFR-512 --repeats 3 --out "$DEST" ;;
  all) run GPEN-BFR-512 1,4,16,32; run GPEN-BFR-256 1,4,16,64
       "$PY" benchmarks/face_crop_bench.py --device cuda --model GPEN-BFR-512 --repeats 3 --out "$DEST" ;;
  *) echo "usage: $0 [512|256|facecrop|all]" >&2; exit 2 ;;
esac
