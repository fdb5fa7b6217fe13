"""--cuda-graph: replay the generator from CUDA Graphs captured per (batch bucket, size, dtype).

What changes: the first batch of each bucket (the restorer's table: 1, 2, 4, 8, 16, 32, 64) runs eager, so a
one-shot run (one photo) never waits on a capture it will not replay; the second is padded up to the bucket, the
module runs a few warm-up calls on a side stream (cuDNN / Inductor choose their kernels outside the capture), then
one call is captured with static input/output buffers (in thread-local capture mode: the pipeline's other threads
go on issuing CUDA work on their own streams meanwhile). Every later call copies its batch into
the static input, zeroes the padding rows, replays the graph and returns a clone of the rows it asked for (the
static output is overwritten by the next replay). Batches above the largest bucket are run in bucket-sized chunks.
All buckets share one private memory pool: only one graph runs at a time and each output is cloned out right
after its replay, so a later capture may reuse an earlier graph's scratch memory (peak = the largest graph, not
the sum).
Why it helps: at batch 1 GPEN launches hundreds of small kernels; the CPU cannot launch them as fast as the GPU
runs them. A graph replay is one launch (upstream on an H200: launches dominate small batches).
With --compile: "reduce-overhead" and "max-autotune" already replay through CUDA graphs (Inductor's
triton.cudagraphs), so no manual capture is done (no capture twice); with "default" the compiled module is what
gets captured.
Warm-up and capture run inside `fir_triton.for_graph_capture()`: every 4x4 FIR of the plain model takes the Triton
kernel there (a replay pays no launch cost; eager calls keep PyTorch's conv for small tensors), measured 5.65 ->
4.89 ms per GPEN-512 bs1 replay in fp32 (plain_bs1_20261130T222113Z).
Tolerance: the same function; fp32 rounding differs from eager where the FIR kernel does (bench: <= 2e-3 max-abs).
Fallback: an out-of-memory error during capture or replay drops that graph and raises, so the restorer splits the
batch (the bucket shrinks with it) and records it; any other capture error falls back to running the module
without graphs (recorded). On the CPU: skipped with the message from `is_supported`.
"""

from __future__ import annotations

import bisect
import ctypes
import gc
import threading
import time
from collections.abc import Callable

import torch

from gpen_tune.ops import fir_triton
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.oom import is_out_of_memory
from gpen_tune.tune.options import TuneConfig

WARMUP_CALLS = 2


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    device = torch.device(device)
    if device.type != "cuda":
        return f"CUDA Graphs need a CUDA device; running on {device.type} without graph capture"
    if not torch.cuda.is_available():
        return "CUDA Graphs need a CUDA device, and CUDA is not available"
    return None


# torch.compile modes whose Inductor output already replays CUDA graphs (torch._inductor.list_mode_options):
# capturing them again by hand would capture twice
COMPILE_MODES_WITH_GRAPHS = ("reduce-overhead", "max-autotune")


def compile_already_graphs(cfg: TuneConfig) -> bool:
    return cfg.compile in COMPILE_MODES_WITH_GRAPHS


# Held by every capture and by every device-wide call (synchronize, empty_cache) of the pipeline's threads: a
# capture's own entry synchronizes and empties the cache, and a device-wide call from another thread during a
# capture breaks it ("operation not permitted when stream is capturing", thread-local mode or not); two captures
# at once would also interleave registering PyTorch's default CUDA generator with their graphs.
CAPTURE_LOCK = threading.RLock()


