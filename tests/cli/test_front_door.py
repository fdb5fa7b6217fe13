"""What a user meets first: no synthetic weights unless asked for, the default preset, one line for a missing input,
weights file or optional part (before any work, no folder left), the report never replaced silently and written
with the user's umask, true summaries for videos, and the small things (80 columns, names in messages).

Real CLI (Typer's runner, or a subprocess where the process matters: umask, blocked imports, terminal width), real
photos from installed packages, checkpoints in the official layout written by the test (conftest_weights)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from conftest_weights import checkpoint_file
from PIL import Image
from typer.testing import CliRunner

import gpen_tune
from gpen_tune.cli import app
from gpen_tune.face import samples
from gpen_tune.file_mode import new_file_mode
from gpen_tune.model.configs import model_info
from gpen_tune.pipeline.api import EnhanceResult, with_default_tune
from gpen_tune.pipeline.conflicts import check_detector_process, check_scale_out, existing_policy
from gpen_tune.pipeline.report import summarize
from gpen_tune.pipeline.scheduler import RunSummary
from gpen_tune.pipeline.settings import EnhanceSettings, resolve_device
from gpen_tune.tune import TuneConfig
from gpen_tune.tune.hardware import cpu_capabilities
from gpen_tune.tune.options import PRESETS, choose_cpu_preset
from gpen_tune.weights.cache import WeightsNotFoundError

ROOT = Path(__file__).resolve().parents[2]
MODEL = "GPEN-BFR-256"
FAST = ["--model", MODEL, "--detector", "mtcnn", "--device", "cpu"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["enhance", *args], catch_exceptions=False)


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def photo(folder: Path, name: str = "astronaut.png", pixels: np.ndarray | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    Image.fromarray(samples.astronaut()[::2, ::2] if pixels is None else pixels).save(path)
    return path


def wall(folder: Path, name: str) -> Path:
    """A face-free photo: the run loads everything but restores nothing (short)."""
    return photo(folder, name, np.full((64, 80, 3), 90, np.uint8))


def cli(args: list[str], env: dict[str, str] | None = None, block: str | None = None, umask: int | None = None):
    """`gpen-tune ARGS` in a child process; `block`: an import name the child cannot find (an extra not installed)."""
    code = "import sys\n"
    if block:
        code += (f"class Block:\n    def find_spec(self, name, path=None, target=None):\n"
                 f"        if name == {block!r} or name.startswith({block + '.'!r}):\n"
                 f"            raise ModuleNotFoundError(name)\n"
                 f"sys.meta_path.insert(0, Block())\n")
    code += "sys.argv = ['gpen-tune', *sys.argv[1:]]\nfrom gpen_tune.cli import main\nmain()\n"
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=600, preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


# ------------------------------------------------------------------------------------------------ weights


def test_no_weights_stops_before_any_work_with_one_line(home, tmp_path):
    src = photo(tmp_path / "in")
    out = tmp_path / "out"
    res = invoke(str(src), "-o", str(out), "--model", MODEL, "--device", "auto")
    assert res.exit_code == 1
    assert len(lines(res.output)) == 1, res.output                   # no device notice, no bar, no table
    info = model_info(MODEL)
    for part in (MODEL, info.urls[0], str(home / info.filename), "--weights synthetic",
                 f"gpen-tune weights download {MODEL}"):
        assert part in res.output, part
    assert not out.exists()
    with pytest.raises(gpen_tune.WeightsNotFoundError, match="--weights synthetic"):
        gpen_tune.enhance([src], out, EnhanceSettings(model=MODEL, device="cpu"))
    assert not out.exists()
    with pytest.raises(WeightsNotFoundError, match=re.escape(info.urls[0])):
        gpen_tune.enhance_image(src, model=MODEL, device="cpu")


@pytest.mark.slow
def test_the_cached_official_file_is_used_without_weights(home, tmp_path):
    """The official layout in the cache: the run takes it (no synthetic notice) and the report says so."""
    home.mkdir()
    shutil.copyfile(checkpoint_file(MODEL), home / model_info(MODEL).filename)
    report = tmp_path / "report.json"
    res = invoke(str(wall(tmp_path / "in", "w.png")), "-o", str(tmp_path / "out"), *FAST, "--report", str(report))
    assert res.exit_code == 0, res.output
    assert "SYNTHETIC" not in res.output
    assert json.loads(report.read_text())["weights"] == str(home / model_info(MODEL).filename)
    pins = home / "sha256-pins.json"                      # the first verified file's pin: the user's umask too
    assert stat.S_IMODE(pins.stat().st_mode) == stat.S_IMODE(report.stat().st_mode) == new_file_mode()


# ------------------------------------------------------------------------------------------------ defaults


def test_preset_auto_is_the_default_of_the_command_and_the_library(tmp_path):
    help_text = CliRunner().invoke(app, ["enhance", "--help"], env={"COLUMNS": "120"}, terminal_width=120).output
    assert "auto (default)" in help_text
    report = tmp_path / "r.json"
    res = invoke(str(wall(tmp_path / "in", "w.png")), "-o", str(tmp_path / "out"), *FAST, "--weights", "synthetic",
                 "--report", str(report))
    assert res.exit_code == 0, res.output
    _, cfg, line = choose_cpu_preset(cpu_capabilities())
    assert f"optimizations: {line}" in " ".join(res.output.split())
    assert json.loads(report.read_text())["tune"]["requested"] == asdict(cfg)
    settings, tune = with_default_tune(EnhanceSettings(model=MODEL, weights="synthetic", device="cpu"), None)
    assert tune == cfg and settings.device == "cpu"
    assert with_default_tune(settings, PRESETS["low-memory"])[1] == PRESETS["low-memory"]     # given: kept


def test_the_no_gpu_notice_names_the_model_that_runs():
    notes: list[str] = []
    resolve_device("auto", notes.append, cuda=False, mps=False, model=MODEL)
    assert len(notes) == 1 and MODEL in notes[0] and "GPEN-BFR-512" not in notes[0]


# ------------------------------------------------------------------------------------------------ missing inputs


def test_a_missing_input_fails_before_the_model_loads_and_leaves_no_folder(tmp_path):
    out = tmp_path / "out"
    res = invoke(str(tmp_path / "absent.jpg"), "-o", str(out), *FAST, "--weights", "synthetic")
    assert res.exit_code == 1
    assert lines(res.output) == [f"error: {tmp_path / 'absent.jpg'}: no such file or folder"]
    assert not out.exists()
    with pytest.raises(gpen_tune.InputError, match="no such file"):
        gpen_tune.enhance([tmp_path / "absent.jpg"], out, EnhanceSettings(model=MODEL, weights="synthetic"))
    assert not out.exists()


@pytest.mark.parametrize("part, args, install", [
    ("spandrel", ["--bg-upsampler", "realesrnet", "--bg-weights", "x.pth"], "pip install 'gpen-tune[upscale]'"),
    ("av", [], "PyAV"),                                    # a video among the inputs
    ("ray", ["--ray"], "pip install 'gpen-tune[ray]'"),
    (None, ["--codec", "no_such_encoder"], "no such video encoder"),
])
def test_a_missing_optional_part_gives_one_line_before_any_work(tmp_path, part, args, install):
    src = wall(tmp_path / "in", "w.png")
    (tmp_path / "in" / "clip.mp4").write_bytes(b"")                        # named only: never read
    out = tmp_path / "out"
    proc = cli(["enhance", str(tmp_path / "in"), "-o", str(out), *FAST, "--weights", "synthetic", *args],
               block=part)
    assert proc.returncode == 1, proc.stderr
    assert len(lines(proc.stderr)) == 1 and install in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists() and src.exists()


class _NoSpandrel:
    """An import finder for which spandrel is not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "spandrel" or name.startswith("spandrel."):
            raise ModuleNotFoundError(name)
        return None


