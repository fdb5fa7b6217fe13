"""The container images' install steps (docker/install.sh, what both Dockerfiles run) in a clean virtual
environment: afterwards `gpen-tune serve --help` works there and the web page's files are installed with the
package. Base images cannot be pulled here, so this is the part of the image build that is tested."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COPY_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                      ".ruff_cache", "gpen-serve-spool", "gpen-tune-demo", "out")


def local_cpu_torch() -> str | None:
    """A CPU torch wheel among pip's find-links, pinned so that pip takes it instead of the CUDA build (GBs)."""
    for folder in filter(None, os.environ.get("PIP_FIND_LINKS", "").split()):
        wheels = sorted(glob.glob(os.path.join(folder, f"torch-*+cpu-cp{sys.version_info.major}"
                                                       f"{sys.version_info.minor}-*.whl")))
        if wheels:
            return Path(wheels[-1]).name.split("-")[1]
    return None


@pytest.mark.slow
def test_install_script_in_a_clean_venv(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=COPY_IGNORED)
    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # torch: a local CPU wheel where pip's find-links has one, else the release this environment runs (pip's cache
    # then serves the download setup.sh made)
    import torch

    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"torch=={local_cpu_torch() or torch.__version__.split('+')[0]}\n")
    env["PIP_CONSTRAINT"] = str(constraints)
    env["PYTHON"] = str(venv / "bin" / "python")
    run = subprocess.run(["sh", str(src / "docker" / "install.sh"), str(src)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "gpen-tune serve installed" in run.stdout
    shutil.rmtree(src)                                      # what runs now is the installed package alone
    help_run = subprocess.run([str(venv / "bin" / "gpen-tune"), "serve", "--help"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    assert help_run.returncode == 0, help_run.stderr
    assert "--max-wait-ms" in help_run.stdout and "--token" in help_run.stdout
    page = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.resources as r, gpen_tune; "
                           "print(gpen_tune.__file__); print((r.files('gpen_tune.serve') / 'static' / "
                           "'index.html').is_file())"], env=env, cwd=tmp_path, capture_output=True, text=True)
    where, has_page = page.stdout.split()
    assert where.startswith(str(venv)) and has_page == "True", page.stderr


def test_compose_file_parses_and_gives_the_gpu_service_shared_memory():
    """compose.yaml is valid YAML (a `: ` inside an unquoted value is not) and the GPU service has room in /dev/shm
    for its request processes' faces (docker's default of 64 MiB holds ~80 faces of 512 px)."""
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    assert services["gpen"]["shm_size"] == "2gb"
    assert services["gpen"]["environment"]["GPEN_TUNE_TOKEN"].startswith("${GPEN_TUNE_TOKEN:?")
    assert set(services) == {"gpen", "gpen-cpu"}
