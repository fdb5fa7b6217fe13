"""Reading and writing photos as people have them.

What happens to each kind of input (documented behaviour, tested in tests/imageio/test_imageio.py):
  * formats in: JPEG, PNG, WebP, BMP, TIFF. Anything else is refused with a message; GIF too (a 256-colour
    palette format: a restored face quantised back to it loses most of what the restoration gained), with the
    hint to convert it to PNG.
  * one frame per file: a multi-page TIFF, an animated WebP or PNG is refused with a message naming the file
    and its frame count (never cut to its first frame); split it into single images first.
  * EXIF orientation is applied to the pixels; the EXIF block is kept with its orientation tag reset to 1, and
    written back (JPEG, PNG, WebP, TIFF; BMP has no EXIF). Tags that describe the source file's own layout
    (width, height, strips, compression, ... which a TIFF's EXIF block holds) are dropped from it: written into
    another file they would contradict its pixels. The ICC profile is carried the same way (dropped for CMYK
    inputs, whose profile does not describe the RGB output).
  * RGBA / LA / palette with transparency: the alpha channel is kept untouched and re-attached on output
    (a JPEG output cannot hold alpha: it is dropped there; BMP readers may ignore it).
  * grayscale (L, 16-bit I;16) is processed as RGB and written back as grayscale (luma 0.299/0.587/0.114, so
    pixels no face touches come back exactly).
  * 16-bit PNG/TIFF: the network sees an 8-bit copy (value / 257, rounded); restored faces are scaled back by 257
    and pasted into the original 16-bit pixels, so every untouched pixel keeps all 16 bits. Output stays 16-bit for
    PNG/TIFF (PNG keeps ICC and EXIF; 16-bit TIFF output carries no metadata), and is 8-bit for other formats.
  * images over 100 megapixels are refused (not tiled), with a message naming the size and the limit. Below the
    limit big photos are fine: detection runs on a downscaled copy (--det-size) and the default --face-crop paste
    touches only each face's region, so per-face cost does not grow with the frame; the limit exists because
    the decoded frame (and its output copy) must fit in host memory.
  * zero-byte, truncated, non-image and unsupported files raise `ImageReadError` naming the file and the reason.

Writing goes to a temporary file in the output folder followed by `os.replace`, so a crash never leaves a half
file; JPEG and WebP are written at quality 95, 8-bit PNG in parallel bands at zlib level 3 unless asked otherwise
(`gpen_tune.png_encode`).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import struct
import tempfile
import warnings
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from gpen_tune.exif import ORIENTATION_TAG, exif_without_orientation
from gpen_tune.file_mode import new_file_mode
from gpen_tune.png_check import DamagedPng, StreamCheck, checked_chunks
from gpen_tune.png_encode import PNG_LEVEL, encode_png

MAX_PIXELS = 100_000_000
JPEG_QUALITY = 95
EXT_TO_FORMAT = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP", "tif": "TIFF",
                 "tiff": "TIFF"}
FORMAT_TO_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "BMP": "bmp", "TIFF": "tiff"}
INPUT_EXTENSIONS = tuple(EXT_TO_FORMAT)
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class ImageReadError(ValueError):
    """An input that cannot be used; str() is one line naming the file and the reason."""


@dataclass
class Picture:
    """Decoded pixels plus what must go back into the output file."""

    rgb: np.ndarray                   # [H, W, 3] uint8 or uint16, RGB, orientation applied
    alpha: np.ndarray | None = None   # [H, W], same dtype as rgb
    grayscale: bool = False           # written back as a single channel
    format: str | None = None         # Pillow format name of the source ("JPEG", ...); None for arrays
    exif: bytes | None = None         # orientation already reset to 1
    icc_profile: bytes | None = None
    path: Path | None = None

    @property
    def bits(self) -> int:
        return 16 if self.rgb.dtype == np.uint16 else 8

    @property
    def size(self) -> tuple[int, int]:
        return self.rgb.shape[1], self.rgb.shape[0]

    def rgb8(self) -> np.ndarray:
        """The 8-bit RGB copy the detector and the network see."""
        if self.rgb.dtype == np.uint8:
            return self.rgb
        return np.rint(self.rgb.astype(np.float32) / 257.0).astype(np.uint8)

    def with_pixels(self, rgb: np.ndarray) -> Picture:
        return replace(self, rgb=rgb)


# ---------------------------------------------------------------------------------------------------- reading


def read_image(path: str | Path) -> Picture:
    """Decode `path` into a Picture; raises ImageReadError with a one-line reason (running out of memory too)."""
    path = Path(path)
    try:
        return _read_image(path)
    except (MemoryError, cv2.error) as e:
        if isinstance(e, cv2.error) and "memory" not in str(e).lower():
            raise ImageReadError(f"{path}: cannot decode ({' '.join(str(e).split())[-120:]})") from None
        raise ImageReadError(f"{path}: not enough memory to decode it: free memory, raise the limit (ulimit -v) "
                             "or downscale the image") from None


def _read_image(path: Path) -> Picture:
    if not path.exists():
        raise ImageReadError(f"{path}: no such file")
    if path.is_dir():
        raise ImageReadError(f"{path}: is a directory, not an image")
    if not path.is_file():
        raise ImageReadError(f"{path}: not a regular file (a pipe or a device): pass an image file")
    if path.stat().st_size == 0:
        raise ImageReadError(f"{path}: empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path)
    except Image.DecompressionBombError:
        raise ImageReadError(_too_big(path, None)) from None
    except UnidentifiedImageError:
        raise ImageReadError(f"{path}: not an image (or a format Pillow cannot read)") from None
    except OSError as e:
        if e.errno is not None:                       # the file system's answer (permission, I/O error)
            raise ImageReadError(f"{path}: cannot read ({e.strerror or e})") from None
        raise ImageReadError(f"{path}: cannot read ({e}); the file is damaged or cut off: copy it again from its "
                             "source") from None
    with img:
        if img.format not in FORMAT_TO_EXT:
            hint = "; convert it to PNG first" if img.format == "GIF" else ""
            raise ImageReadError(f"{path}: unsupported format {img.format} (supported: jpg, png, webp, bmp, "
                                 f"tiff){hint}")
        frames = getattr(img, "n_frames", 1)
        if frames > 1:
            kind = "multi-page TIFF" if img.format == "TIFF" else f"animated {img.format}"
            raise ImageReadError(f"{path}: {kind} with {frames} frames; only single-frame images are processed, "
                                 f"split it into one file per frame first")
        w, h = img.size
        if w * h > MAX_PIXELS:
            raise ImageReadError(_too_big(path, (w, h)))
        data = _checked_png(path) if img.format == "PNG" else None
        check = StreamCheck(data) if data is not None else None             # beside the decode (see png_check)
        if check is not None:
            check.start()
        try:
            picture = _decode(path, img, data)
        except ImageReadError:
            _finish_check(check, path)              # a damaged stream names itself, not the decoder's error
            raise
    _finish_check(check, path)
    return picture


def _finish_check(check: StreamCheck | None, path: Path) -> None:
    if check is not None:
        try:
            check.finish(path)
        except DamagedPng as e:
            raise ImageReadError(f"{e}; copy it again from its source") from None


def _checked_png(path: Path) -> bytes:
    """The PNG file's bytes once every chunk's length and CRC is checked (png_check.checked_chunks)."""
    try:
        return checked_chunks(path.read_bytes())
    except DamagedPng as e:
        raise ImageReadError(f"{path}: {e}; copy it again from its source") from None


def _decode(path: Path, img: Image.Image, data: bytes | None) -> Picture:
    """The pixels of an opened, checked image (`data`: a PNG's bytes, read once), with its EXIF and ICC kept."""
    exif, orientation = exif_without_orientation(img, data)
    icc = img.info.get("icc_profile") or None
    if img.mode == "CMYK":
        icc = None
    if img.format in ("PNG", "TIFF") and _is_16_bit(path, img):
        stored = None   # OpenCV applies a TIFF's orientation itself (and fails on 5-8): decode it with 1
        if img.format == "TIFF" and orientation not in (None, 1):
            stored = _tiff_without_orientation(path.read_bytes())
            if stored is None:
                raise ImageReadError(f"{path}: cannot read its TIFF orientation entry; convert it to PNG first")
        rgb, alpha, gray = _read_16_bit(path, stored)
        rgb, alpha = _orient(rgb, orientation), None if alpha is None else _orient(alpha, orientation)
        return Picture(rgb, alpha, gray, img.format, exif, icc, path)
    if img.format == "TIFF" and orientation not in (None, 1):
        rgb, alpha, gray = _read_oriented_tiff(path, img, orientation)
        return Picture(rgb, alpha, gray, img.format, exif, icc, path)
    fast = _decode_with_opencv(path, img, data)
    if fast is not None:
        return Picture(_orient(fast, orientation), None, False, img.format, exif, icc, path)
    try:
        img.load()
        oriented = ImageOps.exif_transpose(img) if orientation not in (None, 1) else img
        rgb, alpha, gray = _pixels_8_bit(oriented)
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageReadError(f"{path}: truncated or corrupt image data ({e})") from None
    return Picture(rgb, alpha, gray, img.format, exif, icc, path)


def _decode_with_opencv(path: Path, img: Image.Image, data: bytes | None = None) -> np.ndarray | None:
    """RGB pixels of a complete 8-bit RGB JPEG or PNG through OpenCV, else None (Pillow decodes it).

    Why: the same libjpeg-turbo / libpng pixels (identical to Pillow's, tested), but OpenCV releases the GIL for the
    whole decode while Pillow holds it to allocate and copy the frame; with many decode threads in a folder run
    that copy was 38 % of worker-thread GIL time (py-spy, benchmarks/results/20261130-2209_gil_profile_before.json).
    Truncated files go to Pillow, which names the error."""
    if img.mode != "RGB" or img.format not in ("JPEG", "PNG") or img.info.get("progression") is not None:
        return None
    if img.format == "PNG" and ("transparency" in img.info or img.info.get("interlace")):
        return None
    data = path.read_bytes() if data is None else data
    end = b"\xff\xd9" if img.format == "JPEG" else b"IEND\xaeB`\x82"
    if not data.rstrip(b"\x00").endswith(end):
        return None
    buf = np.frombuffer(data, np.uint8)
    rgb = cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION)   # RGB straight from the decoder
    if rgb is None or rgb.shape[:2] != (img.size[1], img.size[0]):
        return None
    return rgb


