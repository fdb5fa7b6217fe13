"""The device paste (gpen_tune.face.paste.paste_faces_device, the kernel of gpen_tune.ops.paste and its PyTorch
twin) against the host paste, on real photos: within 2 grey levels."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.face.align import alignment, warp_crop
from gpen_tune.face.paste import (
    DeviceFace,
    PasteFace,
    default_mask,
    paste_faces,
    paste_faces_device,
    soften,
    soften_device,
)

TOLERANCE = 2          # grey levels


def test_device_paste_matches_cpu_paste():
    """The grid_sample paste (run here on the CPU device) against the face part's cv2 paste: <= 2 grey levels."""
    from gpen_tune.face.detect import init_detector

    image = samples.mosaic(6, 3)
    det = init_detector("mtcnn", device="cpu")
    try:
        (dets,) = det.detect([image])
    finally:
        det.close()
    assert len(dets) >= 5
    size = 128
    cpu_faces, dev_faces = [], []
    for d in dets:
        affine, inverse = alignment(d.landmarks, size, "gpen")
        restored = 255 - warp_crop(image, affine, size)         # a visibly different "restoration"
        small = min(d.box[2] - d.box[0], d.box[3] - d.box[1]) < 100
        cpu_faces.append(PasteFace(soften(restored) if small else restored, inverse, None))
        dev_faces.append(DeviceFace(torch.from_numpy(restored), inverse, default_mask(size, inverse), soften=small))
    for strength in (1.0, 0.6):
        want = paste_faces(image, cpu_faces, strength).astype(int)
        got = paste_faces_device(image, dev_faces, strength, impl="torch").astype(int)
        diff = np.abs(want - got)
        assert diff.max() <= TOLERANCE
        assert (diff > 0).mean() < 0.01
        assert np.abs(want - image).max() > 100                  # the faces did change the picture


_TRITON_PASTE = r"""
import json, sys
import cv2, numpy as np, torch
from gpen_tune.face import samples
from gpen_tune.face.align import alignment, warp_crop
from gpen_tune.face.detect import init_detector
from gpen_tune.face.paste import PasteFace, default_mask, face_mask, paste_faces, soften
from gpen_tune.face.paste import DeviceFace, paste_faces_device
from gpen_tune.ops import paste as paste_op

full = samples.mosaic(4, 3)
det = init_detector("mtcnn", device="cpu")
(dets,) = det.detect([full])
k, size = 0.2, 24                       # small: the interpreter runs every program of the kernel in numpy
image = cv2.resize(full, None, fx=k, fy=k, interpolation=cv2.INTER_AREA)
cpu_faces, dev_faces = [], []
for i, d in enumerate(dets):
    for shift in (0.0, 2.5):            # a second, overlapping face per detection: the larger mask must win
        affine, inverse = alignment(d.landmarks * k + shift, size, "gpen")
        restored = 255 - warp_crop(image, affine, size)
        small = i == 0                  # one softened face (upstream's small-face rule) on the kernel path too
        cpu_faces.append(PasteFace(soften(restored) if small else restored, inverse, None))
        dev_faces.append(DeviceFace(torch.from_numpy(restored), inverse, default_mask(size, inverse), soften=small))
res = {"faces": len(dev_faces), "available": paste_op.available(torch.device("cpu"))}
for case, pick in (("apart", slice(0, None, 2)), ("overlapping", slice(None))):
    for strength in (1.0, 0.6):
        want = paste_faces(image, cpu_faces[pick], strength).astype(int)
        got = paste_faces_device(image, dev_faces[pick], strength, impl="triton").astype(int)
        torch_path = paste_faces_device(image, dev_faces[pick], strength, impl="torch").astype(int)
        res[f"{case} {strength}"] = {
            "vs_cpu_max": int(np.abs(want - got).max()), "vs_torch_max": int(np.abs(torch_path - got).max()),
            "vs_cpu_over_2": float((np.abs(want - got).max(-1) > 2).mean()),
            "vs_torch_over_2": float((np.abs(torch_path - got).max(-1) > 2).mean()),
            "changed": int(np.abs(want - image).max())}
print("RESULT" + json.dumps(res))
"""


@pytest.mark.slow
def test_triton_paste_matches_the_cpu_paste_in_interpreter():
    """The one-kernel GPU paste (Triton, run by its CPU interpreter) against the CPU paste and the PyTorch
    device paste: overlapping faces (the larger mask wins), a softened face, strength 1 and 0.6."""
    from triton_interp import run_in_interpreter

    res = run_in_interpreter(_TRITON_PASTE)
    assert res["available"] and res["faces"] >= 8, res
    for strength in ("1.0", "0.6"):
        apart, overlapping = res[f"apart {strength}"], res[f"overlapping {strength}"]
        assert apart["changed"] > 100 and overlapping["changed"] > 100, res   # the faces did change the picture
        assert apart["vs_cpu_max"] <= TOLERANCE and apart["vs_torch_max"] <= TOLERANCE, res
        # where two faces' masks are equal to float rounding, either may win (all three versions round sampling
        # positions differently): a few pixels on that curve; a wrong winner rule would change whole overlaps
        assert overlapping["vs_cpu_over_2"] < 0.002 and overlapping["vs_torch_over_2"] < 0.002, res


@pytest.mark.gpu
def test_cuda_triton_paste_matches_the_torch_paste():
    """On CUDA: the one-kernel paste against the PyTorch device paste and the CPU paste on a real mosaic with
    512-px crops (GPEN-512's), faces apart: within the pipeline's tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gpen_tune.face.detect import init_detector
    from gpen_tune.ops import paste as paste_op

    if not paste_op.available(torch.device("cuda")):
        pytest.skip("needs Triton")
    image = cv2.resize(samples.mosaic(6, 3), None, fx=1.5, fy=1.5)
    det = init_detector("mtcnn", device="cuda")
    (dets,) = det.detect([image])
    det.close()
    assert len(dets) >= 5
    cpu_faces, dev_faces = [], []
    for d in dets:
        affine, inverse = alignment(d.landmarks, 512, "gpen")
        restored = 255 - warp_crop(image, affine, 512)
        cpu_faces.append(PasteFace(restored, inverse, None))
        dev_faces.append(DeviceFace(torch.from_numpy(restored).cuda(), inverse, default_mask(512, inverse)))
    for strength in (1.0, 0.6):
        got = paste_faces_device(image, dev_faces, strength, impl="triton").astype(int)
        torch_path = paste_faces_device(image, dev_faces, strength, impl="torch").astype(int)
        want = paste_faces(image, cpu_faces, strength).astype(int)
        assert np.abs(got - torch_path).max() <= TOLERANCE
        assert np.abs(got - want).max() <= TOLERANCE and (got != want).mean() < 0.01
        assert np.abs(want - image).max() > 100


def test_device_soften_of_a_batch_equals_each_face_alone_and_the_cpu_filter():
    """The GPU paste softens a batch of small faces in one go: each face gets exactly what it gets alone, and what
    the CPU path's filter gives (the weights are multiples of 1/16: exact sums), on real face crops."""
    faces = [cv2.resize(samples.astronaut()[30:250, 140:360], (48, 48), interpolation=cv2.INTER_AREA),
             cv2.resize(samples.grace_hopper()[40:340, 100:400], (48, 48), interpolation=cv2.INTER_AREA)]
    batch = soften_device(torch.from_numpy(np.stack(faces))).numpy()
    for face, got in zip(faces, batch, strict=True):
        assert np.array_equal(got, soften_device(torch.from_numpy(face)).numpy())
        assert np.array_equal(got, soften(face))
        assert not np.array_equal(got, face)
