"""The CPU greedy NMS against torchvision's nms (the reference): the same boxes kept, in the same order."""

from __future__ import annotations

import pytest
import torch

from gpen_tune.ops.nms import greedy_nms, grouped_nms


def random_boxes(n: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 200
    wh = torch.rand(n, 2, generator=g) * 40
    boxes = torch.cat([xy, xy + wh], 1).to(dtype)
    boxes[: n // 10, 2:] = boxes[: n // 10, :2]                     # zero-area boxes: a NaN IoU suppresses nothing
    scores = (torch.rand(n, generator=g) * 10).round().to(dtype)      # many equal scores
    return boxes, scores


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 400, 2500])
def test_greedy_nms_keeps_what_torchvision_keeps(dtype, n):
    torchvision = pytest.importorskip("torchvision")
    boxes, scores = random_boxes(n, dtype, seed=n)
    for iou in (0.3, 0.5, 0.6, 0.7):
        got = greedy_nms(boxes, scores, iou)
        assert got.dtype == torch.long
        assert torch.equal(got, torchvision.ops.nms(boxes, scores, iou))


def test_grouped_nms_on_the_cpu_never_suppresses_across_groups():
    boxes, scores = random_boxes(600, torch.float32, seed=3)
    groups = torch.arange(600) % 3
    kept = grouped_nms(boxes, scores, groups, 0.5, num_groups=3, impl="torch")
    for gid in range(3):
        members = torch.nonzero(groups == gid).squeeze(1)
        alone = members[greedy_nms(boxes[members], scores[members], 0.5)]
        assert sorted(kept[groups[kept] == gid].tolist()) == sorted(alone.tolist())
    assert torch.all(scores[kept][1:] <= scores[kept][:-1])          # descending score order overall