def _read_oriented_tiff(path: Path, img: Image.Image, orientation: int) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """An 8-bit TIFF with an EXIF orientation: decoded with the orientation entry set to 1, then oriented here.

    Why: Pillow applies a TIFF's orientation while loading, and for uncompressed L, RGBA, P and CMYK files with
    orientation 5-8 its pixels come out scrambled (Pillow 13); OpenCV 5 applies it too and fails on 5-8. Reading
    a copy whose IFD0 says orientation 1 gives the stored pixels in every mode, which `_orient` then turns."""
    data = _tiff_without_orientation(path.read_bytes())
    if data is None:
        raise ImageReadError(f"{path}: cannot read its TIFF orientation entry; convert it to PNG first")
    try:
        with Image.open(io.BytesIO(data)) as raw:
            raw.load()
            rgb, alpha, gray = _pixels_8_bit(raw)
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageReadError(f"{path}: truncated or corrupt image data ({e})") from None
    return _orient(rgb, orientation), None if alpha is None else _orient(alpha, orientation), gray


def _tiff_without_orientation(data: bytes) -> bytes | None:
    """The TIFF file with the value of IFD0's Orientation entry (0x0112) set to 1; None if not found."""
    order = {b"II": "<", b"MM": ">"}.get(data[:2])
    if order is None or len(data) < 16:
        return None
    magic = struct.unpack(order + "H", data[2:4])[0]
    if magic == 42:      # classic TIFF: 4-byte offsets, 12-byte entries
        ifd, count_fmt, entry, value_at = struct.unpack(order + "I", data[4:8])[0], "H", 12, 8
    elif magic == 43:    # BigTIFF: 8-byte offsets, 20-byte entries
        ifd, count_fmt, entry, value_at = struct.unpack(order + "Q", data[8:16])[0], "Q", 20, 12
    else:
        return None
    head = struct.calcsize(order + count_fmt)
    if ifd + head > len(data):
        return None
    n = struct.unpack(order + count_fmt, data[ifd:ifd + head])[0]
    for i in range(n):
        at = ifd + head + i * entry
        if at + entry > len(data):
            return None
        tag, kind = struct.unpack(order + "HH", data[at:at + 4])
        if tag == ORIENTATION_TAG and kind == 3:      # SHORT, stored in the entry itself
            out = bytearray(data)
            out[at + value_at:at + value_at + 2] = struct.pack(order + "H", 1)
            return bytes(out)
    return None


