"""Does the same video command write the same pixels twice? The same frames written N times by `VideoWriter`
(libx264, crf 18, the speed preset asked for), and by bare PyAV with the writer's options but x264's own choice of
instruction sets (the writer keeps it off AVX-512: `gpen_tune.video.x264_cpu`), alone and with each
`--x264-params` setting added (default: the macroblock-tree rate control off, `mbtree=0`): how many different
decoded outputs, how far apart, file size, PSNR against the frames written, and frames per second.

    python benchmarks/encoder_repeat.py [--size 640x360] [--frames 48] [--writes 10] [--preset medium]

The frames are benchmarks/video.py's "one face" clip (the astronaut, or `--image`, drifting on a grey canvas) with
light sensor noise. Writes one JSON to --out (default benchmarks/results/) and prints a table.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import av
import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from clip_files import decoded, pan_frames, psnr, write_clip  # noqa: E402
from results_file import write_result  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.video.encoders import quality_options  # noqa: E402
from gpen_tune.video.reader import Frame, VideoReader, probe  # noqa: E402
from gpen_tune.video.writer import VideoWriter  # noqa: E402


def write_with_writer(path: Path, source: Path, frames: list[Frame], preset: str) -> None:
    """As `gpen-tune enhance` writes a video: the source's `VideoInfo`, its frames with their pts."""
    with VideoWriter(path, probe(source), encoder_preset=preset, copy_streams=False, notify=lambda m: None) as writer:
        for frame in frames:
            writer.write(frame.image, frame.pts)


def repeat(write, frames: list[np.ndarray], writes: int, folder: Path) -> dict:
    """`write` the frames `writes` times: distinct outputs (decoded pixels and file bytes), the largest pixel
    difference from the first output, mean size, PSNR of the first output, frames per second."""
    outputs, files, sizes, seconds, first, apart = {}, set(), [], [], None, 0
    for k in range(writes):
        path = folder / f"out{k}.mp4"
        start = time.perf_counter()
        write(path)
        seconds.append(time.perf_counter() - start)
        data = path.read_bytes()
        files.add(hashlib.sha256(data).hexdigest())
        sizes.append(len(data))
        pixels = np.stack(decoded(path))
        digest = hashlib.sha256(pixels.tobytes()).hexdigest()
        outputs[digest] = outputs.get(digest, 0) + 1
        if first is None:
            first = pixels
        else:
            apart = max(apart, int(np.abs(pixels.astype(np.int16) - first).max()))
        path.unlink()
    return {"distinct_outputs": len(outputs), "output_counts": sorted(outputs.values(), reverse=True),
            "distinct_files": len(files), "max_pixel_difference": apart, "mean_bytes": round(float(np.mean(sizes))),
            "psnr_db": psnr(first, np.stack(frames)),
            "fps": round(len(frames) / float(np.median(seconds)), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="640x360", help="frame size WxH")
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--writes", type=int, default=10, help="times each way writes the same frames")
    ap.add_argument("--preset", default="medium", help="x264 speed preset (the writer's default: medium)")
    ap.add_argument("--x264-params", nargs="*", default=["mbtree=0"],
                    help="x264 settings tried one at a time on top of the writer's options (asm=auto: x264's own "
                         "instruction sets again, for an A/B/A)")
    ap.add_argument("--image", type=Path, help="the photo the frames are made from (default: the astronaut)")
    ap.add_argument("--ab-rounds", type=int, default=0,
                    help="then x264's own instruction sets against the writer's list this many times, alternating")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    photo = samples.astronaut() if args.image is None else cv2.cvtColor(cv2.imread(str(args.image)), cv2.COLOR_BGR2RGB)
    frames = list(pan_frames(photo, args.frames, (w, h), noise=2.0))
    options = quality_options("libx264", None, args.preset)
    own = {k: v for k, v in options.items() if k != "x264-params"}       # x264 picks its instruction sets
    tmp = tempfile.TemporaryDirectory()
    source = Path(tmp.name) / "source.mp4"
    write_clip(source, frames, options={"qp": "0"})     # lossless in YUV: the writer's source and `VideoInfo`
    read = list(VideoReader(source))
    frames = [f.image for f in read]                    # what every way writes, and what PSNR compares against
    ways = {"writer": lambda p: write_with_writer(p, source, read, args.preset),
            "x264 own sets": lambda p: write_clip(p, frames, options=own)}
    host = options.get("x264-params")                   # the writer's instruction sets (None: x264's own)
    extras = args.x264_params + (["asm=auto", host] * args.ab_rounds if host else [])
    for extra in extras:                                 # a setting named again is timed again (A/B/A)
        name = f"x264 own sets, {extra}"
        name += f" #{sum(k.startswith(name) for k in ways) + 1}" if name in ways else ""
        ways[name] = lambda p, extra=extra: write_clip(p, frames, options=own | {"x264-params": extra})
    rows = {}
    with tmp:
        for name, write in ways.items():
            rows[name] = repeat(write, frames, args.writes, Path(tmp.name))
            r = rows[name]
            print(f"{name:28s} {r['distinct_outputs']:3d} different outputs in {args.writes} writes "
                  f"(max {r['max_pixel_difference']} grey levels apart)  {r['mean_bytes']:9d} bytes  "
                  f"PSNR {r['psnr_db']:.2f} dB  {r['fps']:.1f} fps", flush=True)
    result = {"benchmark": "encoder_repeat", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "clip": {"size": f"{w}x{h}", "frames": args.frames, "noise": 2.0}, "writes": args.writes,
              "options": options, "x264_own_sets_options": own,
              "av": av.__version__, "libavcodec": av.library_versions.get("libavcodec"),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_end": os.getloadavg()},
              "rows": rows}
    print("wrote", write_result(args.out, "encoder_repeat", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
