"""scripts/gpen_optimize.sh and scripts/gpen_batch.sh: POSIX sh (dash) with set -eu, on the fixture checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

sys.path.insert(0, str(Path(__file__).parent))
from op_build import skip_unless_checkout_imports  # noqa: E402
from test_patch_engine import copy_checkout  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [REPO / "scripts" / "gpen_optimize.sh", REPO / "scripts" / "gpen_batch.sh"]
SHELL = shutil.which("dash") or "/bin/sh"

# `gpen-tune` as the scripts would call it (mounted under a parent so apply-patches stays a sub-command)
TOOL = f"""#!/bin/sh
PYTHONPATH={REPO} exec {sys.executable} -c '
import sys, typer
from gpen_tune.cli import app
parent = typer.Typer()
parent.add_typer(app, name="gpen-tune")
parent(["gpen-tune"] + sys.argv[1:], prog_name="gpen-tune")
' "$@"
"""

WEIGHTS = r"""
import json, os, sys
sys.path.insert(0, '.')
import __init_paths
import torch
from gpen_model import FullGenerator
torch.manual_seed(0)
os.makedirs('weights', exist_ok=True)
torch.save(FullGenerator(64, 512, 8, 1, narrow=0.125).state_dict(), 'weights/tiny-gpen.pth')
face = {'box': [0.35, 0.12, 0.52, 0.34], 'score': 0.99,
        'landmarks': [[0.40, 0.21], [0.48, 0.21], [0.44, 0.25], [0.41, 0.29], [0.47, 0.29]]}
json.dump({'faces': [face]}, open('weights/RetinaFace-R50.json', 'w'))
json.dump({'radius': 0.3}, open('weights/ParseNet-latest.json', 'w'))
"""


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_as_posix_sh(script):
    assert script.read_text().splitlines()[0] == "#!/bin/sh"
    assert "set -eu" in script.read_text()
    for shell in {"/bin/sh", SHELL}:
        assert subprocess.run([shell, "-n", str(script)]).returncode == 0


def sh(script: Path, *args: str, env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([SHELL, str(script), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_optimize_is_safe_to_rerun_and_batch_runs_the_patched_demo(tmp_path):
    skip_unless_checkout_imports()
    checkout = copy_checkout("fixture", tmp_path / "GPEN")
    tool = tmp_path / "gpen-tune"
    tool.write_text(TOOL)
    tool.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "GPEN_TUNE": str(tool), "HOME": str(tmp_path)}

    first = sh(SCRIPTS[0], str(checkout), "face-crop,lazy-detector", env=env)
    assert first.returncode == 0, first.stderr
    assert "applying face-crop,lazy-detector" in first.stdout and "applied lazy-detector, face-crop" in first.stdout
    again = sh(SCRIPTS[0], str(checkout), "face-crop,lazy-detector", env=env)
    assert again.returncode == 0 and "already applied" in again.stdout
    assert sh(SCRIPTS[0], str(tmp_path), env=env).returncode == 2           # not a checkout: clear refusal

    assert subprocess.run([sys.executable, "-c", WEIGHTS], cwd=checkout).returncode == 0
    indir, outdir = tmp_path / "in", tmp_path / "out"
    indir.mkdir()
    cv2.imwrite(str(indir / "astronaut.png"), np.ascontiguousarray(data.astronaut()[:, :, ::-1]))
    cv2.imwrite(str(indir / "astronaut_small.jpg"), np.ascontiguousarray(data.astronaut()[::2, ::2, ::-1]))
    batch_env = {**env, "GPEN_DIR": str(checkout), "PYTHON": sys.executable, "GPEN_MODEL": "tiny-gpen",
                 "GPEN_SIZE": "64", "GPEN_DEVICE": "cpu", "GPEN_TUNE_FACE_CROP": "1", "GPEN_TUNE_DET_SIZE": "256",
                 "GPEN_TUNE_LAZY_DETECTOR": "release"}
    run = sh(SCRIPTS[1], str(indir), str(outdir), env=batch_env)
    assert run.returncode == 0, run.stderr
    assert "2 images" in run.stdout and "GPEN_TUNE_FACE_CROP=1" in run.stdout and "wrote 2 restored" in run.stdout
    assert sorted(p.name for p in outdir.iterdir()) == ["astronaut_GPEN.png", "astronaut_small_GPEN.png"]
    assert sh(SCRIPTS[1], str(tmp_path / "missing"), str(outdir), env=batch_env).returncode == 2
    assert sh(SCRIPTS[1], env=batch_env).returncode == 2
