"""Detector weights: the cache folder, downloads through gpen_tune's own downloader, and the offline probe of the
`auto` choice (RetinaFace-R50 when its weights are cached or downloadable, else MTCNN, whose weights ship inside
facenet-pytorch's wheel)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from gpen_tune.face.detect.base import DetectorError
from gpen_tune.weights.cache import cache_dir
from gpen_tune.weights.download import DownloadError, download_into

REACH_TIMEOUT_S = 3.0            # `auto` never waits longer than this to learn that it is offline
# A host found unreachable is remembered this long (in the detector cache folder), so an offline or firewalled
# machine, where a connection attempt can hang until the timeout, pays the probe once an hour, not on every run.
UNREACHABLE_MEMORY_S = 3600.0
UNREACHABLE_FILE = "unreachable.json"

_RELEASE = "https://github.com/xinntao/facexlib/releases/download/v0.1.0/"
RETINAFACE_WEIGHTS = {           # name -> (cache file name, facexlib release URL)
    "retinaface_resnet50": ("detection_Resnet50_Final.pth", _RELEASE + "detection_Resnet50_Final.pth"),
    "retinaface_mobile0.25": ("detection_mobilenet0.25_Final.pth", _RELEASE + "detection_mobilenet0.25_Final.pth"),
}
AUTO_RETINAFACE = "retinaface_resnet50"


def detector_cache_dir() -> Path:
    return cache_dir() / "detectors"


def fetch_weights(url: str, filename: str | None = None, timeout: float = 30.0, retries: int = 3) -> Path:
    """A file from `url` in `cache_dir()/detectors/` (downloaded once, through gpen_tune's own downloader: the
    name is one plain file name and a failed download leaves nothing outside its own `.part`)."""
    try:
        return download_into(detector_cache_dir(), url, filename, timeout=timeout, retries=retries)
    except DownloadError as e:
        raise DetectorError(str(e)) from None


def is_url(weights: str | Path | None) -> bool:
    return weights is not None and str(weights).startswith(("http://", "https://"))


def resolve_retinaface(name: str, weights: str | Path | None) -> Path:
    """The local weights file of RetinaFace `name`: the file given, or the URL given / the release file fetched."""
    filename, url = RETINAFACE_WEIGHTS[name]
    if weights is None:
        return fetch_weights(url, filename)
    if is_url(weights):
        return fetch_weights(str(weights))
    return Path(weights).expanduser()


def auto_retinaface_weights(weights: str | Path | None) -> tuple[Path | None, str]:
    """`auto`'s probe: (RetinaFace-R50 weights file, "") when a local file was given, the file is cached or it can
    be downloaded now; else (None, why not)."""
    filename, url = RETINAFACE_WEIGHTS[AUTO_RETINAFACE]
    if weights is not None and not is_url(weights):
        return Path(weights).expanduser(), ""
    url = str(weights) if weights is not None else url
    cached = detector_cache_dir() / (filename if weights is None else Path(urlparse(url).path).name)
    if cached.is_file():
        return cached, ""
    if not reachable(url):
        return None, f"{urlparse(url).hostname} is unreachable{_remembered_note(url)}"
    try:
        return fetch_weights(url, cached.name, timeout=10.0, retries=1), ""
    except Exception as e:  # noqa: BLE001 - any download failure means: fall back
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def auto_fallback_notice(reason: str) -> str:
    filename = RETINAFACE_WEIGHTS[AUTO_RETINAFACE][0]
    return (f"RetinaFace weights not cached and not downloadable ({reason}): using the offline MTCNN detector; "
            f"put {filename} into {detector_cache_dir()} or pass --detector-weights PATH for RetinaFace")


def reachable(url: str, timeout: float = REACH_TIMEOUT_S, memory_s: float = UNREACHABLE_MEMORY_S) -> bool:
    """Whether the URL's host accepts a TCP connection within `timeout` (DNS included: it runs in a thread). A host
    found unreachable less than `memory_s` ago is not probed again (0: always probe)."""
    if os.environ.get("GPEN_TUNE_OFFLINE"):
        return False
    since = _unreachable_since(url)
    if memory_s > 0 and since is not None and time.time() - since < memory_s:
        return False
    parsed = urlparse(url)
    port = _port(url)
    ok: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((parsed.hostname, port), timeout=timeout):
                ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    _remember(url, reachable=bool(ok))
    return bool(ok)


def _port(url: str) -> int:
    parsed = urlparse(url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def _host_key(url: str) -> str:
    return f"{urlparse(url).hostname}:{_port(url)}"


def _memory() -> dict[str, float]:
    try:
        data = json.loads((detector_cache_dir() / UNREACHABLE_FILE).read_text())
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError):
        return {}


def _unreachable_since(url: str) -> float | None:
    return _memory().get(_host_key(url))


def _remember(url: str, reachable: bool) -> None:
    """Record (or clear) the host's failed probe; written to a temporary file and renamed, errors ignored: the
    memory only saves time."""
    memory, key = _memory(), _host_key(url)
    if reachable == (key not in memory):
        return
    if reachable:
        memory.pop(key)
    else:
        memory[key] = time.time()
    folder = detector_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{UNREACHABLE_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(memory))
        os.replace(tmp, folder / UNREACHABLE_FILE)
    except OSError:
        pass


def _remembered_note(url: str) -> str:
    since = _unreachable_since(url)
    if since is None:
        return ""
    left = max(0.0, UNREACHABLE_MEMORY_S - (time.time() - since))
    return f"; next probe in {left / 60:.0f} min, or at once when {detector_cache_dir() / UNREACHABLE_FILE} is deleted"
