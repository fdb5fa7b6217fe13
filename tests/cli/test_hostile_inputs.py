"""Hostile inputs to `gpen-tune enhance` (and `weights download`), each a real command run: upper-case suffixes,
names that try to leave -o, two runs into one folder, a report on an input or an output, side images colliding
with photos, damaged PNGs, checkpoints and videos that claim gigabytes, memory and file-size limits, Ctrl-C twice
during a video, temp files of killed runs, names at the file system's limit, the tool's own renamings, special
files, unusual tensors and a trickling server. Each gives one line naming the file and the fix, the right exit
code, and loses, half-writes and writes outside -o nothing. Face-free images keep most runs short."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from conftest_weights import checkpoint_file, start_server
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.face import samples
from gpen_tune.imageio import temp_owner

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--weights", "synthetic", "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"]


def enhance(*args: str | Path, env: dict | None = None):
    return CliRunner().invoke(app, ["enhance", *map(str, args), *COMMON], env=env)


def walls(folder: Path, *names: str, shade: int = 40) -> list[Path]:
    """Face-free photos (detection runs, the generator does not); each name its own grey."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(names):
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        fmt = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG"}[p.suffix.lower().lstrip(".")]
        Image.fromarray(np.full((48, 64, 3), shade + 20 * i, np.uint8)).save(p, format=fmt)
        paths.append(p)
    return paths


def error_lines(res) -> list[str]:
    """The error lines of a run (per input 'failed:', per command 'error:'), from both streams as the user sees
    them; never a traceback."""
    assert "Traceback" not in res.output, res.output
    return [ln for ln in res.output.splitlines() if ln.lstrip().startswith(("error:", "failed:"))]


def one_error(res, code: int, *needles: str) -> str:
    assert res.exit_code == code, res.output
    lines = error_lines(res)
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes (what was there, and nothing half-written)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def temp_files(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if temp_owner(p.name) is not None or p.name.endswith(".part")]


# ------------------------------------------------------------------------------------------- names and outputs


def test_upper_case_suffixes_are_written_as_planned(tmp_path):
    d = tmp_path / "d"
    p, q = walls(d, "P.JPG", "Q.PNG")
    before = snapshot(d)
    res = enhance(d, "-o", d)                                    # into the input folder itself
    assert res.exit_code == 0, res.output
    assert snapshot(d)["P.JPG"] == before["P.JPG"] and snapshot(d)["Q.PNG"] == before["Q.PNG"]
    assert (d / "P.jpg").is_file() and (d / "Q.png").is_file()

    out = tmp_path / "out"
    out.mkdir()
    (out / "Q.PNG").write_bytes(b"the user's own file")
    assert enhance(q, "-o", out).exit_code == 0
    assert (out / "Q.PNG").read_bytes() == b"the user's own file"
    written = (out / "Q.png").read_bytes()
    kept = enhance(q, "-o", out, "--skip-existing")
    assert kept.exit_code == 0 and "existing outputs kept" in kept.output, kept.output
    assert (out / "Q.png").read_bytes() == written and temp_files(out) == []


@pytest.mark.parametrize("suffix", ["/../../escaped", "\\..\\x", "_a/b"])
def test_suffix_with_folders_is_refused_before_any_work(tmp_path, suffix):
    (a,) = walls(tmp_path / "in", "a.png")
    (tmp_path / "in" / "clip.mp4").write_bytes(b"not looked at: the command stops first")
    before = snapshot(tmp_path)
    res = enhance(a, tmp_path / "in" / "clip.mp4", "-o", tmp_path / "o" / "out", "--suffix", suffix)
    one_error(res, 1, "--suffix", "'/'")
    assert snapshot(tmp_path) == before and not (tmp_path / "o").exists()


def test_a_file_that_appears_after_planning_is_not_replaced(tmp_path):
    """Two runs into one folder with different photos of one name: whichever writes second is refused."""
    import gpen_tune
    from gpen_tune.pipeline.settings import EnhanceSettings

    first, = walls(tmp_path / "one", "x.png", shade=10)
    second, = walls(tmp_path / "two", "x.png", shade=200)
    out = tmp_path / "out"
    assert enhance(first, "-o", out).exit_code == 0
    mine = (out / "x.png").read_bytes()
    res = enhance(second, "-o", out)                           # planned after the first run: refused up front
    one_error(res, 1, "x.png", "--overwrite")
    assert (out / "x.png").read_bytes() == mine

    (out / "x.png").unlink()                                   # the other run writes while this one works

    def other_run_writes(_count: int) -> None:
        (out / "x.png").write_bytes(mine)

    result = gpen_tune.enhance([second], out, EnhanceSettings(**{
        "weights": "synthetic", "model": "GPEN-BFR-256", "detector": "mtcnn", "device": "cpu"}),
        on_start=other_run_writes, notify=lambda _m: None)
    assert result.exit_code == 1
    (job,) = result.jobs
    assert job.status == "error" and "x.png" in job.error and "--overwrite" in job.error
    assert (out / "x.png").read_bytes() == mine and temp_files(out) == []


