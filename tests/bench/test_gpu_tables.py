"""benchmarks/gpu_tables.sh: every part its header lists is a part it runs, and each runs its commands dry
(PYTHON=echo) without a GPU, so that a GPU call is not spent on a typo."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_tables.sh"


def listed_parts() -> list[str]:
    header = SCRIPT.read_text().split("# Parts:", 1)[1].split("\nset ", 1)[0]
    return re.findall(r"^#   ([a-z0-9-]+)", header, flags=re.M)


def run_parts() -> list[str]:
    body = SCRIPT.read_text().split('case "$PART" in', 1)[1]
    return re.findall(r"^  ([a-z0-9-]+)\)", body, flags=re.M)


def test_the_header_lists_every_part_it_runs():
    listed, run = listed_parts(), run_parts()
    assert sorted(listed) == sorted(run) and len(set(listed)) == len(listed)
    assert {"serve", "targets", "serve-contention"} <= set(listed_parts())


@pytest.mark.parametrize("part", listed_parts())
def test_each_part_runs_dry(part, tmp_path):
    if part == "serve-profile" and shutil.which("py-spy") is None:
        pytest.skip("serve-profile needs py-spy on PATH")
    env = dict(os.environ, PYTHON="echo", OUT=str(tmp_path), BASE=str(ROOT))
    done = subprocess.run(["bash", str(SCRIPT), part], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    assert commands and all("benchmarks/" in c or "gpen_tune" in c for c in commands)


def test_an_unknown_part_is_refused(tmp_path):
    env = dict(os.environ, PYTHON="echo", OUT=str(tmp_path))
    done = subprocess.run(["bash", str(SCRIPT), "no-such-part"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "unknown part" in done.stderr
