"""Background upscaling (`--bg-upsampler realesrnet|realesrgan --upscale 2|4`), as upstream's `--use_sr`: the whole
frame goes through an RRDBNet (Real-ESRNet / Real-ESRGAN), and the restored faces are pasted onto it at the output
scale (`scale_inverse`).

The architecture comes from spandrel, which recognises RRDBNet state dicts (upstream's 32-feature `realesrnet_x*`
files and Real-ESRGAN's 64-feature ones, `params_ema` wrapper included) and builds the network; we only load the
file safely (`weights_only=True`), check its scale, pad to the model's size multiple and tile.

Tiles (`tile`, input pixels) are run with `tile_pad` pixels of context on every side and only their core is kept,
so neighbouring tiles meet without a seam as long as the context covers what the network sees of it (measured:
tests/background/test_background_upscale.py). On CUDA each tile shape is run through a captured CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from gpen_tune.weights.aux_files import ensure_aux_file
from gpen_tune.weights.cache import WeightsNotFoundError

UPSAMPLERS = ("realesrnet", "realesrgan")
SCALES = (2, 4)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
TILE_PAD = 32                      # context pixels around each tile (input scale)


class UpscaleError(ValueError):
    """A background upscaler that cannot be built; the one-line message names the file and the fix."""


def registry_name(kind: str, scale: int) -> str:
    """The `gpen_tune.weights.aux_files` entry of an upsampler choice."""
    if kind not in UPSAMPLERS:
        raise UpscaleError(f"--bg-upsampler must be one of {', '.join(UPSAMPLERS)}, got {kind!r}")
    if scale not in SCALES:
        raise UpscaleError(f"--upscale must be 2 or 4, got {scale}")
    return f"realesrnet_x{scale}" if kind == "realesrnet" else f"RealESRGAN_x{scale}plus"


def load_descriptor(path: Path):
    """spandrel's model descriptor for an RRDBNet file (read with weights_only=True)."""
    from spandrel import ModelLoader  # optional heavy dependency (spandrel, extra "upscale")

    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line error
        raise UpscaleError(f"{path}: not a readable checkpoint ({str(e).splitlines()[0]})") from None
    try:
        desc = ModelLoader().load_from_state_dict(sd)
    except Exception as e:  # noqa: BLE001 - spandrel raises several types for unknown layouts
        raise UpscaleError(f"{path}: not an RRDBNet / Real-ESRGAN checkpoint ({str(e).splitlines()[0]})") from None
    if desc.architecture.id != "ESRGAN":
        raise UpscaleError(f"{path}: a {desc.architecture.name} model, not RRDBNet (Real-ESRNet / Real-ESRGAN)")
    return desc


def scale_inverse(inverse: np.ndarray, scale: float) -> np.ndarray:
    """A crop -> image affine moved to an image upscaled `scale` times (pixel centres at integer coordinates:
    x_up = scale * x + (scale - 1) / 2)."""
    m = np.array(inverse, dtype=np.float64) * scale
    m[:, 2] += (scale - 1) / 2.0
    return m


def upscale_alpha(alpha: np.ndarray, scale: int) -> np.ndarray:
    """An alpha plane resized to the upscaled frame (bilinear; the network sees only colour)."""
    h, w = alpha.shape[:2]
    return cv2.resize(alpha, (w * scale, h * scale), interpolation=cv2.INTER_LINEAR)


