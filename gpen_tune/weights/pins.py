"""sha256 pins: trust on first use for weights whose official hash is not published.

The first verified file of a name has its sha256 recorded in `cache_dir()/sha256-pins.json`; a later file with a
different hash is refused until the user pins another one explicitly (`--sha256`). The pins file is rewritten
atomically (temp file + os.replace) so a crash never leaves it half-written. The pin is checked by hashing the file
on every load (`gpen_tune.weights.integrity`): no size+mtime shortcut, which an in-place edit can keep.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from gpen_tune.file_mode import new_file_mode
from gpen_tune.weights.cache import cache_dir

PINS_FILE = "sha256-pins.json"


@dataclass(frozen=True)
class Pin:
    sha256: str
    size: int
    source: str            # URL or local path the pinned file came from
    pinned_at: str         # UTC, ISO 8601


_FIELDS = tuple(f.name for f in fields(Pin))


def pins_path() -> Path:
    return cache_dir() / PINS_FILE


def read_pins() -> dict[str, Pin]:
    """Filename -> Pin; a missing pins file reads as no pins, a damaged one raises ValueError naming it."""
    path = pins_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable pins file ({e}); fix or delete it (pins are re-recorded)") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("pins", {}), dict):
        raise ValueError(f"{path}: unreadable pins file (not a JSON object with 'pins'); fix or delete it")
    pins = {}
    for name, entry in raw.get("pins", {}).items():
        try:  # fields of older versions (e.g. a recorded mtime) are ignored; a pin without its sha256 is damage
            pins[name] = Pin(**{f: entry[f] for f in _FIELDS if f in entry})
            if len(pin_hex := pins[name].sha256) != 64 or set(pin_hex) - set("0123456789abcdef"):
                raise TypeError(f"sha256 {pin_hex!r}")
        except (TypeError, AttributeError) as e:
            raise ValueError(f"{path}: damaged pin for {name} ({e}); fix or delete that entry (it is re-recorded "
                             f"from the next verified file)") from None
    return pins


def get_pin(filename: str) -> Pin | None:
    return read_pins().get(filename)


def set_pin(filename: str, sha256: str, size: int, source: str) -> Pin:
    """Record (or replace) the pin of `filename` and rewrite the pins file atomically."""
    pins = read_pins()
    pin = Pin(sha256=sha256.lower(), size=size, source=source,
              pinned_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    pins[filename] = pin
    _write(pins)
    return pin


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
        os.chmod(tmp, new_file_mode())               # the user's umask (mkstemp makes 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
