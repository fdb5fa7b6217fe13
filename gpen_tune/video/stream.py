"""The former home of `enhance_video` / `enhance_frames`, kept so that users' scripts keep working: they live in
`gpen_tune.pipeline.video` (also `gpen_tune.enhance_video`). Loaded on first use, so that importing `gpen_tune.video`
never imports the pipeline (the pipeline imports video, not the other way round)."""

from __future__ import annotations

import importlib

_MOVED = ("FrameSource", "EncoderSink", "FrameTracker", "VideoResult", "enhance_video", "enhance_frames")


def __getattr__(name: str):
    if name in _MOVED:
        return getattr(importlib.import_module("gpen_tune.pipeline.video"), name)
    raise AttributeError(f"module 'gpen_tune.video.stream' has no attribute {name!r}")
