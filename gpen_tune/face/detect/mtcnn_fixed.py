"""The P-Net stage of the batched MTCNN driver (mtcnn_batched.py) on a fixed canvas per batch bucket, replayed
from CUDA graphs: what makes the detector's P-Net one launch per batch instead of ~2,000."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from gpen_tune.face.detect.mtcnn_batched import (
    PNET_MAX_PIXELS,
    PNetMaps,
    _Chunk,
    _chunk_table,
    pnet_maps,
    pyramid_scales,
)
from gpen_tune.ops import area_resize as area_ops
from gpen_tune.ops.area_resize import integral
from gpen_tune.tune.cuda_graph import CAPTURE_LOCK, capture_stream


class FixedCanvasPNet:
    """The P-Net stage for batches of images up to `side` x `side`, on a fixed canvas per (batch bucket, canvas
    shape), replayed from one CUDA graph each (on CUDA, captured on its second batch, since a capture costs more
    than the eager call it replaces and a one-photo command never reuses it; eager elsewhere, which the CPU tests
    use).

    Why: P-Net over a pyramid of ~11 scales is ~2,000 small kernels per batch, launched from Python one by one:
    the detector call was host-bound (75 ms alone for 21 photos, 33 ms of it GPU time; H200,
    20261201-041142_detector_contention) and, worse, each launch needs the GIL, which a busy folder run holds
    elsewhere. A replay is one launch.
    How the plan is made fixed: every image of the bucket is a plane at every scale of the canvas (the largest
    pyramid any image that fits can have), on a level of that scale's canvas size. An image whose own pyramid stops
    earlier, and the padding slots of the bucket, get a 1 x 1 level there: no P-Net cell at all, so no candidate.
    Each real plane keeps its own level size (facenet's int(h * scale + 1)), area-resized from the image's own
    pixels, so every image gets the cells it gets alone; only the canvas (zero padding) is larger, which changes
    no cell the image has (see pnet_forward). Images are copied into one pinned host canvas and uploaded with one
    copy; the pixels outside an image are never read (area_resize masks them).
    Canvas shapes: P-Net's work is the canvas's pixels, so a batch runs on the smallest canvas holding its images,
    each side rounded up to a multiple of side / CANVAS_STEPS (a 1,024 x 576 video frame: 1,024 x 640, not 1,024
    x 1,024; a 512 x 600 photo: 640 x 512). Memory: one graph pool shared by every plan (one replay at a time,
    outputs consumed before the next); plans beyond `max_kept_bytes` of buffers are dropped, least recently used
    first.
    """

    BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
    CANVAS_STEPS = 8                    # canvas sides are multiples of side / 8
    MAX_KEPT_BYTES = 3 * 2**30          # default bound of the plans' own buffers (canvases, tables, maps) kept

    def __init__(self, pnet: torch.nn.Module, side: int, min_face: float, threshold: float, factor: float,
                 graphs: bool | None = None, max_batch: int = 32, area: area_ops.Impl = "auto",
                 max_kept_bytes: int = MAX_KEPT_BYTES):
        self.max_kept_bytes = int(max_kept_bytes)
        self.buckets = tuple(b for b in self.BUCKETS if b < max_batch) + (int(max_batch),)
        self.pnet, self.side = pnet, int(side)
        self.step = -(-self.side // self.CANVAS_STEPS)
        self.min_face, self.threshold, self.factor = float(min_face), float(threshold), float(factor)
        self.device = next(pnet.parameters()).device
        self.dtype = next(pnet.parameters()).dtype
        self.graphs = self.device.type == "cuda" if graphs is None else bool(graphs)
        self.scales = pyramid_scales(self.side, self.min_face, self.factor)   # of the largest canvas
        self._slots: OrderedDict[tuple[int, int, int], _FixedSlot] = OrderedDict()   # (bucket, h, w), LRU last
        self._pool = None
        self._capture_stream: torch.cuda.Stream | None = None
        self._host: torch.Tensor | None = None          # pinned uint8, viewed as [bucket, h, w, 3] per call
        self._uploaded: torch.cuda.Event | None = None   # the last upload from _host (reused only after it)
        self.replays = 0
        self.area = area                                 # area-resize implementation (captured into the graphs)

    def fits(self, images: Sequence[np.ndarray]) -> bool:
        return (0 < len(images) <= self.buckets[-1] and bool(self.scales)
                and all(img.shape[0] <= self.side and img.shape[1] <= self.side for img in images))

    def canvas_for(self, images: Sequence[np.ndarray]) -> tuple[int, int]:
        """(h, w) of the canvas a batch runs on: its largest height and width, each rounded up to a step."""
        h = max(img.shape[0] for img in images)
        w = max(img.shape[1] for img in images)
        return min(self.side, -(-h // self.step) * self.step), min(self.side, -(-w // self.step) * self.step)

    def __call__(self, images: Sequence[np.ndarray]) -> PNetMaps:
        n = len(images)
        bucket = next(b for b in self.buckets if b >= n)
        key = (bucket, *self.canvas_for(images))
        slot = self._slot(key)
        sizes = np.array([img.shape[:2] for img in images], dtype=np.int64)
        padded = np.zeros((bucket, 2), np.int64)
        padded[:n] = sizes
        host = self._host_canvas(*key)
        pixels = host.numpy()
        for i, img in enumerate(images):                      # the rest of each slot is never read
            pixels[i, :img.shape[0], :img.shape[1]] = img
        small = np.concatenate([padded.reshape(-1), self._planes(padded, slot.scales).reshape(-1)])
        slot.canvas.copy_(host, non_blocking=True)
        slot.small.copy_(_pinned(small), non_blocking=True)
        if self.device.type == "cuda":
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()
        if self.graphs and slot.graph is None and slot.uses > 0:
            slot.graph, slot.outputs = self._capture(slot)    # a plan's second batch: a one-shot photo captures none
        slot.uses += 1
        if slot.graph is not None:
            slot.graph.replay()
            self.replays += 1
        else:
            slot.outputs = self._compute(slot)
        table, mask, feats, edges = slot.outputs
        return PNetMaps(table, sizes, slot.hw, slot.planes, slot.chunk_table, mask, feats, edges)

    def capture_all(self) -> None:
        """Build (and on CUDA capture) every bucket's full-size canvas now rather than at its second batch."""
        for bucket in self.buckets:
            slot = self._slot((bucket, self.side, self.side))
            if self.graphs and slot.graph is None:
                slot.graph, slot.outputs = self._capture(slot)

    # -- plan ----------------------------------------------------------------------------------------------------
    def _chunks(self, bucket: int, h: int, w: int, scales: list[float]) -> list[_Chunk]:
        """Per scale, the bucket's images on that scale's canvas, in calls of at most PNET_MAX_PIXELS (float32)."""
        budget = PNET_MAX_PIXELS * 4 // self.dtype.itemsize
        chunks, n = [], 0
        for scale in scales:
            level_h, level_w = int(h * scale + 1), int(w * scale + 1)
            per_call = max(1, budget // (level_h * level_w))
            for start in range(0, bucket, per_call):
                k = min(per_call, bucket - start)
                chunks.append(_Chunk(scale, n, n + k, level_h, level_w))
                n += k
        return chunks

    def _planes(self, sizes: np.ndarray, scales: list[float]) -> np.ndarray:
        """[bucket * scales, 3] (image id, level h, level w) in the fixed chunk order; 1 x 1 where the image's own
        pyramid has no such scale (or the slot is padding)."""
        n_scales = np.array([len(pyramid_scales(min(h, w), self.min_face, self.factor)) for h, w in sizes])
        rows = []
        for k, scale in enumerate(scales):
            level = (sizes * scale + 1).astype(np.int64)               # facenet's int(h * scale + 1)
            level[n_scales <= k] = 1
            rows.append(np.column_stack([np.arange(len(sizes)), level]))
        return np.concatenate(rows)

    # -- buffers, capture ------------------------------------------------------------------------------------------
    def _host_canvas(self, bucket: int, h: int, w: int) -> torch.Tensor:
        if self._uploaded is not None:
            self._uploaded.synchronize()            # the previous upload has left the pinned buffer
        need = bucket * h * w * 3
        if self._host is None or self._host.numel() < need:
            host = torch.zeros(need, dtype=torch.uint8)
            self._host = host.pin_memory() if self.device.type == "cuda" else host
        return self._host[:need].view(bucket, h, w, 3)

    def _slot(self, key: tuple[int, int, int]) -> _FixedSlot:
        """The plan of `key` (bucket, h, w), built if new; the least recently used plans beyond the bound go."""
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        slot = self._build(*key)
        self._slots[key] = slot
        while len(self._slots) > 1 and sum(s.nbytes() for s in self._slots.values()) > self.max_kept_bytes:
            self._slots.popitem(last=False)
        return slot

    def _build(self, bucket: int, h: int, w: int) -> _FixedSlot:
        scales = pyramid_scales(min(h, w), self.min_face, self.factor)
        chunks = self._chunks(bucket, h, w, scales)
        n_planes = chunks[-1].last
        slot = _FixedSlot(
            scales=scales,
            chunks=chunks,
            canvas=torch.zeros((bucket, h, w, 3), dtype=torch.uint8, device=self.device),
            small=torch.zeros(bucket * 2 + n_planes * 3, dtype=torch.int64, device=self.device),
            chunk_table=torch.as_tensor(_chunk_table(chunks), device=self.device),
        )
        slot.hw = slot.small[:bucket * 2].view(bucket, 2)
        slot.planes = slot.small[bucket * 2:].view(n_planes, 3)
        return slot

    def _compute(self, slot: _FixedSlot):
        table = integral(slot.canvas)
        return (table, *pnet_maps(self.pnet, table, slot.hw, slot.chunks, slot.planes, self.threshold, self.area))

    def _capture(self, slot: _FixedSlot):
        """Warm up on a side stream (cuDNN picks its kernels outside the capture), then capture one call."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side_stream = torch.cuda.Stream(device=self.device)
        side_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side_stream):
            for _ in range(2):
                self._compute(slot)
        torch.cuda.current_stream(self.device).wait_stream(side_stream)
        graph = torch.cuda.CUDAGraph()
        if self._capture_stream is None:
            self._capture_stream = capture_stream(self.device)
        # thread_local, on a stream of its own: the generator thread may be running, or capturing, meanwhile
        with CAPTURE_LOCK, torch.cuda.graph(graph, pool=self._pool, stream=self._capture_stream,
                                            capture_error_mode="thread_local"):
            outputs = self._compute(slot)
        return graph, outputs


class _FixedSlot:
    """One plan's static buffers (inputs: canvas, hw and planes; outputs: table, mask, feats, edges) and graph."""

    def __init__(self, scales: list[float], chunks: list[_Chunk], canvas: torch.Tensor, small: torch.Tensor,
                 chunk_table: torch.Tensor):
        self.scales, self.chunks, self.canvas, self.small, self.chunk_table = scales, chunks, canvas, small, chunk_table
        self.hw: torch.Tensor
        self.planes: torch.Tensor
        self.graph: torch.cuda.CUDAGraph | None = None      # captured on the bucket's second use
        self.outputs: tuple[torch.Tensor, ...] | None = None
        self.uses = 0

    def nbytes(self) -> int:
        """Device bytes this plan holds in its own tensors (its graph's intermediates live in the shared pool)."""
        tensors = (self.canvas, self.small, self.chunk_table, *(self.outputs or ()))
        return sum(t.numel() * t.element_size() for t in tensors)


def _pinned(array: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    return t.pin_memory() if torch.cuda.is_available() else t
