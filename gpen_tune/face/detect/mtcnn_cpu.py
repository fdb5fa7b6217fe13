"""MTCNN on the CPU, one image at a time: the cascade as the paper describes it, with the arithmetic of
facenet-pytorch's driver (the reference the tests compare with: the same boxes and landmarks to the bit).

Why a driver of our own on the CPU: there the per-box work of the reference (one crop and one area resize per
candidate) is cheap, and the batched driver's summed-area tables cost more (0.5-0.8x its speed); but the
reference imports torchvision (and through it torch._dynamo): ~180 MB of a CPU run's resident memory. Differences
from the reference, none of which changes results on an image it handles:
* one image per call: a box never depends on other images (the CPU convolution takes another code path by batch
  size, and a float32 ULP of a landmark can move restored pixels downstream);
* R-Net / O-Net see at most `BOXES_PER_CALL` crops per call (the reference: 512): their activations for 512 crops
  held ~70 MB at a time, and on one CPU core count the chunk size does not change the speed;
* boxes whose clipped crop is empty are dropped (the reference fails on them);
* the last stage's "Min" NMS is `mtcnn_batched.min_nms_host` (vectorised, stable order for equal scores).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from gpen_tune.face.detect.mtcnn_batched import (
    _CELL,
    _NORM_MEAN,
    _NORM_SCALE,
    _STRIDE,
    _empty,
    follow_candidates,
    min_nms_host,
    pyramid_scales,
    regress,
    square,
)
from gpen_tune.ops.nms import greedy_nms

BOXES_PER_CALL = 128                 # R-Net / O-Net crops per call

Result = tuple[np.ndarray, np.ndarray, np.ndarray]


def detect_mtcnn_cpu(image: np.ndarray, pnet: torch.nn.Module, rnet: torch.nn.Module, onet: torch.nn.Module,
                     min_face: float = 20, thresholds: Sequence[float] = (0.6, 0.7, 0.7),
                     factor: float = 0.709) -> Result:
    """Faces of one HWC RGB uint8 image: (boxes [N, 4] x1y1x2y2, scores [N], landmarks [N, 5, 2] (x, y)), float64,
    in descending score order. Landmarks: left eye, right eye, nose, mouth left, mouth right."""
    if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3):
        raise ValueError(f"expected an HWC RGB uint8 array, got {getattr(image, 'dtype', type(image))} "
                         f"{getattr(image, 'shape', '')}")
    h, w = image.shape[:2]
    with torch.inference_mode():
        img = _planar(image)
        boxes = _propose(img, pnet, min_face, thresholds[0], factor)
        if len(boxes):
            boxes = _refine(img, boxes, rnet, thresholds[1])
        if len(boxes):
            return _output(img, boxes, onet, thresholds[2])
    return _empty()


def follow_mtcnn_cpu(image: np.ndarray, boxes: np.ndarray, rnet: torch.nn.Module, onet: torch.nn.Module,
                     thresholds: Sequence[float] = (0.6, 0.7, 0.7)) -> Result:
    """Faces of one image near known boxes [K, 4]: stages 2 and 3 on `follow_candidates(boxes)` instead of P-Net's
    candidates (the same output as `detect_mtcnn_cpu`, without its pyramid)."""
    if not len(boxes):
        return _empty()
    with torch.inference_mode():
        img = _planar(image)
        cand = _refine(img, torch.from_numpy(follow_candidates(boxes)), rnet, thresholds[1])
        if len(cand):
            return _output(img, cand, onet, thresholds[2])
    return _empty()


def _planar(image: np.ndarray) -> torch.Tensor:
    """[1, 3, H, W] float32 in plain NCHW order. The reference resizes the photo's channels-last pixels; the area
    resize gives the same values from NCHW ones, 1.7x faster for the pyramid's levels."""
    pixels = torch.from_numpy(np.ascontiguousarray(image))[None].permute(0, 3, 1, 2)
    return pixels.to(torch.float32, memory_format=torch.contiguous_format)          # one copy, not two


def _normalised(x: torch.Tensor) -> torch.Tensor:
    return (x - _NORM_MEAN) * _NORM_SCALE


