"""The batched MTCNN driver against facenet-pytorch's own driver (the reference) on real photos."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from face_testdata import SOLVAY_FACES, solvay_path

from gpen_tune.face import samples
from gpen_tune.face.detect import (
    DEFAULT_THRESHOLD,
    MTCNN_MIN_FACE,
    MTCNN_PYRAMID_FACTOR,
    MTCNN_STAGE_THRESHOLDS,
    MTCNNDetector,
    shrink_for_detection,
)
from gpen_tune.face.detect.mtcnn_batched import detect_mtcnn_batched, min_nms_host, pyramid_scales
from gpen_tune.face.detect.mtcnn_fixed import FixedCanvasPNet
from gpen_tune.ops.area_resize import integral
from gpen_tune.ops.nms import grouped_nms

PX_TOL = 0.05          # measured: <= 1.3e-4 px (the same pixels and arithmetic; only float summation order differs)


@cache
def nets():
    from facenet_pytorch.models.mtcnn import ONet, PNet, RNet

    return tuple(n().eval() for n in (PNet, RNet, ONet))


def batched(images):
    return detect_mtcnn_batched(images, *nets(), MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR, "cpu")


@cache
def reference(key: str):
    """facenet-pytorch's detect_face on one photo: (boxes, scores, landmarks), highest score first."""
    from facenet_pytorch.models.utils.detect_face import detect_face

    with torch.inference_mode():
        boxes, points = detect_face(photo(key)[None], MTCNN_MIN_FACE, *nets(), list(MTCNN_STAGE_THRESHOLDS),
                                    MTCNN_PYRAMID_FACTOR, "cpu")
    b = np.asarray(boxes[0], dtype=np.float64).reshape(-1, 5)
    p = np.asarray(points[0], dtype=np.float64).reshape(-1, 5, 2)
    return by_score((b[:, :4], b[:, 4], p))


@cache
def _photo(key: str) -> np.ndarray:
    if key == "solvay":
        from gpen_tune.imageio import read_image

        return read_image(solvay_path()).rgb8()
    if key == "crop":          # a face cut by the right border: the padded-canvas edge case
        return np.ascontiguousarray(samples.mosaic(4, 3)[:700, :900])
    if key.startswith("mosaic"):
        n, seed = map(int, key[6:].split("_"))
        return samples.mosaic(n, seed)
    return {"astronaut": samples.astronaut, "grace_hopper": samples.grace_hopper}[key]()


def photo(key: str) -> np.ndarray:
    return _photo(key).copy()


def by_score(result):
    boxes, scores, lms = result
    order = np.argsort(-scores, kind="stable")
    return boxes[order], scores[order], lms[order]


def assert_same(got, want, tol=PX_TOL, score_tol=1e-4):
    gb, gs, gl = by_score(got)
    wb, ws, wl = want
    assert (gs >= DEFAULT_THRESHOLD).sum() == (ws >= DEFAULT_THRESHOLD).sum()
    assert len(gb) == len(wb)
    # pair faces by position, not by score rank: near-equal scores (0.9999...) may swap ranks within score_tol
    dist = np.abs(gb[None, :, :] - wb[:, None, :]).max(-1)             # [want, got]
    pairing = dist.argmin(1)
    assert len(set(pairing.tolist())) == len(wb)
    gb, gs, gl = gb[pairing], gs[pairing], gl[pairing]
    assert gb.dtype == gl.dtype == np.float64 and gl.shape == (len(gb), 5, 2)
    np.testing.assert_allclose(gb, wb, atol=tol, rtol=0)
    np.testing.assert_allclose(gl, wl, atol=tol, rtol=0)
    np.testing.assert_allclose(gs, ws, atol=score_tol, rtol=0)


PHOTOS = ("astronaut", "grace_hopper", "mosaic6_0", "mosaic4_3", "crop")


@pytest.mark.parametrize("key", PHOTOS)
def test_matches_facenet_on_real_photos(key):
    (got,) = batched([photo(key)])
    assert_same(got, reference(key))
    assert (got[1] >= DEFAULT_THRESHOLD).sum() >= 1


