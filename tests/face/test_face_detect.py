"""Face detection on real photos: offline MTCNN counts, coordinate mapping, batching, RetinaFace plumbing."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from face_testdata import SOLVAY_FACES, detections, mtcnn, solvay_path

from gpen_tune.face import samples
from gpen_tune.face.detect import (
    RETINAFACE_WEIGHTS,
    Detection,
    DetectorError,
    MTCNNDetector,
    RetinaFaceDetector,
    init_detector,
)


def test_astronaut_has_exactly_one_face_with_ordered_landmarks():
    img, dets = detections("astronaut")
    assert len(dets) == 1
    d = dets[0]
    assert isinstance(d, Detection) and d.box.shape == (4,) and d.landmarks.shape == (5, 2)
    x1, y1, x2, y2 = d.box
    assert 150 < x1 < x2 < 300 and 30 < y1 < y2 < 200          # the face, not the helmet or the patches
    le, re, nose, ml, mr = d.landmarks
    assert le[0] < re[0] and ml[0] < mr[0]                    # image-left first
    assert max(le[1], re[1]) < nose[1] < min(ml[1], mr[1])    # eyes above nose above mouth
    assert all(x1 <= p[0] <= x2 and y1 <= p[1] <= y2 for p in d.landmarks)


def test_mosaic_every_face_found_once():
    image, tiles = samples.mosaic_with_tiles(6, 0)
    assert np.array_equal(image, samples.mosaic(6, 0))        # deterministic
    _, dets = detections("mosaic")
    assert len(dets) == len(tiles) == 6
    hit = []
    for d in dets:
        cx, cy = (d.box[:2] + d.box[2:]) / 2
        hit.append(next(i for i, (x0, y0, x1, y1) in enumerate(tiles) if x0 <= cx < x1 and y0 <= cy < y1))
    assert sorted(hit) == list(range(6))                      # one face per tile, none missed, none doubled


@pytest.mark.slow
@pytest.mark.shared_data
def test_solvay_at_least_25_of_29_faces():
    path = solvay_path()
    if path is None:
        pytest.skip("shared/data/solvay_conference_1927.png not present")
    from gpen_tune.imageio import read_image

    img = read_image(path).rgb8()
    dets = mtcnn().detect([img])[0]
    assert 25 <= len(dets) <= SOLVAY_FACES + 2
    widths = [d.box[2] - d.box[0] for d in dets]
    assert 15 < np.median(widths) < 60                        # the photo's faces are 25-45 px wide


def test_detection_on_downscaled_copy_maps_back():
    img, dets = detections("astronaut")
    big = np.kron(img, np.ones((3, 3, 1), np.uint8))          # 1536 px: detected on a 512-px copy
    det = MTCNNDetector("cpu", det_size=512)
    (found,) = det.detect([big])
    assert len(found) == 1
    np.testing.assert_allclose(found[0].landmarks, dets[0].landmarks * 3 + 1, atol=4)
    np.testing.assert_allclose(found[0].box, dets[0].box * 3 + 1, atol=8)


def test_batched_detection_matches_single_images():
    a, _ = detections("astronaut")
    flipped = np.ascontiguousarray(a[:, ::-1])
    gh, _ = detections("grace_hopper")
    together = mtcnn().detect([a, gh, flipped])               # two same-size images share a forward pass
    alone = [mtcnn().detect([x])[0] for x in (a, gh, flipped)]
    for t, s in zip(together, alone, strict=True):
        assert len(t) == len(s) == 1
        np.testing.assert_allclose(t[0].landmarks, s[0].landmarks, atol=1e-3)
    # the mirrored photo has its face mirrored, and left/right landmarks stay image-left first
    lm = together[2][0].landmarks
    assert lm[0, 0] < lm[1, 0]
    assert abs((511 - lm[0, 0]) - alone[0][0].landmarks[1, 0]) < 3


def test_threshold_and_no_face_image():
    det = MTCNNDetector("cpu", threshold=0.999999)
    img, dets = detections("astronaut")
    assert len(det.detect([img])[0]) <= len(dets)
    flat = np.full((240, 320, 3), 120, np.uint8)
    assert mtcnn().detect([flat]) == [[]]
    assert mtcnn().detect([np.zeros((12, 30, 3), np.uint8), np.zeros((1, 1, 3), np.uint8)]) == [[], []]


def test_unknown_detector_name_lists_choices():
    with pytest.raises(DetectorError, match="mtcnn"):
        init_detector("yolo")


def test_auto_falls_back_offline_with_one_notice(monkeypatch, tmp_path):
    monkeypatch.setenv("GPEN_TUNE_HOME", str(tmp_path))
    monkeypatch.setenv("GPEN_TUNE_OFFLINE", "1")
    notes: list[str] = []
    det = init_detector("auto", notify=notes.append)
    assert det.name == "mtcnn"
    assert len(notes) == 1 and "MTCNN" in notes[0] and "\n" not in notes[0]
    det.close()
    assert det.pnet is None


# ---------------------------------------------------------------------------------------------- RetinaFace


def _retinaface_file(tmp_path: Path, prefix: str = "module.") -> Path:
    """A randomly initialised facexlib RetinaFace (mobile0.25) saved in the release layout (+ `module.`)."""
    from facexlib.detection.retinaface import RetinaFace

    torch.manual_seed(0)
    net = RetinaFace(network_name="mobile0.25", half=False, device="cpu")
    path = tmp_path / "detection_mobilenet0.25_Final.pth"
    torch.save({prefix + k: v for k, v in net.state_dict().items()}, path)
    return path


def test_retinaface_priors_match_facexlib():
    from facexlib.detection.retinaface import generate_config
    from facexlib.detection.retinaface_utils import PriorBox

    det = RetinaFaceDetector.__new__(RetinaFaceDetector)
    det._priors, det.device = {}, torch.device("cpu")
    for h, w in ((240, 320), (301, 517)):
        ref = PriorBox(generate_config("resnet50"), image_size=(h, w)).forward()
        torch.testing.assert_close(det.priors(h, w), ref, rtol=0, atol=1e-6)


def test_retinaface_from_local_file_strips_module_prefix(tmp_path):
    path = _retinaface_file(tmp_path)
    det = init_detector("retinaface_mobile0.25", weights=path, threshold=0.0, det_size=256)
    img, _ = detections("astronaut")
    found = det.detect([img, img])
    assert len(found) == 2 and len(found[0]) == len(found[1])
    for d in found[0][:20]:
        assert d.landmarks.shape == (5, 2) and 0.0 <= d.score <= 1.0
    scores = [d.score for d in found[0]]
    assert scores == sorted(scores, reverse=True)
    det.close()
    assert det.net is None


def test_retinaface_rejects_wrong_file(tmp_path):
    bad = tmp_path / "bad.pth"
    torch.save({"conv.weight": torch.zeros(3)}, bad)
    with pytest.raises(DetectorError, match="bad.pth"):
        init_detector("retinaface_resnet50", weights=bad)
    with pytest.raises(DetectorError, match="not found"):
        init_detector("retinaface_resnet50", weights=tmp_path / "missing.pth")


@pytest.fixture
def http_dir(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_retinaface_weights_downloaded_into_cache(http_dir, tmp_path, monkeypatch):
    pytest.importorskip("gpen_tune.weights.download", reason="needs the weights downloader")
    served, base = http_dir
    monkeypatch.setenv("GPEN_TUNE_HOME", str(tmp_path / "home"))
    _retinaface_file(served, prefix="")
    url = f"{base}/detection_mobilenet0.25_Final.pth"
    det = init_detector("retinaface_mobile0.25", weights=url, threshold=0.5)
    cached = tmp_path / "home" / "detectors" / "detection_mobilenet0.25_Final.pth"
    assert cached.is_file() and det.name == "retinaface_mobile0.25"
    det.detect([np.zeros((64, 64, 3), np.uint8)])
    # second time: from the cache, even with the server gone
    (served / "detection_mobilenet0.25_Final.pth").unlink()
    assert init_detector("retinaface_mobile0.25", weights=url).name == "retinaface_mobile0.25"
    assert RETINAFACE_WEIGHTS["retinaface_mobile0.25"][0] == cached.name


def test_auto_remembers_an_unreachable_host(tmp_path, monkeypatch):
    """An offline or firewalled machine pays `auto`'s reachability probe once per UNREACHABLE_MEMORY_S, not on every
    run: a refused host is remembered in the cache folder (even after it comes up), and deleting the memory file,
    as the notice says, probes again."""
    import socket

    from gpen_tune.face.detect.weights import UNREACHABLE_FILE, auto_retinaface_weights, reachable

    monkeypatch.setenv("GPEN_TUNE_HOME", str(tmp_path / "home"))
    with socket.socket() as s:                      # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/detection_Resnet50_Final.pth"
    path, reason = auto_retinaface_weights(url)
    memory = tmp_path / "home" / "detectors" / UNREACHABLE_FILE
    assert path is None and reason.startswith("127.0.0.1 is unreachable") and memory.is_file()
    assert f"127.0.0.1:{port}" in memory.read_text()

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path, reason = auto_retinaface_weights(url)           # the host is up now, but remembered as down
        assert path is None and "next probe in 60 min" in reason and str(memory) in reason
        assert reachable(url, memory_s=0)                     # a probe finds it, and clears the memory
        assert f"127.0.0.1:{port}" not in memory.read_text()
        assert reachable(url)
    finally:
        server.shutdown()
        server.server_close()


def test_images_per_call_follow_the_memory_the_process_may_use():
    """The batched MTCNN takes fewer images per call where this process may use little GPU memory (a 4 GiB card,
    or a capped share of a big one): its working set grows with the images of a call."""
    from gpen_tune.face.detect.mtcnn import MTCNN_MAX_BATCH, images_per_call

    gib = 2**30
    assert images_per_call(4 * gib, 1024) == 2
    assert images_per_call(24 * gib, 1024) == 12
    assert images_per_call(140 * gib, 1024) == MTCNN_MAX_BATCH
    assert images_per_call(4 * gib, 512) == 8                     # smaller detection copies: more per call
    assert images_per_call(1 * gib, 1024) == 1                    # never zero
    assert images_per_call(24 * gib, None) < images_per_call(24 * gib, 1024)   # native size assumed large
    assert images_per_call(None, 1024) == MTCNN_MAX_BATCH         # the CPU: no device memory to bound
    assert MTCNNDetector("cpu").max_batch == MTCNN_MAX_BATCH
