"""Images as people have them: orientation, metadata, alpha, grayscale, 16 bit, bad files, atomic writes."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image, ImageCms, ImageOps

from gpen_tune.face import samples
from gpen_tune.imageio import (
    ImageReadError,
    Picture,
    _decode_with_opencv,
    output_format,
    picture_from_array,
    read_image,
    to_array,
    write_image,
)


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    return samples.astronaut()[100:260, 150:330]              # 180x160 real pixels, not square


def _srgb_icc() -> bytes:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010F] = "gpen-tune test camera"
    return exif


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_exif_orientation_applied_and_reset(tmp_path, photo, orientation):
    path = tmp_path / "o.png"
    Image.fromarray(photo).save(path, exif=_exif(orientation))
    pic = read_image(path)
    expect = np.asarray(Image.open(path).transpose(
        {1: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_270,
         8: Image.Transpose.ROTATE_90}[orientation]))
    if orientation == 1:
        expect = photo
    np.testing.assert_array_equal(pic.rgb, expect)
    out = write_image(pic, tmp_path / "out.png")
    with Image.open(out) as im:
        exif = im.getexif()
        assert exif.get(0x0112) == 1 and exif.get(0x010F) == "gpen-tune test camera"


@pytest.mark.parametrize("ext", ["jpg", "png"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_opencv_decode_equals_pillow_for_every_orientation(tmp_path, photo, ext, orientation):
    """8-bit RGB JPEG/PNG are decoded by OpenCV (GIL released); pixels must be Pillow's, orientation applied."""
    path = tmp_path / f"o.{ext}"
    Image.fromarray(photo).save(path, exif=_exif(orientation), **({"quality": 90} if ext == "jpg" else {}))
    with Image.open(path) as im:
        assert _decode_with_opencv(path, im) is not None            # the fast path takes this file
        expect = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    pic = read_image(path)
    assert pic.rgb.flags.c_contiguous and pic.rgb.dtype == np.uint8
    np.testing.assert_array_equal(pic.rgb, expect)


def test_icc_and_exif_carried_by_jpeg_png_webp_tiff(tmp_path, photo):
    icc = _srgb_icc()
    src = tmp_path / "in.jpg"
    Image.fromarray(photo).save(src, quality=95, icc_profile=icc, exif=_exif(1))
    pic = read_image(src)
    assert pic.icc_profile == icc and pic.format == "JPEG"
    for ext in ("jpg", "png", "webp", "tiff"):
        fmt, e = output_format(ext, pic)
        out = write_image(pic, tmp_path / f"o.{e}", fmt)
        with Image.open(out) as im:
            assert im.info.get("icc_profile") == icc, ext
            assert im.getexif().get(0x010F) == "gpen-tune test camera", ext
    assert output_format(None, pic) == ("JPEG", "jpg")


def test_rgba_keeps_alpha(tmp_path, photo):
    alpha = np.linspace(0, 255, photo.shape[1], dtype=np.uint8)[None].repeat(photo.shape[0], 0)
    path = tmp_path / "a.png"
    Image.fromarray(np.dstack([photo, alpha]), "RGBA").save(path)
    pic = read_image(path)
    assert pic.rgb.shape == photo.shape and np.array_equal(pic.alpha, alpha)
    out = np.asarray(Image.open(write_image(pic, tmp_path / "b.png")))
    assert out.shape[2] == 4 and np.array_equal(out[..., 3], alpha) and np.array_equal(out[..., :3], photo)
    assert to_array(pic).shape[2] == 4


def test_grayscale_processed_as_rgb_written_as_gray(tmp_path, photo):
    gray = cv2.cvtColor(photo, cv2.COLOR_RGB2GRAY)
    path = tmp_path / "g.png"
    Image.fromarray(gray, "L").save(path)
    pic = read_image(path)
    assert pic.grayscale and pic.rgb.shape == (*gray.shape, 3)
    assert (pic.rgb[..., 0] == pic.rgb[..., 2]).all()
    with Image.open(write_image(pic, tmp_path / "g2.png")) as im:
        assert im.mode == "L" and np.array_equal(np.asarray(im), gray)
    with Image.open(write_image(pic, tmp_path / "g2.jpg", "JPEG")) as im:
        assert im.mode == "L"