@pytest.mark.parametrize("target", ["input", "output", "fifo"])
def test_report_on_an_input_an_output_or_a_special_file_is_refused(tmp_path, target):
    a, b = walls(tmp_path / "in", "a.png", "b.png")
    out = tmp_path / "out"
    report = {"input": a, "output": out / "b.png", "fifo": tmp_path / "report.fifo"}[target]
    if target == "fifo":
        os.mkfifo(report)
    before = snapshot(tmp_path)
    res = enhance(tmp_path / "in", "-o", out, "--report", report)
    one_error(res, 1, "--report", str(report))
    assert snapshot(tmp_path) == before


def test_side_images_are_planned_with_the_photos(tmp_path):
    src = tmp_path / "in"
    walls(src, "a.png", "comparisons/a.png")
    before = snapshot(tmp_path)
    res = enhance(src, "-r", "-o", tmp_path / "out", "--save-comparison")   # a's comparison is the other's photo
    one_error(res, 1, "comparisons/a.png")
    assert snapshot(tmp_path) == before

    out = tmp_path / "out2"                                    # a first run with side images, then -r over it
    (b,) = walls(tmp_path / "in2", "b.png")
    assert enhance(b, "-o", out, "--save-comparison").exit_code == 0
    done = snapshot(out)
    assert set(done) == {"b.png", "comparisons/b.png"}
    res = enhance(out, "-r", "-o", out, "--suffix", "_v2", "--save-comparison")
    one_error(res, 1, "overwrite the input")
    assert snapshot(out) == done


def test_names_at_the_file_systems_limit(tmp_path):
    name = "n" * 251 + ".png"                                  # 255 bytes: the output keeps it, the temp file fits
    (a,) = walls(tmp_path / "in", name)
    out = tmp_path / "out"
    res = enhance(a, "-o", out)
    assert res.exit_code == 0, res.output
    assert (out / name).is_file() and temp_files(out) == []
    res = enhance(a, "-o", tmp_path / "out2", "--suffix", "_gpen")
    one_error(res, 1, "bytes", "--suffix")
    assert not any((tmp_path / "out2").glob("*"))


def test_the_tools_own_renaming_never_lands_on_another_input(tmp_path):
    a, = walls(tmp_path / "a", "x.png", shade=10)
    b, = walls(tmp_path / "b", "x.png", shade=90)
    c, = walls(tmp_path / "c", "x_1.png", shade=170)
    out = tmp_path / "out"
    res = enhance(a, b, c, "-o", out)
    assert res.exit_code == 0, res.output
    shades = {p.name: int(np.asarray(Image.open(p))[0, 0, 0]) for p in out.glob("*.png")}
    assert shades == {"x.png": 10, "x_2.png": 90, "x_1.png": 170}


def test_special_files_are_named_and_never_read(tmp_path):
    src = tmp_path / "in"
    walls(src, "a.png")
    os.mkfifo(src / "pipe.png")                                # reading it would wait for ever
    (src / "folder.jpg").mkdir()
    out = tmp_path / "out"
    res = enhance(src, "-o", out)
    assert res.exit_code == 0, res.output
    assert any("pipe.png" in ln and "named pipe" in ln for ln in res.output.splitlines()), res.output
    res = enhance(src / "pipe.png", "/dev/zero", "-o", tmp_path / "out2")
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if "not a regular file" in ln]
    assert any("pipe.png" in ln for ln in lines) and any("/dev/zero" in ln for ln in lines), res.output


# ------------------------------------------------------------------------------------------------ damaged data


def test_png_with_a_crc_error_in_its_pixels_fails_that_file(tmp_path):
    src = tmp_path / "in"
    good, bad = walls(src, "good.png", "bad.png")
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), np.uint8)).save(bad)
    data = bytearray(bad.read_bytes())
    data[data.index(b"IDAT") + 40] ^= 0xFF
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    res = enhance(src, "-o", out)
    one_error(res, 1, "bad.png", "CRC")
    assert [p.name for p in out.iterdir()] == ["good.png"]


