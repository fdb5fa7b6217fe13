"""Key frames (`--detect-every N`): the full detector on every Nth frame, the frames between following its faces
(MTCNN's last two stages on boxes near the key frame's), on the bundled photos and clips made from them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from clips import make_clip, moving_frames  # noqa: E402

from gpen_tune.cli import app  # noqa: E402
from gpen_tune.face import samples  # noqa: E402
from gpen_tune.face.detect.build import build_backend  # noqa: E402
from gpen_tune.face.detect.mtcnn_batched import follow_candidates  # noqa: E402
from gpen_tune.face.detect.services import BatchingDetector, follow_faces  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.model.configs import GPENConfig  # noqa: E402
from gpen_tune.pipeline.api import Pipeline  # noqa: E402
from gpen_tune.pipeline.keyframes import KeyFrames  # noqa: E402
from gpen_tune.pipeline.scheduler import SchedulerConfig  # noqa: E402
from gpen_tune.pipeline.settings import EnhanceSettings  # noqa: E402
from gpen_tune.pipeline.video import enhance_video  # noqa: E402
from gpen_tune.video_presets import detect_every_for  # noqa: E402

COMMON = ["--weights", "synthetic", "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"]


def by_x(dets: list) -> list:
    return sorted(dets, key=lambda d: (d.box[0], d.box[1]))


@pytest.fixture(scope="module")
def mtcnn():
    return build_backend("mtcnn", device="cpu")


@pytest.mark.parametrize("driver", ["cpu", "batched"])
def test_following_finds_the_detected_faces_near_their_boxes_and_nothing_elsewhere(mtcnn, driver):
    """Boxes moved by 8 % of their width (a face that moved since its key frame): the same faces as a full
    detection, landmarks within 3 px; a box on the grey background finds nothing."""
    mtcnn.mixed_sizes = driver == "batched"          # the batched driver (what a GPU runs) on the CPU
    try:
        images = [samples.astronaut(), samples.mosaic(4, 2)]
        full = mtcnn.detect(images)
        assert [len(f) for f in full] == [1, 4]
        moved = [np.array([d.box + 0.08 * (d.box[2] - d.box[0]) for d in f]) for f in full]
        followed = mtcnn.follow(images, moved)
        for f, g in zip(full, followed, strict=True):
            assert len(g) == len(f)
            for a, b in zip(by_x(f), by_x(g), strict=True):
                assert np.abs(a.landmarks - b.landmarks).max() < 3.0
                assert b.score >= mtcnn.threshold
        grey = np.full((400, 400, 3), 128, np.uint8)
        assert mtcnn.follow([grey], [np.array([[100.0, 100.0, 200.0, 200.0]])]) == [[]]
    finally:
        mtcnn.mixed_sizes = False


def test_following_through_the_batching_service_matches_the_detector(mtcnn):
    image = samples.astronaut()
    boxes = [np.array([d.box for d in mtcnn.detect([image])[0]])]
    service = BatchingDetector(mtcnn)
    try:
        got = follow_faces(service, [image], boxes)[0]
        want = mtcnn.follow([image], boxes)[0]
        assert len(got) == len(want) == 1
        np.testing.assert_allclose(got[0].landmarks, want[0].landmarks, atol=1e-6)
        assert (service.follow_calls, service.followed, service.calls) == (1, 1, 0)
    finally:
        service.close(inner=False)


def test_follow_candidates_surround_each_box():
    cand = follow_candidates(np.array([[10.0, 20.0, 50.0, 80.0]]))
    assert cand.shape == (18, 5)
    sides = cand[:, 2] - cand[:, 0]
    assert np.allclose(cand[:, 3] - cand[:, 1], sides)                  # squares
    assert set(np.round(sides, 3)) == {60.0, 78.0}                      # the longer side, and 1.3x of it
    centres = (cand[:, :2] + cand[:, 2:4]) / 2
    assert np.allclose(centres.mean(0), [30.0, 50.0])


def test_key_frames_wait_for_their_key_and_fall_back_when_it_fails():
    keys = KeyFrames(4, wait_s=5.0)
    assert [i for i in range(10) if keys.is_key(i)] == [0, 4, 8]
    boxes = np.array([[1.0, 2.0, 3.0, 4.0]])
    threading.Timer(0.2, keys.publish, (4, boxes)).start()
    assert np.array_equal(keys.boxes_for(6), boxes)                     # waited for key 4
    keys.give_up(4)                                                     # already published: kept
    assert np.array_equal(keys.boxes_for(5), boxes)
    keys.give_up(8)                                                     # key 8 failed: its frames detect in full
    assert keys.boxes_for(9) is None
    assert KeyFrames(4, wait_s=0.05).boxes_for(3) is None               # no answer in time: in full
    with pytest.raises(ValueError, match="at least 1"):
        KeyFrames(0)


@pytest.fixture(scope="module")
def pipeline():
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu")
    with Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=8), model=model) as pipe:
        yield pipe


def _tracks(result) -> list[list[tuple]]:
    """Per frame, each face's (track id, filled by the tracker, score): a failed count's message."""
    return [[(f.detection.track_id, f.detection.filled, round(f.detection.score, 3)) for f in job.faces]
            for job in sorted(result.summary.results, key=lambda j: j.index)]


def _decoded(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_a_video_with_key_frames_restores_every_face_close_to_detecting_every_frame(tmp_path, pipeline):
    # lossless: one of the lossy writes of this clip held a second face scoring 0.907 (threshold 0.9) in frame 8
    src = make_clip(tmp_path / "clip.mp4", n=12, size=(320, 240), audio=False, subtitles=False, lossless=True)
    config = SchedulerConfig(workers=1, prepare_workers=2)
    every = enhance_video(src, tmp_path / "every.mp4", pipeline, config=config, crf=0)
    before = pipeline.detector_calls().get("thread", {}).get("follow_calls", 0)
    keyed = enhance_video(src, tmp_path / "keyed.mp4", pipeline, config=config, crf=0, detect_every=4)
    calls = pipeline.detector_calls()["thread"]
    assert every.faces == keyed.faces == 12, f"every: {_tracks(every)} keyed: {_tracks(keyed)}"  # a str: shown whole
    assert keyed.frames == 12 and keyed.passed_through == 0
    assert calls["follow_calls"] > before                               # the frames between followed
    a, b, s = (np.stack(_decoded(p)).astype(np.float32)
               for p in (tmp_path / "every.mp4", tmp_path / "keyed.mp4", src))
    face = (slice(None), slice(60, 180), slice(110, 210))
    restored = np.abs(a[face] - s[face]).mean()                         # what restoring changed in the face
    apart = np.abs(b[face] - a[face]).mean()                            # what following changed of that
    # following moves landmarks by 1-2 px (O-Net sees other boxes than after P-Net and R-Net): measured 1.96
    # against 4.82 grey levels here; a lost or misplaced face would differ by about as much as restoring did
    assert apart < 0.5 * restored, (apart, restored)
    # frame 0 is a key frame: the same detection; only the generator's batch composition may differ between
    # the runs (the pipeline's tolerance: 3 grey levels)
    assert np.abs(a[0] - b[0]).max() <= 3


def test_a_frame_that_loses_its_face_is_detected_in_full(tmp_path, pipeline):
    """The face jumps across the frame after the key frame: following finds nothing near the old box, so those
    frames are detected in full and keep their face."""
    left = next(moving_frames(1, (240, 240)))
    frames = []
    for i in range(4):
        canvas = np.full((240, 640, 3), 128, np.uint8)
        x = 0 if i == 0 else 400
        canvas[:, x:x + 240] = left
        frames.append(canvas)
    src = make_clip(tmp_path / "jump.mp4", n=4, size=(640, 240), frames=frames, audio=False, subtitles=False)
    config = SchedulerConfig(workers=1, prepare_workers=1)
    every = enhance_video(src, tmp_path / "every.mp4", pipeline, config=config)
    keyed = enhance_video(src, tmp_path / "keyed.mp4", pipeline, detect_every=4, config=config)
    assert keyed.faces == every.faces and keyed.passed_through == 0   # the tracker also fills the old face in
    out, inp = (np.stack(_decoded(p)).astype(np.float32) for p in (tmp_path / "keyed.mp4", src))
    moved = np.abs(out[1:, 60:180, 460:580] - inp[1:, 60:180, 460:580]).mean(axis=(1, 2, 3))
    assert (moved > 2.0).all(), moved                                   # the face where it jumped to: restored


def test_the_cli_takes_detect_every_and_defaults_to_every_frame(tmp_path):
    assert detect_every_for(None) == 1
    assert detect_every_for(2) == 2
    src = make_clip(tmp_path / "clip.mp4", n=6, size=(320, 240))
    command = typer.main.get_command(app)
    head = ["enhance"] if hasattr(command, "commands") else []
    ok = CliRunner().invoke(app, [*head, str(src), "-o", str(tmp_path / "out"), "--detect-every", "3", *COMMON],
                            catch_exceptions=False)
    assert ok.exit_code == 0, ok.output
    assert len(_decoded(tmp_path / "out" / "clip.mp4")) == 6
    bad = CliRunner().invoke(app, [*head, str(src), "-o", str(tmp_path / "bad"), "--detect-every", "0", *COMMON],
                             catch_exceptions=False)
    assert bad.exit_code != 0 and "--detect-every 0" in bad.output
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").iterdir())