@pytest.mark.parametrize("ext", ["png", "tiff"])
def test_16_bit_keeps_untouched_pixels(tmp_path, photo, ext):
    deep = photo.astype(np.uint16) * 256 + np.arange(photo.shape[1], dtype=np.uint16)[None, :, None] % 200
    path = tmp_path / f"d.{ext}"
    assert cv2.imwrite(str(path), cv2.cvtColor(deep, cv2.COLOR_RGB2BGR))
    pic = read_image(path)
    assert pic.bits == 16 and np.array_equal(pic.rgb, deep)
    assert np.abs(pic.rgb8().astype(int) - photo).max() <= 1     # what the network sees
    edited = pic.rgb.copy()
    edited[:10, :10] = 65535
    out = write_image(pic.with_pixels(edited), tmp_path / f"o.{ext}")
    back = cv2.cvtColor(cv2.imread(str(out), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGR2RGB)
    assert back.dtype == np.uint16 and np.array_equal(back, edited)


def test_16_bit_png_gray_with_icc(tmp_path):
    g = (np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * 21)
    path = tmp_path / "g16.png"
    cv2.imwrite(str(path), g)
    pic = read_image(path)
    assert pic.grayscale and pic.bits == 16
    pic.icc_profile = _srgb_icc()
    out = write_image(pic, tmp_path / "o.png")
    assert np.array_equal(cv2.imread(str(out), cv2.IMREAD_UNCHANGED), g)
    with Image.open(out) as im:
        assert im.info.get("icc_profile") == pic.icc_profile


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    iend = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + chunk + iend


def test_bad_inputs_each_give_one_clear_line(tmp_path, photo):
    good = tmp_path / "good.jpg"
    Image.fromarray(photo).save(good)
    cases = {
        "empty.png": (b"", "empty file"),
        "notes.jpg": (b"these are my holiday notes\n" * 10, "not an image"),
        "truncated.jpg": (good.read_bytes()[: len(good.read_bytes()) // 3], "truncated"),
        "huge.png": (_png_header(12_000, 9_000), "too large"),
        "bomb.png": (_png_header(40_000, 40_000), "too large"),
    }
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    Image.fromarray(photo).save(tmp_path / "anim.gif")
    cases["anim.gif"] = (None, "unsupported format GIF")
    (tmp_path / "folder.png").mkdir()
    cases["folder.png"] = (None, "directory")
    cases["missing.png"] = (None, "no such file")
    for name, (_, reason) in cases.items():
        with pytest.raises(ImageReadError) as info:
            read_image(tmp_path / name)
        msg = str(info.value)
        assert name in msg and reason in msg and "\n" not in msg, msg


def test_write_is_atomic(tmp_path, photo):
    pic = Picture(photo)
    target = tmp_path / "x.png"
    target.write_bytes(b"old")
    with pytest.raises(Exception):  # noqa: B017 - any failure: the old file must survive and no temp remains
        write_image(Picture(np.zeros((0, 0, 3), np.uint8)), target, "PNG")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]
    write_image(pic, target)
    assert np.array_equal(np.asarray(Image.open(target)), photo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.png"]
    assert (target.stat().st_mode & 0o777) != 0o600              # normal permissions, not mkstemp's


def test_arrays_in_and_out(photo):
    assert picture_from_array(photo).rgb is not None
    assert picture_from_array(photo[..., 0]).grayscale
    with pytest.raises(ValueError):
        picture_from_array(photo.astype(np.float32))


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_with_late_chunks(plain: bytes, late: list[bytes]) -> bytes:
    """`plain` (a PNG without metadata) with the chunks `late` put between its last IDAT and IEND."""
    iend = plain.rindex(b"IEND") - 4
    return plain[:iend] + b"".join(late) + plain[iend:]


@pytest.mark.parametrize("where", ["eXIf", "raw profile", "xmp"])
def test_png_metadata_after_the_pixels_is_read_as_pillow_reads_it(tmp_path, photo, where):
    """EXIF orientation stored after a PNG's pixel data (an eXIf chunk, ImageMagick's raw-profile text, XMP):
    read_image finds it without Pillow decoding the pixels for it (the eXIf chunk) or through Pillow (text
    chunks), and orients the photo as Pillow's own reading does."""
    buf = tmp_path / "plain.png"
    Image.fromarray(photo).save(buf)
    block = _exif(6).tobytes()                                  # b"Exif\0\0" + TIFF header ...
    tiff = block[6:] if block.startswith(b"Exif") else block
    late = {
        "eXIf": [_chunk(b"eXIf", tiff)],
        "raw profile": [_chunk(b"tEXt", b"Raw profile type exif\x00\nexif\n" + f"{len(block):8d}\n".encode()
                                + block.hex().encode() + b"\n")],
        "xmp": [_chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00"
                                b"<x:xmpmeta><tiff:Orientation>6</tiff:Orientation></x:xmpmeta>")],
    }[where]
    path = tmp_path / "late.png"
    path.write_bytes(_png_with_late_chunks(buf.read_bytes(), late))
    with Image.open(path) as im:
        expect = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    assert expect.shape == (photo.shape[1], photo.shape[0], 3)     # Pillow turns it: orientation 6 was found
    pic = read_image(path)
    np.testing.assert_array_equal(pic.rgb, expect)
    if where != "xmp":
        kept = Image.Exif()
        kept.load(pic.exif)
        assert kept.get(0x0112) == 1 and kept.get(0x010F) == "gpen-tune test camera"
