#!/bin/sh
# Set everything up (./.venv, dev tools) and run the whole test suite: lint, then pytest. CI runs exactly this.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh --dev
.venv/bin/python -m ruff check .
.venv/bin/python -m pytest -q "$@"
