"""The released GPEN weights as files in the cache: list them, fetch them, verify them, pin their sha256.

A file is accepted into the cache only after it loads with `weights_only=True` and every key and shape matches
its model config. Official sha256 values are not published, so the first verified file of each name is pinned
(`gpen_tune.weights.pins`) and a later file with another hash is refused unless the user pins it with `sha256=`.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpen_tune.model.configs import MODELS, GPENConfig, ModelInfo, model_info
from gpen_tune.weights import pins
from gpen_tune.weights.cache import WeightsNotFoundError, cache_dir, cached_file, missing_message
from gpen_tune.weights.checkpoint import (
    check_state_dict,
    describe_config,
    infer_model,
    match_model,
    read_state_dict,
)
from gpen_tune.weights.download import ChecksumError, DownloadError, download_file, file_sha256
from gpen_tune.weights.integrity import WeightsMismatchError, mismatch_message, pinned_entry, sha256_of


class WeightsDownloadError(RuntimeError):
    """Every URL of a model failed; the message names the file, the URL and the exact path to put it at."""


@dataclass(frozen=True)
class WeightsStatus:
    """One registry entry as `weights list` shows it."""

    name: str
    file: str
    path: str
    cached: bool
    size: int | None           # bytes, when cached
    config: str
    task: str
    url: str
    source_note: str
    licence: str
    pinned_sha256: str | None
    official_sha256: str | None


@dataclass(frozen=True)
class VerifiedFile:
    """What `verify` found out about a checkpoint file."""

    path: Path
    model: str                 # registry name, or a description of the inferred config
    config: GPENConfig
    sha256: str
    params: int                # learned parameters (the fixed FIR buffers excluded)
    entries: int               # state-dict entries
    pin: str | None            # 'matches' / 'differs' / None (no pin for this model)
    pinned_sha256: str | None


def list_weights() -> list[WeightsStatus]:
    """Every registry model with its cache state and pin."""
    pinned = pins.read_pins()
    rows = []
    for info in MODELS.values():
        path = cached_file(info.filename)
        cached = path.is_file()
        pin = pinned.get(info.filename)
        rows.append(WeightsStatus(
            name=info.name, file=info.filename, path=str(path), cached=cached,
            size=path.stat().st_size if cached else None, config=describe_config(info.config), task=info.task,
            url=info.urls[0], source_note=info.source_note, licence=info.licence,
            pinned_sha256=pin.sha256 if pin else None, official_sha256=info.sha256,
        ))
    return rows


def verify_checkpoint(path: Path, cfg: GPENConfig, *, check_pin: bool = True) -> dict:
    """Load `path` with weights_only=True and check every key, shape and value against `cfg`; returns the state dict.

    `check_pin=False`: the caller has already compared the file's sha256 with the hash it trusts.
    """
    sd = read_state_dict(path, check_pin=check_pin)
    check_state_dict(sd, cfg, source=str(path))
    return sd


def ensure_weights(
    name: str,
    *,
    sha256: str | None = None,
    download: bool = True,
    url: str | None = None,
    progress: bool = True,
    timeout: float = 30.0,
    retries: int = 3,
    backoff: float = 1.0,
) -> Path:
    """The verified cached file of registry model `name`, downloading it into `cache_dir()` when allowed.

    A cached file is hashed on every call (see `gpen_tune.weights.integrity` for why there is no shortcut).

    Args:
        name: registry name, e.g. "GPEN-BFR-512".
        sha256: pin this hash: the file must have it (replaces an older pin). None: use the existing pin, or pin
            the first verified file.
        download: False raises WeightsNotFoundError (naming URL and path) instead of downloading.
        url: fetch from this URL (a mirror) instead of the registry's.
    Raises:
        WeightsNotFoundError, WeightsMismatchError, WeightsDownloadError, CheckpointError (a cached file that
        does not match its config or holds non-finite values).
    """
    info = model_info(name)
    dest = cached_file(info.filename)
    want = _normalise_sha(sha256) or info.sha256
    pin = pins.get_pin(info.filename)

    if dest.is_file():
        got = sha256_of(dest)
        if want:
            if got == want:
                if not (pin and pin.sha256 == got):
                    verify_checkpoint(dest, info.config, check_pin=False)
                    pins.set_pin(info.filename, got, dest.stat().st_size, source=str(dest))
                return dest
            if not download:
                raise WeightsMismatchError(_mismatch_message(info, dest, want, got, requested=True))
        elif pin:
            if got == pin.sha256:
                return dest
            raise WeightsMismatchError(_mismatch_message(info, dest, pin.sha256, got, requested=False))
        else:
            verify_checkpoint(dest, info.config)  # first use of a file someone put there: check, then pin
            pins.set_pin(info.filename, got, dest.stat().st_size, source=str(dest))
            return dest

    if not download:
        raise WeightsNotFoundError(missing_message(info, "is not in the cache"))
    expected = want or (pin.sha256 if pin else None)
    urls = (url,) if url else info.urls
    failures = []
    for u in urls:
        try:
            got = download_file(u, dest, sha256=expected, timeout=timeout, retries=retries, progress=progress,
                                validate=lambda p: verify_checkpoint(p, info.config, check_pin=False),
                                backoff=backoff)
        except ChecksumError as e:
            raise WeightsMismatchError(_mismatch_message(info, u, e.expected, e.got, requested=bool(want),
                                                         saved=False)) from None
        except DownloadError as e:
            failures.append(str(e))
            continue
        if want or not pin:
            pins.set_pin(info.filename, got.sha256, got.size, source=u)
        return dest
    raise WeightsDownloadError(missing_message(info, "could not be downloaded: " + " | ".join(failures),
                                              url=urls[0]))


def import_weights(name: str, src: str | Path, *, sha256: str | None = None) -> Path:
    """Copy a local file (e.g. ModelScope's pytorch_model.pt) into the cache as `name`'s file, verified and pinned."""
    info = model_info(name)
    src = Path(src).expanduser()
    verify_checkpoint(src, info.config, check_pin=False)  # the pin is compared just below
    got = file_sha256(src)
    want = _normalise_sha(sha256) or info.sha256
    pin = pins.get_pin(info.filename)
    if want and got != want:
        raise WeightsMismatchError(_mismatch_message(info, src, want, got, requested=True, saved=False))
    if not want and pin and got != pin.sha256:
        raise WeightsMismatchError(_mismatch_message(info, src, pin.sha256, got, requested=False, saved=False))
    dest = cached_file(info.filename)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dest.resolve():
        tmp = dest.with_name(dest.name + ".part")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    pins.set_pin(info.filename, got, dest.stat().st_size, source=str(src))
    return dest


def verify_file(path: str | Path, model: str | None = None, sha256: str | None = None) -> VerifiedFile:
    """Check a checkpoint file: safe load, keys and shapes (against `model`, or the registry config it matches).

    Raises CheckpointError when it is not a usable checkpoint (non-finite values included), WeightsMismatchError
    when `sha256` is given and differs, or when `path` is a pinned cache file (by any name) that differs from its pin.
    """
    path = Path(path).expanduser()
    got = want = None
    if path.is_file():  # hashes first: a changed pinned file is named as that, not by what torch.load makes of it
        got = sha256_of(path)
        want = _normalise_sha(sha256)
        if want and got != want:
            raise WeightsMismatchError(f"{path}: sha256 {got} differs from the requested {want}")
        entry = pinned_entry(path)
        if entry is not None and not want and entry[1].sha256 != got:
            cached_info = next((m for m in MODELS.values() if m.filename == entry[0]), None)
            raise WeightsMismatchError(mismatch_message(cached_info, entry[0], path, entry[1].sha256, got,
                                                        requested=False))
    sd = read_state_dict(path, check_pin=False)  # the pin was compared above, where a requested hash overrides it
    if model is not None:
        info = model_info(model)
        check_state_dict(sd, info.config, source=str(path))
        name, cfg = info.name, info.config
    else:
        name, cfg = infer_model(sd, source=str(path))
    pin_state = pinned = None
    if name in MODELS:
        pin = pins.get_pin(MODELS[name].filename)
        if pin:
            pinned = pin.sha256
            pin_state = "matches" if pin.sha256 == got else "differs"
    params = sum(v.numel() for k, v in sd.items() if not k.endswith(".kernel"))
    return VerifiedFile(path=path, model=name, config=cfg, sha256=got, params=params, entries=len(sd),
                        pin=pin_state, pinned_sha256=pinned)


def _mismatch_message(info: ModelInfo, where: str | Path, expected: str, got: str, *, requested: bool,
                      saved: bool = True) -> str:
    return mismatch_message(info, info.filename, where, expected, got, requested=requested, saved=saved)


def _normalise_sha(sha256: str | None) -> str | None:
    if not sha256:
        return None
    s = sha256.strip().lower()
    if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
        raise ValueError(f"--sha256 must be 64 hex digits, got {sha256!r}")
    return s


__all__ = [
    "VerifiedFile", "WeightsDownloadError", "WeightsMismatchError", "WeightsNotFoundError", "WeightsStatus",
    "cache_dir", "ensure_weights", "import_weights", "infer_model", "list_weights", "match_model", "missing_message",
    "verify_checkpoint", "verify_file",
]
