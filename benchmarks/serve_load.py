"""Load on `gpen-tune serve`: K concurrent clients on loopback against the same requests sent one at a time, in
one run against a real `gpen-tune serve` child process, interleaved (one at a time, K clients, one at a time, ...:
A/B/A with `--rounds 1`, A/B/A/B/A with 2), so that a machine whose load drifts weighs on both alike.

Reports requests/s, faces/s, p50/p95/p99 latency and faces per generator call (from the server's /metrics) per
phase and per kind over all rounds, and the ratio of the K-client throughput to the one-at-a-time throughput
(requests over wall time, all phases of a kind together; a server's first round of K clients pays its
first-time costs under load, the second is its steady state); the JSON goes to benchmarks/results/
(results_file.write_result). Requests are single-face photos built from the bundled ones
(JPEG, as users send them). Per phase also the CPU time per request of the clients (spread over processes, one per
8 clients, so that their own GIL does not set the pace) and of the server's processes (`server_cores_busy`: how many
cores the service kept busy), and with `--client-ceiling` the load generator's own limit.

CPU, as measured here (2 cores; `--generator-calls 1` for the server's earlier one call at a time):
    python benchmarks/serve_load.py --device cpu --model GPEN-BFR-256 --weights synthetic --clients 4 \\
        --requests 16 --rounds 2

H200 (the target: >= 500 faces/s from 64 concurrent single-face clients, p99 <= 300 ms; `bash
benchmarks/gpu_tables.sh serve` runs exactly this):
    python benchmarks/serve_load.py --device cuda --model GPEN-BFR-512 --weights synthetic --preset speed \\
        --detector mtcnn --clients 64 --requests 2048 --sequential-requests 64 --rounds 2 --batch-size 64 \\
        --max-wait-ms 5
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402
from timing import Stopwatch, py_spy  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLIENTS_PER_PROCESS = 8      # client threads per load process by default (see run_phase)


def photos(count: int) -> list[bytes]:
    """Single-face JPEGs: the bundled astronaut and Grace Hopper at a few sizes (distinct requests)."""
    from gpen_tune.face import samples

    sources = [samples.astronaut(), samples.grace_hopper()]
    out = []
    for i in range(count):
        img = Image.fromarray(sources[i % 2])
        scale = (0.75, 0.875, 1.0)[(i // 2) % 3]
        img = img.resize((int(img.width * scale), int(img.height * scale)))
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def metrics(urls: list[str], name: str) -> float:
    """A counter summed over the replicas."""
    return sum(metric(url, name) for url in urls)


def server_timing(header: str) -> list[tuple[str, float]]:
    """(step, ms) pairs of a `Server-Timing` header ("decode;dur=1.3, detect;dur=87.8, ...")."""
    out = []
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out.append((name, float(dur)))
    return out


def _client_process(urls: list[str], bodies: list[bytes], indices: list[int], threads: int, go: Any, out: Any,
                    params: dict) -> None:
    """One client process: `threads` threads, each with its own connection to one of `urls` (thread i to
    urls[i % len(urls)], as a load balancer spreads connections over replicas), send the bodies named by `indices`
    once `go` is set; (latencies, Server-Timing steps, errors, this process's CPU seconds) go to `out`."""
    latencies: list[float] = []
    steps: dict[str, list[float]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    todo = iter(indices)

    def client(url: str) -> None:
        with httpx.Client(timeout=600) as http:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                with Stopwatch() as sw:
                    r = http.post(f"{url}/v1/enhance", content=bodies[i], headers={"Content-Type": "image/jpeg"},
                                  params=params)
                with lock:
                    latencies.append(sw.seconds)
                    if r.status_code != 200:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                    for name, ms in server_timing(r.headers.get("Server-Timing", "")):
                        steps.setdefault(name, []).append(ms)

    pool = [threading.Thread(target=client, args=(urls[i % len(urls)],)) for i in range(threads)]
    go.wait()
    cpu0 = time.process_time()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    out.put((latencies, steps, errors, time.process_time() - cpu0))


def process_tree_cpu_s(pids: list[int]) -> tuple[float, float]:
    """CPU seconds (user + system) so far of processes `pids` and their direct children (the service's replicas and,
    with --detector-process, their detector processes), and of `pids` alone (the processes whose threads share one
    GIL each), from /proc; 0 where unreadable."""
    tick = os.sysconf("SC_CLK_TCK")
    total = own = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick                     # utime, stime
        if int(stat.parent.name) in pids:
            total, own = total + cpu, own + cpu
        elif int(fields[1]) in pids:                                         # fields[1]: the parent's pid
            total += cpu
    return total, own


def run_phase(urls: list[str], bodies: list[bytes], clients: int, processes: int = 1,
              server_pids: list[int] | None = None, params: dict | None = None) -> dict:
    """Every body once, from `clients` threads (each with its own connection, to the replicas `urls` in turn) spread
    over `processes` client
    processes, so that the load generator is not what sets the pace: against a server that answers at once
    (`--client-ceiling`), 64 clients in one process made 505 requests/s at 3.4 ms of client CPU each, in 8
    processes 749 at 2.3 ms, on 2 cores shared with that server (20261206-161004_serve_load_cpu_GPEN-BFR-256_k64.json).
    Latencies and counts."""
    processes = max(1, min(processes, clients))
    pids = server_pids or []
    calls0, faces0 = metrics(urls, "gpen_serve_generator_calls_total"), metrics(urls, "gpen_serve_faces_total")
    busy0 = metrics(urls, "gpen_serve_generator_seconds_total")
    ctx = multiprocessing.get_context("fork")        # this process has no threads of its own: forking is safe
    go, out = ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_client_process, daemon=True,
                            args=(urls[p % len(urls):] + urls[:p % len(urls)], bodies,
                                  list(range(p, len(bodies), processes)),
                                  clients // processes + (p < clients % processes), go, out, params or {}))
                for p in range(processes)]
    for child in children:
        child.start()
    server_cpu0, main_cpu0 = process_tree_cpu_s(pids)
    with Stopwatch() as phase:
        go.set()
        parts = [out.get() for _ in children]
    server_cpu, main_cpu = (a - b for a, b in zip(process_tree_cpu_s(pids), (server_cpu0, main_cpu0), strict=True))
    for child in children:
        child.join()
    wall = phase.seconds
    latencies = [x for part in parts for x in part[0]]
    steps: dict[str, list[float]] = {}
    for part in parts:
        for name, values in part[1].items():
            steps.setdefault(name, []).extend(values)
    errors = [e for part in parts for e in part[2]]
    client_cpu = sum(part[3] for part in parts)
    calls = metrics(urls, "gpen_serve_generator_calls_total") - calls0
    faces = metrics(urls, "gpen_serve_faces_total") - faces0
    busy = metrics(urls, "gpen_serve_generator_seconds_total") - busy0
    q = np.percentile(latencies, [50, 95, 99])
    return {"clients": clients, "client_processes": processes, "requests": len(bodies), "errors": len(errors),
            "first_errors": errors[:3], "wall_s": round(wall, 3), "requests_per_s": round(len(bodies) / wall, 3),
            "faces_per_s": round(faces / wall, 3), "faces": faces, "generator_calls": calls,
            "faces_per_generator_call": round(faces / calls, 3) if calls else None,
            "generator_s": round(busy, 4),                # 0: no such metric (an older server)
            "generator_call_ms": round(busy * 1000 / calls, 2) if calls and busy else None,
            "generator_busy": round(busy / len(urls) / wall, 3) if busy else None,
            "latency_s": {"p50": round(float(q[0]), 4), "p95": round(float(q[1]), 4), "p99": round(float(q[2]), 4),
                          "mean": round(statistics.mean(latencies), 4)},
            "client_cpu_ms_per_request": round(client_cpu * 1000 / len(bodies), 3),
            "server_cpu_ms_per_request": round(server_cpu * 1000 / len(bodies), 3) if pids else None,
            "server_cores_busy": round(server_cpu / wall, 2) if pids else None,
            "server_main_cpu_ms_per_request": round(main_cpu * 1000 / len(bodies), 3) if pids else None,
            "server_main_cores_busy": round(main_cpu / wall, 2) if pids else None,
            "server_timing_mean_ms": {k: round(statistics.mean(v), 1) for k, v in steps.items()},
            "latencies": [round(x, 4) for x in latencies]}


def _pooled(phases: list[dict]) -> dict:
    """Phases of one kind together: requests over summed wall time, latency percentiles over every request."""
    wall = sum(p["wall_s"] for p in phases)
    requests, faces = sum(p["requests"] for p in phases), sum(p["faces"] for p in phases)
    calls = sum(p["generator_calls"] for p in phases)
    busy = sum(p["generator_s"] for p in phases)
    latencies = [x for p in phases for x in p["latencies"]]
    q = np.percentile(latencies, [50, 95, 99])
    client_cpu = sum(p["client_cpu_ms_per_request"] * p["requests"] for p in phases) / requests
    server_cpu = sum((p.get("server_cpu_ms_per_request") or 0.0) * p["requests"] for p in phases) / requests
    main_cpu = sum((p.get("server_main_cpu_ms_per_request") or 0.0) * p["requests"] for p in phases) / requests
    return {"clients": phases[0]["clients"], "client_processes": phases[0]["client_processes"], "requests": requests,
            "errors": sum(p["errors"] for p in phases), "client_cpu_ms_per_request": round(client_cpu, 3),
            "server_cpu_ms_per_request": round(server_cpu, 3), "server_cores_busy": round(server_cpu * requests / 1000
                                                                                          / wall, 2),
            "server_main_cpu_ms_per_request": round(main_cpu, 3),
            "wall_s": round(wall, 3), "requests_per_s": round(requests / wall, 3),
            "faces_per_s": round(faces / wall, 3), "faces": faces, "generator_calls": calls,
            "faces_per_generator_call": round(faces / calls, 3) if calls else None,
            "generator_call_ms": round(busy * 1000 / calls, 2) if calls and busy else None,
            "latency_s": {"p50": round(float(q[0]), 4), "p95": round(float(q[1]), 4), "p99": round(float(q[2]), 4)}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, cmd: list[str], log: Path | None) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
            raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}\n{tail}")
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{' '.join(cmd)} did not become ready")


def start_server(args: argparse.Namespace, spool: Path) -> tuple[subprocess.Popen, str, list[str], Path]:
    """A `gpen-tune serve` child process (not yet ready: `wait_ready`), its URL, command and log file."""
    port = free_port()
    cmd = [sys.executable, "-m", "gpen_tune", "serve", "--port", str(port), "--spool", str(spool),
           "--model", args.model, "--weights", args.weights, "--device", args.device, "--detector", args.detector,
           "--max-wait-ms", str(args.max_wait_ms), "--max-queue-faces", str(max(256, 4 * args.clients))]
    if args.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    if args.generator_calls:
        cmd += ["--generator-calls", str(args.generator_calls)]
    if args.preset:
        cmd += ["--preset", args.preset]
    if args.detector_process:
        cmd += ["--detector-process"]
    if args.detector_thread:
        cmd += ["--detector-thread"]
    if args.detector_processes:
        cmd += ["--detector-processes", str(args.detector_processes)]
    cmd += shlex.split(args.server_args)
    code = str((args.code or REPO).resolve())                  # whose gpen_tune the server runs
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")])))
    log = spool.parent / f"{spool.name}-server.log"            # the server's own output, shown if it fails
    with log.open("wb") as out:
        # run in the checkout: `python -m` puts its working folder first on sys.path, ahead of PYTHONPATH
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=code)
    return proc, f"http://127.0.0.1:{port}", cmd, log


