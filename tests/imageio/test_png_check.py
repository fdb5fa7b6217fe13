"""The PNG pixel-stream check refuses no valid file: every colour type and bit depth Pillow writes, and an Adam7
interlaced PNG (made here row by row, since neither Pillow nor OpenCV writes one), decode as before."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpen_tune.face import samples
from gpen_tune.imageio import read_image
from gpen_tune.png_check import ADAM7, DamagedPng, check_stream, checked_chunks

RGB = samples.astronaut()[:97, :61]              # odd sizes: partial Adam7 blocks, rows not a multiple of 8 bits


def _modes() -> dict[str, Image.Image]:
    grey = RGB[..., 0]
    return {"RGB": Image.fromarray(RGB), "RGBA": Image.fromarray(np.dstack([RGB, grey])),
            "L": Image.fromarray(grey), "LA": Image.fromarray(np.dstack([grey, RGB[..., 1]]), "LA"),
            "P": Image.fromarray(RGB).convert("P"), "1": Image.fromarray(grey > 128),
            "I;16": Image.fromarray(grey.astype(np.uint16) * 257)}


@pytest.mark.parametrize("mode", sorted(_modes()))
def test_every_pillow_png_passes(mode):
    buf = io.BytesIO()
    _modes()[mode].save(buf, "PNG")
    check_stream(checked_chunks(buf.getvalue()))


def _interlaced(rgb: np.ndarray) -> bytes:
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    raw = b"".join(b"\x00" + row.tobytes() for x0, y0, dx, dy in ADAM7 for row in rgb[y0::dy, x0::dx] if row.size)
    h, w = rgb.shape[:2]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 1))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_an_interlaced_png_passes_and_reads_whole(tmp_path: Path):
    path = tmp_path / "interlaced.png"
    path.write_bytes(_interlaced(RGB))
    check_stream(path.read_bytes())
    assert np.array_equal(read_image(path).rgb, RGB)


def test_an_interlaced_png_cut_short_is_refused():
    data = _interlaced(RGB[:96])                        # 96 rows written under a header that says 97
    data = data[:16] + struct.pack(">I", 97) + data[20:]
    with pytest.raises(DamagedPng, match="cut short"):
        check_stream(data)                              # (the header's CRC is not checked here)
