"""The names a user picks from (detectors, alignment templates, devices): one home, light to import.

The library validates against these tuples and the CLI builds its choices and help texts from them, so a new
detector or template is added here once. Nothing heavy is imported (the CLI's `--help` stays fast).
"""

from __future__ import annotations

DETECTOR_NAMES: tuple[str, ...] = ("auto", "retinaface_resnet50", "retinaface_mobile0.25", "mtcnn")
TEMPLATES: tuple[str, ...] = ("gpen", "ffhq")        # gpen: upstream GPEN's 5 points; ffhq: GFPGAN's
DEVICES: tuple[str, ...] = ("auto", "cuda", "cpu", "mps")
BG_UPSAMPLERS: tuple[str, ...] = ("realesrnet", "realesrgan")


def spelled(names: tuple[str, ...], default: str | None = None) -> str:
    """'a, b, c or d' with the default marked, for help texts."""
    words = [f"{n} (default)" if n == default else n for n in names]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
