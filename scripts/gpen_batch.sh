#!/bin/sh
# gpen_batch.sh - restore every image of a folder with a (patched) upstream GPEN checkout's demo.py.
#
#   scripts/gpen_batch.sh INPUT_DIR OUTPUT_DIR [extra demo.py flags...]
#
# Environment (all optional):
#   GPEN_DIR      the checkout holding demo.py (default: current directory)
#   PYTHON        interpreter (default: python3)
#   GPEN_MODEL    --model (default GPEN-BFR-512); GPEN_SIZE --in_size (default 512)
#   GPEN_DEVICE   cuda (default, adds --use_cuda) or cpu
#   GPEN_TUNE_LAZY_DETECTOR=1|release  GPEN_TUNE_COMPILE=1|MODE  GPEN_TUNE_AMP=bf16|fp16  GPEN_TUNE_OPS=torch
#   GPEN_TUNE_CHECKPOINT=1  GPEN_TUNE_FACE_CROP=1  GPEN_TUNE_DET_SIZE=N  GPEN_TUNE_CUDA_GRAPH=1
#       the gpen-tune switches, read by the patched checkout (run scripts/gpen_optimize.sh once first)
#
# One demo.py process for the whole folder, so models load once (and compile once). Prints the switches in
# effect, the image count and the elapsed time; exits non-zero if demo.py fails or writes no output.
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: gpen_batch.sh INPUT_DIR OUTPUT_DIR [extra demo.py flags...]" >&2
    exit 2
fi
indir=$1
outdir=$2
shift 2

gpen=${GPEN_DIR:-.}
python=${PYTHON:-python3}
model=${GPEN_MODEL:-GPEN-BFR-512}
size=${GPEN_SIZE:-512}
device=${GPEN_DEVICE:-cuda}

if [ ! -f "$gpen/demo.py" ]; then
    echo "gpen_batch.sh: $gpen/demo.py not found; set GPEN_DIR to your GPEN checkout" >&2
    exit 2
fi
if [ ! -d "$indir" ]; then
    echo "gpen_batch.sh: input folder $indir not found" >&2
    exit 2
fi
if ! grep -q gpen_tune_runtime "$gpen/demo.py"; then
    echo "gpen_batch.sh: note: $gpen is not patched (run scripts/gpen_optimize.sh); GPEN_TUNE_* will be ignored" >&2
fi

count=$(find "$indir" -maxdepth 1 -type f \( -name '*.png' -o -name '*.jpg' -o -name '*.jpeg' \) | wc -l | tr -d ' ')
if [ "$count" -eq 0 ]; then
    echo "gpen_batch.sh: no .png/.jpg/.jpeg files in $indir" >&2
    exit 2
fi
mkdir -p "$outdir"

# absolute paths: demo.py runs from the checkout (it loads weights/ relative to it)
indir_abs=$(cd "$indir" && pwd)
outdir_abs=$(cd "$outdir" && pwd)

switches=$(env | grep '^GPEN_TUNE_' | sort | tr '\n' ' ' || true)
echo "gpen_batch.sh: $count images from $indir_abs -> $outdir_abs"
echo "gpen_batch.sh: model $model ($size px) on $device; switches: ${switches:-none}"

set -- --model "$model" --in_size "$size" --indir "$indir_abs" --outdir "$outdir_abs" "$@"
if [ "$device" = "cuda" ]; then
    set -- --use_cuda "$@"
fi

start=$(date +%s)
(cd "$gpen" && "$python" demo.py "$@")
end=$(date +%s)

written=$(find "$outdir_abs" -maxdepth 1 -type f -name '*_GPEN*' | wc -l | tr -d ' ')
echo "gpen_batch.sh: wrote $written restored images in $((end - start)) s"
if [ "$written" -eq 0 ]; then
    echo "gpen_batch.sh: demo.py wrote no output" >&2
    exit 1
fi
