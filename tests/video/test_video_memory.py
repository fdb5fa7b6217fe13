"""Decoding a longer clip keeps host memory flat: frames are produced one at a time, never all held."""

from __future__ import annotations

import os

import pytest
from clips import make_clip

from gpen_tune.video import VideoReader

PAGE = os.sysconf("SC_PAGE_SIZE")
FRAME_BYTES = 320 * 240 * 3


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _peak_growth(path) -> int:
    """Largest resident-size growth seen while iterating `path` (sampled every 25 frames)."""
    start = peak = _rss()
    for i, frame in enumerate(VideoReader(path)):
        assert frame.image.shape == (240, 320, 3)
        if i % 25 == 0:
            peak = max(peak, _rss())
    return max(peak, _rss()) - start


@pytest.mark.slow
def test_rss_does_not_grow_with_the_frame_count(tmp_path):
    short = make_clip(tmp_path / "short.mkv", 150, audio=False, subtitles=False)
    long = make_clip(tmp_path / "long.mkv", 600, audio=False, subtitles=False)
    _peak_growth(short)                                   # warm-up: decoder pools, numpy allocator
    growth_short, growth_long = _peak_growth(short), _peak_growth(long)
    held_all = 450 * FRAME_BYTES                          # what keeping the extra 450 frames would cost (~100 MiB)
    assert growth_long - growth_short < held_all / 10, (growth_short, growth_long)
    assert growth_long < 64 * FRAME_BYTES, growth_long