def _too_big(path: Path, size: tuple[int, int] | None) -> str:
    dims = f"{size[0]}x{size[1]} = {size[0] * size[1] / 1e6:.0f} MP" if size else "more than 179 MP"
    return (f"{path}: image too large ({dims}; the limit is {MAX_PIXELS // 1_000_000} MP): "
            f"downscale or split it first")


def _is_16_bit(path: Path, img: Image.Image) -> bool:
    if img.mode in _SIXTEEN_BIT_MODES:
        return True
    if img.format == "PNG":
        with open(path, "rb") as f:
            head = f.read(25)
        return len(head) == 25 and head[24] == 16               # IHDR bit depth
    bits = getattr(img, "tag_v2", {}).get(258)                  # TIFF BitsPerSample
    bits = bits if isinstance(bits, tuple) else (bits,)
    return any(b == 16 for b in bits if b is not None)


def _read_16_bit(path: Path, data: bytes | None = None) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """16-bit pixels through OpenCV (Pillow truncates 16-bit RGB to 8 bits); `data`: the file's bytes to decode
    instead of reading `path`."""
    if data is None:
        arr = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    else:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if arr is None or arr.dtype != np.uint16:
        raise ImageReadError(f"{path}: truncated or corrupt 16-bit image data")
    if arr.ndim == 2:
        return np.repeat(arr[..., None], 3, axis=2), None, True
    if arr.shape[2] == 2:
        return np.repeat(arr[..., :1], 3, axis=2), arr[..., 1].copy(), True
    if arr.shape[2] == 4:
        return cv2.cvtColor(arr, cv2.COLOR_BGRA2RGB), arr[..., 3].copy(), False
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB), None, False


