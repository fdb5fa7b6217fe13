"""Greedy NMS per group (image, or image and scale): a PyTorch twin (torchvision's nms) and one Triton kernel.

Why the kernel: torchvision's CUDA `nms` computes its IoU bit mask in parallel, but its greedy pass runs in one
thread block over all N boxes in score order: for the ~16,000 P-Net candidates of a 21-photo batch (~200 groups
of at most ~650 boxes) that kernel took 11 of the detector's 35 ms of GPU time (H200, torch profiler,
benchmarks/results/20261201-060340_detector_contention.json) and held the detector's critical path while it ran.
Groups never suppress each other, so the kernel gives each group its own program, which walks its boxes in score
order and clears the later boxes of its group that overlap a kept one: the serial length is the largest group.

Both keep what torchvision's `nms` keeps: IoU = inter / (area_a + area_b - inter) in float64 without the +1 pixel
convention, a box is suppressed when IoU > the threshold rounded to float32 (torchvision takes it as a float), and
the kernel returns the kept indices in descending score order, ties by index (a stable sort, as torch's CUDA sort
is). The twin shifts every group to its own coordinate range (float64: the shift costs no precision), which can
only matter for an IoU within a few ULP of the threshold; with integer coordinates (P-Net windows) both are exact.

`impl`: "auto" (the kernel where it can run: CUDA tensors, or Triton's interpreter, and `num_groups` given),
"torch" (the twin) or "triton" (the kernel; ValueError where Triton is missing).

On the CPU the twin's greedy pass is `greedy_nms` (the same arithmetic as torchvision's CPU kernel, so the same
boxes kept in the same order), and torchvision is not imported: on a CPU-only run it and the torch._dynamo it
imports would hold ~180 MB of resident memory for one function.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from gpen_tune.ops.triton_support import INTERPRET, tl, triton

Impl = Literal["auto", "torch", "triton"]
IMPLS = ("auto", "torch", "triton")
BLOCK = 256
NMS_PAIRS = 2**18                    # greedy_nms: box pairs whose IoUs one numpy pass computes (~2 MB a temporary)


def uses_triton(boxes: torch.Tensor, impl: Impl = "auto") -> bool:
    """Whether `grouped_nms(boxes, ..., num_groups=..., impl=impl)` runs the Triton kernel."""
    if impl not in IMPLS:
        raise ValueError(f"nms impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "torch":
        return False
    available = triton is not None and (boxes.is_cuda or INTERPRET)
    if impl == "triton" and not available:
        raise ValueError("nms impl 'triton' needs Triton and a CUDA tensor (or TRITON_INTERPRET=1): use 'auto'")
    return available


def grouped_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou: float,
                num_groups: int | None = None, impl: Impl = "auto") -> torch.Tensor:
    """torchvision.ops.batched_nms semantics (boxes of different groups never suppress each other) in one call:
    indices of the kept boxes; boxes [N, 4] x1y1x2y2, scores [N], groups [N] int in [0, num_groups).

    The kernel needs `num_groups`; without it the twin runs."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    if num_groups is not None and uses_triton(boxes, impl):
        return grouped_nms_triton(boxes, scores, groups, iou, num_groups)
    return grouped_nms_torch(boxes, scores, groups, iou)


