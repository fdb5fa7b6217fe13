"""One big group photo end to end, warm: seconds per image for decode -> detect -> align -> restore -> paste ->
encode through the serial path (what a single photo takes).

The photo: the 1927 Solvay conference group (29 faces; ../shared/data/solvay_conference_1927.png, or --image),
upscaled x3 (about 6.8 megapixels) so detection, alignment and paste work on a large frame as a user's camera
photo would make them.

    python benchmarks/group_photo.py --model GPEN-BFR-512 --preset speed --repeats 10        # GPU
    python benchmarks/group_photo.py --model GPEN-BFR-256 --preset none --repeats 1          # CPU
    python benchmarks/group_photo.py --model GPEN-BFR-512 --preset speed --parse-mask        # + ParseNet mask

--parse-mask times the pipeline with the ParseNet paste mask (the cached official file, else a seeded random
ParseNet: its cost does not depend on the weights), --no-parse-mask without it; by default it runs as enhance's
does (when its weights are cached). The JSON says which, and the parse step's share of the image.

Writes one JSON to --out (default benchmarks/results/) with the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from meters import Sampler  # noqa: E402
from throughput import environment, metered_pipeline  # noqa: E402
from timing import Stopwatch, bench_device  # noqa: E402

from gpen_tune.face.parse import timing_parse_weights  # noqa: E402
from gpen_tune.pipeline.outputs import OutputNaming  # noqa: E402
from gpen_tune.pipeline.sinks import FileSink  # noqa: E402
from gpen_tune.pipeline.sources import FileSource  # noqa: E402

DEFAULT_IMAGE = ROOT.parent / "shared" / "data" / "solvay_conference_1927.png"
TARGET_S = 0.25


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    ap.add_argument("--scale", type=float, default=3.0, help="upscale factor of the photo (default 3: ~6.8 MP)")
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--weights", default="synthetic")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--preset", default="speed", help="speed | balanced | low-memory | none")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--parse-mask", action=argparse.BooleanOptionalAction, default=None,
                    help="with or without the ParseNet paste mask (default: as enhance, when its weights are cached)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if not args.image.is_file():
        ap.error(f"{args.image}: not found (pass --image)")
    device = bench_device(args.device)
    batch = args.batch or (32 if device.type == "cuda" else 8)
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    work = Path(tempfile.mkdtemp(prefix="gpen-group-"))
    src = cv2.imread(str(args.image))
    big = cv2.resize(src, None, fx=args.scale, fy=args.scale, interpolation=cv2.INTER_CUBIC)
    photo = work / "group.png"
    cv2.imwrite(str(photo), big)

    parse_weights = str(timing_parse_weights()) if args.parse_mask else None
    pipe, detector, restorer, meter, tune_info = metered_pipeline(args.model, args.weights, args.preset, device,
                                                                  batch, parse_mask=args.parse_mask,
                                                                  parse_weights=parse_weights)

    def once(i: int):
        return pipe.run(FileSource([photo]), FileSink(OutputNaming(work / f"out{i}")), serial=True)

    with Stopwatch(device) as warmup:
        first = once(-1)                                    # warm-up: graphs, cuDNN, the detector's first call
    warmup_s = warmup.seconds
    times, stages = [], {}
    meter.clear()
    with Sampler(device) as sampler:
        for i in range(args.repeats):
            with Stopwatch(device) as sw:
                summary = once(i)
            times.append(sw.seconds)
            for k, v in summary.results[0].timings.items():
                stages[k] = stages.get(k, 0.0) + v / args.repeats
    faces = summary.faces
    result = {
        "benchmark": "group_photo", "command": command,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment": environment(device),
        "model": args.model, "weights": args.weights, "tune": tune_info,
        "photo": {"source": args.image.name, "scale": args.scale, "width": big.shape[1], "height": big.shape[0],
                  "megapixels": round(big.shape[0] * big.shape[1] / 1e6, 2), "faces": faces,
                  "faces_first_run": first.faces},
        "warmup_s": round(warmup_s, 2), "repeats": args.repeats,
        "seconds_per_image": {"median": round(float(np.median(times)), 4), "min": round(min(times), 4),
                              "max": round(max(times), 4)},
        "mean_step_s": {k: round(v, 4) for k, v in stages.items()},
        "generator_s_per_image": round(meter.seconds() / args.repeats, 4),
        "parse_mask": parse_mask_info(pipe.parser, stages.get("parse"), float(np.median(times))),
        "peak_host_rss_mib": round(sampler.rss_peak / 2**20, 1),
    }
    if device.type == "cuda":
        result["peak_gpu_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if args.model == "GPEN-BFR-512":
            med = result["seconds_per_image"]["median"]
            result["target"] = {"seconds_per_image": TARGET_S, "got": med, "met": med <= TARGET_S}
    pipe.close()
    detector.close()
    args.out.mkdir(parents=True, exist_ok=True)
    tag = result["environment"].get("gpu", device.type).replace(" ", "-")
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}_group_photo_{tag}_{args.model}.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("photo", "seconds_per_image", "mean_step_s", "parse_mask")}, indent=1))
    print(f"wrote {path}")
    return 0


def parse_mask_info(parser, parse_s: float | None, seconds_per_image: float) -> dict:
    """Whether the paste mask ran, with which weights and dtype, and its step's mean share of the image."""
    if parser is None:
        return {"on": False}
    return {"on": True, "weights": str(parser.weights), "dtype": str(parser.dtype).removeprefix("torch."),
            "s_per_image": None if parse_s is None else round(parse_s, 4),
            "share_of_image": None if parse_s is None else round(parse_s / seconds_per_image, 3)}


if __name__ == "__main__":
    raise SystemExit(main())
