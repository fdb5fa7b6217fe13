"""A PNG file checked before its pixels are used: every chunk's length and CRC, then its pixel stream (the IDAT
chunks) inflated end to end without keeping it.

Why both: libpng inside OpenCV decodes a pixel chunk with a bad CRC into black rows without an error, and a pixel
stream damaged under a valid CRC (a bad filter byte, a broken or short deflate stream) into garbage or black rows
with only a "libpng error" line on stderr; Pillow refuses both files. The CRC pass costs 13-21 ms for a 20 MB
PNG; the stream check ~40 % of OpenCV's decode of the same file (6.8 MP: 0.09 s against 0.21 s), which is why
`StreamCheck` runs it on a thread beside the decode (zlib releases the GIL).
"""

from __future__ import annotations

import struct
import threading
import zlib
from pathlib import Path

import numpy as np

CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}              # IHDR colour type -> samples per pixel
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_PIECE = 1 << 20                                        # inflated bytes looked at a time


class DamagedPng(ValueError):
    """The file is not a whole PNG; the message says what is wrong (without the file's name)."""


def checked_chunks(data: bytes) -> bytes:
    """`data` once every chunk's length and CRC is checked up to IEND; DamagedPng otherwise."""
    at = 8
    while at + 12 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        end = at + 8 + size
        name = kind.decode("latin-1")
        if end + 4 > len(data):
            raise DamagedPng(f"truncated PNG ({name} chunk cut off)")
        if zlib.crc32(data[at + 4:end]) != struct.unpack(">I", data[end:end + 4])[0]:
            raise DamagedPng(f"damaged PNG (CRC error in its {name} chunk)")
        if kind == b"IEND":
            return data
        at = end + 4
    raise DamagedPng("truncated PNG (no IEND chunk)")


def check_stream(data: bytes) -> None:
    """DamagedPng unless the IDAT stream inflates whole to exactly the rows the header promises, each non-interlaced
    row starting with a valid filter type (0-4). `data`: a file that passed `checked_chunks`."""
    width, height, depth, colour, interlace = struct.unpack(">IIBB2xB", data[16:29])
    bits = depth * CHANNELS.get(colour, 1)
    if interlace:
        passes = [((width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy) for x0, y0, dx, dy in ADAM7]
        expected = sum(h * (1 + (w * bits + 7) // 8) for w, h in passes if w and h)
        stride = 0                                      # row starts differ per pass: only the length is checked
    else:
        stride = 1 + (width * bits + 7) // 8
        expected = height * stride
    stream = zlib.decompressobj()
    seen = 0
    try:
        for part in _idat(data):
            piece = stream.decompress(part, _PIECE)
            while True:
                if stride and piece:
                    rows = np.frombuffer(piece, np.uint8)[(-seen) % stride::stride]
                    if rows.size and int(rows.max()) > 4:
                        raise DamagedPng("damaged PNG (a pixel row with an invalid filter type)")
                seen += len(piece)
                if not stream.unconsumed_tail:
                    break
                piece = stream.decompress(stream.unconsumed_tail, _PIECE)
            if stream.eof:
                break
    except zlib.error as e:
        raise DamagedPng(f"damaged PNG (its pixel data does not inflate: {e})") from None
    if not stream.eof or seen < expected:
        raise DamagedPng(f"damaged PNG (pixel data cut short: {seen:,} of {expected:,} bytes)")


class StreamCheck(threading.Thread):
    """`check_stream(data)` on a thread beside the decode; `finish` joins it and raises what it found."""

    def __init__(self, data: bytes):
        super().__init__(name="gpen-png-check", daemon=True)
        self.data = data
        self.error: DamagedPng | None = None

    def run(self) -> None:
        try:
            check_stream(self.data)
        except DamagedPng as e:
            self.error = e

    def finish(self, path: Path) -> None:
        """DamagedPng naming `path` if the stream was damaged."""
        self.join()
        if self.error is not None:
            raise DamagedPng(f"{path}: {self.error}")


def late_chunks(data: bytes) -> dict[bytes, bytes]:
    """The chunks after the pixel data (after the first IDAT, IEND excluded): {type: payload of its first}.
    Pillow reads those only by decoding the whole image (see imageio's EXIF reading). `data`: a checked file."""
    late: dict[bytes, bytes] = {}
    seen_idat = False
    for kind, payload in _chunks(data):
        if kind == b"IDAT":
            seen_idat = True
        elif seen_idat and kind not in late:
            late[kind] = bytes(payload)
    return late


def _idat(data: bytes):
    """The IDAT payloads in file order, as views (no copy)."""
    return (payload for kind, payload in _chunks(data) if kind == b"IDAT")


def _chunks(data: bytes):
    """(type, payload view) of each chunk of a checked file, in file order, up to IEND (excluded)."""
    view = memoryview(data)
    at = 8
    while at + 12 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IEND":
            return
        yield kind, view[at + 8:at + 8 + size]
        at += 12 + size
