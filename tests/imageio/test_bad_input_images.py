"""Hostile images for gpen_tune.imageio: TIFFs with an EXIF orientation in every mode (written back correctly, in
the rotated size, with no layout tag of the source), multi-page TIFF, animated GIF/WebP/PNG (refused with one
line naming the file and the frame count, never cut to page 1), GIF as an input (refused with the fix)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gpen_tune.imageio import ImageReadError, _orient, read_image, write_image

_Y, _X = np.mgrid[0:48, 0:64]
PIXELS = np.dstack([4 * _X, 5 * _Y, 2 * _X + 2 * _Y]).astype(np.uint8)   # smooth (JPEG-friendly), no symmetry


def tiff_with_orientation(path, mode: str, orientation: int, compression: str | None) -> np.ndarray:
    """Writes the TIFF; returns the RGB pixels a viewer shows (orientation applied)."""
    im = Image.fromarray(PIXELS).convert(mode)
    exif = im.getexif()
    exif[0x0112] = orientation
    exif[0x010F] = "Canon"                         # a descriptive tag that must survive
    im.save(path, exif=exif.tobytes(), **({"compression": compression} if compression else {}))
    return _orient(np.asarray(im.convert("RGB")), orientation)


@pytest.mark.parametrize("compression", [None, "tiff_lzw"])
@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "LA", "P", "CMYK"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_tiff_with_exif_orientation_is_read_and_written_correctly(tmp_path, mode, orientation, compression):
    src = tmp_path / "in.tiff"
    shown = tiff_with_orientation(src, mode, orientation, compression)
    pic = read_image(src)
    assert pic.rgb.shape == shown.shape
    for ext in ("tiff", "png", "jpg"):
        out = write_image(pic, tmp_path / f"out.{ext}")
        with Image.open(out) as back:
            back.load()
            assert back.size == (shown.shape[1], shown.shape[0]), ext
            assert back.getexif().get(0x0112) in (None, 1)
            got = np.asarray(back.convert("RGB")).astype(int)
        error = np.abs(got - shown.astype(int))
        assert (error.mean() <= 16 if ext == "jpg" else error.max() <= 1), ext   # a wrong turn: ~50 on average
        if ext == "tiff":
            with Image.open(out) as back:
                assert back.getexif().get(0x010F) == "Canon"


def test_sixteen_bit_tiff_with_orientation(tmp_path):
    gray = (np.arange(48 * 64) * 37 % 65535).astype(np.uint16).reshape(48, 64)
    im = Image.fromarray(gray)
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(tmp_path / "g16.tiff", exif=exif.tobytes())
    pic = read_image(tmp_path / "g16.tiff")
    assert pic.bits == 16 and np.array_equal(pic.rgb[..., 0], np.rot90(gray, -1))
    out = write_image(pic, tmp_path / "out.tiff")
    assert read_image(out).rgb.shape == (64, 48, 3)


def frames(n: int) -> list[Image.Image]:
    return [Image.fromarray(np.roll(PIXELS, 7 * i, axis=1)) for i in range(n)]


def one_line(exc: pytest.ExceptionInfo, *needles: str) -> None:
    text = str(exc.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text


def test_multi_page_tiff_is_refused(tmp_path):
    path = tmp_path / "scan.tiff"
    first, *rest = frames(3)
    first.save(path, save_all=True, append_images=rest)
    with pytest.raises(ImageReadError) as exc:
        read_image(path)
    one_line(exc, str(path), "multi-page TIFF", "3 frames")


@pytest.mark.parametrize("fmt, ext", [("WEBP", "webp"), ("PNG", "png")])
def test_animated_webp_and_png_are_refused(tmp_path, fmt, ext):
    path = tmp_path / f"clip.{ext}"
    first, *rest = frames(4)
    first.save(path, format=fmt, save_all=True, append_images=rest, duration=100, loop=0)
    with pytest.raises(ImageReadError) as exc:
        read_image(path)
    one_line(exc, str(path), f"animated {fmt}", "4 frames")


@pytest.mark.parametrize("n", [1, 3])
def test_gif_is_refused_with_the_fix(tmp_path, n):
    path = tmp_path / "face.gif"
    first, *rest = frames(n)
    first.save(path, save_all=True, append_images=rest, duration=100)
    with pytest.raises(ImageReadError) as exc:
        read_image(path)
    one_line(exc, str(path), "unsupported format GIF", "convert it to PNG")


def test_single_page_tiff_and_still_webp_still_read(tmp_path):
    Image.fromarray(PIXELS).save(tmp_path / "one.tiff")
    Image.fromarray(PIXELS).save(tmp_path / "one.webp", lossless=True)
    assert np.array_equal(read_image(tmp_path / "one.tiff").rgb, PIXELS)
    assert np.array_equal(read_image(tmp_path / "one.webp").rgb, PIXELS)
