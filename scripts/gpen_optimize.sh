#!/bin/sh
# gpen_optimize.sh - patch an upstream GPEN checkout (yangxy/GPEN 2c73670) with gpen-tune, once, inside an image.
#
#   scripts/gpen_optimize.sh [GPEN_DIR] [PATCHES]
#
#   GPEN_DIR  the checkout holding demo.py (default: $GPEN_DIR, else the current directory)
#   PATCHES   comma list for --only (default: $GPEN_TUNE_PATCHES, else all six:
#             lazy-detector,compile,amp,checkpoint,face-crop,cuda-graph)
#
# Safe to re-run: a checkout that already has the patches is left as it is (apply-patches is idempotent).
# Nothing is switched on here; the patched demo.py behaves as upstream until you pass its new flags or set
# GPEN_TUNE_* variables (see scripts/gpen_batch.sh). Undo with: gpen-tune apply-patches GPEN_DIR --revert
# Environment: GPEN_TUNE (command to run gpen-tune, default: gpen-tune, else python3 -m gpen_tune).
set -eu

dir=${1:-${GPEN_DIR:-.}}
only=${2:-${GPEN_TUNE_PATCHES:-}}

if [ -n "${GPEN_TUNE:-}" ]; then
    tool=$GPEN_TUNE
elif command -v gpen-tune >/dev/null 2>&1; then
    tool=gpen-tune
else
    tool="python3 -m gpen_tune"
fi

if [ ! -f "$dir/demo.py" ] || [ ! -f "$dir/face_enhancement.py" ]; then
    echo "gpen_optimize.sh: $dir does not look like a GPEN checkout (no demo.py / face_enhancement.py);" \
         "pass its path as the first argument" >&2
    exit 2
fi

echo "gpen_optimize.sh: checkout $dir"
echo "gpen_optimize.sh: before:"
$tool apply-patches "$dir" --status

if [ -n "$only" ]; then
    echo "gpen_optimize.sh: applying $only"
    $tool apply-patches "$dir" --only "$only"
else
    echo "gpen_optimize.sh: applying all patches"
    $tool apply-patches "$dir"
fi

echo "gpen_optimize.sh: after:"
$tool apply-patches "$dir" --status
echo "gpen_optimize.sh: done. Switches are off until used, e.g.:"
echo "  cd $dir && python demo.py --use_cuda --lazy_detector --face_crop --amp bf16 --compile --indir IN --outdir OUT"
