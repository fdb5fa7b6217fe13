"""Frames from any iterator of arrays in, restored frames back out to the caller."""

from __future__ import annotations

import threading
from fractions import Fraction

import numpy as np
import pytest
from clips import moving_frames

from gpen_tune.video import ArrayFrameSource, FrameQueueSink, VideoReader, VideoWriter, probe


def test_array_source_times_frames_from_the_rate():
    src = ArrayFrameSource(moving_frames(5), fps=25)
    frames = list(src)
    assert [f.pts for f in frames] == [0, 1, 2, 3, 4] and frames[0].time_base == Fraction(1, 25)
    assert src.expected_frames is None and frames[0].image.shape == (240, 320, 3)
    ms = list(ArrayFrameSource(list(moving_frames(4)), fps=Fraction(30000, 1001), time_base=Fraction(1, 1000)))
    assert [f.pts for f in ms] == [0, 33, 67, 100]
    with pytest.raises(RuntimeError, match="once"):
        list(src)


def test_array_source_refuses_frames_that_are_not_rgb():
    with pytest.raises(ValueError, match="frame 1: expected HWC RGB"):
        list(ArrayFrameSource([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8)], fps=10))


def test_array_source_can_be_written_to_a_file(tmp_path):
    src = ArrayFrameSource(moving_frames(12), fps=24)
    dst = tmp_path / "frames.mp4"
    with VideoWriter(dst, src.video_info(320, 240)) as writer:
        for image, pts, _ in src:
            writer.write(image, pts)
    info = probe(dst)
    assert (info.frame_count, info.fps, info.width, info.audio) == (12, 24, 320, ())
    assert [f.pts * f.time_base for f in VideoReader(dst)] == [Fraction(i, 24) for i in range(12)]


def test_queue_sink_hands_frames_back_in_order_and_reports_an_abort():
    sink = FrameQueueSink(maxsize=2)
    images = list(moving_frames(6))

    def produce():
        for i, image in enumerate(images):
            sink.write(image, i, Fraction(1, 25))
        sink.close()

    worker = threading.Thread(target=produce)
    worker.start()
    got = list(sink)
    worker.join()
    assert [f.pts for f in got] == list(range(6))
    assert all(np.array_equal(a.image, b) for a, b in zip(got, images, strict=True))

    failing = FrameQueueSink()
    failing.write(images[0], 0)
    failing.abort("restoring failed on frame 1")
    it = iter(failing)
    assert next(it).pts == 0
    with pytest.raises(RuntimeError, match="frame 1"):
        next(it)