def _orient(a: np.ndarray, orientation: int | None) -> np.ndarray:
    """EXIF orientation for arrays (same mapping as Pillow's exif_transpose)."""
    ops = {
        2: lambda x: x[:, ::-1],
        3: lambda x: x[::-1, ::-1],
        4: lambda x: x[::-1],
        5: lambda x: x.swapaxes(0, 1),
        6: lambda x: np.rot90(x, -1),
        7: lambda x: x.swapaxes(0, 1)[::-1, ::-1],
        8: lambda x: np.rot90(x, 1),
    }
    op = ops.get(orientation or 1)
    return np.ascontiguousarray(op(a)) if op else a


def _pixels_8_bit(img: Image.Image) -> tuple[np.ndarray, np.ndarray | None, bool]:
    mode = img.mode
    if mode == "P" or mode == "PA":
        img = img.convert("RGBA" if ("transparency" in img.info or mode == "PA") else "RGB")
        mode = img.mode
    if mode in ("1", "L"):
        g = np.asarray(img.convert("L"))
        return np.repeat(g[..., None], 3, axis=2), None, True
    if mode in ("LA", "La"):
        a = np.asarray(img.convert("LA"))
        return np.repeat(a[..., :1], 3, axis=2), a[..., 1].copy(), True
    if mode in ("RGBA", "RGBa"):
        a = np.asarray(img.convert("RGBA"))
        return np.ascontiguousarray(a[..., :3]), a[..., 3].copy(), False
    if mode == "F":
        raise ValueError("32-bit float images are not supported")
    return np.asarray(img.convert("RGB")).copy(), None, False


def picture_from_array(array: np.ndarray) -> Picture:
    """Wrap an array from the caller: [H, W] gray, [H, W, 3] RGB or [H, W, 4] RGBA, uint8 or uint16."""
    a = np.asarray(array)
    if a.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"image array must be uint8 or uint16, got {a.dtype}")
    if a.ndim == 2:
        return Picture(np.repeat(a[..., None], 3, axis=2), grayscale=True)
    if a.ndim == 3 and a.shape[2] == 3:
        return Picture(np.ascontiguousarray(a))
    if a.ndim == 3 and a.shape[2] == 4:
        return Picture(np.ascontiguousarray(a[..., :3]), alpha=a[..., 3].copy())
    raise ValueError(f"image array must be HxW, HxWx3 or HxWx4, got shape {a.shape}")


