"""The face-parsing paste mask (on by default when its weights are available, as upstream pastes through it).

Upstream GPEN runs ParseNet (19 classes) on every restored face and pastes only skin, features, hair and neck:
classes 0 (background), 14 (hat) and 18 (cloth) are dropped (upstream GPEN's paste mask). The network is facexlib's
`ParseNet` built with upstream's configuration; upstream's `ParseNet-latest.pth` and facexlib's
`parsing_parsenet.pth` share one key layout (both are the PSFR-GAN parsing net: encoder / body / decoder /
out_img_conv / out_mask_conv, blocks named conv2d and norm.norm), so both load strictly without renaming; a
DataParallel `module.` prefix or a one-entry wrapper dict is undone first. Weights "synthetic" are a seeded random
ParseNet in that layout (benchmarks time the mask offline; its cost does not depend on the weights).

The whole mask runs batched on the parser's device, without host syncs: resize to 512, forward, argmax, class
mask, feather (`gpen_tune.face.paste.feather_params`, widened per face like the default mask: every face's border
and kernel reach the device in one non-blocking upload, one grouped blur serves the batch), resize back. A face's
mask depends only on its crop and its feather, so the pipeline parses each generator batch as it comes off the
generator (`FaceParser.start`: same device and stream, downloaded with one copy per batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from gpen_tune.face.paste import feather_params, feather_sigma
from gpen_tune.ops.transfer import to_device_async
from gpen_tune.weights.aux_files import cached_aux, ensure_aux_file
from gpen_tune.weights.cache import WeightsNotFoundError

PARSE_SIZE = 512
DROPPED_CLASSES = (0, 14, 18)        # background, hat, cloth
PARSE_WEIGHTS = ("ParseNet-latest", "parsing_parsenet")    # registry entries, in order of preference
UNAVAILABLE = "parse mask unavailable: feathered mask"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SYNTHETIC = "synthetic"
SYNTHETIC_NOTICE = ("SYNTHETIC PARSE WEIGHTS: the paste mask is NOT a real face parsing (random ParseNet); "
                    "pass --parse-weights PATH to ParseNet-latest.pth or parsing_parsenet.pth.")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ParseMaskError(ValueError):
    """The parse mask was required but cannot be built; the one-line message names the file and the fix."""


def parse_weights_file(weights: str | Path | None = None, download: bool = True) -> Path:
    """The parser's weights: `weights` (a path) as given, else a cached registry file, else one downloaded
    through `gpen_tune.weights.aux_files` (sha256-pinned). Raises ParseMaskError."""
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise ParseMaskError(f"{path}: parsing weights file not found (pass --parse-weights PATH to a "
                                 "ParseNet .pth)")
        return path
    cached = cached_parse_weights()
    if cached is not None:
        return cached
    failures = []
    for name in PARSE_WEIGHTS:
        try:
            return ensure_aux_file(name, download=download, validate=_check_file, timeout=10.0, retries=0)
        except (WeightsNotFoundError, ValueError) as e:
            failures.append(str(e))
    raise ParseMaskError(failures[0] + " (or pass --parse-weights PATH)")


def cached_parse_weights() -> Path | None:
    """The first cached registry file (verified against its pin), or None; never downloads."""
    for name in PARSE_WEIGHTS:
        if cached_aux(name) is not None:
            return ensure_aux_file(name, download=False, validate=_check_file)
    return None


def timing_parse_weights() -> Path | str:
    """What a benchmark times the mask with: the cached official file, else SYNTHETIC (works offline)."""
    return cached_parse_weights() or SYNTHETIC


def parse_dtype(device: torch.device, precision: str = "auto") -> torch.dtype:
    """The parser's compute dtype. "auto": fp32 on the CPU, where bf16 measured slower, and bf16 on CUDA, where
    its masks agree with fp32's (IoU >= 0.99, tests/face/test_face_parse.py)."""
    if precision not in PRECISIONS:
        raise ValueError(f"parse precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return DTYPES[precision]


def build_parse_net() -> torch.nn.Module:
    """ParseNet with upstream's configuration (19 classes at PARSE_SIZE), random-initialised."""
    from facexlib.parsing.parsenet import ParseNet  # optional heavy dependency (facexlib)

    return ParseNet(in_size=PARSE_SIZE, out_size=PARSE_SIZE, min_feat_size=32, base_ch=64, parsing_ch=19,
                    norm_type="bn", relu_type="LeakyReLU", ch_range=[32, 256])


def read_parse_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A ParseNet state dict from either official file, as the network's keys."""
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise ParseMaskError(f"{path}: not a readable checkpoint ({str(e).splitlines()[0]})") from None
    if isinstance(sd, dict) and len(sd) == 1 and next(iter(sd)) in ("state_dict", "params", "params_ema"):
        sd = next(iter(sd.values()))
    if not isinstance(sd, dict):
        raise ParseMaskError(f"{path}: not a state dict")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def _check_file(path: Path) -> None:
    build_parse_net().load_state_dict(read_parse_state_dict(path), strict=True)


def synthetic_parse_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded random ParseNet in the official key layout (the caller's random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_parse_net().state_dict()


class FaceParser:
    """Batched soft paste masks for restored crops, on the generator's device.

    weights: a ParseNet .pth, None (cached or downloaded registry file) or SYNTHETIC (seeded random network).
    precision: see `parse_dtype` ("auto", "fp32", "bf16", "fp16").
    """

    def __init__(self, device: str | torch.device = "cpu", weights: str | Path | None = None,
                 precision: str = "auto", download: bool = True):
        self.device = torch.device(device)
        self.dtype = parse_dtype(self.device, precision)
        # the file first: without one (the usual case of `auto`) facexlib, and the torchvision it imports, stay out
        # of the process (~180 MB resident on a CPU run)
        path: Path | str = SYNTHETIC if weights == SYNTHETIC else parse_weights_file(weights, download)
        net = build_parse_net()
        if path == SYNTHETIC:
            net.load_state_dict(synthetic_parse_state_dict(), strict=True)
        else:
            try:
                net.load_state_dict(read_parse_state_dict(path), strict=True)
            except RuntimeError as e:
                raise ParseMaskError(f"{path}: not ParseNet weights ({str(e).splitlines()[0]})") from None
        self.weights = path
        self.net = net.to(self.device, self.dtype).eval().requires_grad_(False)

    @torch.inference_mode()
    def masks_device(self, restored: torch.Tensor, inverses: Sequence[np.ndarray] | None = None) -> torch.Tensor:
        """[B, S, S, 3] uint8 RGB restored crops -> [B, S, S] float32 paste masks, on the parser's device.
        `inverses` (crop -> image per face) widen each face's feather as the default mask's."""
        b, size = restored.shape[0], restored.shape[1]
        x = restored.to(self.device).permute(0, 3, 1, 2).float()
        if size != PARSE_SIZE:
            x = F.interpolate(x, size=(PARSE_SIZE, PARSE_SIZE), mode="bilinear", align_corners=False)
        x = (x / 127.5 - 1.0).to(self.dtype)
        classes = self.net(x)[0].argmax(1)                                       # [B, 512, 512]
        keep = torch.ones_like(classes, dtype=torch.bool)
        for c in DROPPED_CLASSES:
            keep &= classes != c
        sigmas = [feather_sigma(size, inv) * PARSE_SIZE / size if inv is not None else None
                  for inv in (inverses if inverses is not None else [None] * b)]
        m = feather_device(keep.float(), sigmas)
        if size != PARSE_SIZE:
            m = F.interpolate(m[:, None], size=(size, size), mode="bilinear", align_corners=False)[:, 0]
        return m

    def masks(self, faces: list[np.ndarray], inverses: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Soft masks for restored crops [S, S, 3] uint8 RGB (one size per call), each [S, S] float32 on the host:
        `masks_device` and one download for the batch."""
        if not faces:
            return []
        out = self.masks_device(torch.from_numpy(np.stack(faces)), inverses).cpu().numpy()
        return list(out)

    def start(self, restored: torch.Tensor, inverses: Sequence[np.ndarray | None], download: bool) -> PendingMasks:
        """The masks of a restored batch [B, S, S, 3] uint8 (on its device), queued behind it on the current stream
        (`download`: also copied to the host); read them with `result()`."""
        return PendingMasks(self, restored, inverses, download)

    def close(self) -> None:
        self.net = None


class PendingMasks:
    """One batch's masks in flight. On CUDA they are queued on the current stream without a host sync, with CUDA
    events around them and (`download`) one non-blocking copy into pinned memory; `result()` waits once. On the CPU
    they are computed at once (wall time)."""

    def __init__(self, parser: FaceParser, restored: torch.Tensor, inverses: Sequence[np.ndarray | None],
                 download: bool):
        self.source, self.downloads = restored, download
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        self._done: torch.cuda.Event | None = None
        if parser.device.type != "cuda":
            t = time.perf_counter()
            self.device = parser.masks_device(restored, inverses)
            self.seconds = time.perf_counter() - t
            self._host = self.device if download else None
            return
        stream = torch.cuda.current_stream(parser.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        self.device = parser.masks_device(restored, inverses)
        end.record(stream)
        self._host = None
        if download:
            self._host = torch.empty(self.device.shape, dtype=self.device.dtype, pin_memory=True)
            self._host.copy_(self.device, non_blocking=True)
        self._done = torch.cuda.Event()
        self._done.record(stream)
        self._events, self.seconds = (start, end), 0.0

    def result(self) -> tuple[torch.Tensor, list[np.ndarray] | None, float]:
        """(masks [B, S, S] float32 on the parser's device, the host copy per face or None, the parse's seconds:
        CUDA-event time on CUDA)."""
        if self._done is not None:
            self._done.synchronize()
            self.seconds = self._events[0].elapsed_time(self._events[1]) / 1000.0
            self._done = None
        host = None if self._host is None else list(self._host.numpy())
        return self.device, host, self.seconds


def feather_device(masks: torch.Tensor, sigmas: Sequence[float | None]) -> torch.Tensor:
    """`gpen_tune.face.paste.feather` on a batch [B, N, N] float32 on its device, without host syncs: every face's
    cleared border and blur kernel (OpenCV's, zero-padded to the batch's widest, centred) go up in one pinned
    upload; one grouped separable blur (reflect-101 border, as OpenCV's) serves all faces."""
    b, size = masks.shape[0], masks.shape[-1]
    params = [feather_params(size, s) for s in sigmas]
    width = max(ksize for _, _, ksize in params)
    table = np.zeros((b, 1 + width), np.float32)        # per face: border, then its kernel in `width` taps
    for i, (border, sigma, ksize) in enumerate(params):
        start = 1 + (width - ksize) // 2
        table[i, 0] = border
        table[i, start:start + ksize] = cv2.getGaussianKernel(ksize, sigma).ravel()
    table_device = to_device_async(table, masks.device)
    borders, kernels = table_device[:, :1], table_device[:, 1:]
    pos = torch.arange(size, device=masks.device, dtype=torch.float32)
    inside = (pos >= borders) & (pos < size - borders)                         # [B, N]
    x = torch.where(inside[:, :, None] & inside[:, None, :], masks, 0.0)[None]  # [1, B, N, N]: faces as channels
    across, down = kernels.view(b, 1, 1, width), kernels.view(b, 1, width, 1)
    half = width // 2
    for _ in range(2):
        x = F.conv2d(F.pad(x, (half, half, 0, 0), mode="reflect"), across, groups=b)
        x = F.conv2d(F.pad(x, (0, 0, half, half), mode="reflect"), down, groups=b)
    return x[0]


def load_parser(mode: bool | None, device: str | torch.device, weights: str | Path | None = None,
                notify: Callable[[str], None] | None = None, precision: str = "auto") -> FaceParser | None:
    """The parser for settings.parse_mask: None = when available (else `notify(UNAVAILABLE)` once and None),
    True = required (ParseMaskError, one line, when its weights are missing), False = none. Weights SYNTHETIC
    are said loudly (`notify(SYNTHETIC_NOTICE)`), as the generator's."""
    if mode is False:
        return None
    if weights == SYNTHETIC and notify is not None:
        notify(SYNTHETIC_NOTICE)
    try:
        return FaceParser(device, weights, precision=precision)
    except ParseMaskError:
        if mode or weights is not None:
            raise
        if notify is not None:
            notify(UNAVAILABLE)
        return None


def mask_area_iou(a: torch.Tensor, b: torch.Tensor, threshold: float = 0.5) -> float:
    """IoU of two mask batches thresholded at `threshold` (how the precision choice is measured)."""
    x, y = a > threshold, b > threshold
    union = (x | y).sum().item()
    return 1.0 if union == 0 else (x & y).sum().item() / union