def test_the_library_says_a_missing_part_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "meta_path", [_NoSpandrel(), *sys.meta_path])
    for name in [m for m in sys.modules if m == "spandrel" or m.startswith("spandrel.")]:
        monkeypatch.delitem(sys.modules, name)
    settings = EnhanceSettings(model=MODEL, weights="synthetic", device="cpu", detector="mtcnn",
                               bg_upsampler="realesrnet")
    out = tmp_path / "out"
    with pytest.raises(gpen_tune.MissingPart, match=re.escape("pip install 'gpen-tune[upscale]'")):
        gpen_tune.enhance([wall(tmp_path / "in", "w.png")], out, settings)
    assert not out.exists()
    with pytest.raises(gpen_tune.MissingPart, match="--bg-upsampler needs spandrel"):
        gpen_tune.enhance_image(samples.astronaut(), settings)


def test_doctor_lists_every_optional_part_with_its_install_line():
    data = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).stdout)
    for name in ("spandrel", "ray", "av", "onnxruntime", "tensorrt", "fastapi"):
        part = data["optional"][name]
        assert isinstance(part["installed"], bool) and "pip install" in part["purpose"], name
    assert data["optional"]["av"]["importable"] is True


# ------------------------------------------------------------------------------------------------ report, modes


@pytest.mark.slow
def test_the_report_is_not_replaced_silently_and_files_get_the_umask(tmp_path):
    src = tmp_path / "in"
    wall(src, "a.png")
    wall(src, "b.png")
    report = tmp_path / "report.json"
    base = [str(src), *FAST, "--weights", "synthetic", "--report", str(report)]
    first = cli(["enhance", *base, "-o", str(tmp_path / "one")], umask=0o022, env={"COLUMNS": "80"})
    assert first.returncode == 0, first.stderr
    for path in (report, tmp_path / "one" / "a.png"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    bar = [line for line in first.stderr.splitlines() if line.startswith("enhance")]
    assert bar and "2/2" in bar[-1] and all(len(line) <= 80 for line in bar), first.stderr      # the bar fits 80
    before = report.read_bytes()

    again = cli(["enhance", *base, "-o", str(tmp_path / "two")])
    assert again.returncode == 1 and lines(again.stderr) == [
        f"error: --report {report} already exists: pass --overwrite to replace it or name another file"]
    assert report.read_bytes() == before and not (tmp_path / "two").exists()

    replaced = cli(["enhance", *base, "-o", str(tmp_path / "two"), "--overwrite"])
    assert replaced.returncode == 0, replaced.stderr
    assert f"--report {report} exists: replaced at the end (--overwrite)" in replaced.stderr
    assert json.loads(report.read_text())["summary"]["images"] == 2 and report.read_bytes() != before

    resumed = cli(["enhance", *base, "-o", str(tmp_path / "two"), "--skip-existing"])     # a resumed batch
    assert resumed.returncode == 0 and "replaced at the end (--skip-existing: a resumed batch)" in resumed.stderr
    assert json.loads(report.read_text())["summary"]["skipped"] == 2


@pytest.mark.slow
def test_the_auto_detector_is_decided_once_per_run(home, tmp_path):
    """Offline, `--detector auto` falls back to MTCNN: the notice comes once although a folder run builds a
    second detector service (the threaded one)."""
    src = tmp_path / "in"
    wall(src, "a.png")
    wall(src, "b.png")
    proc = cli(["enhance", str(src), "-o", str(tmp_path / "out"), "--model", MODEL, "--device", "cpu", "--weights",
                "synthetic"], env={"GPEN_TUNE_OFFLINE": "1", "GPEN_TUNE_HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("RetinaFace weights not cached") == 1, proc.stderr


# ------------------------------------------------------------------------------------------------ summaries


def test_library_summary_of_a_video_counts_its_frames_and_the_whole_call(tmp_path):
    from video.clips import make_clip

    clip = make_clip(tmp_path / "clip.mp4", n=4, audio=False, subtitles=False,
                     frames=[samples.astronaut()[:240, 96:416]] * 4)
    seen: list[float] = []
    result = gpen_tune.enhance([clip], tmp_path / "out", EnhanceSettings(model=MODEL, weights="synthetic",
                                                                         detector="mtcnn", device="cpu"),
                               TuneConfig(), on_start=lambda n: seen.append(time.perf_counter()),
                               on_result=lambda job: seen.append(time.perf_counter()))
    assert result.exit_code == 0 and result.frames == 4 and result.faces >= 4
    assert result.wall_s >= seen[-1] - seen[0] > 0              # the video's frames are inside the call's wall
    summary = summarize(result, result.wall_s)
    assert summary["images"] == 0 and summary["videos"] == summary["videos_written"] == 1
    assert summary["frames"] == 4 and summary["faces"] == result.faces
    assert summary["frames_per_s"] and summary["faces_per_s"] and summary["images_per_s"] is None


def test_no_rate_when_nothing_was_written():
    from gpen_tune.pipeline.job import ImageJob

    dropped = ImageJob(source="a.png", status="dropped", error="a.png: not processed (interrupted)")
    result = EnhanceResult(RunSummary([dropped], wall_s=3.0, interrupted=True), [], [], [], [])
    summary = summarize(result, 3.0)
    assert summary["images_per_s"] is None and summary["faces_per_s"] is None and summary["not_processed"] == 1


# ------------------------------------------------------------------------------------------------ small things


def test_choices_errors_and_help_texts():
    res = invoke("x.png", "--preset", "fastest")
    assert res.exit_code == 2 and "Value error" not in res.output
    assert "choose one of auto, speed, balanced, low-memory, cpu, mps, none" in re.sub(r"[│\s]+", " ", res.output)
    res = invoke("x.png", "--detector", "yolo")
    assert res.exit_code == 2 and "retinaface_mobile0.25" in res.output and "Value error" not in res.output
    help_text = re.sub(r"[│\s]+", " ", CliRunner().invoke(app, ["enhance", "--help"]).output)
    assert "not GFPGAN/CodeFormer's -w" in help_text


def test_contradicting_flags_are_refused_in_one_line_by_the_library_rule(tmp_path):
    src = wall(tmp_path / "in", "w.png")
    for flags, rule in ((["--devices", "all", "--ray"], lambda: check_scale_out("all", True)),
                        (["--overwrite", "--skip-existing"], lambda: existing_policy(True, True)),
                        (["--detector-process", "--lazy-detector"], lambda: check_detector_process(True, True))):
        with pytest.raises(ValueError) as refused:
            rule()
        res = invoke(str(src), "-o", str(tmp_path / "out"), *FAST, "--weights", "synthetic", *flags)
        assert res.exit_code == 1 and lines(res.output) == [f"error: {refused.value}"], res.output
        assert not (tmp_path / "out").exists()


def test_readme_puts_the_command_on_path_before_calling_it_bare():
    """After the setup command the README's examples work as written: `.venv/bin/gpen-tune`, or a PATH line first."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    bare = [ln for b in blocks for ln in b.splitlines() if ln.startswith("gpen-tune ")]
    path_line = 'export PATH="$PWD/.venv/bin:$PATH"'
    assert bare and path_line in text and text.index(path_line) < text.index(bare[0])
    assert '-m venv .venv' in (ROOT / "scripts" / "setup.sh").read_text()       # the folder the line names


def test_constraints_name_paths_that_exist():
    text = (ROOT / "tests" / "constraints.txt").read_text()
    paths = re.findall(r"tests/[\w/.]+\w", text)
    assert paths and all((ROOT / p).exists() for p in paths), paths
