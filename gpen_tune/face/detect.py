"""Face detection behind one small interface: boxes, scores and 5 landmarks per image.

Backends:
  * `retinaface_resnet50` / `retinaface_mobile0.25`: facexlib's RetinaFace networks (the detector upstream GPEN
    uses). Weights come from facexlib's GitHub release through our own downloader into
    `cache_dir()/detectors/`, or from a local file (upstream GPEN's `RetinaFace-R50.pth` has the same layout).
  * `mtcnn`: facenet-pytorch's MTCNN networks, whose weights ship inside the wheel (MIT): works offline. On a GPU
    driven by our batched driver (`gpen_tune.face.mtcnn_batched`), on the CPU by facenet's own (faster there).
  * `auto`: RetinaFace-R50 when its weights are cached or downloadable, else MTCNN with a one-line notice.

Images are "HWC, RGB, uint8, [0, 255]". Detection runs on a copy whose long side is at most `det_size` and the
coordinates are mapped back; same-size images are detected in one forward pass (MTCNN on a GPU: images of any sizes).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import cv2
import numpy as np
import torch

DETECTOR_NAMES = ("auto", "retinaface_resnet50", "retinaface_mobile0.25", "mtcnn")
DEFAULT_THRESHOLD = 0.9          # upstream GPEN keeps faces scoring > 0.9 (facts 2.3)
DEFAULT_DET_SIZE = 1024          # long side for detection; upstream shrinks images > 1500 px to 1000 px
NMS_IOU = 0.4                    # RetinaFace NMS overlap, as upstream
MTCNN_MIN_FACE = 20              # px at detection scale (facenet-pytorch default)
MTCNN_STAGE_THRESHOLDS = (0.6, 0.7, 0.7)
MTCNN_PYRAMID_FACTOR = 0.709
MAX_BATCH = 8                    # images per detector forward pass (RetinaFace: same-size images only)
MTCNN_MAX_BATCH = 32             # images per batched-MTCNN call, of any sizes (P-Net chunks itself by pixels)
PNET_GRAPHS_MIN_GIB = 12         # MTCNN on CUDA: P-Net from CUDA graphs by default on GPUs at least this large
REACH_TIMEOUT_S = 3.0            # `auto` never waits longer than this to learn that it is offline

_RELEASE = "https://github.com/xinntao/facexlib/releases/download/v0.1.0/"
RETINAFACE_WEIGHTS = {           # name -> (cache file name, facexlib release URL)
    "retinaface_resnet50": ("detection_Resnet50_Final.pth", _RELEASE + "detection_Resnet50_Final.pth"),
    "retinaface_mobile0.25": ("detection_mobilenet0.25_Final.pth", _RELEASE + "detection_mobilenet0.25_Final.pth"),
}
_RETINAFACE_NET = {"retinaface_resnet50": "resnet50", "retinaface_mobile0.25": "mobile0.25"}


class DetectorError(RuntimeError):
    """A detector that cannot be built; the message says what to do."""


def default_notify(msg: str) -> None:
    print(f"notice: {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Detection:
    """One face: box x1y1x2y2, score, landmarks [5, 2] (x, y): left eye, right eye, nose, mouth L, mouth R
    (image-left first)."""

    box: np.ndarray
    score: float
    landmarks: np.ndarray

    def to_dict(self) -> dict:
        return {
            "box": [round(float(v), 2) for v in self.box],
            "score": round(float(self.score), 4),
            "landmarks": [[round(float(x), 2), round(float(y), 2)] for x, y in self.landmarks],
        }


class FaceDetector:
    """Common part of every backend: shrink to `det_size`, batch images, map coordinates back.

    `mixed_sizes`: the backend's `_detect_batch` takes a list of images of different sizes (else: same-size
    images are stacked into one array per call). `max_batch`: images per `_detect_batch` call.
    """

    name = "base"
    mixed_sizes = False
    max_batch = MAX_BATCH

    def __init__(self, device: str | torch.device, threshold: float | None, det_size: int | None):
        self.device = torch.device(device)
        self.threshold = DEFAULT_THRESHOLD if threshold is None else float(threshold)
        self.det_size = det_size

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        """Faces of every image, highest score first."""
        results: list[list[Detection] | None] = [None] * len(images)
        groups: dict[tuple[int, int], list[tuple[int, np.ndarray, tuple[float, float]]]] = {}
        for i, img in enumerate(images):
            small, scale = self._shrink(img)
            groups.setdefault((0, 0) if self.mixed_sizes else small.shape[:2], []).append((i, small, scale))
        for members in groups.values():
            for start in range(0, len(members), self.max_batch):
                chunk = members[start:start + self.max_batch]
                batch = [m[1] for m in chunk] if self.mixed_sizes else np.stack([m[1] for m in chunk])
                with torch.inference_mode():
                    found = self._detect_batch(batch)
                for (i, _, (sx, sy)), (boxes, scores, lms) in zip(chunk, found, strict=True):
                    results[i] = _to_detections(boxes, scores, lms, sx, sy, self.threshold)
        return [r or [] for r in results]

    def _shrink(self, img: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
        return shrink_for_detection(img, self.det_size)

    def _detect_batch(self, batch) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """[B, H, W, 3] uint8 RGB (or a list of HWC arrays when `mixed_sizes`) -> per image (boxes [N, 4],
        scores [N], landmarks [N, 5, 2])."""
        raise NotImplementedError

    def to(self, device: str | torch.device) -> FaceDetector:
        self.device = torch.device(device)
        for net in self._networks():
            net.to(self.device)
        return self

    def close(self) -> None:
        """Free the networks; the detector cannot be used afterwards."""
        self._drop_networks()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _networks(self) -> list[torch.nn.Module]:
        return []

    def _drop_networks(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device={str(self.device)!r}, threshold={self.threshold})"


def shrink_for_detection(img: np.ndarray, det_size: int | None) -> tuple[np.ndarray, tuple[float, float]]:
    """(copy whose long side is at most det_size, (sx, sy) = small / original size); as is below det_size."""
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"detector input must be HWC RGB uint8, got shape {img.shape} dtype {img.dtype}")
    h, w = img.shape[:2]
    if not det_size or max(h, w) <= det_size:
        return np.ascontiguousarray(img), (1.0, 1.0)
    k = det_size / max(h, w)
    nw, nh = max(1, round(w * k)), max(1, round(h * k))
    small = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA)
    return small, (nw / w, nh / h)


def rescale(dets: list[Detection], sx: float, sy: float) -> list[Detection]:
    """Detections found on a copy scaled by (sx, sy), in the original image's coordinates."""
    if sx == 1.0 and sy == 1.0:
        return dets
    scale = np.array([sx, sy])
    return [Detection(box=d.box / np.tile(scale, 2), score=d.score, landmarks=d.landmarks / scale) for d in dets]