def _png_with_pixel_stream(path: Path, rgb: np.ndarray, stream: bytes) -> None:
    """A PNG of `rgb`'s size whose IDAT holds `stream`, every chunk's CRC valid."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    h, w = rgb.shape[:2]
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", stream) + chunk(b"IEND", b""))


@pytest.mark.parametrize("damage, needle", [("filter", "invalid filter type"), ("short", "cut short"),
                                            ("deflate", "does not inflate")])
def test_png_damaged_under_valid_crcs_fails_that_file(tmp_path, damage, needle):
    """Pixel data damaged inside chunks whose CRCs are right (a bad row filter, a stream that stops early, a broken
    deflate stream): OpenCV decoded such files into garbage or black rows with only a libpng line on stderr; now
    the file fails with one line and nothing is written for it."""
    src = tmp_path / "in"
    walls(src, "good.png")
    rgb = samples.astronaut()[:96, :128]
    rows = b"".join(b"\x00" + row.tobytes() for row in rgb)
    if damage == "filter":
        rows = rows[: 40 * (1 + 128 * 3)] + b"\x07" + rows[40 * (1 + 128 * 3) + 1:]
        stream = zlib.compress(rows)
    elif damage == "short":
        stream = zlib.compress(rows[: len(rows) // 2])
    else:
        stream = bytearray(zlib.compress(rows))
        stream[len(stream) // 2: len(stream) // 2 + 16] = bytes(16)
        stream = bytes(stream)
    _png_with_pixel_stream(src / "bad.png", rgb, stream)
    out = tmp_path / "out"
    res = enhance(src, "-o", out)
    one_error(res, 1, "bad.png", "damaged PNG", needle)
    assert [p.name for p in out.iterdir()] == ["good.png"]


def test_a_name_with_a_line_break_stays_one_line(tmp_path):
    src = tmp_path / "in"
    walls(src, "good.png")
    (src / "line\nbreak.png").write_bytes(b"")
    res = enhance(src, "-o", tmp_path / "out")
    one_error(res, 1, "line\\nbreak.png", "empty file")


def _deflated_claim(path: Path, record: str, claimed: int) -> None:
    """Rewrite the zip checkpoint at `path` with `record` deflated, its sizes saying `claimed` bytes."""
    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for info, data in entries:
            z.writestr(info.filename, data, zipfile.ZIP_DEFLATED if info.filename.endswith(record) else 0)
    data = bytearray(path.read_bytes())
    name = next(i.filename for i, _ in entries if i.filename.endswith(record)).encode()
    at = 0
    while True:                                                # the central directory entry of `record`
        at = data.index(b"PK\x01\x02", at)
        size = struct.unpack("<H", data[at + 28:at + 30])[0]
        if data[at + 46:at + 46 + size] == name:
            data[at + 24:at + 28] = struct.pack("<I", claimed)
            break
        at += 4
    path.write_bytes(bytes(data))


def test_checkpoint_claiming_gigabytes_is_refused_before_loading(tmp_path):
    (a,) = walls(tmp_path / "in", "a.png")
    sd = torch.load(checkpoint_file("GPEN-BFR-256"), weights_only=True)
    ckpt = tmp_path / "claims.pth"
    torch.save(sd, ckpt)
    _deflated_claim(ckpt, "data/0", 2_000_000_000)
    assert ckpt.stat().st_size < 100_000_000
    res = CliRunner().invoke(app, ["enhance", str(a), "-o", str(tmp_path / "out"), "--weights", str(ckpt),
                                   "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"])
    one_error(res, 1, "claims.pth", "2.0 GB", "refused before loading")
    assert not any((tmp_path / "out").glob("*"))


@pytest.mark.parametrize("change", [pytest.param("float16", marks=pytest.mark.slow),
                                    pytest.param("float64", marks=pytest.mark.slow), "int", "scalar"])
def test_checkpoints_with_unusual_tensors(tmp_path, change):
    import cv2

    a = tmp_path / "in" / "a.png"                              # a face: the generator runs with these weights
    a.parent.mkdir()
    Image.fromarray(cv2.resize(samples.astronaut(), (192, 192), interpolation=cv2.INTER_AREA)).save(a)
    sd = torch.load(checkpoint_file("GPEN-BFR-256"), weights_only=True)
    key = "generator.convs.3.conv.weight"
    sd = {k: v.half() for k, v in sd.items()} if change == "float16" else \
        {k: v.double() for k, v in sd.items()} if change == "float64" else sd
    if change == "int":
        sd[key] = sd[key].to(torch.int32)
    if change == "scalar":
        sd[key] = torch.tensor(1.0)
    ckpt = tmp_path / f"{change}.pth"
    torch.save(sd, ckpt)
    out, report = tmp_path / "out", tmp_path / "report.json"
    res = CliRunner().invoke(app, ["enhance", str(a), "-o", str(out), "--weights", str(ckpt), "--report",
                                   str(report), "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"])
    if change in ("float16", "float64"):                       # the same numbers in another float type: loads
        assert res.exit_code == 0, res.output
        assert (out / "a.png").is_file() and json.loads(report.read_text())["summary"]["faces"] == 1
    else:
        one_error(res, 1, f"{change}.pth", key)
        assert not any(out.glob("*"))


def test_video_frames_over_the_limit_are_refused_from_the_header(tmp_path):
    clip = tmp_path / "huge.mp4"
    w, h = 8208, 4336                                          # 35.6 MP: just over 8192 x 4320
    with av.open(str(clip), "w") as c:
        s = c.add_stream("libx264", rate=1)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"preset": "ultrafast"}
        frame = av.VideoFrame(w, h, "yuv420p")
        for plane in frame.planes:
            plane.update(np.zeros(plane.buffer_size, np.uint8))
        for packet in [*s.encode(frame), *s.encode(None)]:
            c.mux(packet)
    out = tmp_path / "out"
    res = enhance(clip, "-o", out)
    one_error(res, 1, "huge.mp4", "8208x4336", "downscale")
    assert not any(out.glob("*")) and temp_files(tmp_path) == []


# ---------------------------------------------------------------------------------- limits, signals, leftovers


def _png_16_bit(path: Path, width: int, height: int) -> None:
    """A 16-bit RGB PNG of zeros, streamed (no array of its size is made here)."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    z = zlib.compressobj(1)
    row = bytes(1 + width * 6)
    body = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0))
                     + chunk(b"IDAT", body) + chunk(b"IEND", b""))


