"""The video's own doors, checkouts interleaved: `VideoReader` (decode to RGB) and `VideoWriter` (RGB to an x264
file) alone on a 1080p clip, beside PyAV's bare decode and encode (swscale's default flags) in the same child.

    python benchmarks/video_io.py --code ../before --code . [--frames 120] [--rounds 3] [--preset veryfast]

The clip is benchmarks/video.py's "one face" clip (the astronaut drifting on a grey 1920x1080 canvas, crf 18).
Each round runs one child process per checkout (its own `gpen_tune`, imported from that folder) that times, after
one untimed pass of each: the reader over every frame; the writer fed those frames (RGB, as the pipeline's sink
hands them) with the x264 speed preset `--preset` (veryfast: `--preset speed`'s); PyAV decoding the clip to RGB
with swscale's default flags, and encoding the frames with them (what benchmarks/doors.py calls the decoder and
the encoder alone). Frames per second; the JSON keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
sys.path.insert(0, str(HERE))
from results_file import write_result  # noqa: E402

CHILD = """
import json, sys, time
from pathlib import Path
import av
sys.path.insert(0, sys.argv[4])
from clip_files import write_clip
from gpen_tune.video.reader import VideoReader, probe
from gpen_tune.video.writer import VideoWriter
clip, work, preset = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
info = probe(clip)

def reader():
    return [f.image for f in VideoReader(clip, upright=True)]

def writer(frames):
    w = VideoWriter(work / "out.mp4", info, encoder_preset=preset, device_type="cpu", notify=lambda m: None)
    for i, image in enumerate(frames):
        w.write(image, i)
    w.close()

def bare_decode():
    with av.open(str(clip)) as c:
        c.streams.video[0].thread_type = "AUTO"
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]

def bare_encode(frames):
    write_clip(work / "bare.mp4", frames, preset=preset)

def fps(fn, *a):
    fn(*a)                                          # untimed: first-use costs
    start = time.perf_counter()
    fn(*a)
    return len(frames) / (time.perf_counter() - start)

frames = reader()
print(json.dumps({"reader_fps": fps(reader), "writer_fps": fps(writer, frames),
                  "bare_decode_fps": fps(bare_decode), "bare_encode_fps": fps(bare_encode, frames)}))
"""


def make_clip(folder: Path, frames: int) -> Path:
    from clip_files import pan_frames, write_clip
    from skimage import data

    return write_clip(folder / "clip.mp4", pan_frames(data.astronaut(), frames, (1920, 1080)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, action="append", required=True, help="a checkout (repeat for an A/B)")
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="veryfast", help="x264 speed preset of the writer and the bare encode")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        clip = make_clip(Path(tmp), args.frames)
        for r in range(args.rounds):
            for code in args.code:
                env = dict(os.environ, PYTHONPATH=str(code.resolve()))
                out = subprocess.run([sys.executable, "-c", CHILD, str(clip), tmp, args.preset, str(HERE)], env=env,
                                     cwd=code.resolve(), capture_output=True, text=True, check=True)
                figures = {k: round(v, 1) for k, v in json.loads(out.stdout.splitlines()[-1]).items()}
                runs.append({"round": r + 1, "code": str(code), **figures})
                print(f"round {r + 1} {code}: " + ", ".join(f"{k} {v}" for k, v in figures.items()), flush=True)
    result = {"benchmark": "video_io", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "clip": {"size": "1920x1080", "frames": args.frames}, "preset": args.preset,
              "cpu_count": os.cpu_count(), "load_avg_end": os.getloadavg(), "runs": runs}
    print("wrote", write_result(args.out, "video_io", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
