# gpen-tune serve on an NVIDIA GPU. Build: docker build -t gpen-tune-serve .   Run: see README ("Serving").
# Weights come from the /weights volume (GPEN_TUNE_HOME: registry names resolve there), jobs live in /spool, and the
# GPU kernels compiled on a first run (Triton, Inductor, the driver's PTX cache) in /cache: kept, a new container
# starts like a second run (one photo on an H100: 9.0-9.2 s first-ever, 5.2-5.3 s with the caches warm;
# benchmarks/results/20261206-184743_doors_ab_NVIDIA-H100-80GB-HBM3_startup.json).
ARG BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
FROM ${BASE}

ARG TORCH_INDEX_URL=
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv python3-pip libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 gpen \
    && mkdir -p /weights /spool /cache && chown gpen:gpen /weights /spool /cache

COPY . /opt/gpen-tune/src
RUN python3 -m venv /opt/venv \
    && PYTHON=/opt/venv/bin/python TORCH_INDEX_URL="${TORCH_INDEX_URL}" sh /opt/gpen-tune/src/docker/install.sh /opt/gpen-tune/src

ENV PATH=/opt/venv/bin:$PATH \
    GPEN_TUNE_HOME=/weights \
    TRITON_CACHE_DIR=/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/cache/inductor \
    CUDA_CACHE_PATH=/cache/nv \
    PYTHONUNBUFFERED=1
VOLUME ["/weights", "/spool", "/cache"]
USER gpen
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1
# listening on 0.0.0.0 needs a token: set GPEN_TUNE_TOKEN (or pass --no-auth behind a trusted proxy)
ENTRYPOINT ["gpen-tune", "serve", "--host", "0.0.0.0", "--port", "8000", "--spool", "/spool"]
CMD ["--weights", "GPEN-BFR-512", "--preset", "auto"]
