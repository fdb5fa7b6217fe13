"""`gpen_tune.imageio.read_image` of one big photo, checkouts interleaved: the decode step of issue 37's big photo.

    python benchmarks/read_image.py --code ../before --code . [--image solvay_conference_1927.png] [--scale 3]

The photo (the Solvay photo scaled x3, 6.8 MP, as benchmarks/doors.py makes it; the bundled mosaic of 16 faces
scaled to the same size where the Solvay photo is absent) is written once as a PNG by OpenCV. Each round runs one
child process per checkout (its own `gpen_tune`, imported from that folder), which reads the file `--reads` times
after two warm-up reads; the JSON keeps every read's seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from results_file import write_result  # noqa: E402

CHILD = """
import json, sys, time
from pathlib import Path
from gpen_tune.imageio import read_image
path, reads = Path(sys.argv[1]), int(sys.argv[2])
for _ in range(2):
    read_image(path)
times = []
for _ in range(reads):
    start = time.perf_counter()
    read_image(path)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def make_photo(image: Path | None, scale: float, folder: Path) -> Path:
    if image is not None and image.exists():
        src = cv2.imread(str(image))
    else:
        sys.path.insert(0, str(ROOT))
        from gpen_tune.face import samples

        src = cv2.cvtColor(samples.mosaic(16, 0), cv2.COLOR_RGB2BGR)
        src = cv2.resize(src, (1328, 568))
    big = src if scale == 1 else cv2.resize(src, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    path = folder / "big.png"
    cv2.imwrite(str(path), big)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, action="append", required=True, help="a checkout (repeat for an A/B)")
    ap.add_argument("--image", type=Path, default=ROOT.parent / "shared" / "data" / "solvay_conference_1927.png")
    ap.add_argument("--scale", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        photo = make_photo(args.image, args.scale, Path(tmp))
        with Image.open(photo) as im:                         # the header only
            w, h = im.size
        for r in range(args.rounds):
            for code in args.code:
                env = dict(os.environ, PYTHONPATH=str(code.resolve()))
                out = subprocess.run([sys.executable, "-c", CHILD, str(photo), str(args.reads)], env=env,
                                     cwd=code.resolve(), capture_output=True, text=True, check=True)
                times = json.loads(out.stdout)
                runs.append({"round": r + 1, "code": str(code), "read_s": times})
                print(f"round {r + 1} {code}: min {min(times) * 1000:.1f} ms, "
                      f"median {sorted(times)[len(times) // 2] * 1000:.1f} ms", flush=True)
        result = {"benchmark": "read_image", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                  "photo": {"megapixels": round(h * w / 1e6, 2), "bytes": photo.stat().st_size},
                  "load_avg_end": os.getloadavg(), "runs": runs}
    print("wrote", write_result(args.out, "read_image", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
