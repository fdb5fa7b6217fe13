"""`gpen-tune enhance` end to end on the CPU with real photos and GPEN-BFR-256: folders with good, face-free and
broken inputs, naming, output-folder problems, the detector process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.face import samples

MODEL = "GPEN-BFR-256"


def invoke(args: list[str]):
    """Run the real CLI; `enhance` is named when the app has several commands (it does once merged)."""
    command = typer.main.get_command(app)
    argv = (["enhance"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


@pytest.fixture
def mixed_folder(tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    Image.fromarray(samples.astronaut()).save(folder / "astronaut.jpg", quality=92)
    Image.fromarray(samples.grace_hopper()).save(folder / "sub" / "hopper.png")
    Image.fromarray(np.full((120, 160, 3), 90, np.uint8)).save(folder / "wall.png")
    jpeg = (folder / "astronaut.jpg").read_bytes()
    (folder / "broken.jpg").write_bytes(jpeg[: len(jpeg) // 4])
    (folder / "empty.png").write_bytes(b"")
    (folder / "notes.png").write_text("not a picture")
    (folder / "readme.txt").write_text("ignored: not an image extension")
    return folder


def test_cli_folder_mixing_good_no_face_and_broken(mixed_folder, tmp_path):
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    res = invoke([str(mixed_folder), "-r", "-o", str(out), "--weights", "synthetic", "--model", MODEL,
                  "--detector", "mtcnn", "--device", "cpu", "--batch-size", "2", "--report", str(report),
                  "--save-faces", "--save-comparison", "--suffix", "_gpen",
                  "--no-serial"])                    # the threads (a 2-core CPU would run serially): their report
    assert res.exit_code == 1, res.output
    for name in ("broken.jpg", "empty.png", "notes.png"):
        lines = [ln for ln in res.output.splitlines() if name in ln and "failed" in ln]
        assert len(lines) == 1, res.output
    assert "SYNTHETIC WEIGHTS" in res.output
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted([
        "astronaut_gpen.jpg", "sub/hopper_gpen.png", "wall_gpen.png",
        "faces/astronaut_face00.jpg", "faces/sub/hopper_face00.png",
        "comparisons/astronaut.jpg", "comparisons/sub/hopper.png", "comparisons/wall.png",
    ])
    # no face: the very same file; faces: changed pixels, same size
    assert (out / "wall_gpen.png").read_bytes() == (mixed_folder / "wall.png").read_bytes()
    restored = np.asarray(Image.open(out / "sub" / "hopper_gpen.png"))
    assert restored.shape == samples.grace_hopper().shape and not np.array_equal(restored, samples.grace_hopper())

    data = json.loads(report.read_text())
    by_name = {r["input"].rsplit("/", 1)[-1]: r for r in data["images"]}
    assert {k: v["status"] for k, v in by_name.items()} == {
        "astronaut.jpg": "ok", "hopper.png": "ok", "wall.png": "no_face",
        "broken.jpg": "error", "empty.png": "error", "notes.png": "error"}
    face = by_name["astronaut.jpg"]["faces"][0]
    assert len(face["box"]) == 4 and len(face["landmarks"]) == 5 and 0.9 <= face["score"] <= 1.0
    assert 150 < face["box"][0] < 200
    assert set(by_name["hopper.png"]["timings_s"]) >= {"decode", "detect", "align", "restore", "paste", "encode"}
    sizes = {name: (out / rel).stat().st_size for name, rel in (("astronaut.jpg", "astronaut_gpen.jpg"),
                                                                  ("hopper.png", "sub/hopper_gpen.png"),
                                                                  ("wall.png", "wall_gpen.png"))}
    assert {k: by_name[k]["output_bytes"] for k in sizes} == sizes and by_name["broken.jpg"]["output_bytes"] is None
    assert data["summary"]["output_bytes"] == sum(sizes.values())
    assert "truncated" in by_name["broken.jpg"]["error"] and "empty" in by_name["empty.png"]["error"]
    assert data["summary"]["failed"] == 3 and data["summary"]["faces"] == 2 and data["summary"]["no_face"] == 1
    assert data["weights"] == "synthetic" and data["detector"] == "mtcnn"
    gen = data["tune"]["generator"]                  # how busy the run kept the generator, first batch to last
    assert gen["faces"] == 2 and 0 < gen["busy_s"] <= gen["span_s"] and 0 < gen["busy_share"] <= 1
    det = data["summary"]["detector_calls"]["thread"]   # the folder's detector service: each decoded image once
    assert det["images"] == 3 and sum(det["calls_by_size"].values()) == det["calls"] <= 3 and det["busy_s"] > 0


def test_cli_png_level_trades_size_for_speed_with_the_same_pixels(tmp_path):
    src = tmp_path / "in" / "hopper.png"
    src.parent.mkdir()
    Image.fromarray(samples.grace_hopper()).save(src)
    common = ["--weights", "synthetic", "--model", MODEL, "--detector", "mtcnn", "--device", "cpu"]
    for level in ("0", "9"):
        res = invoke([str(src), "-o", str(tmp_path / f"l{level}"), "--png-level", level, *common])
        assert res.exit_code == 0, res.output
    fast, small = tmp_path / "l0" / "hopper.png", tmp_path / "l9" / "hopper.png"
    assert fast.stat().st_size > 2 * small.stat().st_size
    assert np.array_equal(np.asarray(Image.open(fast)), np.asarray(Image.open(small)))
    bad = invoke([str(src), "-o", str(tmp_path / "bad"), "--png-level", "10", *common])
    assert bad.exit_code != 0 and "--png-level 10" in bad.output and not (tmp_path / "bad").exists()


def test_cli_all_good_exits_zero_with_globs_and_ext(tmp_path):
    src = tmp_path / "a.png"
    Image.fromarray(np.full((64, 80, 3), 30, np.uint8)).save(src)
    out = tmp_path / "o"
    res = invoke([str(tmp_path / "*.png"), "-o", str(out), "--weights", "synthetic", "--model", MODEL,
                  "--detector", "mtcnn", "--device", "cpu", "--ext", "webp", "--name-pattern", "x_{name}.{ext}"])
    assert res.exit_code == 0, res.output
    assert [p.name for p in out.iterdir()] == ["x_a.webp"]


def test_cli_output_dir_problems_fail_before_any_work(tmp_path, mixed_folder):
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    for target in (afile, afile / "sub"):
        res = invoke([str(mixed_folder), "-o", str(target), "--weights", "synthetic", "--device", "cpu"])
        assert res.exit_code != 0
        assert str(target) in res.output and ("is a file" in res.output or "not writable" in res.output)
        assert "SYNTHETIC" not in res.output                     # refused before the model was even built
    res = invoke([str(tmp_path / "nothing-here"), "-o", str(tmp_path / "o"), "--device", "cpu"])
    assert res.exit_code != 0 and "no such file or folder" in res.output


def test_cli_refuses_to_overwrite_inputs(tmp_path):
    Image.fromarray(np.full((32, 32, 3), 9, np.uint8)).save(tmp_path / "p.png")
    res = invoke([str(tmp_path), "-o", str(tmp_path), "--weights", "synthetic", "--model", MODEL,
                  "--detector", "mtcnn", "--device", "cpu"])
    assert res.exit_code != 0 and "overwrite" in res.output


@pytest.mark.slow
def test_cli_detector_process_writes_what_the_detector_thread_writes(tmp_path):
    """--detector-process (now --detector-processes N): the runner's detector in one or two child processes gives
    the same files; a negative count and --lazy-detector are refused in one line, before any output."""
    src = tmp_path / "in"
    src.mkdir()
    Image.fromarray(samples.astronaut()).save(src / "a.png")
    Image.fromarray(samples.mosaic(4, 0)).save(src / "b.png")
    # fp32 (--preset none): batches differ between the two runs, and bf16 rounds each composition its own way
    common = ["--weights", "synthetic", "--model", MODEL, "--detector", "mtcnn", "--device", "cpu", "--preset", "none"]
    thread = invoke([str(src), "-o", str(tmp_path / "thread"), *common])
    proc = invoke([str(src), "-o", str(tmp_path / "proc"), "--detector-process", *common])     # the hidden alias
    procs = invoke([str(src), "-o", str(tmp_path / "procs"), "--detector-processes", "2", *common])
    assert thread.exit_code == 0 and proc.exit_code == 0 and procs.exit_code == 0, proc.output + procs.output
    for name in ("a.png", "b.png"):
        a = np.asarray(Image.open(tmp_path / "thread" / name)).astype(int)
        for other in ("proc", "procs"):
            b = np.asarray(Image.open(tmp_path / other / name)).astype(int)
            assert np.abs(a - b).max() <= 2, (other, name)
        assert np.abs(a - np.asarray(Image.open(src / name)).astype(int)).max() > 20      # faces were restored
    bad = invoke([str(src), "-o", str(tmp_path / "bad"), "--detector-processes", "-1", *common])
    assert bad.exit_code == 1 and "--detector-processes -1" in bad.output and not (tmp_path / "bad").exists()
    lazy = invoke([str(src), "-o", str(tmp_path / "lazy"), "--detector-process", "--lazy-detector", *common])
    assert lazy.exit_code == 1 and "lazy" in lazy.output
    assert not any((tmp_path / "lazy").glob("*.png"))