class BackgroundUpscaler:
    """The frame upscaler: `upscale(rgb)` -> the frame `scale` times larger, same dtype.

    Args:
        kind: "realesrnet" (upstream's) or "realesrgan".
        scale: 2 or 4; the weights must be of that scale.
        weights: a local .pth (offline use); None = the registry file (cached, else downloaded, sha256-pinned).
        tile: tile size in input pixels (0 = the whole frame at once).
        precision: "auto" (bf16 on CUDA, fp32 elsewhere), "fp32", "bf16", "fp16".
        cuda_graphs: on CUDA, replay one captured graph per tile shape.
    """

    def __init__(self, kind: str = "realesrnet", scale: int = 2, weights: str | Path | None = None,
                 device: str | torch.device = "cpu", tile: int = 0, precision: str = "auto",
                 tile_pad: int = TILE_PAD, cuda_graphs: bool = True, download: bool = True):
        name = registry_name(kind, scale)
        if tile < 0 or tile_pad < 0:
            raise UpscaleError(f"--tile must be >= 0 (0 = whole frame), got {tile}")
        if precision not in PRECISIONS:
            raise UpscaleError(f"upscaler precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        path = self._weights_path(name, weights, download)
        desc = load_descriptor(path)
        if desc.scale != scale:
            raise UpscaleError(f"{path}: a x{desc.scale} model, but --upscale {scale} was asked for (pass "
                               f"--upscale {desc.scale} or x{scale} weights)")
        self.device = torch.device(device)
        if precision == "auto":
            precision = "bf16" if self.device.type == "cuda" else "fp32"
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.scale, self.tile, self.tile_pad = scale, tile, tile_pad
        self.multiple = max(1, desc.size_requirements.multiple_of)
        self.weights = path
        self.net = desc.model.to(self.device, self.dtype).eval().requires_grad_(False)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self._graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _weights_path(name: str, weights: str | Path | None, download: bool) -> Path:
        if weights is not None:
            path = Path(weights).expanduser()
            if not path.is_file():
                raise UpscaleError(f"{path}: upscaler weights file not found (pass --bg-weights PATH to a "
                                   "Real-ESRNet / Real-ESRGAN .pth)")
            return path
        try:
            return ensure_aux_file(name, download=download, validate=load_descriptor)
        except WeightsNotFoundError as e:
            raise UpscaleError(f"{e} (or pass --bg-weights PATH)") from None

    @torch.inference_mode()
    def upscale(self, rgb: np.ndarray) -> np.ndarray:
        """[H, W, 3] uint8 or uint16 RGB -> [scale*H, scale*W, 3], same dtype (rounded, clamped)."""
        top = 65535.0 if rgb.dtype == np.uint16 else 255.0
        x = torch.from_numpy(np.ascontiguousarray(rgb)).to(self.device).permute(2, 0, 1)[None].float() / top
        y = self.upscale_tensor(x)
        out = (y[0].permute(1, 2, 0) * top).round_().clamp_(0, top)
        return out.to(torch.int32).cpu().numpy().astype(rgb.dtype)

    def upscale_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """[1, 3, H, W] float in [0, 1] on the device -> [1, 3, sH, sW] float32 (whole frame or tiles)."""
        h, w = x.shape[-2:]
        if not self.tile or (h <= self.tile and w <= self.tile):
            return self._forward(x)
        s, t, p = self.scale, self.tile, self.tile_pad
        out = torch.empty((1, 3, h * s, w * s), dtype=torch.float32, device=x.device)
        for y0 in range(0, h, t):
            for x0 in range(0, w, t):
                y1, x1 = min(y0 + t, h), min(x0 + t, w)
                py0, px0 = max(0, y0 - p), max(0, x0 - p)
                py1, px1 = min(h, y1 + p), min(w, x1 + p)
                part = self._forward(x[..., py0:py1, px0:px1])
                out[..., y0 * s:y1 * s, x0 * s:x1 * s] = part[..., (y0 - py0) * s:(y1 - py0) * s,
                                                              (x0 - px0) * s:(x1 - px0) * s]
        return out

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """One piece through the network: reflect-padded to the size multiple, cropped back."""
        h, w = x.shape[-2:]
        ph, pw = -h % self.multiple, -w % self.multiple
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph), mode="reflect" if min(h, w) > max(ph, pw) else "replicate")
        y = self._graph_run(x) if self.use_graphs else self.net(x.to(self.dtype)).float()
        return y[..., :h * self.scale, :w * self.scale]

    def _graph_run(self, x: torch.Tensor) -> torch.Tensor:
        """The network through a CUDA graph captured once per input shape (tiles share a few shapes)."""
        key = tuple(x.shape)
        hit = self._graphs.get(key)
        if hit is None:
            static_in = x.to(self.dtype).clone()
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.net(static_in)                       # warm-up outside the capture (cuDNN picks algorithms)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self.net(static_in).float()
            hit = self._graphs[key] = (graph, static_in, static_out)
        graph, static_in, static_out = hit
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()

    def close(self) -> None:
        self._graphs.clear()
        self.net = None


def load_upscaler(kind: str | None, scale: int, weights: str | Path | None, device: str | torch.device,
                  tile: int = 0, notify: Callable[[str], None] | None = None) -> BackgroundUpscaler | None:
    """The upscaler for the settings (None when kind is None); errors are one line (UpscaleError)."""
    if kind is None:
        return None
    up = BackgroundUpscaler(kind, scale, weights, device, tile=tile)
    if notify is not None:
        notify(f"background upscaler: {kind} x{scale} ({up.weights.name}, {str(up.dtype).removeprefix('torch.')}"
               f"{f', tiles of {tile} px' if tile else ''})")
    return up
