"""`gpen-tune enhance --devices` / `--ray` from the command line: the same files as the plain command, the
per-device lines, and the one-line message when Ray is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest_weights import checkpoint_file
from distributed_data import BROKEN, MODEL, assert_same_outputs, mixed_folder, read_outputs
from typer.testing import CliRunner

from gpen_tune.cli import app

REPO = Path(__file__).resolve().parents[2]


def invoke(args: list[str]):
    return CliRunner().invoke(app, ["enhance", *args], catch_exceptions=False)


def common(out: Path) -> list[str]:
    return ["-o", str(out), "--weights", str(checkpoint_file(MODEL)), "--model", MODEL, "--detector", "mtcnn",
            "--device", "cpu", "--ext", "png"]


@pytest.fixture(scope="module")
def folder_and_plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    folder = mixed_folder(tmp / "in")
    for name in ("hopper.jpg", "mosaic.png"):            # small: astronaut, a wall, a broken file
        (folder / name).unlink()
    res = invoke([str(folder), *common(tmp / "plain")])
    assert res.exit_code == 1, res.output
    return folder, read_outputs(tmp / "plain")


def test_devices_flag_writes_what_the_plain_command_writes(folder_and_plain, tmp_path: Path) -> None:
    folder, plain = folder_and_plain
    res = invoke([str(folder), *common(tmp_path / "out"), "--devices", "cpu,cpu"])
    assert res.exit_code == 1                             # the broken file, as in the plain run
    assert_same_outputs(read_outputs(tmp_path / "out"), plain)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("device cpu:")]
    assert len(lines) == 2 and all("faces/s" in ln for ln in lines)
    assert BROKEN in res.output


def test_devices_flag_refuses_gpus_it_cannot_see(folder_and_plain, tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("this machine has GPUs")
    res = CliRunner().invoke(app, ["enhance", str(folder_and_plain[0]), *common(tmp_path / "out"),
                                   "--devices", "0,1"])
    assert res.exit_code == 1 and "only 0 CUDA GPU(s) visible" in res.output
    assert not (tmp_path / "out").exists()


BLOCK_RAY = """
import sys
class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError("No module named 'ray'", name="ray")
        return None
sys.meta_path.insert(0, NoRay())
sys.argv = ["gpen-tune", *sys.argv[1:]]
from gpen_tune.cli import main
main()
"""


def test_ray_flag_without_ray_says_how_to_install_it_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    proc = subprocess.run([sys.executable, "-c", BLOCK_RAY, "enhance", str(tmp_path / "in"), "-o",
                           str(tmp_path / "out"), "--ray", "--device", "cpu"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr
    assert lines == ["error: --ray needs Ray: pip install 'gpen-tune[ray]'"]


def test_ray_address_where_nothing_answers_is_one_line_not_a_hang(folder_and_plain, tmp_path: Path) -> None:
    """A cluster address with nothing listening (a port just closed on this host): one line naming the address
    and the fix, exit 1, the output folder not left behind (Ray's own connect would retry for minutes)."""
    pytest.importorskip("ray.data")
    import socket

    with socket.socket() as s:                            # a free port, closed again: nothing answers there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder, _ = folder_and_plain
    proc = subprocess.run([sys.executable, "-m", "gpen_tune", "enhance", str(folder), *common(tmp_path / "out"),
                           "--ray-address", f"127.0.0.1:{port}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert lines[-1].startswith(f"error: --ray-address 127.0.0.1:{port}: nothing answers"), lines
    assert "ray start --head" in lines[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ray_flag_writes_what_the_plain_command_writes(folder_and_plain, tmp_path: Path) -> None:
    pytest.importorskip("ray.data")
    folder, plain = folder_and_plain
    res = invoke([str(folder), *common(tmp_path / "out"), "--ray"])
    assert res.exit_code == 1, res.output
    assert_same_outputs(read_outputs(tmp_path / "out"), plain)
    assert BROKEN in res.output
