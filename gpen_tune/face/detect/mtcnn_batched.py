"""A batched MTCNN driver: whole batches of mixed-size images per kernel launch, on the device.

facenet-pytorch's driver loops in Python over every candidate box (one crop and one resize each) and syncs with
the host many times per image, which caps detection at a few images/s on a fast GPU. This driver runs the same
algorithm (same networks, thresholds, pyramid, NMS rules and box arithmetic) with a number of launches and host
syncs that depends on the number of pyramid scales and stages, not on the number of boxes or images.

Resizing uses a summed-area table (integral image) of the uint8 batch: an "area" resize (F.interpolate's
mode="area", i.e. adaptive average pooling, which facenet uses for the pyramid and for the R-Net/O-Net crops) is,
for every output pixel, the mean of an integer rectangle of input pixels, i.e. four table look-ups. That gives
* pyramid levels computed per image at the image's own size (facenet's `int(h * scale + 1)`), laid into one
  zero-padded canvas per scale, so a mixed-size batch sees exactly the pixels each image sees alone;
* the 24x24 / 48x48 crops of all boxes of all images in one gather, exactly facenet's per-box area resize (no
  bilinear approximation as with roi_align), up to float rounding (sums are exact integers here).
Measured against facenet's driver on the test photos (astronaut, grace hopper, mosaics, a face cut by the border,
the Solvay photo): the same boxes in the same number, max difference 1.3e-4 px on boxes and landmarks; a
mixed-size batch gives each image its image-alone result to the same precision.

Other differences from facenet's driver, none of which changes results:
* NMS per (image, scale) for all scales at once, then per image, in one call each (`gpen_tune.ops.nms`: on CUDA
  one Triton program per group; else one torchvision nms call with batched_nms semantics, without
  batched_nms's Python loop over groups for large inputs); equal P-Net scores are
  ranked by position (`_rank_key`), so ties do not depend on the other images of the batch;
* the last stage's "Min" NMS runs on the host on the final few boxes, vectorised (`min_nms_host`);
* P-Net's ceil-mode pooling at each image's own border is reproduced on the padded canvas (`pnet_forward`);
* boxes whose clipped crop is empty are dropped (facenet would fail on them).
Host syncs: P-Net over the whole pyramid: three (one nonzero, two nms; all P-Net calls are queued before them,
index uploads are pinned and non-blocking), R-Net and O-Net: a few each, one download at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from gpen_tune.ops import area_resize as area_ops
from gpen_tune.ops import nms as nms_ops
from gpen_tune.ops.area_resize import integral
from gpen_tune.ops.nms import grouped_nms
from gpen_tune.ops.transfer import to_device_async

PNET_MAX_PIXELS = 16 * 1024 * 1024   # canvas pixels per P-Net call (~150 B/px of activations: ~2.5 GB)
CROPS_PER_CALL = 8192                # boxes per R-Net / O-Net call
NMS_MAX_BOXES = 32768                # P-Net candidates per NMS call (CUDA nms keeps an N x N bit mask: 128 MiB)
ROWS_ALIGN = 64                      # GPU: R-Net / O-Net batches are padded to a multiple of this (_run_chunked)
_NORM_MEAN, _NORM_SCALE = 127.5, 0.0078125
_STRIDE, _CELL = 2, 12               # P-Net: one 12x12 window every 2 px

Result = tuple[np.ndarray, np.ndarray, np.ndarray]


def detect_mtcnn_batched(
    images: Sequence[np.ndarray] | torch.Tensor,
    pnet: torch.nn.Module,
    rnet: torch.nn.Module,
    onet: torch.nn.Module,
    min_face: float = 20,
    thresholds: Sequence[float] = (0.6, 0.7, 0.7),
    factor: float = 0.709,
    device: str | torch.device | None = None,
    fixed: Any = None,                   # a mtcnn_fixed.FixedCanvasPNet (it builds on this module)
    nms: nms_ops.Impl = "auto",
    area: area_ops.Impl = "auto",
) -> list[Result]:
    """Faces of every image: (boxes [N, 4] x1y1x2y2, scores [N], landmarks [N, 5, 2] (x, y)), float64.

    `images`: HWC RGB uint8 arrays of any sizes, or a uint8 tensor [B, H, W, 3]. Landmarks come in the networks'
    order (left eye, right eye, nose, mouth left, mouth right). No score threshold beyond the stage thresholds.
    `fixed`: run the P-Net stage through this fixed-canvas plan (CUDA graphs) when the batch fits it.
    `nms` / `area`: the NMS and area-resize implementations (`gpen_tune.ops.nms` / `gpen_tune.ops.area_resize`:
    "auto" = the Triton kernels where they can run, "torch" = the PyTorch twins, "triton"); the fixed plan's P-Net
    uses the area resize it was made with.
    """
    device = torch.device(device) if device is not None else next(pnet.parameters()).device
    with torch.inference_mode():
        if fixed is not None and (fixed.min_face, fixed.threshold, fixed.factor) != (
                float(min_face), float(thresholds[0]), float(factor)):
            raise ValueError("the fixed-canvas P-Net was made for another min_face / threshold / factor")
        if fixed is not None and not isinstance(images, torch.Tensor) and fixed.fits(images):
            maps = fixed(list(images))
            driver = _Driver(maps.table, maps.sizes, pnet, rnet, onet, float(min_face), tuple(thresholds),
                             float(factor), hw=maps.hw, nms=nms, area=area)
            return driver.run(maps)
        canvas, sizes = _upload(images, device)
        if canvas is None:
            return []
        driver = _Driver(integral(canvas), sizes, pnet, rnet, onet, float(min_face), tuple(thresholds),
                         float(factor), nms=nms, area=area)
        del canvas                                             # only its summed-area table is needed from here
        return driver.run()


def follow_mtcnn_batched(
    images: Sequence[np.ndarray],
    boxes: Sequence[np.ndarray],
    rnet: torch.nn.Module,
    onet: torch.nn.Module,
    thresholds: Sequence[float] = (0.6, 0.7, 0.7),
    device: str | torch.device | None = None,
    nms: nms_ops.Impl = "auto",
    area: area_ops.Impl = "auto",
) -> list[Result]:
    """Faces near known boxes: R-Net and O-Net (stages 2 and 3) on `follow_candidates(boxes[i])` of each image
    instead of P-Net's candidates. The same output as `detect_mtcnn_batched`; no P-Net, so a small part of its
    cost. How a video follows the faces of its last full detection between key frames."""
    device = torch.device(device) if device is not None else next(rnet.parameters()).device
    with torch.inference_mode():
        canvas, sizes = _upload(images, device)
        if canvas is None:
            return []
        cand = [follow_candidates(b) for b in boxes]
        img = np.repeat(np.arange(len(cand)), [len(c) for c in cand])
        if not len(img):
            return [_empty() for _ in range(len(sizes))]
        driver = _Driver(integral(canvas), sizes, None, rnet, onet, min_face=0.0, thresholds=tuple(thresholds),
                         factor=0.0, nms=nms, area=area)          # no P-Net: no pyramid (min_face, factor)
        del canvas
        cand_t = torch.from_numpy(np.concatenate(cand)).to(device=device, dtype=driver.dtype)
        img_t = torch.from_numpy(img).to(device)
        return driver.from_candidates(cand_t, img_t)


FOLLOW_SHIFTS = (-0.3, 0.0, 0.3)     # follow_candidates: offsets of each box, in box sides, along x and y
FOLLOW_SCALES = (1.0, 1.3)           # ... and its sizes


def follow_candidates(boxes: np.ndarray) -> np.ndarray:
    """R-Net candidates [18K, 5] (box, score 1) for K known face boxes [K, 4]: each box squared, at two sizes and
    shifted by up to 0.3 of its side along x and y, so a face that moved since still fills one of them as a
    detection's candidate would (stage 2's NMS keeps the best). 18 small crops per face: a tiny part of P-Net's
    whole-image search."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
    side = np.maximum(b[:, 2] - b[:, 0], b[:, 3] - b[:, 1])
    rows = [np.stack([cx + dx * side - k * side / 2, cy + dy * side - k * side / 2,
                      cx + dx * side + k * side / 2, cy + dy * side + k * side / 2, np.ones_like(cx)], 1)
            for k in FOLLOW_SCALES for dx in FOLLOW_SHIFTS for dy in FOLLOW_SHIFTS]
    return np.concatenate(rows).astype(np.float32)


