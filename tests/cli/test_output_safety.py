"""Output safety of `gpen-tune enhance` (bad-input issue): outputs planned before any work, existing files never
replaced silently, name patterns limited to their fields, the report checked up front and written atomically,
Ctrl-C once / twice / during start-up. Real CLI, real photos and files; face-free images keep the runs short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.face import samples

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--weights", "synthetic", "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"]


def invoke(args: list[str]):
    command = typer.main.get_command(app)
    argv = (["enhance"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


def walls(folder: Path, names: list[str]) -> list[Path]:
    """Face-free photos (detection runs, the generator does not)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(names):
        p = folder / name
        Image.fromarray(np.full((64, 80, 3), 40 + 20 * i, np.uint8)).save(p)
        paths.append(p)
    return paths


def leftovers(*folders: Path) -> list[str]:
    return [p.name for f in folders if f.exists() for p in f.rglob("*") if p.name.endswith((".part", ".tmp"))]


def test_two_inputs_on_one_output_are_refused_before_any_work(tmp_path):
    a, b = walls(tmp_path / "in", ["a.png", "b.png"])
    out = tmp_path / "out"
    res = invoke([str(a), str(b), "-o", str(out), "--name-pattern", "same.{ext}", *COMMON])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if "error" in ln]
    assert len(lines) == 1 and "a.png" in lines[0] and "b.png" in lines[0] and "same.png" in lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("pattern", ["{name.__class__.__init__.__globals__}.{ext}", "{0}.{ext}", "{name!r}.{ext}",
                                     "{name:>9}.{ext}", "{other}.{ext}", ".", "..", "", "sub/{name}.{ext}"])
def test_name_patterns_accept_only_their_fields(tmp_path, pattern):
    (a,) = walls(tmp_path / "in", ["a.png"])
    out = tmp_path / "o" / "out"
    res = invoke([str(a), "-o", str(out), "--name-pattern", pattern, *COMMON])
    assert res.exit_code == 1, res.output
    assert "--name-pattern" in res.output and "Traceback" not in res.output
    assert not out.exists() and leftovers(tmp_path) == []         # nothing made, not even the output folder


def test_existing_output_is_refused_replaced_or_kept(tmp_path):
    a, b = walls(tmp_path / "in", ["a.png", "b.png"])
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "a.jpg"
    mine.write_bytes(b"the user's own file")
    res = invoke([str(tmp_path / "in" / "*.png"), "-o", str(out), "--ext", "jpg", *COMMON])
    assert res.exit_code == 1
    refused = [ln for ln in res.output.splitlines() if "a.jpg" in ln and "already exists" in ln]
    assert len(refused) == 1 and "--overwrite" in refused[0] and "--skip-existing" in refused[0]
    assert mine.read_bytes() == b"the user's own file"               # never replaced silently
    assert (out / "b.jpg").is_file()                                 # the rest went on

    kept = invoke([str(tmp_path / "in" / "*.png"), "-o", str(out), "--ext", "jpg", "--skip-existing", *COMMON])
    assert kept.exit_code == 0, kept.output
    assert mine.read_bytes() == b"the user's own file"
    assert "existing outputs kept" in kept.output

    replaced = invoke([str(tmp_path / "in" / "*.png"), "-o", str(out), "--ext", "jpg", "--overwrite", *COMMON])
    assert replaced.exit_code == 0, replaced.output
    with Image.open(mine) as im:
        assert im.format == "JPEG" and im.size == (80, 64)
    both = invoke([str(a), "-o", str(out), "--overwrite", "--skip-existing", *COMMON])
    assert both.exit_code == 1 and "choose one" in both.output
    assert leftovers(out) == []


def test_output_onto_an_input_is_refused(tmp_path):
    walls(tmp_path, ["p.png"])
    res = invoke([str(tmp_path), "-o", str(tmp_path), *COMMON])
    assert res.exit_code == 1 and "overwrite the input" in res.output


@pytest.mark.parametrize("kind", ["folder", "read_only"])
def test_report_is_checked_before_any_work(tmp_path, kind):
    (a,) = walls(tmp_path / "in", ["a.png"])
    if kind == "folder":
        report = tmp_path / "report.json"
        report.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        report = locked / "report.json"
    out = tmp_path / "out"
    res = invoke([str(a), "-o", str(out), "--report", str(report), *COMMON])
    assert res.exit_code == 1 and "--report" in res.output and "Traceback" not in res.output
    assert not out.exists() and leftovers(tmp_path) == []


def test_report_written_atomically_with_every_image(tmp_path):
    walls(tmp_path / "in", ["a.png", "b.png"])
    report = tmp_path / "r" / "report.json"
    res = invoke([str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--report", str(report), *COMMON])
    assert res.exit_code == 0, res.output
    import json

    data = json.loads(report.read_text())
    assert [Path(i["input"]).name for i in data["images"]] == ["a.png", "b.png"]
    assert leftovers(report.parent) == []


def test_folder_entries_passed_over_are_named(tmp_path):
    folder = tmp_path / "in"
    walls(folder, ["a.png"])
    (folder / "x.jpg").mkdir()                                       # a folder with an image name
    (folder / "anim.gif").write_bytes(b"GIF89a")
    (folder / "dangling.png").symlink_to(folder / "missing.png")
    res = invoke([str(folder), "-o", str(tmp_path / "out"), *COMMON])
    assert res.exit_code == 0, res.output
    for name in ("x.jpg", "anim.gif", "dangling.png"):
        assert any(name in ln and "passed over" in ln for ln in res.output.splitlines()), name


# ---------------------------------------------------------------------------------------------------- signals


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:                                      # the process has just ended
        return ""


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gpen_tune", "enhance", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.slow
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tmp_path):
    (a,) = walls(tmp_path / "in", ["a.png"])
    proc = _cli([str(a), "-o", str(tmp_path / "out"), *COMMON])
    # inside the imports / model build: torch's library is mapped (the CLI loads torch after its start-up handler
    # is in place; a Ctrl-C before Python itself has started is not ours to handle)
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline and "libtorch" not in _read(maps):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_twice_exits_130_at_once_with_no_partial_files(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(12):                                  # faces: the generator keeps the run busy for a while
        Image.fromarray(samples.astronaut()).save(folder / f"p{i:02d}.png")
    out = tmp_path / "out"
    proc = _cli([str(folder), "-o", str(out), "--model", "GPEN-BFR-512", "--weights", "synthetic", "--detector",
                 "mtcnn", "--device", "cpu", "--batch-size", "1"])
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not any(out.glob("*.png")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "terminate called" not in err and "Traceback" not in err
    assert leftovers(out) == []
    for p in out.glob("*.png"):                          # every file written is complete
        with Image.open(p) as im:
            im.load()
