"""The folder benchmark's meters: generator busy time from CUDA events around every call (`BusyMeter`), and
per-thread CPU and process memory sampled during a run (`Sampler`). Shared by throughput.py, video.py and
group_photo.py."""

from __future__ import annotations

import os
import threading

import torch
from timing import Stopwatch


class BusyMeter:
    """Wraps the restore callable: CUDA events around every generator call (evaluated after the run)."""

    def __init__(self, restore):
        self.restore = restore
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.cpu_s = 0.0
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.device.type != "cuda":
            with Stopwatch() as sw:
                y = self.restore(x)
            self.cpu_s += sw.seconds
            return y
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = self.restore(x)
        end.record()
        self.events.append((start, end))
        return y

    def clear(self) -> None:
        self.events, self.cpu_s, self.calls = [], 0.0, 0
        self.origin = None
        if torch.cuda.is_available():
            self.origin = torch.cuda.Event(enable_timing=True)   # t = 0 of the run's GPU timeline
            self.origin.record()

    def seconds(self) -> float:
        if self.events:
            torch.cuda.synchronize()
        return self.cpu_s + sum(s.elapsed_time(e) for s, e in self.events) / 1000.0

    def timeline(self, wall_s: float) -> dict | None:
        """When the generator ran, from the run's start: its first batch, the end of its last one, and its busy
        share of the middle of the run (10-90 % of the wall time), without the ramp-up (first decodes and
        detections) and the drain (last pastes and writes)."""
        if not self.events or self.origin is None:
            return None
        torch.cuda.synchronize()
        spans = sorted((self.origin.elapsed_time(s) / 1000.0, self.origin.elapsed_time(e) / 1000.0)
                       for s, e in self.events)
        lo, hi = 0.1 * wall_s, 0.9 * wall_s
        inside = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)
        return {"first_batch_s": round(spans[0][0], 3), "last_batch_end_s": round(spans[-1][1], 3),
                "gpu_busy_10_90": round(inside / (hi - lo), 3)}


def _thread_cpu_ticks() -> dict[int, int]:
    """CPU time (user + system, clock ticks) of every live thread of this process, by native thread id."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[int(tid)] = int(fields[11]) + int(fields[12])     # utime, stime (fields 14, 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return ticks


def _thread_group(name: str) -> str:
    """gpen-prep17 -> gpen-prep: one row per kind of thread."""
    return name.rstrip("0123456789") or name


class Sampler:
    """Background sampling of host RSS, CPU seconds per kind of thread (is a stage CPU-bound or waiting?), and
    NVML GPU utilisation when pynvml is importable."""

    def __init__(self, device: torch.device, period: float = 0.05):
        self.period = period
        self.rss_peak = 0
        self.util: list[float] = []
        self._ticks0: dict[int, int] = {}
        self._ticks: dict[int, int] = {}
        self._names: dict[int, str] = {}
        self._times0 = os.times()
        self.process_cpu_s = 0.0
        self._stop = threading.Event()
        self._nvml = None
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                idx = device.index if device.index is not None else torch.cuda.current_device()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx))
            except Exception:  # noqa: BLE001 - NVML is optional
                self._nvml = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample_threads(self) -> None:
        if not os.path.isdir("/proc/self/task"):
            return
        for t in threading.enumerate():
            if t.native_id is not None:
                self._names[t.native_id] = _thread_group(t.name)
        self._ticks.update(_thread_cpu_ticks())

    def cpu_by_thread(self) -> dict[str, dict]:
        """CPU seconds during the run per kind of thread (threads not started by Python: "native"), with the
        number of threads; threads that ended between two samples lose their last period."""
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        out: dict[str, dict] = {}
        for tid, ticks in self._ticks.items():
            used = (ticks - self._ticks0.get(tid, 0)) / hz
            if used <= 0:
                continue
            row = out.setdefault(self._names.get(tid, "native"), {"cpu_s": 0.0, "threads": 0})
            row["cpu_s"] += used
            row["threads"] += 1
        return {k: {"cpu_s": round(v["cpu_s"], 2), "threads": v["threads"]}
                for k, v in sorted(out.items(), key=lambda kv: -kv[1]["cpu_s"])}

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        while not self._stop.is_set():
            self._sample_threads()
            try:
                with open("/proc/self/statm") as f:
                    self.rss_peak = max(self.rss_peak, int(f.read().split()[1]) * page)
            except OSError:
                pass
            if self._nvml is not None:
                nv, h = self._nvml
                self.util.append(nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            self._stop.wait(self.period)

    def __enter__(self):
        if os.path.isdir("/proc/self/task"):
            self._ticks0 = _thread_cpu_ticks()
        self._times0 = os.times()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample_threads()
        t1 = os.times()
        self.process_cpu_s = (t1.user - self._times0.user) + (t1.system - self._times0.system)