def _upload(images, device: torch.device) -> tuple[torch.Tensor | None, np.ndarray]:
    """The batch as one zero-padded uint8 canvas [B, H, W, 3] on the device, and each image's (h, w)."""
    if isinstance(images, torch.Tensor):
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"expected a uint8 tensor [B, H, W, 3], got {images.dtype} {tuple(images.shape)}")
        b, h, w, _ = images.shape
        return (images.to(device) if b else None), np.tile([h, w], (b, 1))
    images = list(images)
    if not images:
        return None, np.zeros((0, 2), np.int64)
    for img in images:
        if not (isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3):
            raise ValueError("expected HWC RGB uint8 arrays, got "
                             f"{getattr(img, 'dtype', type(img))} {getattr(img, 'shape', '')}")
    sizes = np.array([img.shape[:2] for img in images], dtype=np.int64)
    hmax, wmax = sizes.max(0)
    host = np.zeros((len(images), hmax, wmax, 3), np.uint8)
    for i, img in enumerate(images):          # host memcpy only: one upload for the whole batch
        host[i, :img.shape[0], :img.shape[1]] = img
    host_t = torch.from_numpy(host)
    if device.type == "cuda":
        host_t = host_t.pin_memory()
    return host_t.to(device, non_blocking=True), sizes


