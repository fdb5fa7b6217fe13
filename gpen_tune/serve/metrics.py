"""The service's Prometheus metrics, in a registry of its own (several apps in one process do not collide)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class ServeMetrics:
    def __init__(self, queue_depth: Callable[[], int], gpu_memory: Callable[[], int],
                 generator_workers: Callable[[], int] = lambda: 0):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gpen_serve_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.latency = Histogram("gpen_serve_request_seconds", "Request latency by endpoint", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.in_progress = Gauge("gpen_serve_requests_in_progress", "Restore requests being served", registry=r)
        self.faces = Counter("gpen_serve_faces", "Faces restored", registry=r)
        self.generator_calls = Counter("gpen_serve_generator_calls", "Generator calls (each a batch of faces)",
                                       registry=r)
        self.generator_seconds = Counter("gpen_serve_generator_seconds", "Seconds spent in generator calls (its "
                                         "rate over time: the fraction of time the generator is busy)", registry=r)
        self.faces_per_call = Histogram("gpen_serve_faces_per_generator_call", "Faces per generator call",
                                        buckets=BATCH_BUCKETS, registry=r)
        self.stage_seconds = Histogram("gpen_serve_stage_seconds", "Seconds each live request spent in each step "
                                       "(decode, detect, align, restore, paste, encode; waits included): where "
                                       "requests wait under load", ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.dropped = Counter("gpen_serve_faces_dropped", "Queued faces dropped (client gone, timeout)", registry=r)
        queue = Gauge("gpen_serve_queue_faces", "Faces waiting for the generator", registry=r)
        queue.set_function(queue_depth)
        memory = Gauge("gpen_serve_gpu_memory_bytes", "GPU memory allocated by this process (0 on the CPU)",
                       registry=r)
        memory.set_function(gpu_memory)
        workers = Gauge("gpen_serve_generator_workers", "Generator calls that may run at once (0 while loading)",
                        registry=r)
        workers.set_function(generator_workers)

    def on_batch(self, faces: int, seconds: float) -> None:
        self.generator_calls.inc()
        self.faces.inc(faces)
        self.generator_seconds.inc(seconds)
        self.faces_per_call.observe(faces)

    def on_restored(self, timings: dict[str, float]) -> None:
        """One image's step times (its Server-Timing header), each into its stage's histogram."""
        for stage, seconds in timings.items():
            self.stage_seconds.labels(stage).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