def grouped_nms_torch(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou: float) -> torch.Tensor:
    """The twin: one torchvision nms over every group shifted to its own coordinate range (batched_nms itself
    switches to a Python loop over groups for large inputs). Kept indices in descending score order."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    b = boxes.double()
    span = b.max() - b.min() + 1
    shifted = b + (groups.double() * span)[:, None]
    if not shifted.is_cuda:
        return greedy_nms(shifted, scores.double(), iou)
    import torchvision  # CUDA only: see the module text

    return torchvision.ops.nms(shifted, scores.double(), iou)


def greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, iou: float) -> torch.Tensor:
    """torchvision.ops.nms on the CPU, in numpy: boxes [N, 4] x1y1x2y2, kept indices in descending score order.

    The same steps in the boxes' own dtype as torchvision's CPU kernel (a stable descending sort, areas without the
    +1 pixel, IoU = inter / (area_a + area_b - inter), suppressed when IoU > `iou`; a NaN IoU suppresses nothing),
    so the same boxes survive. The IoUs are computed for many boxes against all at once (`NMS_PAIRS` pairs a pass);
    the greedy pass then only walks the boxes that overlap a later one above the threshold (the MTCNN detector's
    NMS over all scales keeps most of its ~1,000 boxes: a few vectorised passes instead of one per kept box)."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    order, (x0, y0, x1, y1), area = by_score(boxes, scores)
    zero = area.dtype.type(0)
    n = len(order)
    later = np.arange(n)
    keep = np.ones(n, bool)
    rows = max(1, NMS_PAIRS // n)
    for a in range(0, n, rows):
        z = min(n, a + rows)
        w = np.maximum(np.minimum(x1[a:z, None], x1) - np.maximum(x0[a:z, None], x0), zero)
        h = np.maximum(np.minimum(y1[a:z, None], y1) - np.maximum(y0[a:z, None], y0), zero)
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            over = inter / (area[a:z, None] + area - inter)
        hits = (over.astype(np.float64) > iou) & (later[a:z, None] < later)     # row i suppresses later box j
        for i in np.flatnonzero(hits.any(1)):
            if keep[a + i]:
                keep[hits[i]] = False
    return torch.from_numpy(order[keep]).long()


def by_score(boxes: torch.Tensor, scores: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CPU greedy pass's start: the order of a stable descending sort of `scores` (torchvision's), the boxes'
    corners in that order as numpy [4, N] (x1, y1, x2, y2, the boxes' own dtype), and their areas without the +1
    pixel."""
    order = torch.sort(scores, descending=True, stable=True).indices.numpy()
    corners = boxes.detach().cpu().numpy()[order].T
    x0, y0, x1, y1 = corners
    return order, corners, (x1 - x0) * (y1 - y0)


def grouped_nms_triton(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou: float,
                       num_groups: int) -> torch.Tensor:
    """The kernel: one program per group. Kept indices in descending score order (ties: lower index first)."""
    n = boxes.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    by_score = torch.sort(scores, descending=True, stable=True).indices
    by_group = torch.sort(groups[by_score], stable=True).indices
    order = by_score[by_group]                                   # group-major, score order within each group
    # counts per group without a host sync (bincount would read the largest id first); an id outside
    # [0, num_groups) is a caller bug and fails here
    counts = torch.zeros(num_groups, dtype=torch.long, device=boxes.device).scatter_add_(
        0, groups.long(), torch.ones_like(groups, dtype=torch.long))
    starts = torch.cumsum(counts, 0) - counts
    sorted_boxes = boxes[order].to(torch.float64).contiguous()
    keep = torch.ones(n, dtype=torch.int8, device=boxes.device)
    threshold = float(np.float32(iou))                           # torchvision compares with a float threshold
    # no FMA contraction: plain IEEE float64 steps, as numpy (the interpreter) and torchvision's CPU nms compute them
    _nms_kernel[(num_groups,)](sorted_boxes, starts, counts, keep, threshold, BLOCK=BLOCK, enable_fp_fusion=False)
    kept = torch.empty(n, dtype=torch.bool, device=boxes.device)
    kept[order] = keep.bool()
    return by_score[kept[by_score]]


if triton is not None:

    @triton.jit
    def _nms_kernel(boxes_ptr, starts_ptr, counts_ptr, keep_ptr, threshold, BLOCK: tl.constexpr):
        group = tl.program_id(0)
        start = tl.load(starts_ptr + group)
        n = tl.load(counts_ptr + group)
        lanes = tl.arange(0, BLOCK)
        for i in range(0, n):
            kept = tl.load(keep_ptr + start + i, volatile=True)
            if kept != 0:
                row = boxes_ptr + (start + i) * 4
                ax0 = tl.load(row)
                ay0 = tl.load(row + 1)
                ax1 = tl.load(row + 2)
                ay1 = tl.load(row + 3)
                area_a = (ax1 - ax0) * (ay1 - ay0)
                for j0 in range(i + 1, n, BLOCK):
                    j = j0 + lanes
                    live = j < n
                    other = boxes_ptr + (start + j) * 4
                    bx0 = tl.load(other, mask=live, other=0.0)
                    by0 = tl.load(other + 1, mask=live, other=0.0)
                    bx1 = tl.load(other + 2, mask=live, other=0.0)
                    by1 = tl.load(other + 3, mask=live, other=0.0)
                    width = tl.maximum(tl.minimum(ax1, bx1) - tl.maximum(ax0, bx0), 0.0)
                    height = tl.maximum(tl.minimum(ay1, by1) - tl.maximum(ay0, by0), 0.0)
                    inter = width * height
                    area_b = (bx1 - bx0) * (by1 - by0)
                    over = inter / (area_a + area_b - inter) > threshold      # float64: an IEEE division
                    tl.store(keep_ptr + start + j, tl.zeros([BLOCK], dtype=tl.int8), mask=live & over)
            tl.debug_barrier()        # this box's clears are seen by every lane before the next box is read
