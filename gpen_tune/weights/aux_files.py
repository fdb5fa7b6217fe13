"""Registry entries for the weights beside the generator: the face parser (paste mask) and the background
upscalers. Same rules as the GPEN registry: files live in `cache_dir()`, arrive through our downloader, and the
first verified file of each name has its sha256 pinned (`gpen_tune.weights.pins`); a later file with another hash
is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpen_tune.weights import pins
from gpen_tune.weights.cache import WeightsNotFoundError, cached_file
from gpen_tune.weights.download import ChecksumError, DownloadError, download_file, file_sha256

_OSS = "https://public-vigen-video.oss-cn-shanghai.aliyuncs.com/robin/models/"
_FACEXLIB = "https://github.com/xinntao/facexlib/releases/download/"
_ESRGAN = "https://github.com/xinntao/Real-ESRGAN/releases/download/"


@dataclass(frozen=True)
class AuxFile:
    """One released weights file that is not a GPEN generator."""

    name: str
    filename: str
    urls: tuple[str, ...]
    task: str
    sha256: str | None = None        # None: not published; pinned on first verified download
    source_note: str = ""


AUX_FILES: dict[str, AuxFile] = {
    "ParseNet-latest": AuxFile(
        "ParseNet-latest", "ParseNet-latest.pth", (_OSS + "ParseNet-latest.pth",),
        task="face parsing paste mask (ParseNet 512, 19 classes)", source_note="upstream GPEN README download link"),
    "parsing_parsenet": AuxFile(
        "parsing_parsenet", "parsing_parsenet.pth", (_FACEXLIB + "v0.2.2/parsing_parsenet.pth",),
        task="face parsing paste mask (ParseNet 512, 19 classes)", source_note="facexlib release"),
    "realesrnet_x2": AuxFile(
        "realesrnet_x2", "realesrnet_x2.pth", (_OSS + "realesrnet_x2.pth",),
        task="background upscaler x2 (RRDBNet, 32 features)", source_note="upstream GPEN README (--use_sr)"),
    "realesrnet_x4": AuxFile(
        "realesrnet_x4", "realesrnet_x4.pth", (_OSS + "realesrnet_x4.pth",),
        task="background upscaler x4 (RRDBNet, 32 features)", source_note="upstream GPEN README (--use_sr)"),
    "RealESRGAN_x2plus": AuxFile(
        "RealESRGAN_x2plus", "RealESRGAN_x2plus.pth", (_ESRGAN + "v0.2.1/RealESRGAN_x2plus.pth",),
        task="background upscaler x2 (Real-ESRGAN, RRDBNet 64 features)", source_note="Real-ESRGAN release"),
    "RealESRGAN_x4plus": AuxFile(
        "RealESRGAN_x4plus", "RealESRGAN_x4plus.pth", (_ESRGAN + "v0.1.0/RealESRGAN_x4plus.pth",),
        task="background upscaler x4 (Real-ESRGAN, RRDBNet 64 features)", source_note="Real-ESRGAN release"),
}


def aux_file(name: str) -> AuxFile:
    try:
        return AUX_FILES[name]
    except KeyError:
        raise KeyError(f"unknown weights file {name!r}; known: {', '.join(AUX_FILES)}") from None


def cached_aux(name: str) -> Path | None:
    """The cached file of `name`, or None."""
    path = cached_file(aux_file(name).filename)
    return path if path.is_file() else None


def ensure_aux_file(name: str, *, download: bool = True, validate: Callable[[Path], None] | None = None,
                    timeout: float = 30.0, retries: int = 3, progress: bool = True) -> Path:
    """The verified cached file of registry entry `name`, downloaded when allowed (never with GPEN_TUNE_OFFLINE).

    `validate(path)` checks a file before its first pin (e.g. a strict load). Raises WeightsNotFoundError (one
    line naming the URL and the path to put the file at), or ValueError for a file whose hash differs from its
    pin.
    """
    info = aux_file(name)
    dest = cached_file(info.filename)
    pin = pins.get_pin(info.filename)
    want = info.sha256 or (pin.sha256 if pin else None)
    if dest.is_file():
        st = dest.stat()
        if pin and not info.sha256 and st.st_size == pin.size and st.st_mtime_ns == pin.mtime_ns:
            return dest
        got = file_sha256(dest)
        if want and got != want:
            raise ValueError(f"{dest}: sha256 {got} differs from the pinned {want} for {info.filename}: refused; "
                             f"delete the file to fetch it again")
        if not pin or pin.sha256 != got:
            if validate is not None:
                validate(dest)
            pins.set_pin(info.filename, got, st.st_size, source=str(dest))
        return dest
    where = f"download {info.urls[0]} yourself and put it at {dest}"
    if not download or os.environ.get("GPEN_TUNE_OFFLINE"):
        raise WeightsNotFoundError(f"{info.filename} is not in the cache: {where}")
    failures = []
    for url in info.urls:
        try:
            got = download_file(url, dest, sha256=want, timeout=timeout, retries=retries, progress=progress,
                                validate=validate)
        except ChecksumError as e:
            raise ValueError(f"{url}: sha256 {e.got} differs from the pinned {e.expected}: refused, nothing "
                             "written to the cache") from None
        except DownloadError as e:
            failures.append(str(e))
            continue
        pins.set_pin(info.filename, got.sha256, got.size, source=url, mtime_ns=dest.stat().st_mtime_ns)
        return dest
    raise WeightsNotFoundError(f"{info.filename} could not be downloaded ({' | '.join(failures)}): {where}")