def to_array(pic: Picture) -> np.ndarray:
    """The inverse of picture_from_array: gray, RGB or RGBA array."""
    if pic.grayscale:
        g = _luma(pic.rgb)
        return g if pic.alpha is None else np.dstack([g, pic.alpha])
    return pic.rgb if pic.alpha is None else np.dstack([pic.rgb, pic.alpha])


# ---------------------------------------------------------------------------------------------------- writing


def output_format(ext: str | None, pic: Picture) -> tuple[str, str]:
    """(Pillow format, file extension without dot): `ext` if given, else the input's format (PNG for arrays)."""
    if ext:
        e = ext.lower().lstrip(".")
        if e not in EXT_TO_FORMAT:
            raise ValueError(f"unsupported output extension {ext!r} (use one of: {', '.join(EXT_TO_FORMAT)})")
        return EXT_TO_FORMAT[e], e
    fmt = pic.format or "PNG"
    if pic.path is not None and pic.path.suffix.lower().lstrip(".") in EXT_TO_FORMAT:
        return fmt, pic.path.suffix.lower().lstrip(".")     # as the output plan names it (P.JPG -> P.jpg)
    return fmt, FORMAT_TO_EXT[fmt]


TEMP_NAME_KEEP = 200       # bytes of the final name kept in a temp name (pid, random part and ".part" follow)
_OWN_TEMP = re.compile(r"^\..*\.(\d+)\.[a-z0-9_]{8}\.part$")


def temp_prefix(name: str) -> str:
    """The start of this process's temp names for `name`: ".<name>.<pid>." (the name cut to TEMP_NAME_KEEP bytes,
    so a final name near the file system's 255-byte limit still gets a temp name)."""
    cut = os.fsencode(name)[:TEMP_NAME_KEEP].decode(errors="ignore") if len(os.fsencode(name)) > TEMP_NAME_KEEP \
        else name
    return f".{cut}.{os.getpid()}."


def video_temp_path(dst: Path) -> Path:
    """The hidden name a video is written under before the rename (same folder: the rename is atomic)."""
    return dst.with_name(f"{temp_prefix(dst.stem)}partial{dst.suffix}")


_OWN_VIDEO_TEMP = re.compile(r"^\..*\.(\d+)\.partial\.[A-Za-z0-9]+$")


def temp_owner(file_name: str) -> int | None:
    """The process id in a temp name this package gives (`write_image`, `copy_file`, `video_temp_path`); None
    for any other name."""
    m = _OWN_TEMP.match(file_name) or _OWN_VIDEO_TEMP.match(file_name)
    return int(m.group(1)) if m else None


