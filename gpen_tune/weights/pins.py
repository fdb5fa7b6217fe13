"""sha256 pins: trust on first use for weights whose official hash is not published.

The first verified file of a name has its sha256 recorded in `cache_dir()/sha256-pins.json`; a later file with a
different hash is refused until the user pins another one explicitly (`--sha256`). The file is rewritten
atomically (temp file + os.replace) so a crash never leaves it half-written.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpen_tune.weights.cache import cache_dir

PINS_FILE = "sha256-pins.json"


@dataclass(frozen=True)
class Pin:
    sha256: str
    size: int
    source: str            # URL or local path the pinned file came from
    pinned_at: str         # UTC, ISO 8601
    mtime_ns: int = 0      # stat of the cached file when last hashed: lets us skip re-hashing an unchanged file


def pins_path() -> Path:
    return cache_dir() / PINS_FILE


def read_pins() -> dict[str, Pin]:
    """Filename -> Pin; a missing or unreadable pins file reads as no pins."""
    path = pins_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable pins file ({e}); fix or delete it (pins are re-recorded)") from None
    pins = {}
    for name, entry in raw.get("pins", {}).items():
        try:
            pins[name] = Pin(**entry)
        except TypeError:
            continue
    return pins


def get_pin(filename: str) -> Pin | None:
    return read_pins().get(filename)


def set_pin(filename: str, sha256: str, size: int, source: str, mtime_ns: int = 0) -> Pin:
    """Record (or replace) the pin of `filename` and rewrite the pins file atomically."""
    pins = read_pins()
    pin = Pin(sha256=sha256.lower(), size=size, source=source,
              pinned_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), mtime_ns=mtime_ns)
    pins[filename] = pin
    _write(pins)
    return pin


def touch_pin(filename: str, mtime_ns: int) -> None:
    """Remember that the cached file with this mtime was hashed and matched its pin."""
    pins = read_pins()
    if filename in pins and pins[filename].mtime_ns != mtime_ns:
        pins[filename] = Pin(**{**asdict(pins[filename]), "mtime_ns": mtime_ns})
        _write(pins)


def _write(pins: dict[str, Pin]) -> None:
    path = pins_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "about": "sha256 of the first verified file of each name (trust on first use); "
                 "pass --sha256 to pin another file",
        "pins": {k: asdict(v) for k, v in sorted(pins.items())},
    }
    fd, tmp = tempfile.mkstemp(prefix=".pins-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
