"""`DetectorHost`: one real spawned detector process (the offline MTCNN on the CPU) serving two clients at once,
each a `ProcessDetector.attached` to its own pipe. Both clients' images are detected in shared calls, and every
photo's faces equal the in-process detector's (each photo has a size of its own, so no two share a forward pass:
see test_detect_process.py)."""

from __future__ import annotations

import threading

import cv2
import numpy as np
import pytest
import torch
from face_testdata import mtcnn

from gpen_tune.face import samples
from gpen_tune.face.detect import DetectorProcessError, DetectorSpec, ProcessDetector
from gpen_tune.face.detect.host import DetectorHost

pytestmark = pytest.mark.slow   # a real spawned detector process


def _photos() -> list[np.ndarray]:
    imgs = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(4, 0),
            cv2.resize(samples.astronaut(), (384, 384), interpolation=cv2.INTER_AREA),
            cv2.resize(samples.grace_hopper(), (384, 450), interpolation=cv2.INTER_AREA),
            cv2.resize(samples.mosaic(4, 0), (300, 300), interpolation=cv2.INTER_AREA)]
    assert len({im.shape for im in imgs}) == len(imgs)
    return imgs


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        np.array_equal(g.box, w.box) and np.array_equal(g.landmarks, w.landmarks) and g.score == w.score
        for g, w in zip(got, want, strict=True))


def test_two_clients_share_the_host_and_get_the_in_process_faces():
    photos = _photos()
    want = [mtcnn().detect([img])[0] for img in photos]
    host = DetectorHost(DetectorSpec(name="mtcnn", device="cpu", torch_threads=torch.get_num_threads()), clients=2)
    a, b = (ProcessDetector.attached(conn) for conn in host.client_conns)
    assert a.name == "mtcnn" and str(a.device) == "cpu" and a.det_size == mtcnn().det_size
    got: dict[int, list] = {}
    go = threading.Barrier(len(photos))

    def detect(i: int) -> None:
        go.wait()
        got[i] = (a if i % 2 else b).detect([photos[i]])[0]

    threads = [threading.Thread(target=detect, args=(i,)) for i in range(len(photos))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(_same(got[i], want[i]) for i in range(len(photos)))
    assert sum(len(f) for f in want) > len(photos)          # the mosaics have several faces each
    assert a.images + b.images == len(photos)
    a.close()
    assert _same(b.detect([photos[2]])[0], want[2])        # one client gone: the other is still served
    b.close()
    host.close()
    assert host.process.exitcode == 0                       # it left once no client was left


def test_a_client_whose_host_died_fails_its_calls_in_one_line():
    host = DetectorHost(DetectorSpec(name="mtcnn", device="cpu", torch_threads=torch.get_num_threads()), clients=1)
    client = ProcessDetector.attached(host.client_conns[0])
    host.process.kill()
    host.process.join(10)
    with pytest.raises(DetectorProcessError, match="the detector process died"):
        client.detect([samples.astronaut()])
    client.close()
