"""The face-parsing paste mask (on by default when its weights are available, as upstream pastes through it).

Upstream GPEN runs ParseNet (19 classes) on every restored face and pastes only skin, features, hair and neck:
classes 0 (background), 14 (hat) and 18 (cloth) are dropped (upstream GPEN's paste mask). The network is facexlib's
`ParseNet` built with upstream's configuration; upstream's `ParseNet-latest.pth` and facexlib's
`parsing_parsenet.pth` share one key layout (both are the PSFR-GAN parsing net: encoder / body / decoder /
out_img_conv / out_mask_conv, blocks named conv2d and norm.norm), so both load strictly without renaming; a
DataParallel `module.` prefix or a one-entry wrapper dict is undone first.

The whole mask runs batched on the parser's device, without host syncs: resize to 512, forward, argmax, class
mask, feather (`gpen_tune.face.paste.feather_params`, widened per face like the default mask), resize back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from gpen_tune.face.paste import feather_params, feather_sigma
from gpen_tune.weights.aux_files import cached_aux, ensure_aux_file
from gpen_tune.weights.cache import WeightsNotFoundError

PARSE_SIZE = 512
DROPPED_CLASSES = (0, 14, 18)        # background, hat, cloth
PARSE_WEIGHTS = ("ParseNet-latest", "parsing_parsenet")    # registry entries, in order of preference
UNAVAILABLE = "parse mask unavailable: feathered mask"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


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
    for name in PARSE_WEIGHTS:
        if cached_aux(name) is not None:
            return ensure_aux_file(name, download=False, validate=_check_file)
    failures = []
    for name in PARSE_WEIGHTS:
        try:
            return ensure_aux_file(name, download=download, validate=_check_file, timeout=10.0, retries=0)
        except (WeightsNotFoundError, ValueError) as e:
            failures.append(str(e))
    raise ParseMaskError(failures[0] + " (or pass --parse-weights PATH)")


def _build_net() -> torch.nn.Module:
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
    _build_net().load_state_dict(read_parse_state_dict(path), strict=True)


class FaceParser:
    """Batched soft paste masks for restored crops, on the generator's device.

    precision: "auto" (fp32 on the CPU, where bf16 measured slower, and bf16 on CUDA), "fp32", "bf16", "fp16".
    """

    def __init__(self, device: str | torch.device = "cpu", weights: str | Path | None = None,
                 precision: str = "auto", download: bool = True):
        if precision not in PRECISIONS:
            raise ValueError(f"parse precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        path = parse_weights_file(weights, download)
        net = _build_net()
        try:
            net.load_state_dict(read_parse_state_dict(path), strict=True)
        except RuntimeError as e:
            raise ParseMaskError(f"{path}: not ParseNet weights ({str(e).splitlines()[0]})") from None
        self.device = torch.device(device)
        if precision == "auto":
            precision = "bf16" if self.device.type == "cuda" else "fp32"
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
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

    def close(self) -> None:
        self.net = None


def feather_device(masks: torch.Tensor, sigmas: Sequence[float | None]) -> torch.Tensor:
    """`gpen_tune.face.paste.feather` on a batch [B, N, N] float32 on its device: faces with the same feather share
    one separable blur (OpenCV's kernel and its reflect-101 border)."""
    size = masks.shape[-1]
    out = torch.empty_like(masks)
    groups: dict[tuple[int, float, int], list[int]] = {}
    for i, s in enumerate(sigmas):
        groups.setdefault(feather_params(size, s), []).append(i)
    for (border, sigma, ksize), idx in groups.items():
        m = masks[idx].clone()
        m[:, :border] = 0
        m[:, -border:] = 0
        m[:, :, :border] = 0
        m[:, :, -border:] = 0
        k = torch.from_numpy(cv2.getGaussianKernel(ksize, sigma).astype(np.float32).ravel()).to(m.device)
        x = m[:, None]
        for _ in range(2):
            x = _blur_1d(_blur_1d(x, k, dim=3), k, dim=2)
        out[idx] = x[:, 0]
    return out


def _blur_1d(x: torch.Tensor, kernel: torch.Tensor, dim: int) -> torch.Tensor:
    half = kernel.numel() // 2
    if dim == 3:
        return F.conv2d(F.pad(x, (half, half, 0, 0), mode="reflect"), kernel.view(1, 1, 1, -1))
    return F.conv2d(F.pad(x, (0, 0, half, half), mode="reflect"), kernel.view(1, 1, -1, 1))


def load_parser(mode: bool | None, device: str | torch.device, weights: str | Path | None = None,
                notify: Callable[[str], None] | None = None, precision: str = "auto") -> FaceParser | None:
    """The parser for settings.parse_mask: None = when available (else `notify(UNAVAILABLE)` once and None),
    True = required (ParseMaskError, one line, when its weights are missing), False = none."""
    if mode is False:
        return None
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

