"""A photo's EXIF as `read_image` keeps it: read without decoding the pixels, written back with orientation 1 and
without the tags that describe the source file's own layout."""

from __future__ import annotations

from PIL import Image

from gpen_tune.png_check import late_chunks

ORIENTATION_TAG = 0x0112
# TIFF tags that describe how one file stores its pixels (size, samples, strips/tiles, compression, colour map,
# ICC profile, sub-IFDs): meaningless in another file; a TIFF written with a rotated frame and the source's
# width/height would be corrupt
LAYOUT_TAGS = frozenset({254, 255, 256, 257, 258, 259, 262, 263, 264, 265, 266, 273, 277, 278, 279, 280, 281, 284,
                         288, 289, 290, 291, 292, 293, 317, 320, 322, 323, 324, 325, 330, 338, 339, 340, 341, 347,
                         513, 514, 530, 531, 532, 34675})


def read_exif(img: Image.Image, data: bytes | None) -> Image.Exif:
    """`img.getexif()`, without decoding a PNG's pixels where its chunks allow.

    Why: Pillow's PNG reader looks for an EXIF block stored after the pixel data by decoding the whole image: 112 ms
    of a 6.8 MP photo's 255 ms read (2 cores), the pixels then decoded again by OpenCV. With the file's bytes at
    hand (`data`, checked), an eXIf chunk after the pixels is read here; text chunks after them (a raw EXIF profile
    or XMP may be there) still go through Pillow's load."""
    if img.format != "PNG" or data is None:
        return img.getexif()
    late = late_chunks(data)
    if late.keys() & {b"tEXt", b"zTXt", b"iTXt"}:
        return img.getexif()
    if b"eXIf" in late and "exif" not in img.info:
        img.info["exif"] = b"Exif\x00\x00" + late[b"eXIf"]       # as Pillow's reader stores it
    return Image.Image.getexif(img)                                # what the header chunks gave: no decode


def exif_without_orientation(img: Image.Image, data: bytes | None = None) -> tuple[bytes | None, int | None]:
    """(the EXIF block to write: orientation 1, no layout tags; the source's orientation)."""
    try:
        exif = read_exif(img, data)
    except Exception:  # noqa: BLE001 - broken EXIF must not make the photo unreadable
        return None, None
    if not len(exif):
        return None, None
    orientation = exif.get(ORIENTATION_TAG)
    try:
        copy = Image.Exif()                           # the image keeps its own block for transposing
        copy.load(exif.tobytes())
        for tag in LAYOUT_TAGS & set(copy):
            del copy[tag]
        if orientation is not None:
            copy[ORIENTATION_TAG] = 1
        return (copy.tobytes() if len(copy) else None), orientation
    except Exception:  # noqa: BLE001
        return None, orientation
