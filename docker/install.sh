#!/bin/sh
# The container images' install steps (Dockerfile and Dockerfile.cpu run exactly this): gpen-tune from a source
# tree with its serve extra, and the offline MTCNN face detector, into the Python environment of $PYTHON.
#
#   PYTHON=/opt/venv/bin/python sh docker/install.sh [SOURCE_DIR]      (default SOURCE_DIR: the current folder)
#
# torch is installed first unless the environment has it already; TORCH_INDEX_URL, when set, is the wheel index
# it comes from (the CPU image: https://download.pytorch.org/whl/cpu, a build without the CUDA libraries).
set -eu
SRC=${1:-.}
PY=${PYTHON:-python3}
PIP="$PY -m pip install --no-cache-dir"

if "$PY" -c "import torch" 2>/dev/null; then
    echo "== torch $("$PY" -c 'import torch; print(torch.__version__)'): already installed"
else
    echo "== torch and torchvision${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
    # shellcheck disable=SC2086  # $PIP is a command line
    $PIP ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch>=2.4,<2.15" "torchvision>=0.19,<0.30"
fi

echo "== gpen-tune with the serve extra (FastAPI, uvicorn, prometheus-client, python-multipart) from $SRC"
# shellcheck disable=SC2086
$PIP "$SRC[serve]"

# facenet-pytorch ships the MTCNN weights that make detection work offline; its metadata pins an old torch
# although the code runs on current torch, hence --no-deps (as scripts/setup.sh)
echo "== facenet-pytorch 2.6.0 (--no-deps): the offline MTCNN face detector"
# shellcheck disable=SC2086
$PIP --no-deps "facenet-pytorch==2.6.0"

"$PY" -c "import fastapi, uvicorn, prometheus_client, multipart, gpen_tune.serve.app; print('gpen-tune serve installed')"
