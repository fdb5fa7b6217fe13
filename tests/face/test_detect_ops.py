"""The detector's kernels (gpen_tune.ops.nms, gpen_tune.ops.area_resize) against their PyTorch twins: in Triton's
CPU interpreter, and on CUDA (marker gpu); the whole batched MTCNN driver on real photos with either."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.face.detect import MTCNNDetector
from gpen_tune.face.detect import mtcnn_batched as mb
from gpen_tune.ops import area_resize as area_ops
from gpen_tune.ops import nms as nms_ops


def test_impl_argument_is_checked():
    boxes = torch.tensor([[0.0, 0, 10, 10]])
    with pytest.raises(ValueError, match="nms impl"):
        nms_ops.grouped_nms(boxes, torch.ones(1), torch.zeros(1, dtype=torch.long), 0.5, 1, impl="fast")
    assert not nms_ops.uses_triton(boxes, "torch") and not area_ops.uses_triton(torch.zeros(1, 2, 2, 3),
                                                                                 torch.float32, "torch")
    with pytest.raises(ValueError, match="nms and area"):
        MTCNNDetector("cpu", nms="fast")


_AREA_TRITON = r"""
import json
import cv2, numpy as np, torch
from gpen_tune.face import samples
from gpen_tune.face.detect import mtcnn_batched as mb
from gpen_tune.face.detect import MTCNN_MIN_FACE, MTCNN_PYRAMID_FACTOR, MTCNN_STAGE_THRESHOLDS
from gpen_tune.ops import area_resize as area_ops
from facenet_pytorch.models.mtcnn import ONet, PNet, RNet

imgs = [cv2.resize(samples.astronaut(), (200, 200), interpolation=cv2.INTER_AREA),
        cv2.resize(samples.mosaic(4, 3), (260, 230), interpolation=cv2.INTER_AREA)]
canvas, sizes = mb._upload(imgs, torch.device("cpu"))
table = area_ops.integral(canvas)
planes = torch.tensor([[0, 150, 150], [1, 113, 131], [0, 1, 1], [1, 30, 21]])    # strided columns, as P-Net's
img, lh, lw = planes.unbind(1)
hw = torch.as_tensor(sizes)[img]
zeros = torch.zeros_like(lh)
boxes = torch.tensor([[10, 5, 100, 120], [0, 100, 200, 129], [150, 0, 1, 5], [37, 3, 77, 9]])
full = torch.full((4,), 24)
cases = {"levels": (img, zeros, zeros, hw[:, 0], hw[:, 1], lh, lw, 152, 152),
         "crops": (img, boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3], full, full, 24, 24)}
res = {"auto_is_triton": area_ops.uses_triton(table, torch.float32, "auto")}
for name, case in cases.items():
    got = mb.area_resize(table, torch.float32, *case, impl="triton")
    want = mb.area_resize(table, torch.float32, *case, impl="torch")
    res[name] = bool(torch.equal(got, want)) and bool((want != 0).any())