def test_mosaic_face_counts():
    image, tiles = samples.mosaic_with_tiles(6, 0)
    (boxes, scores, _), = batched([image])
    assert (scores >= DEFAULT_THRESHOLD).sum() == len(tiles) == 6


def test_mixed_size_batch_equals_each_image_alone():
    keys = ("mosaic6_0", "astronaut", "crop", "grace_hopper", "mosaic4_3")
    together = batched([photo(k) for k in keys])
    assert len(together) == len(keys)
    for key, got in zip(keys, together, strict=True):
        assert_same(got, reference(key))


def test_uint8_tensor_batch():
    a = photo("astronaut")
    both = torch.from_numpy(np.stack([a, np.ascontiguousarray(a[:, ::-1])]))
    got = batched(both)
    assert_same(got[0], reference("astronaut"))
    assert len(got[1][0]) == len(got[0][0])
    lm = by_score(got[1])[2][0]
    assert lm[0, 0] < lm[1, 0]                                   # mirrored: still image-left first
    np.testing.assert_allclose(511 - lm[1, 0], reference("astronaut")[2][0, 0, 0], atol=3)


@pytest.mark.parametrize("kind", ["coffee", "gradient"])
def test_no_face_images(kind):
    import skimage.data

    if kind == "coffee":
        img = skimage.data.coffee()
    else:
        ramp = np.linspace(0, 255, 400, dtype=np.float64)
        img = np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], ramp[None, ::-1]), -1).astype(np.uint8)
    (boxes, scores, lms), = batched([img])
    assert (scores >= DEFAULT_THRESHOLD).sum() == 0
    assert lms.shape == (len(boxes), 5, 2)


def test_tiny_images_give_nothing_also_next_to_a_face():
    tiny = [np.zeros((12, 30, 3), np.uint8), np.full((1, 1, 3), 200, np.uint8), np.zeros((19, 400, 3), np.uint8)]
    assert all(len(b) == 0 for b, _, _ in batched(tiny))
    mixed = batched([tiny[0], photo("astronaut"), tiny[1]])
    assert len(mixed[0][0]) == len(mixed[2][0]) == 0
    assert_same(mixed[1], reference("astronaut"))
    assert batched([]) == []


def test_pyramid_matches_facenet_rule():
    assert pyramid_scales(11, 20, 0.709) == []
    s = pyramid_scales(512, 20, 0.709)
    assert s[0] == 0.6 and 512 * s[-1] >= 12 > 512 * s[-1] * 0.709


def test_grouped_nms_equals_torchvision_batched_nms():
    from torchvision.ops import batched_nms

    g = torch.Generator().manual_seed(0)
    xy = torch.rand(600, 2, generator=g) * 300 - 20                   # negatives included
    boxes = torch.cat([xy, xy + 5 + torch.rand(600, 2, generator=g) * 60], 1)
    scores = torch.rand(600, generator=g)
    groups = torch.randint(0, 7, (600,), generator=g)
    ours = grouped_nms(boxes, scores, groups, 0.5)
    theirs = batched_nms(boxes, scores, groups, 0.5)
    assert torch.equal(ours.sort().values, theirs.sort().values)


def test_min_nms_equals_facenet_numpy_version():
    from facenet_pytorch.models.utils.detect_face import batched_nms_numpy

    rng = np.random.default_rng(1)
    xy = rng.uniform(0, 200, (300, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 50, (300, 2))], 1)
    scores = rng.permutation(300) / 300.0                             # distinct: no tie-breaking ambiguity
    groups = rng.integers(0, 4, 300)
    ours = min_nms_host(boxes, scores, groups, 0.7)
    theirs = batched_nms_numpy(torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(groups), 0.7, "Min")
    assert 0 < len(ours) < 300
    assert sorted(ours.tolist()) == sorted(theirs.tolist())