def detect_shrunk(detect, images, det_size: int) -> list[list[Detection]]:
    """`detect` (images -> detections per image) run on copies shrunk to det_size, results in the originals'
    coordinates: the caller's thread does the resizing (the detector servers' callers use this)."""
    shrunk = [shrink_for_detection(img, det_size) for img in images]
    found = detect([small for small, _ in shrunk])
    return [rescale(dets, sx, sy) for dets, (_, (sx, sy)) in zip(found, shrunk, strict=True)]


def _to_detections(boxes, scores, lms, sx: float, sy: float, threshold: float) -> list[Detection]:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    lms = np.asarray(lms, dtype=np.float64).reshape(-1, 5, 2)
    scale = np.array([sx, sy])
    out = []
    for i in np.argsort(-scores, kind="stable"):
        if scores[i] < threshold:
            continue
        out.append(Detection(box=boxes[i] / np.tile(scale, 2), score=float(scores[i]), landmarks=lms[i] / scale))
    return out


# ----------------------------------------------------------------------------------------------------------------


class MTCNNDetector(FaceDetector):
    """facenet-pytorch's MTCNN networks (weights in the wheel) driven by our batched driver
    (`gpen_tune.face.mtcnn_batched`): up to `MTCNN_MAX_BATCH` images of any sizes per call on a GPU.

    On the CPU, images are still grouped by size (`mixed_sizes` False there): batching brings no speed on the CPU,
    and the CPU convolution picks another code path by batch size (native below 2 images, oneDNN above), so
    an image's landmarks would depend on its batch mates by a float32 ULP, enough to change restored pixels
    downstream when serial and pipelined runs are compared.
    """

    name = "mtcnn"
    mixed_sizes = True
    max_batch = MTCNN_MAX_BATCH

    def __init__(self, device="cpu", threshold=None, det_size=DEFAULT_DET_SIZE, pnet_graphs: bool | None = None):
        """`pnet_graphs`: replay the P-Net stage from CUDA graphs (`mtcnn_batched.FixedCanvasPNet`); None = on CUDA
        devices with at least PNET_GRAPHS_MIN_GIB of memory (the graphs keep ~1-2 GB of buffers)."""
        super().__init__(device, threshold, det_size)
        self.mixed_sizes = self.device.type != "cpu"
        self.pnet_graphs = pnet_graphs
        self._fixed = None
        self._fixed_lock = threading.Lock()
        try:
            from facenet_pytorch.models.mtcnn import ONet, PNet, RNet
        except ImportError as e:
            raise DetectorError(
                "the offline detector needs facenet-pytorch: pip install --no-deps facenet-pytorch==2.6.0"
            ) from e
        # float32 everywhere: float64 networks on the GPU (tried for batch-invariant landmarks) made a folder run
        # 1.5x slower (cuDNN's float64 convs) and did not change the serial-vs-pipeline pixel differences, which
        # come from the half-precision generator's batch sizes (20261130-200449 vs -195016 throughput runs)
        self.pnet, self.rnet, self.onet = (net().to(self.device).eval() for net in (PNet, RNet, ONet))

    def to(self, device):
        self._fixed = None                  # its graphs point at the networks' old buffers
        super().to(device)
        self.mixed_sizes = self.device.type != "cpu"
        return self

    def _networks(self):
        return [n for n in (self.pnet, self.rnet, self.onet) if n is not None]

    def _drop_networks(self):
        self.pnet = self.rnet = self.onet = None
        self._fixed = None

    @property
    def uses_pnet_graphs(self) -> bool:
        if self.device.type != "cuda" or not self.det_size or self.pnet_graphs is False:
            return False
        if self.pnet_graphs is None:
            total = torch.cuda.get_device_properties(self.device).total_memory
            return total >= PNET_GRAPHS_MIN_GIB * 2**30
        return True

    def capture_graphs(self) -> None:
        """Capture the P-Net graphs of every batch bucket now (else each is captured by its first batch)."""
        if self.uses_pnet_graphs and self.pnet is not None:
            with self._fixed_lock:
                self._fixed_pnet().capture_all()

    def _fixed_pnet(self):
        from gpen_tune.face.mtcnn_batched import FixedCanvasPNet

        if self._fixed is None:
            self._fixed = FixedCanvasPNet(self.pnet, self.det_size, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS[0],
                                          MTCNN_PYRAMID_FACTOR, max_batch=self.max_batch)
        return self._fixed

    def _detect_batch(self, batch):
        from gpen_tune.face.mtcnn_batched import detect_mtcnn_batched

        if self.pnet is None:
            raise DetectorError("detector was closed")
        if not self.mixed_sizes:           # the CPU default: same-size stacks through facenet's driver
            return self._detect_batch_facenet(batch)
        if not self.uses_pnet_graphs:
            return detect_mtcnn_batched(list(batch), self.pnet, self.rnet, self.onet, MTCNN_MIN_FACE,
                                        MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR, self.device)
        with self._fixed_lock:             # the fixed plan's buffers serve one call at a time
            return detect_mtcnn_batched(list(batch), self.pnet, self.rnet, self.onet, MTCNN_MIN_FACE,
                                        MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR, self.device,
                                        fixed=self._fixed_pnet())

    def _detect_batch_facenet(self, batch: np.ndarray):
        """facenet-pytorch's own driver, for the CPU: there its per-box work is cheap and our driver's summed-area
        tables cost more (0.5-0.8x its speed, measured on 2 cores); same detections to 1.3e-4 px (tested)."""
        from facenet_pytorch.models.utils.detect_face import detect_face

        if min(batch.shape[1:3]) < MTCNN_MIN_FACE:       # no pyramid level fits: nothing to find
            empty = (np.zeros((0, 4)), np.zeros(0), np.zeros((0, 5, 2)))
            return [empty] * len(batch)
        boxes, points = detect_face(
            batch, MTCNN_MIN_FACE, self.pnet, self.rnet, self.onet,
            list(MTCNN_STAGE_THRESHOLDS), MTCNN_PYRAMID_FACTOR, self.device,
        )
        out = []
        for b, p in zip(boxes, points, strict=True):
            b = np.asarray(b, dtype=np.float64).reshape(-1, 5)
            out.append((b[:, :4], b[:, 4], np.asarray(p, dtype=np.float64).reshape(-1, 5, 2)))
        return out


