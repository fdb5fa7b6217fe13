"""Summarise a `py-spy record --gil --threads --format raw` profile of a folder run: where the GIL is held.

Only samples of worker threads (stacks under threading's bootstrap) are counted, so the process start-up (imports,
synthetic weights) does not swamp the run. Writes a small JSON: samples per thread kind, and the functions that
hold the GIL most (inclusive: a function counts once per sample whatever its depth). The raw profile is large and
stays out of the repository; this summary is what benchmarks/RESULTS.md quotes.

    python3 benchmarks/gil_summary.py RAW.txt --command "py-spy record ..." --rate 250 -o summary.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

_FRAME = re.compile(r"(\S+) \((\S+?):(\d+)\)")


def summarise(raw: Path, top: int = 40) -> dict:
    threads: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "Thread._bootstrap" not in stack:
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        threads[re.sub(r"\d+", "N", frames[0].split(": ")[-1])] += n
        seen = set()
        for frame in frames[1:]:
            m = _FRAME.match(frame)
            if m:
                key = f"{m.group(1)} ({m.group(2).split('/')[-1]})"
                if key not in seen:
                    inclusive[key] += n
                    seen.add(key)
    return {
        "worker_thread_samples": total,
        "per_thread_kind": dict(threads.most_common()),
        "top_inclusive": [{"function": k, "samples": v, "share": round(v / total, 3)}
                          for k, v in inclusive.most_common(top)],
    }


def leaves(raw: Path, kinds: list[str], top: int = 25) -> dict:
    """Per thread kind: the innermost Python frames with their line (where the thread was: computing, waiting on
    the GPU, or waiting to get the GIL back after a call that released it). For `--idle` profiles."""
    out: dict[str, collections.Counter] = {k: collections.Counter() for k in kinds}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        kind = re.sub(r"\d+", "N", frames[0].split(": ")[-1])
        if kind not in out:
            continue
        m = _FRAME.match(frames[-1])
        leaf = f"{m.group(1)} ({m.group(2).split('/')[-1]}:{m.group(3)})" if m else frames[-1]
        caller = _FRAME.match(frames[-2]) if len(frames) > 2 else None
        if caller:
            leaf += f" <- {caller.group(1)}:{caller.group(3)}"
        out[kind][leaf] += int(count)
    res = {}
    for kind, counter in out.items():
        total = sum(counter.values())
        res[kind] = {"samples": total, "top": [{"where": k, "samples": v, "share": round(v / max(total, 1), 3)}
                                               for k, v in counter.most_common(top)]}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--command", required=True, help="the py-spy command line that made the profile")
    ap.add_argument("--rate", type=int, required=True, help="py-spy samples per second")
    ap.add_argument("--note", default="")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--leaves", default="", help="comma-separated thread kinds (gpen-gpu,gpen-detect): where each "
                    "was, by innermost frame and line (for py-spy --idle profiles)")
    args = ap.parse_args()
    res = {"benchmark": "gil_profile", "command": args.command, "rate_hz": args.rate, "note": args.note,
           **summarise(args.raw)}
    res["gil_seconds_in_workers"] = round(res["worker_thread_samples"] / args.rate, 2)
    if args.leaves:
        res["benchmark"] = "thread_profile"
        res["leaves"] = leaves(args.raw, args.leaves.split(","))
    args.output.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "top_inclusive"}, indent=1))


if __name__ == "__main__":
    main()