def test_detector_sends_mixed_sizes_in_one_call():
    det = MTCNNDetector("cpu")
    assert not det.mixed_sizes and MTCNNDetector.mixed_sizes      # CPU: by size (see MTCNNDetector); GPU: mixed
    det.pnet, det.rnet, det.onet = nets()
    det.mixed_sizes = True
    calls = []
    inner = det._detect_batch
    det._detect_batch = lambda batch: calls.append([im.shape for im in batch]) or inner(batch)
    keys = ("astronaut", "grace_hopper", "mosaic6_0")
    found = det.detect([photo(k) for k in keys])
    assert len(calls) == 1 and len({s for s in calls[0]}) == 3      # one call, three sizes
    assert [len(f) for f in found] == [1, 1, 6]


@pytest.mark.shared_data
def test_solvay_all_29_faces_like_facenet():
    if solvay_path() is None:
        pytest.skip("shared/data/solvay_conference_1927.png not present")
    (got,) = batched([photo("solvay")])
    assert_same(got, reference("solvay"))
    assert (got[1] >= DEFAULT_THRESHOLD).sum() == SOLVAY_FACES


def test_memory_chunking_changes_nothing(monkeypatch):
    import gpen_tune.face.detect.mtcnn_batched as driver

    monkeypatch.setattr(driver, "PNET_MAX_PIXELS", 1)       # one image per P-Net call
    monkeypatch.setattr(driver, "CROPS_PER_CALL", 7)        # R-Net / O-Net in chunks of 7 boxes
    keys = ("astronaut", "mosaic6_0", "grace_hopper")
    for key, got in zip(keys, batched([photo(k) for k in keys]), strict=True):
        assert_same(got, reference(key))


@pytest.mark.gpu
def test_cuda_driver_matches_facenet_on_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda_nets = tuple(type(m)().to("cuda").eval() for m in nets())
    keys = ("mosaic6_0", "astronaut", "crop", "grace_hopper", "mosaic4_3")
    together = detect_mtcnn_batched([photo(k) for k in keys], *cuda_nets, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS,
                                    MTCNN_PYRAMID_FACTOR, "cuda")
    for key, got in zip(keys, together, strict=True):
        assert_same(got, reference(key), tol=2.0, score_tol=1e-2)  # cuDNN may use TF32 convolutions
    gpu_det = MTCNNDetector("cuda")
    assert gpu_det.mixed_sizes
    found = gpu_det.detect([photo(k) for k in keys])
    assert [len(f) for f in found] == [int((reference(k)[1] >= DEFAULT_THRESHOLD).sum()) for k in keys]


# -- P-Net stage: one host sync for all scales, the same candidates as the per-scale version it replaced ----------