# ----------------------------------------------------------------------------------------------------------------


class RetinaFaceDetector(FaceDetector):
    """facexlib's RetinaFace network with our own batched pre/post-processing.

    Input convention (as facexlib/upstream): BGR float, minus the mean (104, 117, 123), no scaling, NCHW.
    """

    name = "retinaface_resnet50"
    _VARIANCE = (0.1, 0.2)
    _MIN_SIZES = ((16, 32), (64, 128), (256, 512))
    _STEPS = (8, 16, 32)

    def __init__(self, name: str, weights_path: Path, device="cpu", threshold=None, det_size=DEFAULT_DET_SIZE):
        super().__init__(device, threshold, det_size)
        self.name = name
        from facexlib.detection.retinaface import RetinaFace

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision's deprecated `pretrained=` argument inside facexlib
            net = RetinaFace(network_name=_RETINAFACE_NET[name], half=False, device="cpu")
        sd = _read_detector_state(weights_path)
        try:
            net.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            first = str(e).splitlines()[0]
            raise DetectorError(f"{weights_path}: not {name} weights ({first})") from None
        self.net = net.to(self.device).eval().requires_grad_(False)
        self._mean = torch.tensor([104.0, 117.0, 123.0]).view(1, 3, 1, 1)
        self._priors: dict[tuple[int, int], torch.Tensor] = {}

    def _networks(self):
        return [self.net] if self.net is not None else []

    def _drop_networks(self):
        self.net = None
        self._priors.clear()

    def priors(self, h: int, w: int) -> torch.Tensor:
        """Anchors [P, 4] (cx, cy, w, h) relative to the image, in the order of the network's outputs."""
        key = (h, w)
        if key not in self._priors:
            parts = []
            for step, sizes in zip(self._STEPS, self._MIN_SIZES, strict=True):
                fh, fw = -(-h // step), -(-w // step)
                cy, cx = np.meshgrid((np.arange(fh) + 0.5) * step / h, (np.arange(fw) + 0.5) * step / w, indexing="ij")
                per_size = [np.stack([cx, cy, np.full_like(cx, s / w), np.full_like(cx, s / h)], -1) for s in sizes]
                parts.append(np.stack(per_size, axis=2).reshape(-1, 4))      # [fh*fw*len(sizes), 4]
            self._priors[key] = torch.from_numpy(np.concatenate(parts).astype(np.float32))
        return self._priors[key].to(self.device)

    def _detect_batch(self, batch):
        import torchvision
        from facexlib.detection.retinaface_utils import batched_decode, batched_decode_landm

        if self.net is None:
            raise DetectorError("detector was closed")
        b, h, w, _ = batch.shape
        x = torch.from_numpy(batch).to(self.device)                          # [B, H, W, 3] uint8 RGB
        x = x.flip(-1).permute(0, 3, 1, 2).float() - self._mean.to(self.device)   # [B, 3, H, W] BGR - mean
        loc, conf, landm = self.net(x)
        priors = self.priors(h, w)[None]
        boxes = batched_decode(loc.float(), priors, self._VARIANCE) * torch.tensor([w, h, w, h], device=self.device)
        lms = batched_decode_landm(landm.float(), priors, self._VARIANCE) * torch.tensor([w, h] * 5,
                                                                                          device=self.device)
        scores = conf[..., 1].float()
        out = []
        for i in range(b):
            keep = scores[i] >= self.threshold
            bi, si, li = boxes[i][keep], scores[i][keep], lms[i][keep]
            k = torchvision.ops.nms(bi, si, NMS_IOU)
            out.append((bi[k].cpu().numpy(), si[k].cpu().numpy(), li[k].cpu().numpy().reshape(-1, 5, 2)))
        return out


def _read_detector_state(path: Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise DetectorError(f"{path}: detector weights file not found")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line message
        raise DetectorError(f"{path}: cannot read detector weights ({type(e).__name__}: {e})") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise DetectorError(f"{path}: expected a state dict of tensors")
    return {(k[7:] if k.startswith("module.") else k): v for k, v in sd.items()}


# ----------------------------------------------------------------------------------------------------------------


def detector_cache_dir() -> Path:
    from gpen_tune.weights.cache import cache_dir

    return cache_dir() / "detectors"


def fetch_weights(url: str, filename: str | None = None, timeout: float = 30.0, retries: int = 3) -> Path:
    """A file from `url` in `cache_dir()/detectors/` (downloaded once, through gpen_tune's own downloader)."""
    dest = detector_cache_dir() / (filename or Path(urlparse(url).path).name)
    if dest.is_file():
        return dest
    try:
        from gpen_tune.weights.download import download
    except ImportError as e:
        raise DetectorError(f"cannot download {url}: gpen_tune.weights.download is unavailable ({e}); "
                            f"download it yourself to {dest} or pass a weights file") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    return download(url, dest, timeout=timeout, retries=retries)


def _resolve_retinaface(name: str, weights: str | Path | None) -> Path:
    filename, url = RETINAFACE_WEIGHTS[name]
    if weights is None:
        return fetch_weights(url, filename)
    if str(weights).startswith(("http://", "https://")):
        return fetch_weights(str(weights))
    return Path(weights).expanduser()


def _reachable(url: str, timeout: float = REACH_TIMEOUT_S) -> bool:
    """Whether the URL's host accepts a TCP connection within `timeout` (DNS included: it runs in a thread)."""
    if os.environ.get("GPEN_TUNE_OFFLINE"):
        return False
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
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
    return bool(ok)


def init_detector(
    name: str = "auto",
    device: str | torch.device = "cpu",
    weights: str | Path | None = None,
    threshold: float | None = None,
    det_size: int | None = DEFAULT_DET_SIZE,
    notify: Callable[[str], None] = default_notify,
) -> FaceDetector:
    """Build a face detector.

    Args:
        name: "auto", "retinaface_resnet50", "retinaface_mobile0.25" or "mtcnn".
        device: where the networks run.
        weights: RetinaFace weights: a local file, an http(s) URL (downloaded into the cache) or None (facexlib's
            release file, cached or downloaded). Ignored by mtcnn.
        threshold: minimum score (default 0.9, as upstream GPEN).
        det_size: long side of the copy that detection runs on (None = native resolution).
        notify: receives the one-line notice when `auto` falls back to MTCNN.
    """
    if name not in DETECTOR_NAMES:
        raise DetectorError(f"unknown detector {name!r}; choose one of: {', '.join(DETECTOR_NAMES)}")
    if name == "mtcnn":
        return MTCNNDetector(device, threshold, det_size)
    if name == "auto":
        return _init_auto(device, weights, threshold, det_size, notify)
    return RetinaFaceDetector(name, _resolve_retinaface(name, weights), device, threshold, det_size)


def _init_auto(device, weights, threshold, det_size, notify) -> FaceDetector:
    name = "retinaface_resnet50"
    filename, url = RETINAFACE_WEIGHTS[name]
    if weights is not None and not str(weights).startswith(("http://", "https://")):
        return RetinaFaceDetector(name, Path(weights).expanduser(), device, threshold, det_size)
    url = str(weights) if weights is not None else url
    cached = detector_cache_dir() / (filename if weights is None else Path(urlparse(url).path).name)
    reason = None
    if cached.is_file():
        return RetinaFaceDetector(name, cached, device, threshold, det_size)
    if not _reachable(url):
        reason = f"{urlparse(url).hostname} is unreachable"
    else:
        try:
            path = fetch_weights(url, cached.name, timeout=10.0, retries=1)
            return RetinaFaceDetector(name, path, device, threshold, det_size)
        except Exception as e:  # noqa: BLE001 - any download failure means: fall back
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    notify(f"RetinaFace weights not cached and not downloadable ({reason}): using the offline MTCNN detector; "
           f"put {filename} into {detector_cache_dir()} or pass --detector-weights PATH for RetinaFace")
    return MTCNNDetector(device, threshold, det_size)
