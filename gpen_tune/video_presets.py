"""The libx264 / libx265 speed preset a video is written with: the one asked for, else by the tune preset.

Outside gpen_tune.video (whose package imports PyAV): the CLI checks the flag before anything heavy loads.
"""

from __future__ import annotations

# libx264 / libx265 speed presets, fastest first: a faster one writes a bigger file at about the same crf quality
ENCODER_PRESETS: tuple[str, ...] = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                                    "slower", "veryslow")
DEFAULT_ENCODER_PRESET = "medium"
SPEED_ENCODER_PRESET = "veryfast"                          # with the tune preset "speed"


# Frames per full detection in a video, whatever the tune preset: following faces between key frames pays on the
# CPU, where a detection costs ~6x a follow, but not on a GPU, where both are a few ms of launches and syncs and the
# video is limited elsewhere (benchmarks/RESULTS.md, "Key frames in a video").
DEFAULT_DETECT_EVERY = 1


def detect_every_for(requested: int | None) -> int:
    """Frames per full detection in a video: the number asked for (at least 1), else every frame."""
    if requested is None:
        return DEFAULT_DETECT_EVERY
    if requested < 1:
        raise ValueError(f"--detect-every {requested}: use 1 (every frame) or more")
    return requested


def encoder_preset_for(requested: str | None, tune_preset: str | None) -> str:
    """The x264/x265 speed preset: the one asked for, else veryfast under `--preset speed`, else medium."""
    if requested is not None:
        if requested not in ENCODER_PRESETS:
            raise ValueError(f"--video-preset {requested}: use one of {', '.join(ENCODER_PRESETS)}")
        return requested
    return SPEED_ENCODER_PRESET if tune_preset == "speed" else DEFAULT_ENCODER_PRESET