def client_ceiling(bodies: list[bytes], clients: int, processes: int) -> dict:
    """The load generator's own limit: requests like the run's against `loopback_echo.py` (answers at once), with this
    run's client processes and, for comparison, with all clients in one process."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).with_name("loopback_echo.py")), str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, cmd, None)
        out = {}
        for p in sorted({processes, 1}, reverse=True):
            phase = run_phase([url], bodies, clients, p)
            out[f"{p}_processes"] = {k: phase[k] for k in ("clients", "client_processes", "requests", "wall_s",
                                                            "requests_per_s", "client_cpu_ms_per_request",
                                                            "latency_s")}
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="GPEN-BFR-256")
    ap.add_argument("--weights", default="synthetic")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--detector", default="mtcnn")
    ap.add_argument("--preset", default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--generator-calls", type=int, default=None, help="the server's --generator-calls (default: "
                    "its own)")
    where = ap.add_mutually_exclusive_group()      # neither: the server's default (a process on a GPU)
    where.add_argument("--detector-process", action="store_true", help="the server's --detector-process")
    where.add_argument("--detector-thread", action="store_true", help="the server's --detector-thread")
    ap.add_argument("--detector-processes", type=int, default=None, help="the server's --detector-processes")
    ap.add_argument("--server-args", default="", help="more options of the server (quoted), e.g. an A/B of a flag")
    ap.add_argument("--strength", type=float, default=None,
                    help="the requests' strength (0: no generator call: what the server spends around it)")
    ap.add_argument("--tag", default=None, help="added to the JSON name (e.g. what the server's environment had)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=32, help="requests of the K-client phase")
    ap.add_argument("--sequential-requests", type=int, default=None, help="of each one-at-a-time phase "
                    "(default: --requests)")
    ap.add_argument("--client-processes", type=int, default=None, help="processes the K clients are spread over "
                    "(default: one per 8 clients)")
    ap.add_argument("--client-ceiling", action="store_true", help="first measure the load generator's own limit: "
                    "the K-client phase against a loopback server that answers at once (benchmarks/loopback_echo.py)")
    ap.add_argument("--rounds", type=int, default=2, help="K-client phases, each followed by a one-at-a-time "
                    "phase (the run starts with one)")
    ap.add_argument("--warmup", type=int, default=4, help="requests sent first, not counted")
    ap.add_argument("--py-spy", dest="profile", type=Path, default=None,
                    help="attach py-spy to the ready server (every thread, non-blocking) and write its samples "
                    "here (folded stacks)")
    ap.add_argument("--replicas", type=int, default=1, help="servers started side by side on the same device, each "
                    "with its own port, spool and batcher; clients spread their connections over them as a load "
                    "balancer would (the figures are their sums)")
    ap.add_argument("--code", type=Path, default=None, help="the checkout whose gpen_tune the server runs (default: "
                    "this one; e.g. an earlier commit's tree for a before/after)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    seq_n = args.sequential_requests or args.requests
    bodies = photos(max(args.requests, seq_n))
    processes = args.client_processes or -(-args.clients // CLIENTS_PER_PROCESS)
    ceiling = None
    if args.client_ceiling:                      # at least 16 requests a client: long enough to be a rate
        ceiling = client_ceiling(photos(max(args.requests, 16 * args.clients)), args.clients, processes)
    if ceiling is not None:
        for name, c in ceiling.items():
            print(f"client ceiling ({name.replace('_', ' ')}): {c['requests_per_s']:.1f} req/s, client CPU "
                  f"{c['client_cpu_ms_per_request']:.2f} ms/request", flush=True)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    servers = [start_server(args, tmp / f"gpen-serve-load-{os.getpid()}-{i}") for i in range(max(1, args.replicas))]
    procs, urls, pids = [s[0] for s in servers], [s[1] for s in servers], [s[0].pid for s in servers]
    spy = None                                    # py-spy attached to the first ready server; it writes when it ends
    phases: dict[str, dict] = {}
    ready: dict = {}
    started = time.perf_counter()
    ready_s = None
    try:
        for proc, url, cmd, log in servers:       # started side by side, ready one by one
            wait_ready(proc, url, cmd, log)
        ready_s = round(time.perf_counter() - started, 2)
        if args.profile is not None:
            spy = subprocess.Popen([py_spy(), "record", "--pid", str(pids[0]), "--threads", "--subprocesses",
                                    "--nonblocking", "-f", "raw", "-r", "100", "-o", str(args.profile)])
        workers = int(metric(urls[0], "gpen_serve_generator_workers"))
        ready = httpx.get(f"{urls[0]}/readyz", timeout=10).json()     # what the server chose (request processes)
        params = {} if args.strength is None else {"strength": args.strength}
        run_phase(urls, bodies[: args.warmup], min(args.clients, max(args.warmup, len(urls))), params=params)
        phases = {"one_at_a_time_0": run_phase(urls, bodies[:seq_n], 1, server_pids=pids, params=params)}
        for r in range(1, args.rounds + 1):
            phases[f"concurrent_{r}"] = run_phase(urls, bodies[: args.requests], args.clients, processes, pids,
                                                  params)
            phases[f"one_at_a_time_{r}"] = run_phase(urls, bodies[:seq_n], 1, server_pids=pids, params=params)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=600)
        if spy is not None:
            spy.wait(timeout=120)
        for _, _, _, log in servers:
            if not phases or any(p["errors"] for p in phases.values()):
                print(f"server output (tail):\n{log.read_text(errors='replace')[-4000:]}", file=sys.stderr)
            log.unlink(missing_ok=True)
    kinds = {kind: _pooled([p for name, p in phases.items() if name.startswith(kind)])
             for kind in ("one_at_a_time", "concurrent")}
    given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result = {"benchmark": "serve_load", "command": shlex.join(["python", "benchmarks/serve_load.py", *sys.argv[1:]]),
              "args": given, "client_ceiling": ceiling, "phases": phases, "pooled": kinds,
              "server_generator_calls": workers, "server_request_processes": ready.get("request_processes"),
              "server_ready_s": ready_s,
              "throughput_ratio": round(kinds["concurrent"]["requests_per_s"]
                                        / kinds["one_at_a_time"]["requests_per_s"], 3),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_avg_start_end": os.getloadavg()}}
    replicas = f"_r{args.replicas}" if args.replicas > 1 else ""
    replicas += f"_d{args.detector_processes}" if args.detector_processes else ""
    replicas += f"_{args.tag}" if args.tag else ""
    path = write_result(args.out, f"serve_load_{args.device}_{args.model}_k{args.clients}{replicas}", result)
    for name, p in list(phases.items()) + [(f"all {k}", v) for k, v in kinds.items()]:
        print(f"{name:20s} {p['clients']:3d} clients  {p['requests_per_s']:7.2f} req/s  {p['faces_per_s']:7.2f} "
              f"faces/s  p50 {p['latency_s']['p50'] * 1000:7.0f} ms  p95 {p['latency_s']['p95'] * 1000:7.0f} ms  "
              f"p99 {p['latency_s']['p99'] * 1000:7.0f} ms  faces/call {p['faces_per_generator_call']}  "
              f"call {p.get('generator_call_ms')} ms (busy {p.get('generator_busy')})  "
              f"client CPU {p['client_cpu_ms_per_request']:.2f} ms/request in {p['client_processes']} processes  "
              f"server CPU {p.get('server_cpu_ms_per_request') or 0:.1f} ms/request "
              f"(its main process {p.get('server_main_cpu_ms_per_request') or 0:.1f})  errors {p['errors']}")
    for name, p in phases.items():
        print(f"{name:20s} Server-Timing mean ms: {p['server_timing_mean_ms']}")
    print(f"server request processes: {ready.get('request_processes')}")
    print(f"K-client throughput / one at a time: {result['throughput_ratio']:.2f}x  -> {path}")


if __name__ == "__main__":
    main()
