"""The host's per-face steps on real photos, checkouts interleaved A/B/A: finding the faces (the offline MTCNN on
the CPU, as `enhance` calls it, one torch thread), cutting them (`gpen_tune.face.align.cut_faces`) and pasting
them back (`gpen_tune.face.paste.paste_faces`).

The faces are the detections aligned as `gpen-tune enhance` aligns them; each restored face is its own aligned
crop with its pixels reversed (so the paste changes the image). Cases: the service's request (one face of the
bundled astronaut, 512 crop), the bundled photos' 12-face mosaic, and `--image` (e.g. the Solvay photo). Each
checkout runs in a fresh process per round; every round's detections, crops and pastes must be the same in every
checkout (a checksum per case and step), else the run fails. `--beside N`: the steps timed beside N threads that
only hold the GIL, at the service's GIL switch interval (a request process's other requests under load).

    python benchmarks/host_faces.py --code <checkout A> --code <checkout B> [--image solvay.png] [--rounds 3]
        [--beside 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402
from timing import gil_holders  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def cases(det: Any, image: Path | None, size: int) -> dict:
    """name -> (image [H, W, 3] uint8, each face's alignment affine): `det`'s faces aligned as `enhance` aligns."""
    from gpen_tune.face import samples
    from gpen_tune.face.align import alignment
    from gpen_tune.imageio import read_image

    photos = {"one face (astronaut)": samples.astronaut(), "mosaic, 12 faces": samples.mosaic(12, 0)}
    if image is not None:
        photos[image.name] = read_image(str(image)).rgb
    found = det.detect(list(photos.values()))
    return {name: (img, [alignment(d.landmarks, size)[0] for d in dets])
            for (name, img), dets in zip(photos.items(), found, strict=True)}


def timed(step, repeats: int) -> tuple[Any, dict]:
    """step()'s result and its median / best time in ms over `repeats` calls after a first."""
    out = step()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return out, {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3}


def child(args: argparse.Namespace) -> None:
    """In a checkout's process: time detection, `cut_faces` and `paste_faces` per case; print one JSON line."""
    import cv2
    import torch

    from gpen_tune.face.detect import init_detector
    from gpen_tune.pipeline.threads import SWITCH_INTERVAL_S

    cv2.setNumThreads(args.cv_threads)
    torch.set_num_threads(args.torch_threads)
    if args.beside:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    det = init_detector("mtcnn", device="cpu")
    result = {}
    try:
        for name, (img, affines) in cases(det, args.image, args.size).items():
            with gil_holders(args.beside):
                result[name] = steps(det, img, affines, args)
    finally:
        det.close()
    print(json.dumps(result))


def steps(det: Any, img: Any, affines: list, args: argparse.Namespace) -> dict:
    """The timings and checksums of one photo's detection, cut and paste."""
    import numpy as np

    from gpen_tune.face.align import cut_faces, invert_affine
    from gpen_tune.face.paste import PasteFace, paste_faces

    found, detect = timed(lambda: det.detect([img])[0], args.detect_repeats)
    crops, cut = timed(lambda: cut_faces(img, affines, args.size), args.repeats)
    faces = [PasteFace(np.ascontiguousarray(c[:, ::-1]), invert_affine(a)) for c, a in zip(crops, affines,
                                                                                             strict=True)]
    out, paste = timed(lambda: paste_faces(img, faces, 1.0), args.repeats)
    boxes = np.array([np.r_[d.box, d.score, np.ravel(d.landmarks)] for d in found], np.float64)
    crops_sum = hashlib.sha256(b"".join(c.tobytes() for c in crops)).hexdigest()
    return {"faces": len(affines), "pixels": img.shape[0] * img.shape[1],
            "detect": {**detect, "sha256": hashlib.sha256(boxes.tobytes()).hexdigest()},
            "cut": {**cut, "sha256": crops_sum},
            "paste": {**paste, "sha256": hashlib.sha256(out.tobytes()).hexdigest()}}


def commit(code: Path) -> str:
    """The checkout's commit (with "+changes" where its gpen_tune differs), or its folder's name (an archive)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(code), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != code:
        return code.name                                  # not a checkout of its own: an archive's folder
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "gpen_tune") else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, action="append", default=None,
                    help="a checkout whose gpen_tune is timed (repeat for A/B; default: this one)")
    ap.add_argument("--image", type=Path, default=None, help="another photo to find, cut and paste faces in")
    ap.add_argument("--size", type=int, default=512, help="the crop size (the generator's)")
    ap.add_argument("--repeats", type=int, default=50, help="timed calls of the cut and the paste")
    ap.add_argument("--detect-repeats", type=int, default=10, help="timed calls of the detector")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch's threads (1: as a threaded run's detector)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cv-threads", type=int, default=1, help="OpenCV's threads (1: as one request's thread)")
    ap.add_argument("--beside", type=int, default=0, help="threads holding the GIL while the steps run")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    codes = [c.resolve() for c in (args.code or [REPO])]
    argv = sys.argv[1:]
    own = ["--size", str(args.size), "--repeats", str(args.repeats), "--cv-threads", str(args.cv_threads),
           "--beside", str(args.beside), "--detect-repeats", str(args.detect_repeats),
           "--torch-threads", str(args.torch_threads)]
    if args.image is not None:
        own += ["--image", str(args.image.resolve())]
    runs = []
    for r in range(args.rounds):
        for code in codes:
            env = dict(os.environ, PYTHONPATH=str(code))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", *own]
            done = subprocess.run(cmd, env=env, cwd=code, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{code}: the timing process failed:\n{done.stderr}")
            runs.append({"round": r + 1, "code": str(code), "commit": commit(code),
                         "cases": json.loads(done.stdout.splitlines()[-1])})
            print(f"round {r + 1} {runs[-1]['commit']}: " + ", ".join(
                f"{k} detect {v['detect']['median_ms']:.1f} / cut {v['cut']['median_ms']:.2f} / paste "
                f"{v['paste']['median_ms']:.2f} ms"
                for k, v in runs[-1]["cases"].items()), flush=True)
    sums = {(name, step, case[step]["sha256"]) for run in runs for name, case in run["cases"].items()
            for step in ("detect", "cut", "paste")}
    same = len(sums) == 3 * len(runs[0]["cases"])
    result = {"command": "python benchmarks/" + Path(__file__).name + " " + shlex.join(argv),
              "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
              "load_1min": os.getloadavg()[0], "same_pixels_in_every_run": same, "runs": runs}
    path = write_result(args.out, "host_faces" + (f"_{args.tag}" if args.tag else ""), result)
    print(f"the same faces, crops and pixels in every run: {same}\n{path}")
    if not same:
        sys.exit("the checkouts found, cut or pasted differently")


if __name__ == "__main__":
    main()
