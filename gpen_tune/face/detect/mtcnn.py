"""MTCNN (`mtcnn`): our P-/R-/O-Net (mtcnn_nets.py) with facenet-pytorch's weights, which ship inside its wheel
(MIT): works offline. On a GPU driven by the batched driver (mtcnn_batched.py, P-Net from CUDA graphs:
mtcnn_fixed.py), on the CPU by the one-image driver (mtcnn_cpu.py: faster there, and lean)."""

from __future__ import annotations

import threading

from gpen_tune.device_memory import cuda_total
from gpen_tune.face.detect import mtcnn_batched
from gpen_tune.face.detect.base import DEFAULT_DET_SIZE, DetectorError, FaceDetector
from gpen_tune.face.detect.mtcnn_cpu import detect_mtcnn_cpu, follow_mtcnn_cpu
from gpen_tune.face.detect.mtcnn_fixed import FixedCanvasPNet
from gpen_tune.face.detect.mtcnn_nets import load_networks
from gpen_tune.ops import area_resize as area_ops
from gpen_tune.ops import nms as nms_ops

MTCNN_MIN_FACE = 20              # px at detection scale (facenet-pytorch default)
MTCNN_STAGE_THRESHOLDS = (0.6, 0.7, 0.7)
MTCNN_PYRAMID_FACTOR = 0.709
MTCNN_MAX_BATCH = 32             # images per batched-MTCNN call, of any sizes (P-Net chunks itself by pixels)
PNET_GRAPHS_MIN_GIB = 12         # MTCNN on CUDA: P-Net from CUDA graphs by default on GPUs at least this large
PNET_PLANS_MEMORY_SHARE = 16     # the P-Net plans' kept buffers: at most this fraction of the usable memory (3 GiB)
# The batched driver's working set per image pixel at det_size (P-Net maps, summed-area table, resized levels):
# ~860 MiB live at the peak of a call of ~15 images at 1,024 px, measured (benchmarks/results/
# 20261202-005523_low_memory_low-memory.json, peak_by_site). A call may take 1/DETECTOR_MEMORY_SHARE of the
# memory this process may use: 2 images per call on a 4 GiB card, 12 on 24 GiB, MTCNN_MAX_BATCH from 64 GiB.
DETECTOR_BYTES_PER_PIXEL = 64
DETECTOR_MEMORY_SHARE = 32
NATIVE_SIZE_ESTIMATE = 2048      # det_size None (native resolution): the long side assumed for the bound


def images_per_call(total_bytes: int | None, det_size: int | None) -> int:
    """Images per batched-MTCNN call on a device where this process may use `total_bytes` (None: off CUDA)."""
    if total_bytes is None:
        return MTCNN_MAX_BATCH
    side = det_size or NATIVE_SIZE_ESTIMATE
    fits = total_bytes // DETECTOR_MEMORY_SHARE // (DETECTOR_BYTES_PER_PIXEL * side * side)
    return int(max(1, min(MTCNN_MAX_BATCH, fits)))


