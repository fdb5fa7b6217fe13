"""Images for checking a result by eye: the input | output comparison (`--save-comparison`) and the paste's blend
weights (`--save-mask`).

Transparent parts are shown over a grey checkerboard (as image editors do): flattening them onto black made
half-transparent faces look darker than they are. With a background upscaler the input is resized to the
output's size, so the two halves line up pixel for pixel.
"""

from __future__ import annotations

import cv2
import numpy as np

from gpen_tune.imageio import Picture

CHECKER_CELL = 16                    # px
CHECKER_GREYS = (204, 153)           # light / dark squares


def checkerboard(height: int, width: int, cell: int = CHECKER_CELL) -> np.ndarray:
    """[H, W, 3] uint8 grey checkerboard."""
    ys, xs = np.indices((height, width))
    dark = ((ys // cell + xs // cell) % 2).astype(bool)
    board = np.where(dark, CHECKER_GREYS[1], CHECKER_GREYS[0]).astype(np.uint8)
    return np.repeat(board[..., None], 3, axis=2)


def over_checkerboard(rgb8: np.ndarray, alpha: np.ndarray | None) -> np.ndarray:
    """8-bit RGB composited over the checkerboard by `alpha` (uint8 or uint16, same size); as is without alpha."""
    if alpha is None:
        return rgb8
    a = alpha.astype(np.float32) / (65535.0 if alpha.dtype == np.uint16 else 255.0)
    board = checkerboard(*rgb8.shape[:2]).astype(np.float32)
    out = board + a[..., None] * (rgb8.astype(np.float32) - board)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def comparison_image(before: Picture, after: Picture) -> np.ndarray:
    """input | output side by side, [H, 2W, 3] uint8 RGB at the output's size, alpha over a checkerboard."""
    w, h = after.size
    left = over_checkerboard(before.rgb8(), before.alpha)
    if (left.shape[1], left.shape[0]) != (w, h):
        left = cv2.resize(left, (w, h), interpolation=cv2.INTER_LINEAR)
    return np.hstack([left, over_checkerboard(after.rgb8(), after.alpha)])


def weights_image(weights: np.ndarray) -> np.ndarray:
    """Blend weights [H, W] in [0, 1] (`gpen_tune.face.paste.blend_weights`) -> [H, W] uint8 grey (255 = fully
    restored), for looking at seams."""
    return np.clip(np.rint(np.asarray(weights, np.float32) * 255.0), 0, 255).astype(np.uint8)