nets = [n().eval() for n in (PNet, RNet, ONet)]
args = (MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR, "cpu")
got = mb.detect_mtcnn_batched(imgs, *nets, *args, area="triton")
want = mb.detect_mtcnn_batched(imgs, *nets, *args, area="torch")
res["faces"] = [int((s >= 0.9).sum()) for _, s, _ in got]
res["detections_equal"] = all(np.array_equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
print("RESULT" + json.dumps(res))
"""


@pytest.mark.slow
def test_triton_area_resize_is_bit_identical_in_interpreter():
    """The detector's area resize as one Triton kernel (Triton's CPU interpreter) against the PyTorch twin:
    the same bits for pyramid levels and box crops (strided index vectors, a 1 x 1 level, a 1-px-wide box), and
    the same detections through the whole driver on two small real photos."""
    from triton_interp import run_in_interpreter

    res = run_in_interpreter(_AREA_TRITON)
    assert res["auto_is_triton"] and res["levels"] and res["crops"], res
    assert res["detections_equal"] and sum(res["faces"]) >= 3, res


@pytest.mark.gpu
def test_cuda_triton_area_resize_is_bit_identical():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    canvas, sizes = mb._upload([samples.mosaic(6, 0), samples.astronaut()], torch.device("cuda"))
    table = area_ops.integral(canvas)
    if not area_ops.uses_triton(table, torch.float32):
        pytest.skip("needs Triton")
    planes = torch.tensor([[0, 700, 1050], [1, 308, 308], [1, 1, 1]], device="cuda")
    img, lh, lw = planes.unbind(1)
    hw = torch.as_tensor(sizes, device="cuda")[img]
    zeros = torch.zeros_like(lh)
    case = (img, zeros, zeros, hw[:, 0], hw[:, 1], lh, lw, 704, 1056)
    got = mb.area_resize(table, torch.float32, *case, impl="triton")
    want = mb.area_resize(table, torch.float32, *case, impl="torch")
    assert torch.equal(got, want) and bool((want != 0).any())


_NMS_TRITON = r"""
import json
import cv2, numpy as np, torch
from gpen_tune.face import samples
from gpen_tune.face.detect import mtcnn_batched as mb
from gpen_tune.face.detect import MTCNN_MIN_FACE, MTCNN_PYRAMID_FACTOR, MTCNN_STAGE_THRESHOLDS
from gpen_tune.ops import nms as nms_ops
from facenet_pytorch.models.mtcnn import ONet, PNet, RNet


def greedy(boxes, scores, groups, iou):
    # the definition: per group, descending score (ties: lower index), IoU > float32(iou) suppresses
    b, s, g = boxes.double().numpy(), scores.double().numpy(), groups.numpy()
    order = sorted(range(len(b)), key=lambda i: (-s[i], i))
    thr, removed, keep = float(np.float32(iou)), set(), []
    for a, i in enumerate(order):
        if i in removed:
            continue
        keep.append(i)
        for j in order[a + 1:]:
            if g[j] == g[i]:
                w = max(min(b[i, 2], b[j, 2]) - max(b[i, 0], b[j, 0]), 0.0)
                h = max(min(b[i, 3], b[j, 3]) - max(b[i, 1], b[j, 1]), 0.0)
                union = (b[i, 2] - b[i, 0]) * (b[i, 3] - b[i, 1]) + (b[j, 2] - b[j, 0]) * (b[j, 3] - b[j, 1]) - w * h
                if union != 0 and w * h / union > thr:
                    removed.add(j)
    return keep