LIMITED = """
import resource, sys
import torch, cv2, gpen_tune.cli.enhance, gpen_tune.pipeline.api
def vm():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
limit = vm() + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from gpen_tune.cli import app
sys.argv = ["gpen-tune", *sys.argv[2:]]
app()
"""


@pytest.mark.slow
def test_huge_16_bit_png_under_a_memory_limit_is_one_line_on_the_one_input_path(tmp_path):
    big = tmp_path / "big16.png"
    _png_16_bit(big, 12000, 8000)                              # 96 MP, 576 MB decoded
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(400 << 20), "enhance", str(big), "-o", str(out),
                           *COMMON], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed:")]
    assert len(lines) == 1 and "big16.png" in lines[0] and "memory" in lines[0], proc.stderr
    assert not any(out.glob("*"))


@pytest.mark.slow
def test_file_size_limit_fails_the_file_and_leaves_no_half_file(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (256, 256, 3), np.uint8)).save(src / "noise.png")
    walls(src, "small.png")
    out = tmp_path / "out"

    def limit() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))   # 64 KiB: the noise PNG needs ~190

    proc = subprocess.run([sys.executable, "-m", "gpen_tune", "enhance", str(src), "-o", str(out), *COMMON],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300, preexec_fn=limit)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("failed:")]
    assert len(lines) == 1 and "noise.png" in lines[0], proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["small.png"]


def test_temp_files_of_killed_runs_are_removed_and_only_those(tmp_path):
    (a,) = walls(tmp_path / "in", "a.png")
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [out / f".a.png.{dead.pid}.k3j_x9q2.part", out / "sub" / f".clip.{dead.pid}.partial.mp4"]
    kept = [out / f".b.png.{os.getpid()}.abcdefgh.part",      # a live process's write in progress
            out / ".notes.part", out / "sub" / "mine.part"]   # not names of ours
    for p in stale + kept:
        p.write_bytes(b"x")
    res = enhance(a, "-o", out, "--skip-existing")
    assert res.exit_code == 0, res.output
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)
    assert (out / "a.png").is_file()


def _cli(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpen_tune", "enhance", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_ctrl_c_twice_during_a_video_leaves_no_partial_file(tmp_path):
    import cv2

    clip = tmp_path / "clip.mp4"
    face = cv2.resize(samples.astronaut(), (160, 160))
    with av.open(str(clip), "w") as c:                         # faces in every frame: the generator is busy
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 160, 160, "yuv420p"
        for i in range(200):
            frame = av.VideoFrame.from_ndarray(np.roll(face, i % 7, axis=1), format="rgb24")
            for packet in s.encode(frame):
                c.mux(packet)
        for packet in s.encode(None):
            c.mux(packet)
    out = tmp_path / "out"
    proc = _cli([str(clip), "-o", str(out), *COMMON])
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and not temp_files(tmp_path):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert temp_files(tmp_path) == [] and not (out / "clip.mp4").exists()


def test_trickling_server_gives_one_line(tmp_path):
    fs, httpd = start_server()
    try:
        url = fs.add("GPEN-BFR-256.pth", data=b"x" * 4096, trickle=0.05)
        res = CliRunner().invoke(app, ["weights", "download", "GPEN-BFR-256", "--url", url, "--timeout", "1",
                                       "--retries", "0", "--no-progress"], env={"GPEN_TUNE_HOME": str(tmp_path)})
    finally:
        httpd.shutdown()
        httpd.server_close()
    one_error(res, 1, "stalled")
    assert not any(p.name.endswith(".pth") for p in tmp_path.rglob("*"))
