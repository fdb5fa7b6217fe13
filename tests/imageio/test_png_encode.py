"""The parallel PNG writer: every band layout decodes (OpenCV and Pillow) to the exact pixels, metadata is kept,
and the level is the user's choice."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from gpen_tune import png_encode
from gpen_tune.face import samples
from gpen_tune.imageio import Picture, read_image, write_image
from gpen_tune.png_encode import encode_png


def _photo(scale: float = 2.0) -> np.ndarray:
    img = samples.astronaut()
    return cv2.resize(img, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("threads", [1, 3, 7])
def test_every_band_layout_decodes_to_the_same_pixels(channels, threads, monkeypatch):
    monkeypatch.setattr(png_encode, "MIN_BAND_BYTES", 4096)          # many bands on a small photo
    rgb = _photo(0.5)
    px = {1: rgb[..., 0], 2: np.dstack([rgb[..., 0], rgb[..., 2]]), 3: rgb, 4: np.dstack([rgb, rgb[..., 1]])}
    pixels = np.ascontiguousarray(px[channels])
    data = encode_png(pixels, 3, threads=threads)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), pixels)
    if channels == 2:
        return                                                        # OpenCV reads grey+alpha as BGRA
    back = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if channels >= 3:
        back = cv2.cvtColor(back, cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGRA2RGBA)
    assert np.array_equal(back.reshape(pixels.shape), pixels)


def test_levels_trade_size_for_time_and_bad_levels_are_refused():
    pixels = _photo(1.5)
    sizes = {lvl: len(encode_png(pixels, lvl)) for lvl in (0, 1, 3, 9)}
    assert sizes[0] > sizes[1] > sizes[3] >= sizes[9]
    assert sizes[0] > pixels.size                                     # level 0: stored, bigger than the pixels
    for bad in (-1, 10):
        with pytest.raises(ValueError, match="0 .*9"):
            encode_png(pixels, bad)


def test_write_image_keeps_exif_and_icc_and_takes_the_level(tmp_path):
    src = tmp_path / "src.jpg"
    exif = Image.Exif()
    exif[0x010E] = "a description"                                    # ImageDescription
    Image.fromarray(_photo(1.0)).save(src, quality=95, exif=exif.tobytes(), icc_profile=b"\0" * 128)
    pic = read_image(src)
    fast = write_image(pic, tmp_path / "fast.png", "PNG", png_level=0)
    small = write_image(pic, tmp_path / "small.png", "PNG", png_level=9)
    assert fast.stat().st_size > small.stat().st_size
    for path in (fast, small):
        back = read_image(path)
        assert np.array_equal(back.rgb, pic.rgb)
        assert back.icc_profile == pic.icc_profile
        assert Image.open(path).getexif()[0x010E] == "a description"


def test_grey_and_alpha_pictures_stay_grey_and_alpha(tmp_path):
    g = samples.astronaut()[..., 1]
    alpha = np.full(g.shape, 200, np.uint8)
    path = write_image(Picture(np.repeat(g[..., None], 3, axis=2), alpha=alpha, grayscale=True),
                       tmp_path / "la.png", "PNG")
    img = Image.open(path)
    assert img.mode == "LA" and np.array_equal(np.asarray(img)[..., 1], alpha)