def _propose(img: torch.Tensor, pnet: torch.nn.Module, min_face: float, threshold: float,
             factor: float) -> torch.Tensor:
    """Stage 1: P-Net windows over the pyramid, NMS'd at 0.5 per scale and 0.7 over all scales, moved by their
    offsets and squared: [K, 5] (box, score)."""
    h, w = img.shape[2:]
    per_scale = []
    for scale in pyramid_scales(min(h, w), min_face, factor):
        level = F.interpolate(img, size=(int(h * scale + 1), int(w * scale + 1)), mode="area")
        # channels-last, as the reference's levels: P-Net's convolutions round by the layout they are given
        reg, probs = pnet(_normalised(level.contiguous(memory_format=torch.channels_last)))
        cand = _windows(reg[0], probs[0, 1], scale, threshold)
        per_scale.append(cand[greedy_nms(cand[:, :4], cand[:, 4], 0.5)])
    cand = torch.cat(per_scale) if per_scale else torch.zeros((0, 9))
    cand = cand[greedy_nms(cand[:, :4], cand[:, 4], 0.7)]
    w_, h_ = cand[:, 2] - cand[:, 0], cand[:, 3] - cand[:, 1]     # the window offsets scale without the +1 pixel
    moved = torch.stack([cand[:, 0] + cand[:, 5] * w_, cand[:, 1] + cand[:, 6] * h_,
                         cand[:, 2] + cand[:, 7] * w_, cand[:, 3] + cand[:, 8] * h_, cand[:, 4]], 1)
    return square(moved)


def _windows(reg: torch.Tensor, probs: torch.Tensor, scale: float, threshold: float) -> torch.Tensor:
    """P-Net cells with a face probability >= threshold as image-space 12x12 windows: [N, 9] (box, score, the four
    offsets), in row-major cell order."""
    mask = probs >= threshold
    cells = mask.nonzero()                                  # [N, 2] (row, column)
    xy = cells.to(reg.dtype).flip(1)
    first = ((_STRIDE * xy + 1) / scale).floor()
    last = ((_STRIDE * xy + _CELL - 1 + 1) / scale).floor()
    return torch.cat([first, last, probs[mask][:, None], reg[:, mask].T], 1)


def _crops(img: torch.Tensor, boxes: torch.Tensor, size: int) -> tuple[torch.Tensor, np.ndarray]:
    """Each box's pixels (truncated to integers, clipped to the image: 1-based inclusive corners) area-resized to
    size x size and normalised: [M, 3, size, size], and the indices of the M boxes whose clipped crop is not
    empty."""
    h, w = img.shape[2:]
    xy = boxes[:, :4].trunc().int().numpy()
    x0, y0 = np.maximum(xy[:, 0], 1), np.maximum(xy[:, 1], 1)
    x1, y1 = np.minimum(xy[:, 2], w), np.minimum(xy[:, 3], h)
    live = np.flatnonzero((y1 > y0 - 1) & (x1 > x0 - 1))
    if not live.size:
        return img.new_zeros((0, 3, size, size)), live
    # plain NCHW crops, as the reference's resize writes them: R-Net / O-Net round differently on channels-last
    crops = [F.interpolate(img[0, :, y0[k] - 1:y1[k], x0[k] - 1:x1[k]][None], size=(size, size), mode="area")
             for k in live]
    return _normalised(torch.cat(crops)), live


def _in_chunks(net: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    parts = [net(x[i:i + BOXES_PER_CALL]) for i in range(0, len(x), BOXES_PER_CALL)]
    return tuple(torch.cat(p) for p in zip(*parts, strict=True))


def _refine(img: torch.Tensor, boxes: torch.Tensor, rnet: torch.nn.Module, threshold: float) -> torch.Tensor:
    """Stage 2: R-Net on 24x24 crops; boxes above the threshold, NMS'd at 0.7, moved and squared: [K, 5]."""
    crops, live = _crops(img, boxes, 24)
    boxes = boxes[torch.from_numpy(live).long()]
    if not len(boxes):
        return boxes
    reg, probs = _in_chunks(rnet, crops)
    passed = probs[:, 1] > threshold
    boxes = torch.cat([boxes[passed, :4], probs[passed, 1:2]], 1)
    reg = reg[passed]
    pick = greedy_nms(boxes[:, :4], boxes[:, 4], 0.7)
    return square(regress(boxes[pick], reg[pick]))


def _output(img: torch.Tensor, boxes: torch.Tensor, onet: torch.nn.Module, threshold: float) -> Result:
    """Stage 3: O-Net on 48x48 crops; boxes above the threshold with their landmarks, moved, "Min"-NMS'd at 0.7."""
    crops, live = _crops(img, boxes, 48)
    boxes = boxes[torch.from_numpy(live).long()]
    if not len(boxes):
        return _empty()
    reg, marks, probs = _in_chunks(onet, crops)
    passed = probs[:, 1] > threshold
    boxes = torch.cat([boxes[passed, :4], probs[passed, 1:2]], 1)
    reg, marks = reg[passed], marks[passed]
    w, h = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    px = w[:, None] * marks[:, :5] + boxes[:, 0:1] - 1      # landmarks from box-relative to image coordinates
    py = h[:, None] * marks[:, 5:] + boxes[:, 1:2] - 1
    points = torch.stack([px, py], 2)
    boxes = regress(boxes, reg).numpy()
    pick = min_nms_host(boxes[:, :4], boxes[:, 4], np.zeros(len(boxes), np.int64), 0.7)
    out = boxes[pick].astype(np.float64)
    return out[:, :4], out[:, 4], points.numpy()[pick].astype(np.float64)