def settle(device: torch.device | None = None, *, sync: bool = True, free: bool = True) -> None:
    """Synchronize the device and/or return the allocator's cached memory, never while a graph is being captured
    in another thread."""
    if not torch.cuda.is_available():
        return
    with CAPTURE_LOCK:
        if sync:
            torch.cuda.synchronize(device)
        if free:
            torch.cuda.empty_cache()


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """A new stream to capture on, outside PyTorch's stream pool; each capturing owner keeps its own.

    Why: `torch.cuda.Stream()` hands out one of a small pool of streams round-robin, so a pipeline thread's own
    stream (detector, upload, paste) can be the very stream a capture runs on; that thread's next copy then fails
    ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"), and its image with it. A stream made
    by cudaStreamCreateWithFlags (non-blocking) is shared with no one. Falls back to a pooled stream when the CUDA
    runtime library cannot be opened by name."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _private_stream(index) or torch.cuda.Stream(device=index)


def _private_stream(index: int) -> torch.cuda.Stream | None:
    major = (torch.version.cuda or "12").split(".")[0]
    for name in (f"libcudart.so.{major}", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        handle = ctypes.c_void_p()
        with torch.cuda.device(index):
            torch.cuda.init()
            if cudart.cudaStreamCreateWithFlags(ctypes.byref(handle), 1) != 0:     # 1: cudaStreamNonBlocking
                return None
        return torch.cuda.ExternalStream(handle.value, device=torch.device("cuda", index))
    return None


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, static_in: torch.Tensor, static_out: torch.Tensor,
                 seconds: float):
        self.graph = graph
        self.static_in = static_in
        self.static_out = static_out
        self.seconds = seconds


class GraphedForward:
    """A callable replaying per-bucket CUDA graphs of `module` (which maps [B,3,S,S] -> [B,3,S,S])."""

    def __init__(self, module: Callable[[torch.Tensor], torch.Tensor], buckets: tuple[int, ...],
                 on_fallback: Callable[[str], None] | None = None):
        self.module = module
        self.buckets = tuple(sorted(buckets))
        self.on_fallback = on_fallback
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: set[tuple] = set()
        self.pool = None
        self.stream: torch.cuda.Stream | None = None
        self.disabled: str | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.disabled is not None or x.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return self.module(x)
        top = self.buckets[-1]
        if x.shape[0] > top:
            return torch.cat([self(chunk) for chunk in x.split(top)])
        n = x.shape[0]
        bucket = self.buckets[bisect.bisect_left(self.buckets, n)]     # smallest bucket >= n
        key = (bucket, tuple(x.shape[1:]), x.dtype, x.device)
        entry = self.graphs.get(key)
        if entry is None:
            if key not in self.seen:            # first use of this bucket: eager (a one-shot run never captures)
                self.seen.add(key)
                return self.module(x)
            try:
                entry = self._capture(key)
            except Exception as e:
                if is_out_of_memory(e):
                    raise
                self.disabled = f"CUDA graph capture failed, running without graphs: {type(e).__name__}: " \
                                f"{(str(e).splitlines() or [''])[0][:200]}"
                if self.on_fallback is not None:
                    self.on_fallback(self.disabled)
                return self.module(x)
            self.graphs[key] = entry
        entry.static_in[:n].copy_(x)
        if n < bucket:
            entry.static_in[n:].zero_()
        entry.graph.replay()
        return entry.static_out[:n].clone()

    def _capture(self, key: tuple) -> _Captured:
        bucket, shape, dtype, device = key
        start = time.perf_counter()
        with torch.inference_mode(False):  # a normal tensor: refillable inside and outside inference_mode
            static_in = torch.zeros((bucket, *shape), dtype=dtype, device=device)
        graph = torch.cuda.CUDAGraph()
        try:
            with fir_triton.for_graph_capture():    # replays pay no launch cost: the GPU-cheaper FIR everywhere
                static_out = self._warm_and_capture(graph, static_in, device)
        except BaseException:
            del graph, static_in
            gc.collect()
            settle(sync=False)
            raise
        return _Captured(graph, static_in, static_out, time.perf_counter() - start)

    def _warm_and_capture(self, graph: torch.cuda.CUDAGraph, static_in: torch.Tensor, device: torch.device
                          ) -> torch.Tensor:
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):   # with the FIR kernels a replay takes (the eager first use did not)
                self.module(static_in)
        torch.cuda.current_stream(device).wait_stream(side)
        settle(device, free=False)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # thread_local: the pipeline's other threads (detector, paste, decode) keep issuing CUDA work on their own
        # streams while this thread captures; the default "global" mode fails their calls and the capture with them
        if self.stream is None:
            self.stream = capture_stream(device)
        with CAPTURE_LOCK, torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                                            capture_error_mode="thread_local"):
            static_out = self.module(static_in)
        settle(device, free=False)
        return static_out

    def reset(self) -> None:
        """Drop every graph and its memory (e.g. after an OOM); the next capture takes a new pool (the old one is
        released with its last graph, and capturing into it again trips PyTorch's allocator)."""
        self.graphs.clear()
        self.pool = None
        gc.collect()
        settle(sync=False)


def apply(done: Applied) -> None:
    """Wrap the forward so far in per-bucket graphs (done.buckets: the restorer's table), unless the compile mode
    already replays CUDA graphs."""
    if done.on("compile") and compile_already_graphs(done.cfg):
        done.notes.append(f"cuda_graph: --compile {done.cfg.compile} already replays CUDA graphs; "
                          "no second manual capture")
        return
    done.forward = GraphedForward(done.forward, buckets=done.buckets, on_fallback=done.log.append)
