"""benchmarks/pyspy_summary.py on py-spy's raw format (`record -f raw --threads --subprocesses`): a thread of the
profiled process, a thread of a process it spawned (whose command line holds a ';'), an idle stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SERVER = 'process 10:"python -m gpen_tune serve --port 1"'
CHILD = 'process 11:"python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=10) --fork"'
RAW = "\n".join([
    f"{SERVER};thread (10): MainThread;BaseEventLoop._run_once (asyncio/base_events.py:1884);"
    "EpollSelector.select (selectors.py:468) 30",
    f"{SERVER};thread (10): MainThread 10",
    f"{SERVER};{CHILD};thread (20): gpen-detect;BatchingDetector._serve (gpen_tune/face/detect/services.py:90);"
    "Conv2d.forward (torch/nn/modules/conv.py:565) 45",
    f"{SERVER};{CHILD};thread (21): gpen-request_3;_decode (gpen_tune/imageio.py:194) 15",
    f"{SERVER};{CHILD};thread (22): gpen-request_12;_decode (gpen_tune/imageio.py:194) 5",
])


def summarise(path: Path, *args: str) -> dict:
    """The script as run (a child process: its folder on sys.path would shadow the tests' own modules)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pyspy_summary.py"), str(path), *args,
                           "--out", str(path.parent / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (written,) = (path.parent / "out").glob("*.json")
    result = json.loads(written.read_text())["profiles"][path.name]
    written.unlink()
    return result


def test_threads_of_spawned_processes_are_named_apart_and_numbers_merge(tmp_path):
    path = tmp_path / "serve.folded"
    path.write_text(RAW + "\n")
    out = summarise(path, "--depth", "2", "--top", "5")
    assert {k: v["samples"] for k, v in out.items()} == {"child/gpen-detect": 45, "MainThread": 40,
                                                         "child/gpen-request_": 20}
    assert out["child/gpen-detect"]["top"] == [{"share": 1.0, "stack": "BatchingDetector._serve:90;"
                                                                         "Conv2d.forward:565"}]
    main = {t["stack"]: t["share"] for t in out["MainThread"]["top"]}
    assert main == {"BaseEventLoop._run_once:1884;EpollSelector.select:468": 0.75, "(no Python frame)": 0.25}
    assert summarise(path, "--threads", "gpen-detect", "--depth", "1").keys() == {"child/gpen-detect"}
