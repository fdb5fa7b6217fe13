#!/bin/sh
# Set everything up (./.venv, dev tools), lint, then the test suite in two tiers: the fast tier (-m "not slow")
# first, then the slow one (Triton's interpreter, torch.compile, child processes, big models), each spread over
# one worker process per core. CI runs exactly this. It changes ./.venv (said when it starts): it adds pytest,
# pytest-xdist, ruff, Ray, spandrel, onnx and onnxruntime, and installs the OpenCV release of tests/constraints.txt
# (which may replace, even downgrade, the one there).
#
#   sh scripts/test.sh                 # both tiers
#   sh scripts/test.sh --fast          # the fast tier only (--slow: the slow tier only)
#   sh scripts/test.sh tests/face      # both tiers, on these paths (a tier with no test there is fine)
set -eu
cd "$(dirname "$0")/.."
tiers="fast slow"
case "${1:-}" in
    --fast) tiers="fast"; shift ;;
    --slow) tiers="slow"; shift ;;
esac
narrowed=$#          # paths or -k given: a tier may legitimately select nothing
echo "== test.sh changes ./.venv: adds pytest, pytest-xdist, ruff, Ray, spandrel, onnx and onnxruntime, and installs" \
     "$(grep -v '^#' tests/constraints.txt | tr '\n' ' ')(tests/constraints.txt; it may replace the release there)"
sh scripts/setup.sh --dev
echo "== ruff"
.venv/bin/python -m ruff check .
for tier in $tiers; do
    if [ "$tier" = fast ]; then marker="not slow"; else marker="slow"; fi
    echo "== pytest, $tier tier (-m \"$marker\")"
    status=0
    # one worker process per core (pytest-xdist; idle workers take tests queued on busy ones), a line per file as
    # it finishes (tests/file_progress.py; skip and failure reasons: -ra in pyproject.toml), the slowest tests
    .venv/bin/python -m pytest -m "$marker" -n auto --dist worksteal -o console_output_style=classic \
        --durations=15 "$@" || status=$?
    if [ "$status" -eq 5 ] && [ "$narrowed" -gt 0 ]; then
        echo "== no $tier tests in the given selection"
    elif [ "$status" -ne 0 ]; then
        echo "== $tier tier failed (pytest exit $status)"
        exit "$status"
    fi
done
echo "== all tests passed"
