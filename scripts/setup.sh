#!/bin/sh
# Set up gpen-tune in ./.venv (created if missing): torch, the package and its offline face detector.
# Safe to re-run. Usage: sh scripts/setup.sh [--dev]      (--dev adds pytest and ruff)
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
# torch first, in the range the package accepts (pip picks the build for this platform)
$PIP install -q "torch>=2.4,<2.15" "torchvision>=0.19,<0.30"
$PIP install -q -e ".${extras}"
# facenet-pytorch ships the MTCNN weights (MIT) that make detection work offline; its metadata pins
# torch<2.3 although the code runs on current torch, hence --no-deps (its real needs are installed above).
$PIP install -q --no-deps "facenet-pytorch==2.6.0"
.venv/bin/python -c "import gpen_tune, torch; print(f'gpen-tune {gpen_tune.__version__} ready (torch {torch.__version__})')"