res = {"auto_is_triton": nms_ops.uses_triton(torch.zeros(1, 4), "auto")}
gen = torch.Generator().manual_seed(0)
xy = torch.rand(700, 2, generator=gen) * 200 - 20
boxes = torch.cat([xy, xy + 5 + torch.rand(700, 2, generator=gen) * 60], 1)
scores = torch.rand(700, generator=gen)
groups = torch.randint(0, 3, (700,), generator=gen)            # ~230 boxes per group: several tiles of 256 lanes
got = nms_ops.grouped_nms(boxes, scores, groups, 0.5, 4, impl="triton")     # group 3 is empty
res["random"] = got.tolist() == greedy(boxes, scores, groups, 0.5)
twin = nms_ops.grouped_nms(boxes, scores, groups, 0.5, 4, impl="torch")
res["random_vs_torchvision"] = sorted(got.tolist()) == sorted(twin.tolist())
res["kept"] = [len(got), 700]
# equal scores on an integer grid (ties), and an IoU of exactly 7/10 against the threshold 0.7
cells = torch.arange(40)
x, y = (cells % 8).double() * 3, (cells // 8).double() * 3
gb = torch.cat([torch.stack([x, y, x + 10, y + 10], 1), torch.tensor([[0., 0, 10, 10], [0, 0, 10, 7]])])
gs = torch.cat([torch.full((40,), 0.9), torch.tensor([0.95, 0.5])])
gg = torch.cat([torch.zeros(40, dtype=torch.long), torch.ones(2, dtype=torch.long)])
got = nms_ops.grouped_nms(gb, gs, gg, 0.7, 2, impl="triton")
res["grid"] = got.tolist() == greedy(gb, gs, gg, 0.7)
res["iou_exactly_07_suppressed"] = 41 not in got.tolist() and 40 in got.tolist()
res["empty"] = nms_ops.grouped_nms(torch.zeros((0, 4)), torch.zeros(0), torch.zeros(0, dtype=torch.long),
                                   0.5, 3, impl="triton").tolist()
# the whole driver on real photos: the same detections with either NMS
imgs = [cv2.resize(samples.astronaut(), (220, 220), interpolation=cv2.INTER_AREA),
        cv2.resize(samples.mosaic(4, 3), (300, 260), interpolation=cv2.INTER_AREA)]
nets = [n().eval() for n in (PNet, RNet, ONet)]
calls = []
kernel = nms_ops._nms_kernel
nms_ops._nms_kernel = type("Counted", (), {"__getitem__": lambda self, grid: calls.append(grid) or kernel[grid]})()
args = (MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR, "cpu")
got = mb.detect_mtcnn_batched(imgs, *nets, *args, nms="triton")
nms_ops._nms_kernel = kernel
want = mb.detect_mtcnn_batched(imgs, *nets, *args, nms="torch")
res["triton_calls"] = len(calls)
res["faces"] = [int((s >= 0.9).sum()) for _, s, _ in got]
res["detections_equal"] = all(np.array_equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
print("RESULT" + json.dumps(res))
"""


@pytest.mark.slow
def test_triton_grouped_nms_matches_greedy_nms_in_interpreter():
    """The per-group NMS kernel (Triton's CPU interpreter) against the greedy definition and the torchvision twin:
    random boxes in groups larger than one tile, an empty group, equal scores (ties by index), an IoU of exactly
    the threshold (torchvision's CUDA nms compares with the float32 threshold), and the whole driver on two real
    photos giving the same detections as with the twin."""
    from triton_interp import run_in_interpreter

    res = run_in_interpreter(_NMS_TRITON)
    assert res["auto_is_triton"] and res["random"] and res["random_vs_torchvision"], res
    assert 100 < res["kept"][0] < res["kept"][1], res
    assert res["grid"] and res["iou_exactly_07_suppressed"] and res["empty"] == [], res
    assert res["triton_calls"] >= 3 and res["detections_equal"] and sum(res["faces"]) >= 3, res


@pytest.mark.gpu
def test_cuda_triton_grouped_nms_matches_torchvision():
    """On CUDA: the per-group kernel keeps exactly what torchvision's CUDA nms keeps (one call over shifted groups,
    unique scores), on ~16,000 boxes in 200 groups as after P-Net, and the detector finds the same faces with it."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(3)
    cells = torch.randint(0, 60, (16000, 2), generator=g).double() * 2        # integer windows, as P-Net's
    side = torch.randint(12, 40, (16000, 1), generator=g).double()
    boxes = torch.cat([cells, cells + side], 1).cuda()
    scores = torch.randperm(16000, generator=g).double().cuda()
    groups = torch.randint(0, 200, (16000,), generator=g).cuda()
    if not nms_ops.uses_triton(boxes):
        pytest.skip("needs Triton")
    got = nms_ops.grouped_nms(boxes, scores, groups, 0.5, 200, impl="triton")
    want = nms_ops.grouped_nms(boxes, scores, groups, 0.5, 200, impl="torch")
    assert torch.equal(got, want) and 1000 < len(got) < 16000
    photos = [samples.mosaic(6, 0), samples.astronaut(), np.ascontiguousarray(samples.mosaic(4, 3)[:700, :900]),
              samples.grace_hopper(), samples.mosaic(4, 3)]
    before = MTCNNDetector("cuda", pnet_graphs=False, nms="torch").detect(photos)
    after = MTCNNDetector("cuda", pnet_graphs=False, nms="triton").detect(photos)
    for a, b in zip(after, before, strict=True):
        assert len(a) == len(b)
        for fa, fb in zip(a, b, strict=True):
            assert np.array_equal(fa.box, fb.box) and np.array_equal(fa.landmarks, fb.landmarks)
