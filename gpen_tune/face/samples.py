"""Real photos that ship inside installed wheels, for tests, demos and `bench`'s default inputs.

* `astronaut()`: scikit-image's portrait of Eileen Collins (NASA, public domain), 512x512, one face.
* `grace_hopper()`: matplotlib's sample photo of Grace Hopper, 512x600, one face.
* `mosaic()`: several of them at different scales and small rotations on one canvas (deterministic).
* `aligned_face_crops(size)`: the faces the offline detector finds in those, aligned to GPEN's template.
"""

from __future__ import annotations

import math
from functools import lru_cache

import cv2
import numpy as np

BACKGROUND = 128                    # mosaic canvas grey
MOSAIC_SCALES = (0.38, 0.8)         # tile scale range relative to the 512-px source photos
MOSAIC_MAX_ROTATION = 12.0          # degrees


@lru_cache(maxsize=1)
def _astronaut() -> np.ndarray:
    from skimage import data  # optional: scikit-image (sample photo source)

    img = np.ascontiguousarray(data.astronaut()[..., :3])
    img.setflags(write=False)
    return img


@lru_cache(maxsize=1)
def _grace_hopper() -> np.ndarray:
    from matplotlib import cbook  # optional: matplotlib (sample photo source)
    from PIL import Image  # heavy: PIL, only when the photo is first asked for

    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as im:
        img = np.asarray(im.convert("RGB")).copy()
    img.setflags(write=False)
    return img


def astronaut() -> np.ndarray:
    """[512, 512, 3] uint8 RGB, one face."""
    return _astronaut().copy()


def grace_hopper() -> np.ndarray:
    """[600, 512, 3] uint8 RGB, one face."""
    return _grace_hopper().copy()


def mosaic_with_tiles(n_faces: int = 6, seed: int = 0) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """The mosaic and the rectangle (x0, y0, x1, y1) of each tile; every tile holds exactly one face."""
    rng = np.random.default_rng(seed)
    sources = [_astronaut(), _grace_hopper()]
    cols = max(1, math.ceil(math.sqrt(n_faces)))
    rows = math.ceil(n_faces / cols)
    cell = int(max(max(s.shape[:2]) for s in sources) * MOSAIC_SCALES[1] * 1.15)
    canvas = np.full((rows * cell, cols * cell, 3), BACKGROUND, np.uint8)
    tiles = []
    for i in range(n_faces):
        src = sources[i % 2]
        scale = rng.uniform(*MOSAIC_SCALES)
        angle = rng.uniform(-MOSAIC_MAX_ROTATION, MOSAIC_MAX_ROTATION)
        h, w = src.shape[:2]
        tw, th = round(w * scale), round(h * scale)
        small = cv2.resize(src, (tw, th), interpolation=cv2.INTER_AREA)
        rot = cv2.getRotationMatrix2D((tw / 2, th / 2), angle, 1.0)
        tile = cv2.warpAffine(small, rot, (tw, th), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                              borderValue=(BACKGROUND,) * 3)
        r, c = divmod(i, cols)
        x0 = c * cell + (cell - tw) // 2
        y0 = r * cell + (cell - th) // 2
        canvas[y0:y0 + th, x0:x0 + tw] = tile
        tiles.append((c * cell, r * cell, (c + 1) * cell, (r + 1) * cell))
    return canvas, tiles


def mosaic(n_faces: int = 6, seed: int = 0) -> np.ndarray:
    """Several real faces at different scales and small rotations on one grey canvas (RGB uint8)."""
    return mosaic_with_tiles(n_faces, seed)[0]


@lru_cache(maxsize=1)
def _sample_landmarks() -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """(image, landmarks [5, 2]) of every face the offline detector finds in the bundled photos."""
    from gpen_tune.face.detect import init_detector  # heavy: torch (samples stays light to import)

    images = [_astronaut(), _grace_hopper(), mosaic(6, 0)]
    det = init_detector("mtcnn", device="cpu")
    try:
        found = det.detect(images)
    finally:
        det.close()
    return tuple((img, d.landmarks) for img, dets in zip(images, found, strict=True) for d in dets)


def aligned_face_crops(size: int, n: int | None = None) -> np.ndarray:
    """[N, S, S, 3] uint8 RGB real faces aligned to GPEN's template; `n` repeats or truncates the set."""
    from gpen_tune.face.align import alignment, warp_crop  # heavy: torch (samples stays light to import)

    crops = []
    for img, lms in _sample_landmarks():
        affine, _ = alignment(lms, size, "gpen")
        crops.append(warp_crop(img, affine, size))
    if n is not None:
        crops = [crops[i % len(crops)] for i in range(n)]
    return np.stack(crops)
