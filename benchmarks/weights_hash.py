"""What checking a weights file on every load costs: sha256 of the file and the non-finite scan of its tensors,
next to the load itself (torch.load with weights_only=True, and the whole `load_model` on the CPU).

Writes synthetic checkpoints in the official key layout for GPEN-BFR-256/512/1024/2048 into a temp folder, then
times each step (best of --repeats, warm page cache: the file was just written or read, as on a second run).
No assertions on timing.

    PYTHONPATH=$PWD python3 benchmarks/weights_hash.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import best_seconds  # noqa: E402

from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.model.configs import MODELS  # noqa: E402
from gpen_tune.weights.checkpoint import find_non_finite, synthetic_state_dict  # noqa: E402
from gpen_tune.weights.download import file_sha256  # noqa: E402

MODEL_NAMES = ("GPEN-BFR-256", "GPEN-BFR-512", "GPEN-BFR-1024", "GPEN-BFR-2048")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(name: str, folder: Path, repeats: int) -> dict:
    cfg = MODELS[name].config
    path = folder / MODELS[name].filename
    torch.save(synthetic_state_dict(cfg), path)
    size = path.stat().st_size
    sha_s = best_seconds(lambda: file_sha256(path), repeats)
    load_s = best_seconds(lambda: torch.load(path, map_location="cpu", weights_only=True), repeats)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    finite_s = best_seconds(lambda: find_non_finite(sd), repeats)
    model_s = best_seconds(lambda: load_model(path, name), repeats)
    path.unlink()
    return {
        "model": name, "file_mb": round(size / 1e6, 1),
        "sha256_s": round(sha_s, 3), "sha256_gb_s": round(size / sha_s / 1e9, 2),
        "torch_load_s": round(load_s, 3), "non_finite_scan_s": round(finite_s, 3),
        "load_model_s": round(model_s, 3),
        "sha256_pct_of_load_model": round(100 * sha_s / model_s, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (the non-finite scan uses them)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res: dict = {"benchmark": "weights_hash", "command": "python3 " + shlex.join(sys.argv),
                 "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": args.threads,
                 "torch": torch.__version__, "python": platform.python_version(),
                 "openssl": getattr(hashlib, "openssl_version", None) or __import__("ssl").OPENSSL_VERSION,
                 "note": "warm page cache; load_model builds the module tree and checks keys, shapes and values",
                 "models": []}
    with tempfile.TemporaryDirectory(prefix="gpen-tune-hash-") as tmp:
        for name in MODEL_NAMES:
            row = measure(name, Path(tmp), args.repeats)
            print(json.dumps(row))
            res["models"].append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    dest = args.out / f"{stamp}_weights_hash_cpu.json"
    dest.write_text(json.dumps(res, indent=1) + "\n")
    print(dest)


if __name__ == "__main__":
    main()