def pyramid_scales(min_side: float, min_face: float, factor: float) -> list[float]:
    """facenet's scale pyramid for an image whose short side is `min_side` (same float arithmetic)."""
    m = 12.0 / min_face
    minl = min_side * m
    scales, s = [], m
    while minl >= 12:
        scales.append(s)
        s *= factor
        minl *= factor
    return scales


class _Driver:
    """One batch through P-Net, R-Net and O-Net."""

    def __init__(self, table, sizes, pnet, rnet, onet, min_face, thresholds, factor, hw=None,
                 nms: nms_ops.Impl = "auto", area: area_ops.Impl = "auto"):
        self.device = table.device
        self.sizes = sizes                                     # host [B, 2] (h, w)
        self.pnet, self.rnet, self.onet = pnet, rnet, onet
        self.dtype = next(rnet.parameters()).dtype
        self.min_face, self.thresholds, self.factor = min_face, thresholds, factor
        self.b = len(sizes)
        self.hw = to_device_async(sizes, self.device) if hw is None else hw   # [>= B, 2] (h, w), int64
        self.table = table                                     # summed-area table [>= B, H+1, W+1, 3]
        self.nms, self.area = nms, area                        # implementations (gpen_tune.ops)

    def run(self, maps: PNetMaps | None = None) -> list[Result]:
        boxes, img = self._stage1(*self.pyramid()) if maps is None else self._candidates(maps)
        if len(boxes):
            boxes, img = self._stage2(boxes, img)
        if len(boxes):
            boxes, img, scores, points = self._stage3(boxes, img)
            return self._finish(boxes, img, scores, points)
        return [_empty() for _ in range(self.b)]

    def from_candidates(self, boxes: torch.Tensor, img: torch.Tensor) -> list[Result]:
        """Stages 2 and 3 from given candidates [K, 5] (box, score) and their image ids (no P-Net)."""
        boxes, img = self._stage2(boxes, img)
        if len(boxes):
            return self._finish(*self._stage3(boxes, img))
        return [_empty() for _ in range(self.b)]

    def pyramid(self) -> tuple[list[float], np.ndarray]:
        """The batch's pyramid scales (those of its largest short side) and each image's number of them."""
        n_scales = [len(pyramid_scales(min(h, w), self.min_face, self.factor)) for h, w in self.sizes]
        return pyramid_scales(int(self.sizes.min(1).max()), self.min_face, self.factor), np.array(n_scales)

    # -- P-Net over the pyramid ---------------------------------------------------------------------------------

    def _stage1(self, scales: list[float], n_scales: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """P-Net over the pyramid: squared, regressed candidate boxes [K, 5] (box, score) and their image ids.

        Every P-Net call is queued before the first host sync (the candidates' count, one nonzero over all scales);
        then one NMS per (image, scale) for all planes at once and one across scales per image: three syncs for any
        number of scales (a few more only for batches of over NMS_MAX_BOXES candidates)."""
        budget = PNET_MAX_PIXELS * 4 // self.dtype.itemsize          # the same bytes in float64
        chunks, planes = _pyramid_plan(self.sizes, scales, n_scales, budget)
        if not chunks:
            return torch.zeros((0, 5), device=self.device), torch.zeros(0, dtype=torch.long, device=self.device)
        planes = to_device_async(planes, self.device)                      # [P, 3] image id, level h, level w
        table = to_device_async(_chunk_table(chunks), self.device)         # [C, 5] see _chunk_table
        mask, feats, edges = pnet_maps(self.pnet, self.table, self.hw, chunks, planes, self.thresholds[0],
                                       self.area)
        return self._candidates(PNetMaps(self.table, self.sizes, self.hw, planes, table, mask, feats, edges))

    def _candidates(self, maps: PNetMaps) -> tuple[torch.Tensor, torch.Tensor]:
        """From P-Net's maps of every plane: candidates NMS'd per plane, then per image across scales."""
        boxes, plane = _pnet_candidates(maps.mask, maps.feats, maps.edges, maps.chunk_table, len(maps.planes),
                                        self.nms)
        img = maps.planes[plane, 0]
        keep = grouped_nms(boxes[:, :4], boxes[:, 4], img, 0.7, self.b, self.nms)   # across scales, per image
        boxes, img = boxes[keep], img[keep]
        w = (boxes[:, 2] - boxes[:, 0]).unsqueeze(1)
        h = (boxes[:, 3] - boxes[:, 1]).unsqueeze(1)
        regressed = boxes[:, :4] + boxes[:, 5:9] * torch.cat([w, h, w, h], 1)
        return square(torch.cat([regressed, boxes[:, 4:5]], 1)), img

    # -- R-Net and O-Net -------------------------------------------------------------------------------------------

    def _stage2(self, boxes: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        boxes, img, reg, prob = self._net_on_crops(self.rnet, boxes, img, 24)
        score = prob[:, 1]
        keep = (score > self.thresholds[1]).nonzero().squeeze(1)
        boxes = torch.cat([boxes[keep, :4], score[keep, None]], 1)
        img, reg = img[keep], reg[keep]
        keep = grouped_nms(boxes[:, :4], boxes[:, 4], img, 0.7, self.b, self.nms)
        return square(regress(boxes[keep], reg[keep])), img[keep]

    def _stage3(self, boxes: torch.Tensor, img: torch.Tensor):
        boxes, img, reg, lms, prob = self._net_on_crops(self.onet, boxes, img, 48)
        score = prob[:, 1]
        keep = (score > self.thresholds[2]).nonzero().squeeze(1)
        boxes, img, reg, lms, score = boxes[keep, :4], img[keep], reg[keep], lms[keep], score[keep]
        w = (boxes[:, 2] - boxes[:, 0] + 1)[:, None]
        h = (boxes[:, 3] - boxes[:, 1] + 1)[:, None]
        points = torch.stack([w * lms[:, :5] + boxes[:, 0:1] - 1, h * lms[:, 5:] + boxes[:, 1:2] - 1], -1)
        boxes = regress(torch.cat([boxes, score[:, None]], 1), reg)
        return boxes, img, score, points

    def _net_on_crops(self, net: torch.nn.Module, boxes: torch.Tensor, img: torch.Tensor, size: int):
        """(boxes, img, *net outputs) for every box cut from its own image (clipped to it) and area-resized to
        size x size; boxes whose clipped crop is empty are dropped (facenet skips them, then fails)."""
        hw = self.hw[img]
        xy = boxes[:, :4].trunc().long()                        # facenet: trunc, then 1-based clipping
        x0 = xy[:, 0].clamp(min=1) - 1
        y0 = xy[:, 1].clamp(min=1) - 1
        x1 = torch.minimum(xy[:, 2], hw[:, 1])
        y1 = torch.minimum(xy[:, 3], hw[:, 0])
        ok = ((x1 > x0) & (y1 > y0)).nonzero().squeeze(1)
        boxes, img, x0, y0, h, w = boxes[ok], img[ok], x0[ok], y0[ok], (y1 - y0)[ok], (x1 - x0)[ok]
        full = torch.full_like(x0, size)

        def crops(a: int, z: int) -> torch.Tensor:
            return area_resize(self.table, self.dtype, img[a:z], y0[a:z], x0[a:z], h[a:z], w[a:z], full[a:z],
                               full[a:z], size, size, self.area)

        return boxes, img, *_run_chunked(net, crops, len(boxes))

    # -- results ---------------------------------------------------------------------------------------------------

    def _finish(self, boxes, img, scores, points) -> list[Result]:
        boxes = boxes[:, :4].double().cpu().numpy()             # the one download of the results
        img, scores = img.cpu().numpy(), scores.double().cpu().numpy()
        points = points.double().cpu().numpy()
        keep = min_nms_host(boxes, scores, img, 0.7)
        boxes, img, scores, points = boxes[keep], img[keep], scores[keep], points[keep]
        order = np.argsort(img, kind="stable")
        bounds = np.searchsorted(img[order], np.arange(self.b + 1))
        spans = zip(bounds[:-1], bounds[1:], strict=True)
        return [(boxes[order[a:z]], scores[order[a:z]], points[order[a:z]]) for a, z in spans]


class PNetMaps(NamedTuple):
    """P-Net's output over a batch's pyramid, what the rest of the driver starts from."""

    table: torch.Tensor          # summed-area table of the batch [>= B, H+1, W+1, 3]
    sizes: np.ndarray            # host [B, 2] (h, w) of the real images
    hw: torch.Tensor             # device [>= B, 2] (h, w)
    planes: torch.Tensor         # device [P, 3] (image id, level h, level w)
    chunk_table: torch.Tensor    # device [C, 5] (_chunk_table)
    mask: torch.Tensor           # [cells] bool: score >= threshold at a cell the image has
    feats: torch.Tensor          # [cells, 5] (score, 4 offsets)
    edges: torch.Tensor          # [sum of chunk sides, 2] window edges (_window_edges)


def pnet_maps(pnet: torch.nn.Module, table: torch.Tensor, hw: torch.Tensor, chunks: list[_Chunk],
              planes: torch.Tensor, threshold: float,
              area: area_ops.Impl = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All P-Net calls, queued back to back (no host sync, so also capturable in a CUDA graph): for every cell of
    every plane (chunk, image, row, column order) the threshold test [cells] and (score, 4 offsets) [cells, 5];
    the chunks' window edges (_window_edges, one table after the other). Kept: ~21 bytes per cell, far below one
    call's activations."""
    device, dtype = table.device, next(pnet.parameters()).dtype
    total = sum(c.cells for c in chunks)
    mask = torch.empty(total, dtype=torch.bool, device=device)
    feats = torch.empty((total, 5), dtype=dtype, device=device)
    edges, a = [], 0
    for c in chunks:
        img_ids, lh, lw = planes[c.first:c.last].unbind(1)
        img_hw = hw[img_ids]
        zeros = torch.zeros_like(lh)
        level = area_resize(table, dtype, img_ids, zeros, zeros, img_hw[:, 0], img_hw[:, 1], lh, lw,
                            c.canvas_h, c.canvas_w, area)
        reg, prob = pnet_forward(pnet, level, lh, lw)
        score = prob[:, 1]                                      # [b, oh, ow]
        if score.shape[1:] != (c.out_h, c.out_w):
            raise RuntimeError(f"P-Net output {tuple(score.shape[1:])}, expected {(c.out_h, c.out_w)}")
        rows_ok = torch.arange(score.shape[1], device=device)[None] < _pnet_cells(lh)[:, None]
        cols_ok = torch.arange(score.shape[2], device=device)[None] < _pnet_cells(lw)[:, None]
        ok = (score >= threshold) & rows_ok[:, :, None] & cols_ok[:, None, :]
        z = a + c.cells
        mask[a:z] = ok.reshape(-1)
        out = feats[a:z].view(c.last - c.first, c.out_h, c.out_w, 5)
        out[..., 0] = score
        out[..., 1:] = reg.permute(0, 2, 3, 1)
        edges.append(_window_edges(max(c.out_h, c.out_w), c.scale, reg.dtype, device))
        a = z
    return mask, feats, torch.cat(edges)


def area_resize(table: torch.Tensor, dtype: torch.dtype, img, top, left, in_h, in_w, out_h, out_w,
                canvas_h: int, canvas_w: int, impl: area_ops.Impl = "auto") -> torch.Tensor:
    """Normalised [N, 3, canvas_h, canvas_w] network input: for each n, the rectangle (top, left, in_h, in_w) of
    image img[n] area-resized to (out_h[n], out_w[n]) as F.interpolate(mode="area") does; zeros beyond (out_h,
    out_w). `table` is the batch's summed-area table (`integral`). See `gpen_tune.ops.area_resize`."""
    return area_ops.area_resize(table, dtype, img, top, left, in_h, in_w, out_h, out_w, canvas_h, canvas_w,
                                _NORM_MEAN, _NORM_SCALE, impl)


class _Chunk(NamedTuple):
    """One P-Net call: pyramid planes first..last-1 (consecutive images at one scale) on one zero-padded canvas."""

    scale: float
    first: int
    last: int
    canvas_h: int
    canvas_w: int

    @property
    def out_h(self) -> int:
        return _pnet_cells(self.canvas_h)

    @property
    def out_w(self) -> int:
        return _pnet_cells(self.canvas_w)

    @property
    def cells(self) -> int:
        return (self.last - self.first) * self.out_h * self.out_w


def _pnet_cells(n):
    """P-Net's output length for an input length n (3x3 conv, 2x2 ceil-mode pooling, two 3x3 convs); int or tensor."""
    return (n - 1) // 2 - 4


def _pyramid_plan(sizes: np.ndarray, scales: list[float], n_scales: np.ndarray,
                  budget: int) -> tuple[list[_Chunk], np.ndarray]:
    """The batch's P-Net calls, scale-major: each scale's images (those whose own pyramid reaches it) in chunks of
    at most `budget` canvas pixels (one image at least); and every plane's (image id, level h, level w) [P, 3]."""
    chunks, planes, n = [], [], 0
    for k, scale in enumerate(scales):
        members = np.flatnonzero(n_scales > k)
        level_hw = (sizes[members] * scale + 1).astype(np.int64)   # facenet's int(h * scale + 1)
        per_call = max(1, budget // int(level_hw.max(0).prod()))
        for start in range(0, len(members), per_call):
            hw = level_hw[start:start + per_call]
            planes.append(np.column_stack([members[start:start + per_call], hw]))
            chunks.append(_Chunk(scale, n, n + len(hw), int(hw[:, 0].max()), int(hw[:, 1].max())))
            n += len(hw)
    return chunks, (np.concatenate(planes) if planes else np.zeros((0, 3), np.int64))


def _chunk_table(chunks: list[_Chunk]) -> np.ndarray:
    """Per chunk, what decodes a flat cell index (see pnet_maps): [C, 5] = (first cell, output h,
    output w, first plane, first row of its window-edge table)."""
    cells = np.cumsum([0] + [c.cells for c in chunks[:-1]])
    edges = np.cumsum([0] + [max(c.out_h, c.out_w) for c in chunks[:-1]])
    shape = [(c.out_h, c.out_w, c.first) for c in chunks]
    return np.column_stack([cells, np.array(shape, np.int64).reshape(-1, 3), edges]).astype(np.int64)


def _window_edges(n: int, scale: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[n, 2]: facenet's first and last image coordinate of the 12-px window of P-Net cells 0..n-1 at `scale`
    (either axis); the float ops of facenet's generateBoundingBox on the same values, so the same results."""
    cell = torch.arange(n, device=device).to(dtype)
    q1 = ((_STRIDE * cell + 1) / scale).floor()
    q2 = ((_STRIDE * cell + _CELL - 1 + 1) / scale).floor()
    return torch.stack([q1, q2], 1)


def _pnet_candidates(mask: torch.Tensor, feats: torch.Tensor, edges: torch.Tensor, table: torch.Tensor,
                     num_planes: int, nms: nms_ops.Impl = "auto"):
    """P-Net windows passing the threshold, NMS'd at 0.5 per plane (image and scale) as facenet does per image and
    scale: [K, 9] (box, score, offsets) and plane ids, chunk by chunk, each chunk's boxes in score order."""
    flat = mask.nonzero().squeeze(1)                # the host sync: data-dependent size, once for all scales
    chunk = torch.searchsorted(table[:, 0].contiguous(), flat, right=True) - 1
    start, oh, ow, first, e0 = table[chunk].unbind(1)
    local = flat - start
    n, rest = local // (oh * ow), local % (oh * ow)
    ex, ey = edges[e0 + rest % ow], edges[e0 + rest // ow]
    cand = torch.cat([ex[:, :1], ey[:, :1], ex[:, 1:], ey[:, 1:], feats[flat]], 1)
    plane = first + n
    key = _rank_key(cand[:, 4])
    spans = [(0, len(flat))]
    if len(flat) > NMS_MAX_BOXES and not nms_ops.uses_triton(cand, nms):   # bound torchvision's N x N bit mask: a few
        spans = _spans(torch.searchsorted(flat, table[:, 0].contiguous()).tolist() + [len(flat)],  # whole chunks
                       NMS_MAX_BOXES)
    keep = torch.cat([a + grouped_nms(cand[a:z, :4], key[a:z], plane[a:z], 0.5, num_planes, nms)
                      for a, z in spans])
    keep = keep[torch.sort(chunk[keep], stable=True).indices]   # chunk-major, score order within (as per chunk)
    return cand[keep], plane[keep]


def _rank_key(scores: torch.Tensor) -> torch.Tensor:
    """NMS scores (float64) ordered like `scores`, ties broken by position: with them NMS keeps the same boxes
    whichever other planes share the call and however the sort treats ties (torch's default sort is unstable)."""
    order = torch.sort(scores, descending=True, stable=True).indices
    rank = -torch.arange(len(order), dtype=torch.float64, device=scores.device)
    return torch.empty_like(rank).scatter_(0, order, rank)


def _spans(bounds: list[int], limit: int) -> list[tuple[int, int]]:
    """Runs of consecutive chunks (chunk i: candidates bounds[i]..bounds[i+1]) of at most `limit` candidates, one
    chunk at least each."""
    spans, a = [], bounds[0]
    for i in range(1, len(bounds)):
        if bounds[i] - a > limit and bounds[i - 1] > a:
            spans.append((a, bounds[i - 1]))
            a = bounds[i - 1]
    return spans + [(a, bounds[-1])]


def _empty() -> Result:
    return np.zeros((0, 4)), np.zeros(0), np.zeros((0, 5, 2))


def pnet_forward(pnet: torch.nn.Module, x: torch.Tensor, heights: torch.Tensor, widths: torch.Tensor):
    """facenet's P-Net on a zero-padded canvas, as if each image x[n] were only heights[n] x widths[n] large.

    P-Net's first pooling uses ceil mode: on an image of odd conv1 width, the last window holds one column alone.
    On a wider canvas that window also sees a column computed from the padding, which moved boxes of faces cut by
    the right/bottom border by up to ~5 px. Filling conv1's out-of-image outputs with a very low value before the
    pooling restores the image-alone result (only cells the image alone has are read afterwards).
    """
    y = pnet.prelu1(pnet.conv1(x))
    rows = torch.arange(y.shape[2], device=y.device)[None] < (heights - 2)[:, None]
    cols = torch.arange(y.shape[3], device=y.device)[None] < (widths - 2)[:, None]
    inside = (rows[:, :, None] & cols[:, None, :])[:, None]
    y = torch.where(inside, y, -1e4)
    y = pnet.prelu2(pnet.conv2(pnet.pool1(y)))
    y = pnet.prelu3(pnet.conv3(y))
    return pnet.conv4_2(y), pnet.softmax4_1(pnet.conv4_1(y))


def _run_chunked(net: torch.nn.Module, inputs, n: int) -> tuple[torch.Tensor, ...]:
    """net(inputs(a, z)) over boxes a..z-1 in chunks of CROPS_PER_CALL boxes (crops are cut per chunk, so a huge
    candidate set cannot exhaust memory); off the CPU each chunk is padded to a multiple of ROWS_ALIGN rows.

    The padding keeps every box's result independent of how many boxes share the call: BLAS/conv libraries take
    other code paths (other summation orders) for small batches (measured on CPU: below 16 rows), and a float32
    ULP change of a landmark can change restored pixels downstream. On a GPU the padded rows cost nothing; on the
    CPU they cost ~30% of a detection, and the CPU detector does not mix images of different sizes anyway.
    """
    outs = []
    for i in range(0, max(n, 1), CROPS_PER_CALL):
        part = inputs(i, min(n, i + CROPS_PER_CALL))
        align = 1 if part.device.type == "cpu" else ROWS_ALIGN
        rows = max(align, -(-len(part) // align) * align)
        if rows != len(part):
            part = torch.cat([part, part.new_zeros((rows - len(part), *part.shape[1:]))])
        outs.append(net(part))
    return tuple(torch.cat(parts)[:n] for parts in zip(*outs, strict=True))


def regress(boxes: torch.Tensor, reg: torch.Tensor) -> torch.Tensor:
    """Apply a network's box offsets (relative to width/height + 1), keeping any extra columns."""
    w = boxes[:, 2] - boxes[:, 0] + 1
    h = boxes[:, 3] - boxes[:, 1] + 1
    out = boxes.clone()
    out[:, :4] = boxes[:, :4] + reg[:, :4] * torch.stack([w, h, w, h], 1)
    return out


def square(boxes: torch.Tensor) -> torch.Tensor:
    """Grow each box to a square around its centre (side = the longer side); extra columns kept."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    side = torch.maximum(w, h)
    out = boxes.clone()
    out[:, 0] = boxes[:, 0] + w * 0.5 - side * 0.5
    out[:, 1] = boxes[:, 1] + h * 0.5 - side * 0.5
    out[:, 2] = out[:, 0] + side
    out[:, 3] = out[:, 1] + side
    return out


def min_nms_host(boxes: np.ndarray, scores: np.ndarray, groups: np.ndarray, threshold: float) -> np.ndarray:
    """Greedy NMS with intersection over the smaller box ("Min", +1 pixel areas, as facenet's last stage), per group.

    Vectorised: a box survives when no surviving higher-scored box of its group overlaps it by more than
    `threshold`; the triangular system is solved by fixed-point iteration (a few rounds), not a loop over boxes.
    """
    n = len(boxes)
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.argsort(-scores, kind="stable")
    b, g = boxes[order], groups[order]
    area = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
    iw = np.maximum(0.0, np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0]) + 1)
    ih = np.maximum(0.0, np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1]) + 1)
    overlap = iw * ih / np.minimum(area[:, None], area[None, :])
    beats = (overlap > threshold) & (g[:, None] == g[None, :]) & np.tri(n, k=-1, dtype=bool)   # [i, j]: j < i
    keep = np.ones(n, bool)
    for _ in range(n):
        new = ~(beats & keep[None, :]).any(1)
        if np.array_equal(new, keep):
            break
        keep = new
    return order[keep]
