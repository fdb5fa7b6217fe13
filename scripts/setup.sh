#!/bin/sh
# Set up gpen-tune in ./.venv (created if missing): torch, the package and its offline face detector.
# Safe to re-run (what is installed already is kept). Prints each step, pip's progress, and at the end how long
# it took and how large .venv is.
# Usage: sh scripts/setup.sh [--dev]      (--dev adds pytest (+ xdist), ruff and the optional extras the tests cover: Ray
#                                          for --ray, spandrel for --bg-upsampler, onnx + onnxruntime for export
#                                          and --backend onnxruntime, the serve extra (FastAPI, uvicorn,
#                                          prometheus-client, python-multipart) with httpx and selenium for its
#                                          tests; the versions the golden outputs were made with:
#                                          tests/constraints.txt; and, with apt-get as root, Debian's chromium and
#                                          chromium-driver for the web page's test, installed only when missing)
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)
step() { printf '\n==> %s\n' "$*"; }

if [ ! -x .venv/bin/python ]; then
    step "creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv .venv
else
    step "using the existing .venv ($(.venv/bin/python --version 2>&1))"
fi
PIP=".venv/bin/python -m pip"
extras=""
with_dev=""
pins=""
if [ "${1:-}" = "--dev" ]; then
    extras="[dev,ray,upscale,onnx,serve]"
    with_dev=", with pytest (+ xdist), ruff, Ray, spandrel, onnx and onnxruntime, the serve extra (OpenCV pinned to the goldens' version: tests/constraints.txt)"
    pins="-c tests/constraints.txt"
fi

# torch first, in the range the package accepts (pip picks the build for this platform)
step "1/3 torch and torchvision: the largest part (a few GB with CUDA libraries on Linux)"
$PIP install --progress-bar on "torch>=2.4,<2.15" "torchvision>=0.19,<0.30"

step "2/3 gpen-tune (editable) and its dependencies${with_dev}: opencv, pillow, facexlib, scikit-image, matplotlib, typer, rich, libcst"
# shellcheck disable=SC2086  # $pins is empty or two words
$PIP install --progress-bar on -e ".${extras}" $pins

# facenet-pytorch ships the MTCNN weights (MIT) that make detection work offline; its metadata pins
# torch<2.3 although the code runs on current torch, hence --no-deps (its real needs are installed above).
step "3/3 facenet-pytorch 2.6.0 (--no-deps): the offline MTCNN face detector, its weights inside the wheel"
$PIP install --progress-bar on --no-deps "facenet-pytorch==2.6.0"

if [ "${1:-}" = "--dev" ]; then
    # the web page's test drives a real headless Chromium; Debian's packages, installed once (as root, with apt)
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        step "chromium and chromium-driver: already installed"
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        step "chromium and chromium-driver (Debian packages) for the web page's test"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
    else
        step "chromium / chromium-driver missing and not installable here (needs root and apt-get): the web page's test will be skipped"
    fi
fi

step "check"
.venv/bin/python -c "import gpen_tune, torch; print(f'gpen-tune {gpen_tune.__version__} ready (torch {torch.__version__})')"
elapsed=$(( $(date +%s) - start ))
size=$(du -sh .venv | cut -f1)
printf 'setup took %d min %02d s; .venv is %s\n' $((elapsed / 60)) $((elapsed % 60)) "$size"
