"""Bench inputs: real aligned face crops, as a [N,3,S,S] tensor in [-1,1] (NCHW, RGB)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


class InputError(ValueError):
    """Unusable --inputs; the message names the path and the fix."""


def crops_from_folder(folder: str | Path, size: int, limit: int | None = None) -> np.ndarray:
    """Every image in `folder` (sorted by name), RGB, resized to size x size: [N,S,S,3] uint8."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder; pass --inputs DIR with aligned face crops (PNG/JPEG)")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise InputError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}); put aligned face crops there")
    files = files[:limit] if limit else files
    crops = []
    for path in files:
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                if im.size != (size, size):
                    im = im.resize((size, size), Image.BICUBIC)
                crops.append(np.asarray(im))
        except OSError as e:
            raise InputError(f"{path}: not a readable image ({e}); remove it from --inputs") from None
    return np.stack(crops)


def bundled_crops(size: int, limit: int | None = None) -> np.ndarray:
    """Faces detected in the bundled real photos (gpen_tune.face.samples, the pipeline part)."""
    try:
        from gpen_tune.face.samples import aligned_face_crops  # optional: the pipeline part and its offline detector

        return aligned_face_crops(size, n=limit)
    except Exception as e:  # the pipeline part or its offline detector (facenet-pytorch) missing
        raise InputError(f"the bundled face crops need gpen_tune.face.samples and its detector "
                         f"({type(e).__name__}: {e}); pass --inputs DIR with aligned face crops instead") from None


def to_tensor(crops: np.ndarray) -> torch.Tensor:
    """[N,S,S,3] uint8 RGB -> [N,3,S,S] float32 in [-1,1]."""
    return torch.from_numpy(np.ascontiguousarray(crops)).permute(0, 3, 1, 2).float().div(127.5).sub(1).contiguous()


def load_faces(inputs: str | Path | None, size: int, limit: int | None = 16) -> tuple[torch.Tensor, str]:
    """(faces, a description of where they came from)."""
    if inputs is None:
        crops = bundled_crops(size, limit)
        return to_tensor(crops), f"bundled photos (gpen_tune.face.samples), {len(crops)} faces"
    crops = crops_from_folder(inputs, size, limit)
    return to_tensor(crops), f"{inputs}, {len(crops)} faces"