def _temp_beside(path: Path) -> str:
    """A new empty temp file next to `path`, named as `partial_pattern` describes."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path.name), suffix=".part")
    os.close(fd)
    return tmp


def partial_pattern(name_glob: str) -> str:
    """Glob of the temp files `write_image` and `copy_file` leave beside a file matching `name_glob` when their
    process dies mid-write (a live write's temp file matches too)."""
    return f".{name_glob}.*.part"


class OutputExistsError(FileExistsError):
    """The output appeared after the run planned it (another run into the same folder): not replaced."""


def commit(tmp: str | Path, path: Path, replace: bool = True) -> None:
    """Move the finished temp file onto `path`: os.replace, or (replace=False) only if `path` does not exist,
    atomically where the file system has hard links (a file another process writes meanwhile is never replaced)."""
    if replace:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OutputExistsError(f"{path} appeared while this run worked (another run into the same folder?): not "
                                "replaced; pass --overwrite to replace it") from None
    except OSError:                           # no hard links here (some network and FAT file systems)
        if os.path.lexists(path):
            raise OutputExistsError(f"{path} already exists: not replaced; pass --overwrite to replace it") \
                from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def write_image(pic: Picture, path: str | Path, fmt: str | None = None, png_level: int = PNG_LEVEL, *,
                replace: bool = True) -> Path:
    """Encode `pic` to `path` atomically (temp file in the same folder, then `commit`); 8-bit PNG in parallel bands
    at zlib level `png_level` (`gpen_tune.png_encode`)."""
    path = Path(path)
    fmt = fmt or EXT_TO_FORMAT.get(path.suffix.lower().lstrip("."), "PNG")
    tmp = _temp_beside(path)
    try:
        if pic.bits == 16 and fmt in ("PNG", "TIFF"):
            _write_16_bit(pic, Path(tmp), fmt)
        elif fmt == "PNG":
            _write_png(pic, Path(tmp), png_level)
        else:
            _write_8_bit(pic, Path(tmp), fmt)
        os.chmod(tmp, new_file_mode())
        commit(tmp, path, replace)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def copy_file(src: str | Path, path: str | Path, *, replace: bool = True) -> Path:
    """Byte-for-byte copy through a temp file and `commit` (images no face was pasted into)."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, new_file_mode())
        commit(tmp, path, replace)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma, rounded; R=G=B pixels map back to exactly that value."""
    y = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
    return np.clip(np.rint(y), 0, np.iinfo(rgb.dtype).max).astype(rgb.dtype)


def _to_pil(pic: Picture, fmt: str) -> Image.Image:
    rgb = pic.rgb if pic.bits == 8 else np.rint(pic.rgb.astype(np.float32) / 257.0).astype(np.uint8)
    alpha = pic.alpha
    if alpha is not None and alpha.dtype != np.uint8:
        alpha = np.rint(alpha.astype(np.float32) / 257.0).astype(np.uint8)
    if fmt == "JPEG":
        alpha = None
    if pic.grayscale and fmt != "WEBP":
        g = _luma(rgb)
        if alpha is None:
            return Image.fromarray(g, "L")
        if fmt in ("PNG", "TIFF"):
            return Image.fromarray(np.dstack([g, alpha]), "LA")
        rgb = np.repeat(g[..., None], 3, axis=2)
    if alpha is not None:
        return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    return Image.fromarray(rgb, "RGB")


def _save_options(pic: Picture, fmt: str) -> dict:
    opts: dict = {}
    if fmt in ("JPEG", "WEBP"):
        opts["quality"] = JPEG_QUALITY
    if fmt != "BMP":
        if pic.exif:
            opts["exif"] = pic.exif
        if pic.icc_profile:
            opts["icc_profile"] = pic.icc_profile
    return opts


def _write_8_bit(pic: Picture, tmp: Path, fmt: str) -> None:
    _to_pil(pic, fmt).save(tmp, format=fmt, **_save_options(pic, fmt))


def _write_png(pic: Picture, tmp: Path, level: int) -> None:
    pixels = np.asarray(_to_pil(pic, "PNG"))
    tmp.write_bytes(encode_png(pixels, level, _metadata_chunks(pic.icc_profile, pic.exif)))


def _write_16_bit(pic: Picture, tmp: Path, fmt: str) -> None:
    if pic.grayscale:
        arr = _luma(pic.rgb)
        if pic.alpha is not None:
            arr = np.dstack([arr, pic.alpha])
    else:
        arr = cv2.cvtColor(pic.rgb, cv2.COLOR_RGB2BGR)
        if pic.alpha is not None:
            arr = np.dstack([arr, pic.alpha])
    ok, buf = cv2.imencode(".png" if fmt == "PNG" else ".tiff", arr)
    if not ok:
        raise OSError(f"cannot encode a 16-bit {fmt} image")
    data = buf.tobytes()
    if fmt == "PNG":
        data = _png_with_metadata(data, pic.icc_profile, pic.exif)
    tmp.write_bytes(data)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _metadata_chunks(icc: bytes | None, exif: bytes | None) -> bytes:
    extra = b""
    if icc:
        extra += _png_chunk(b"iCCP", b"ICC Profile\0\0" + zlib.compress(icc))
    if exif:
        extra += _png_chunk(b"eXIf", exif[6:] if exif.startswith(b"Exif\0\0") else exif)
    return extra


def _png_with_metadata(png: bytes, icc: bytes | None, exif: bytes | None) -> bytes:
    """Insert iCCP / eXIf chunks right after IHDR (signature 8 bytes + IHDR chunk 25 bytes)."""
    return png[:33] + _metadata_chunks(icc, exif) + png[33:]
