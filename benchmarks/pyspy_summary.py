"""Where each thread's py-spy samples go: a raw profile (`py-spy record -f raw --threads`, as written by
`benchmarks/doors.py --py-spy DIR` and `benchmarks/serve_load.py --py-spy FILE`) summarised into a JSON.

    python benchmarks/pyspy_summary.py PROFILE.folded [...] [--threads gpen-detect,gpen-gpu] [--depth 3]

Per file and per thread (numbered suffixes merged: gpen-prep3 -> gpen-prep; threads of the processes the profiled
one started, with `--subprocesses`, as child/NAME): the samples, and the share of each
stack tail of `--depth` frames (function and line), largest first. Samples count only where the thread was
running Python (py-spy leaves idle threads out), so a share says where a thread's work went, not its wall time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402

THREAD = re.compile(r"(?:^|;)thread \(\d+\): ([^;]*)")
PROCESS = re.compile(r"(?:^|;)process \d+:")


def summarise(path: Path, threads: list[str] | None, depth: int, top: int) -> dict:
    tails: dict[str, Counter] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        match = THREAD.search(stack)    # after any "process PID:CMDLINE" frames (whose command lines may hold ";")
        name = re.sub(r"\d+$", "", match.group(1).strip()) if match else "?"
        if threads and name not in threads:
            continue
        if match and len(PROCESS.findall(stack[: match.start()])) >= 2:
            name = f"child/{name}"      # --subprocesses: a process the profiled one started (its own GIL)
        frames = [f for f in (stack[match.end():] if match else stack).split(";") if f] or ["(no Python frame)"]
        tail = ";".join(f.split(" (")[0] + (":" + f.rsplit(":", 1)[-1].rstrip(")") if " (" in f else "")
                        for f in frames[-depth:])
        tails[name][tail] += int(count)
    out = {}
    for name, counter in sorted(tails.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counter.values())
        out[name] = {"samples": total,
                     "top": [{"share": round(n / total, 3), "stack": s} for s, n in counter.most_common(top)]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", type=Path, nargs="+")
    ap.add_argument("--threads", default=None, help="comma list of thread names (numbers dropped); default all")
    ap.add_argument("--depth", type=int, default=3, help="frames of each stack tail")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--tag", default="pyspy_summary")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    threads = args.threads.split(",") if args.threads else None
    result = {"benchmark": "pyspy_summary", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "profiles": {p.name: summarise(p, threads, args.depth, args.top) for p in args.profiles}}
    print("wrote", write_result(args.out, args.tag, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