class MTCNNDetector(FaceDetector):
    """MTCNN with facenet-pytorch's weights driven by our batched driver (`mtcnn_batched`): up to
    `MTCNN_MAX_BATCH` images of any sizes per call on a GPU, fewer where the memory this process may use is small
    (`images_per_call`).

    On the CPU, images are grouped by size (`mixed_sizes` False there) and each runs alone through `mtcnn_cpu`:
    batching brings no speed on the CPU, and the CPU convolution picks another code path by batch size (native
    below 2 images, oneDNN above), so an image's landmarks would depend on its batch mates by a float32 ULP,
    enough to change restored pixels downstream when serial and pipelined runs are compared.
    """

    name = "mtcnn"
    mixed_sizes = True
    max_batch = MTCNN_MAX_BATCH

    def __init__(self, device="cpu", threshold=None, det_size=DEFAULT_DET_SIZE, pnet_graphs: bool | None = None,
                 nms: nms_ops.Impl = "auto", area: area_ops.Impl = "auto"):
        """`pnet_graphs`: replay the P-Net stage from CUDA graphs (`FixedCanvasPNet`); None = on CUDA devices with
        at least PNET_GRAPHS_MIN_GIB of memory (the graphs keep ~1-2 GB of buffers).
        `nms` / `area`: the batched driver's NMS and area-resize implementations ("auto": the Triton kernels where
        they can run, "torch": the PyTorch twins; see `gpen_tune.ops.nms` / `gpen_tune.ops.area_resize`)."""
        super().__init__(device, threshold, det_size)
        self.mixed_sizes = self.device.type != "cpu"
        self.max_batch = images_per_call(cuda_total(self.device), det_size)
        self.pnet_graphs = pnet_graphs
        self._check_impls(nms, area)
        self.nms, self.area = nms, area
        self._fixed: FixedCanvasPNet | None = None
        self._fixed_lock = threading.Lock()
        # float32 everywhere: float64 networks on the GPU (tried for batch-invariant landmarks) made a folder run
        # 1.5x slower (cuDNN's float64 convs) and did not change the serial-vs-pipeline pixel differences, which
        # come from the half-precision generator's batch sizes (20261130-200449 vs -195016 throughput runs)
        try:
            self.pnet, self.rnet, self.onet = load_networks(self.device)
        except FileNotFoundError as e:
            raise DetectorError(str(e)) from None

    @staticmethod
    def _check_impls(nms: str, area: str) -> None:
        if nms not in nms_ops.IMPLS or area not in area_ops.IMPLS:
            raise ValueError(f"nms and area must be one of {', '.join(nms_ops.IMPLS)}, got {nms!r}, {area!r}")

    def set_impls(self, nms: nms_ops.Impl | None = None, area: area_ops.Impl | None = None,
                  max_batch: int | None = None) -> None:
        """Switch the driver's kernels or images per call (benchmarks' A/B); a new area resize or batch bound
        drops the P-Net graphs (they hold the kernels and buckets they were captured with): captured again on next
        use or by `capture_graphs`."""
        self._check_impls(nms or self.nms, area or self.area)
        with self._fixed_lock:
            if (area or self.area) != self.area or (max_batch or self.max_batch) != self.max_batch:
                self._fixed = None
            self.nms, self.area = nms or self.nms, area or self.area
            self.max_batch = max_batch or self.max_batch

    def to(self, device):
        self._fixed = None                  # its graphs point at the networks' old buffers
        super().to(device)
        self.mixed_sizes = self.device.type != "cpu"
        return self

    def _networks(self):
        return [n for n in (self.pnet, self.rnet, self.onet) if n is not None]

    def _drop_networks(self):
        self.pnet = self.rnet = self.onet = None
        self._fixed = None

    @property
    def uses_pnet_graphs(self) -> bool:
        if self.device.type != "cuda" or not self.det_size or self.pnet_graphs is False:
            return False
        if self.pnet_graphs is None:     # the memory this process may use: a capped process (4 GB mode) has less
            return (cuda_total(self.device) or 0) >= PNET_GRAPHS_MIN_GIB * 2**30
        return True

    def capture_graphs(self) -> None:
        """Capture the P-Net graphs of every batch bucket now (else each is captured by its first batch)."""
        if self.uses_pnet_graphs and self.pnet is not None:
            with self._fixed_lock:
                self._fixed_pnet().capture_all()

    def _fixed_pnet(self) -> FixedCanvasPNet:
        if self._fixed is None:
            total = cuda_total(self.device)                      # None off CUDA: the default bound
            kept = FixedCanvasPNet.MAX_KEPT_BYTES if total is None else min(FixedCanvasPNet.MAX_KEPT_BYTES,
                                                                            total // PNET_PLANS_MEMORY_SHARE)
            self._fixed = FixedCanvasPNet(self.pnet, self.det_size, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS[0],
                                          MTCNN_PYRAMID_FACTOR, max_batch=self.max_batch, area=self.area,
                                          max_kept_bytes=kept)
        return self._fixed

    def _detect_batch(self, batch):
        if self.pnet is None:
            raise DetectorError("detector was closed")
        if not self.mixed_sizes:           # the CPU default: one image at a time
            return [detect_mtcnn_cpu(image, self.pnet, self.rnet, self.onet, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS,
                                     MTCNN_PYRAMID_FACTOR) for image in batch]
        args = (list(batch), self.pnet, self.rnet, self.onet, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS,
                MTCNN_PYRAMID_FACTOR, self.device)
        # through the module: a benchmark's A/B may run an earlier driver file in its place
        if not self.uses_pnet_graphs:
            return mtcnn_batched.detect_mtcnn_batched(*args, nms=self.nms, area=self.area)
        with self._fixed_lock:             # the fixed plan's buffers serve one call at a time
            return mtcnn_batched.detect_mtcnn_batched(*args, fixed=self._fixed_pnet(), nms=self.nms, area=self.area)

    def _follow_batch(self, batch, boxes):
        if self.rnet is None:
            raise DetectorError("detector was closed")
        if not self.mixed_sizes:
            return [follow_mtcnn_cpu(image, b, self.rnet, self.onet, MTCNN_STAGE_THRESHOLDS)
                    for image, b in zip(batch, boxes, strict=True)]
        return mtcnn_batched.follow_mtcnn_batched(batch, boxes, self.rnet, self.onet, MTCNN_STAGE_THRESHOLDS,
                                                  self.device, nms=self.nms, area=self.area)
