"""`gpen-tune enhance` end to end and the pipeline's library API, on CPU with real photos and GPEN-BFR-256."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import typer
from face_testdata import detections, mtcnn, serial_run
from PIL import Image
from typer.testing import CliRunner

import gpen_tune
from gpen_tune.cli import app
from gpen_tune.face import samples
from gpen_tune.model.configs import GPENConfig
from gpen_tune.pipeline import EnhanceSettings, FileSink, FileSource, OutputNaming, Pipeline
from gpen_tune.pipeline.settings import resolve_device
from gpen_tune.restore import as_restorer
from gpen_tune.restore.convert import to_uint8_nhwc
from gpen_tune.tune import TuneConfig

MODEL = "GPEN-BFR-256"


def invoke(args: list[str]):
    """Run the real CLI; `enhance` is named when the app has several commands (it does once merged)."""
    command = typer.main.get_command(app)
    argv = (["enhance"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


@pytest.fixture(scope="module")
def model():
    """A tiny real GPEN (64 px, narrow 0.25, synthetic weights): the library tests need speed, not quality."""
    return gpen_tune.load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu")


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
                  "--save-faces", "--save-comparison", "--suffix", "_gpen"])
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
    assert "truncated" in by_name["broken.jpg"]["error"] and "empty" in by_name["empty.png"]["error"]
    assert data["summary"]["failed"] == 3 and data["summary"]["faces"] == 2 and data["summary"]["no_face"] == 1
    assert data["weights"] == "synthetic" and data["detector"] == "mtcnn"


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


# ---------------------------------------------------------------------------------------------- library API


class CountingDetector:
    """The lazy-detector interface around the real MTCNN: counts `before_restore` calls."""

    name = "mtcnn"

    def __init__(self):
        self.inner, self.hooks = mtcnn(), 0

    def detect(self, images):
        return self.inner.detect(images)

    def before_restore(self):
        self.hooks += 1

    def close(self):
        pass


def test_faces_of_several_images_share_batches(model):
    calls: list[int] = []

    def restore(x):
        calls.append(x.shape[0])
        assert x.dtype == torch.float32 and -1.0 <= x.min() and x.max() <= 1.0
        return model(x)

    det = CountingDetector()
    images = [samples.astronaut(), samples.grace_hopper(), samples.mosaic()]
    restorer = as_restorer(restore, device="cpu", size=64, max_batch=3)
    pipe = Pipeline(EnhanceSettings(device="cpu", batch_size=3), TuneConfig(lazy_detector=True), restorer=restorer,
                    detector=det)
    sink = serial_run(pipe, images)
    assert [len(sink.jobs[i].faces) for i in range(3)] == [1, 1, 6]
    assert calls == [3, 3, 2] and det.hooks == 3                 # 8 faces of 3 images in 3 batches
    for i, j in sink.jobs.items():
        assert j.status == "ok" and sink.results[i].shape == images[i].shape
        assert j.timings["restore"] > 0 and all(r.shape == (64, 64, 3) for r in sink.restored[i])


def test_enhance_image_library_call(model):
    img = samples.astronaut()
    out = gpen_tune.enhance_image(img, weights="synthetic", model=MODEL, detector="mtcnn", device="cpu")
    assert out.shape == img.shape and out.dtype == np.uint8 and not np.array_equal(out, img)
    changed = (out != img).any(axis=2)
    ys, xs = np.nonzero(changed)
    assert 100 < xs.mean() < 350 and ys.mean() < 250          # only around the face
    zero = Pipeline(EnhanceSettings(device="cpu", strength=0.0), model=model, detector=CountingDetector())
    assert np.array_equal(gpen_tune.enhance_image(img, pipeline=zero), img)
    one = Pipeline(EnhanceSettings(device="cpu"), model=model, detector=CountingDetector())
    flat = np.full((100, 140), 77, np.uint8)
    assert np.array_equal(gpen_tune.enhance_image(flat, pipeline=one), flat)   # grayscale, no face: unchanged


def test_only_center_face_and_ffhq_template(model):
    det = CountingDetector()
    pipe = Pipeline(EnhanceSettings(device="cpu", only_center_face=True, template="ffhq"), model=model, detector=det)
    job = serial_run(pipe, [samples.mosaic()]).jobs[0]
    assert len(job.faces) == 1
    _, dets = detections("mosaic")
    h, w = samples.mosaic().shape[:2]
    centre = np.array([w / 2, h / 2])
    best = min(dets, key=lambda d: np.linalg.norm((d.box[:2] + d.box[2:]) / 2 - centre))
    np.testing.assert_allclose(job.faces[0].detection.box, best.box)


def test_aligned_inputs(model):
    crops = samples.aligned_face_crops(64, n=10)
    assert crops.shape == (10, 64, 64, 3) and crops.dtype == np.uint8
    assert not np.array_equal(crops[0], crops[1]) and np.array_equal(crops[0], crops[8])   # 8 faces, repeated
    pipe = Pipeline(EnhanceSettings(device="cpu", aligned=True, strength=0.5), model=model)
    big = np.ascontiguousarray(np.kron(crops[0], np.ones((2, 2, 1), np.uint8)))   # a 128-px aligned face
    sink = serial_run(pipe, [crops[1], big])
    full, half = sink.results[0], sink.results[1]
    assert full.shape == (64, 64, 3) and half.shape == (128, 128, 3)
    restored = sink.restored[0][0].astype(float)
    np.testing.assert_allclose(full, (restored + crops[1]) / 2, atol=1.01)
    assert pipe.prepare() is None                                # no detector for aligned inputs


def test_bf16_model_gets_bf16_batches():
    m = gpen_tune.load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu", dtype=torch.bfloat16)
    pipe = Pipeline(EnhanceSettings(device="cpu"), model=m)
    assert pipe.restorer.dtype == torch.bfloat16
    out = pipe.restorer.restore_crops(samples.aligned_face_crops(64, n=2))
    assert out.shape == (2, 64, 64, 3) and out.dtype == np.uint8


def test_output_conversion_rounds_and_clips():
    y = torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0, -1 + 2 * 100.4 / 255, -1 + 2 * 100.6 / 255]).view(1, 1, 1, 7)
    y = y.expand(1, 3, 1, 7)
    assert to_uint8_nhwc(y)[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255, 100, 101]


def test_device_choice():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            resolve_device("cuda")
        notes: list[str] = []
        assert resolve_device("auto", notes.append).type in ("cpu", "mps")
        assert notes and "CPU" in notes[0] or resolve_device("auto").type == "mps"
    assert resolve_device("cpu").type == "cpu"


def test_exif_rotated_photo_is_restored_upright(tmp_path, model):
    side = np.ascontiguousarray(np.rot90(samples.astronaut(), 1))     # stored sideways ...
    exif = Image.Exif()
    exif[0x0112] = 6                                                  # ... and tagged "rotate 90 CW to view"
    path = tmp_path / "side.jpg"
    Image.fromarray(side).save(path, exif=exif, quality=95)
    pipe = Pipeline(EnhanceSettings(device="cpu"), model=model, detector=CountingDetector())
    summary = pipe.run(FileSource([path], ["o"]), FileSink(OutputNaming(tmp_path / "out")), serial=True)
    (job,) = summary.results
    assert job.size == (512, 512) and len(job.faces) == 1 and job.status == "ok"   # upright: MTCNN finds it
    with Image.open(job.output) as im:
        assert im.size == (512, 512) and im.getexif().get(0x0112) == 1


def test_cli_detector_process_writes_what_the_detector_thread_writes(tmp_path):
    """--detector-process: the runner's detector in a child process gives the same files; with --lazy-detector it
    is refused in one line, before any output."""
    src = tmp_path / "in"
    src.mkdir()
    Image.fromarray(samples.astronaut()).save(src / "a.png")
    Image.fromarray(samples.mosaic(4, 0)).save(src / "b.png")
    common = ["--weights", "synthetic", "--model", MODEL, "--detector", "mtcnn", "--device", "cpu"]
    thread = invoke([str(src), "-o", str(tmp_path / "thread"), *common])
    proc = invoke([str(src), "-o", str(tmp_path / "proc"), "--detector-process", *common])
    assert thread.exit_code == 0 and proc.exit_code == 0, proc.output
    for name in ("a.png", "b.png"):
        a = np.asarray(Image.open(tmp_path / "thread" / name)).astype(int)
        b = np.asarray(Image.open(tmp_path / "proc" / name)).astype(int)
        assert np.abs(a - b).max() <= 2, name
        assert np.abs(a - np.asarray(Image.open(src / name)).astype(int)).max() > 20      # faces were restored
    lazy = invoke([str(src), "-o", str(tmp_path / "lazy"), "--detector-process", "--lazy-detector", *common])
    assert lazy.exit_code == 1 and "lazy" in lazy.output
    assert not any((tmp_path / "lazy").glob("*.png"))