def per_scale_stage1(self, scales, n_scales):
    """The driver's P-Net stage before it was batched over scales (commit 2fa709b), kept as the reference: one
    nonzero and one NMS per scale and chunk."""
    from gpen_tune.face.detect import mtcnn_batched as mb

    found, found_img = [], []
    for k, scale in enumerate(scales):
        members = np.flatnonzero(n_scales > k)
        level_hw = (self.sizes[members] * scale + 1).astype(np.int64)
        per_call = max(1, mb.PNET_MAX_PIXELS * 4 // self.dtype.itemsize // int(level_hw.max(0).prod()))
        for start in range(0, len(members), per_call):
            cand, cand_img = per_scale_candidates(self, members[start:start + per_call],
                                                  level_hw[start:start + per_call], scale)
            found.append(cand)
            found_img.append(cand_img)
    if not found:
        return torch.zeros((0, 5)), torch.zeros(0, dtype=torch.long)
    boxes, img = torch.cat(found), torch.cat(found_img)
    keep = mb.grouped_nms(boxes[:, :4], boxes[:, 4], img, 0.7)
    boxes, img = boxes[keep], img[keep]
    w = (boxes[:, 2] - boxes[:, 0]).unsqueeze(1)
    h = (boxes[:, 3] - boxes[:, 1]).unsqueeze(1)
    regressed = boxes[:, :4] + boxes[:, 5:9] * torch.cat([w, h, w, h], 1)
    return mb.square(torch.cat([regressed, boxes[:, 4:5]], 1)), img


def per_scale_candidates(self, idx, level_hw, scale):
    from gpen_tune.face.detect import mtcnn_batched as mb

    img_ids, lh, lw = (torch.as_tensor(a) for a in (idx, level_hw[:, 0], level_hw[:, 1]))
    hw = self.hw[img_ids]
    zeros = torch.zeros_like(lh)
    level = mb.area_resize(self.table, self.dtype, img_ids, zeros, zeros, hw[:, 0], hw[:, 1], lh, lw,
                           int(level_hw[:, 0].max()), int(level_hw[:, 1].max()))
    reg, prob = mb.pnet_forward(self.pnet, level, lh, lw)
    score = prob[:, 1]
    rows_ok = torch.arange(score.shape[1])[None] < ((lh - 1) // 2 - 4)[:, None]
    cols_ok = torch.arange(score.shape[2])[None] < ((lw - 1) // 2 - 4)[:, None]
    where = ((score >= self.thresholds[0]) & rows_ok[:, :, None] & cols_ok[:, None, :]).nonzero()
    cell = where[:, 1:].to(reg.dtype).flip(1)
    q1 = ((2 * cell + 1) / scale).floor()
    q2 = ((2 * cell + 12 - 1 + 1) / scale).floor()
    n, y, x = where.unbind(1)
    cand = torch.cat([q1, q2, score[n, y, x].unsqueeze(1), reg.permute(0, 2, 3, 1)[n, y, x]], 1)
    cand_img = img_ids[where[:, 0]]
    keep = mb.grouped_nms(cand[:, :4], cand[:, 4], cand_img, 0.5)
    return cand[keep], cand_img[keep]


def driver(images):
    from gpen_tune.face.detect.mtcnn_batched import _Driver, _upload

    canvas, sizes = _upload(images, torch.device("cpu"))
    return _Driver(integral(canvas), sizes, *nets(), float(MTCNN_MIN_FACE), tuple(MTCNN_STAGE_THRESHOLDS),
                   float(MTCNN_PYRAMID_FACTOR))


STAGE1_BATCHES = (("astronaut",), ("grace_hopper",), ("mosaic6_0",), ("crop",),
                  ("mosaic6_0", "astronaut", "crop", "grace_hopper", "mosaic4_3"))


@pytest.mark.slow
@pytest.mark.parametrize("limits", [None, (1, 40)], ids=["default", "one_image_per_call_small_nms"])
@pytest.mark.parametrize("keys", STAGE1_BATCHES, ids="+".join)
def test_stage1_equals_the_per_scale_version(keys, limits, monkeypatch):
    """Bit-identical P-Net candidates (boxes, scores, image ids, order), and so identical final detections, also
    with P-Net in one-image calls and the NMS split into many calls."""
    import gpen_tune.face.detect.mtcnn_batched as mb

    if limits:
        monkeypatch.setattr(mb, "PNET_MAX_PIXELS", limits[0])
        monkeypatch.setattr(mb, "NMS_MAX_BOXES", limits[1])
    images = [photo(k) for k in keys]
    with torch.inference_mode():
        d = driver(images)
        boxes, img = d._stage1(*d.pyramid())
        want_boxes, want_img = per_scale_stage1(d, *d.pyramid())
    assert len(boxes) > 0
    assert torch.equal(boxes, want_boxes) and torch.equal(img, want_img)
    got = batched(images)
    monkeypatch.setattr(mb._Driver, "_stage1", per_scale_stage1)
    for (gb, gs, gl), (wb, ws, wl) in zip(got, batched(images), strict=True):
        assert np.array_equal(gb, wb) and np.array_equal(gs, ws) and np.array_equal(gl, wl)


def counting(monkeypatch):
    """Calls of the P-Net stage's host syncs on a GPU (nonzero's size, the nms pass: torchvision's on a GPU, its
    CPU twin `greedy_nms` here), counted on the CPU."""
    import gpen_tune.ops.nms as nms_ops

    calls = {"nonzero": 0, "nms": 0}
    nonzero, nms = torch.Tensor.nonzero, nms_ops.greedy_nms

    def counted_nonzero(self, *args, **kwargs):
        calls["nonzero"] += 1
        return nonzero(self, *args, **kwargs)

    def counted_nms(*args, **kwargs):
        calls["nms"] += 1
        return nms(*args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "nonzero", counted_nonzero)
    monkeypatch.setattr(nms_ops, "greedy_nms", counted_nms)
    return calls


@pytest.mark.parametrize("pnet_max_pixels", [None, 1], ids=["default", "one_image_per_call"])
def test_stage1_syncs_do_not_grow_with_scales_or_chunks(pnet_max_pixels, monkeypatch):
    import gpen_tune.face.detect.mtcnn_batched as mb

    if pnet_max_pixels:
        monkeypatch.setattr(mb, "PNET_MAX_PIXELS", pnet_max_pixels)
    keys = ("mosaic6_0", "astronaut", "crop", "grace_hopper", "mosaic4_3")
    with torch.inference_mode():
        d = driver([photo(k) for k in keys])
        scales, n_scales = d.pyramid()
        calls = counting(monkeypatch)
        d._stage1(scales, n_scales)
        assert calls == {"nonzero": 1, "nms": 2}
        calls.update(nonzero=0, nms=0)
        per_scale_stage1(d, scales, n_scales)
    chunks = len(mb._pyramid_plan(d.sizes, scales, n_scales, mb.PNET_MAX_PIXELS)[0])
    assert len(scales) >= 10 and chunks >= len(scales)
    # what the per-scale version did: a nonzero per chunk, an nms per chunk with candidates, one across scales
    assert calls["nonzero"] == chunks and len(scales) <= calls["nms"] <= chunks + 1


# -- the fixed-canvas P-Net plan (replayed from CUDA graphs on CUDA; eager here) --------------------------------------

def fixed_pnet(side: int = 1024, graphs: bool = False, pnet=None):
    return FixedCanvasPNet(pnet or nets()[0], side, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS[0], MTCNN_PYRAMID_FACTOR,
                           graphs=graphs)


def with_fixed(images, fixed, net_set=None, device="cpu"):
    return detect_mtcnn_batched(images, *(net_set or nets()), MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS,
                                MTCNN_PYRAMID_FACTOR, device, fixed=fixed)


def assert_identical(got, want):
    """The same faces per image to float rounding (the convolution may sum in another order on a larger canvas)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(g[0]) == len(w[0])
        if len(w[0]):
            assert_same(g, by_score(w), tol=1e-3, score_tol=1e-5)


@pytest.mark.slow
def test_fixed_canvas_plan_gives_the_dynamic_drivers_detections():
    """Six real photos (bucket 8: two padding slots), one too small for most scales and one face cut by the border,
    on a canvas 40 px larger than the largest: every P-Net cell each image has alone, so the same detections (same
    networks, same arithmetic; only the zero padding around each image is larger: float rounding at most)."""
    keys = ("mosaic6_0", "astronaut", "crop", "grace_hopper", "mosaic4_3")
    images = [photo(k) for k in keys] + [np.ascontiguousarray(photo("astronaut")[:60, :90])]
    fixed = fixed_pnet(side=max(max(im.shape[:2]) for im in images) + 40)
    assert fixed.fits(images)
    got = with_fixed(images, fixed)
    assert_identical(got, batched(images))
    for key, found in zip(keys, got[:-1], strict=True):
        assert_same(found, reference(key))
    assert len(got[-1][0]) == 0                     # the 60 x 90 corner: no face


def test_fixed_canvas_buffers_carry_nothing_between_calls():
    """The static buffers are reused: a batch after a different batch of the same bucket gets its own answer."""
    fixed = fixed_pnet(side=640)
    first = [photo("astronaut"), photo("crop")[:500, :600].copy()]
    then = [photo("grace_hopper"), np.zeros((40, 40, 3), np.uint8)]
    with_fixed(first, fixed)
    assert_identical(with_fixed(then, fixed), batched(then))
    assert_identical(with_fixed(first[::-1], fixed), batched(first[::-1]))


def test_fixed_canvas_runs_a_batch_on_the_smallest_canvas_that_holds_it():
    """A batch of small photos runs on a canvas cut to them (P-Net's work is the canvas's pixels), with the
    detections of the dynamic driver; each plan is kept per (bucket, canvas), and plans beyond the byte budget
    are dropped, least recently used first."""
    fixed = fixed_pnet(side=1024)
    small = [photo("astronaut"), photo("grace_hopper")]               # 512 x 512 and 600 x 512
    assert fixed.canvas_for(small) == (640, 512)
    assert fixed.canvas_for([np.zeros((576, 1024, 3), np.uint8)]) == (640, 1024)
    assert fixed.canvas_for([np.zeros((1000, 1, 3), np.uint8)]) == (1024, 128)
    assert_identical(with_fixed(small, fixed), batched(small))
    wide = [np.ascontiguousarray(np.concatenate([photo("astronaut")] * 2, axis=1))]   # 512 x 1024
    assert_identical(with_fixed(wide, fixed), batched(wide))
    assert list(fixed._slots) == [(2, 640, 512), (1, 512, 1024)]
    fixed.max_kept_bytes = fixed._slots[(1, 512, 1024)].nbytes()      # room for one plan: the older one goes
    with_fixed(small[:1], fixed)
    assert list(fixed._slots) == [(1, 512, 512)]


def test_fixed_canvas_falls_back_for_what_it_cannot_hold():
    """Images larger than the canvas, or batches above the largest bucket, take the dynamic driver."""
    fixed = fixed_pnet(side=512)
    big = [photo("grace_hopper")]                    # 600 x 512: taller than 512
    assert not fixed.fits(big)
    assert_identical(with_fixed(big, fixed), batched(big))
    assert not fixed.fits([photo("astronaut")] * (fixed.buckets[-1] + 1))
    assert fixed.buckets == (1, 2, 4, 8, 16, 32) and fixed_pnet().buckets[-1] == 32
    assert fixed._slots == {}                        # nothing was built for them


def test_fixed_canvas_must_match_the_thresholds():
    with pytest.raises(ValueError, match="another min_face"):
        detect_mtcnn_batched([photo("astronaut")], *nets(), MTCNN_MIN_FACE, (0.5, 0.7, 0.7), MTCNN_PYRAMID_FACTOR,
                             "cpu", fixed=fixed_pnet())


def test_cpu_detector_never_uses_pnet_graphs():
    det = MTCNNDetector("cpu")
    assert not det.uses_pnet_graphs
    assert not MTCNNDetector("cpu", pnet_graphs=True).uses_pnet_graphs


@pytest.mark.gpu
def test_pnet_graph_replays_match_the_eager_driver_on_cuda():
    """On CUDA: the captured P-Net replays give the eager driver's detections on real photos, over several
    buckets and repeated batches (a bucket's first batch eager, its second captured and replayed, later ones
    replayed, not re-captured), and the detector uses them by default."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda_nets = tuple(type(m)().to("cuda").eval() for m in nets())
    fixed = fixed_pnet(graphs=True, pnet=cuda_nets[0])
    keys = ("mosaic6_0", "astronaut", "crop", "grace_hopper", "mosaic4_3")
    shrunk = [shrink_for_detection(photo(k), fixed.side)[0] for k in keys]     # what the detector passes on
    batches = [shrunk, [photo("astronaut")], shrunk[::-1] * 3] * 2 + [shrunk]
    for images in batches:
        got = with_fixed(images, fixed, cuda_nets, "cuda")
        assert fixed.fits(images)
        want = detect_mtcnn_batched(images, *cuda_nets, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS,
                                    MTCNN_PYRAMID_FACTOR, "cuda")
        for g, w in zip(got, want, strict=True):
            assert_same(g, by_score(w), tol=0.05, score_tol=1e-4)
    assert fixed.replays == len(batches) - 3 and sorted(bucket for bucket, _, _ in fixed._slots) == [1, 8, 16]
    assert all(slot.graph is not None for slot in fixed._slots.values())
    det = MTCNNDetector("cuda")
    assert det.uses_pnet_graphs == (torch.cuda.get_device_properties(0).total_memory >= 12 * 2**30)
    found = det.detect([photo(k) for k in keys])
    assert [len(f) for f in found] == [int((reference(k)[1] >= DEFAULT_THRESHOLD).sum()) for k in keys]
