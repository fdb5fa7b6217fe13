"""`EnhanceSettings`: every choice of the face pipeline, each default written once, and the device/weights rules.

The generator's optimization switches are not here: they are `gpen_tune.tune.options.TuneConfig` (one owner per
setting); the two meet in `gpen_tune.pipeline.api.Pipeline`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpen_tune.choices import BG_UPSAMPLERS, DETECTOR_NAMES, DEVICES, TEMPLATES
from gpen_tune.face.detect import DEFAULT_DET_SIZE, default_notify
from gpen_tune.model.configs import model_info
from gpen_tune.png_encode import PNG_LEVEL
from gpen_tune.tune.hardware import mps_available
from gpen_tune.weights.cache import WeightsNotFoundError, cached_file

PASTE_MODES = ("auto", "cpu", "gpu")
DEFAULT_MODEL = "GPEN-BFR-512"


@dataclass
class EnhanceSettings:
    """What a user chooses for `gpen-tune enhance` and `gpen_tune.enhance*` (tune switches: TuneConfig)."""

    model: str = DEFAULT_MODEL           # registry name: fixes the architecture and the crop size
    weights: str | None = None           # path | registry name | "synthetic"; None = the cached official file
    template: str = "gpen"               # "gpen" (upstream) or "ffhq" (GFPGAN / facefusion)
    detector: str = "auto"
    detector_weights: str | None = None  # RetinaFace file or URL
    det_size: int | None = DEFAULT_DET_SIZE   # long side for detection; None = native resolution
    det_threshold: float | None = None   # None = 0.9
    strength: float = 1.0                # 0 = input unchanged, 1 = fully restored
    only_center_face: bool = False
    aligned: bool = False                # inputs are already aligned face crops
    parse_mask: bool | None = None       # ParseNet mask: None = when its weights are available, True = required
    parse_weights: str | None = None     # a ParseNet .pth (upstream's or facexlib's layout)
    batch_size: int | None = None        # faces per generator call, across images; None = the restorer's default
    device: str = "auto"
    soften_small_faces: bool = True      # upstream's 3x3 softening of faces with a box under 100 px
    paste: str = "auto"                  # "auto" | "cpu" | "gpu": where faces are pasted back (GPU: CUDA, 8-bit)
    detector_process: bool = False       # pipelined runs: the detector in a process of its own (its own GIL)
    detector_processes: int = 1          # with detector_process: how many, detecting side by side
    bg_upsampler: str | None = None      # None | "realesrnet" | "realesrgan": the frame upscaled, faces pasted on it
    upscale: int = 2                     # 2 or 4 (with bg_upsampler)
    bg_weights: str | None = None        # a local upscaler .pth (offline use); None = the registry file
    tile: int = 0                        # upscaler tile size in input px (0 = whole frame)
    png_level: int = PNG_LEVEL           # zlib level of 8-bit PNG output: 0 (fastest) .. 9 (smallest)

    def __post_init__(self) -> None:
        if not 0 <= self.png_level <= 9:
            raise ValueError(f"--png-level {self.png_level}: use 0 (fastest, biggest) .. 9 (smallest, slowest)")
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1], got {self.strength}")
        if self.detector_processes < 1:
            raise ValueError(f"--detector-processes {self.detector_processes}: use 1 or more")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.template not in TEMPLATES:
            raise ValueError(f"template must be one of {', '.join(TEMPLATES)}, got {self.template!r}")
        if self.detector not in DETECTOR_NAMES:
            raise ValueError(f"unknown detector {self.detector!r}; choose one of: {', '.join(DETECTOR_NAMES)}")
        if self.paste not in PASTE_MODES:
            raise ValueError(f"paste must be one of {', '.join(PASTE_MODES)}, got {self.paste!r}")
        if self.det_size is not None and self.det_size < 1:
            raise ValueError(f"det_size must be >= 1 or None (native size), got {self.det_size}")
        if self.bg_upsampler is not None and self.bg_upsampler not in BG_UPSAMPLERS:
            raise ValueError(f"bg_upsampler must be one of {', '.join(BG_UPSAMPLERS)}, got {self.bg_upsampler!r}")
        if self.upscale not in (2, 4):
            raise ValueError(f"upscale must be 2 or 4, got {self.upscale}")
        if self.tile < 0:
            raise ValueError(f"tile must be >= 0 (0 = whole frame), got {self.tile}")
        model_info(self.model)           # an unknown model name fails here, before anything is printed or built


def resolve_device(name: str = "auto", notify: Callable[[str], None] = default_notify, *,
                   cuda: bool | None = None, mps: bool | None = None, model: str = DEFAULT_MODEL) -> torch.device:
    """auto: cuda > mps > cpu, with a loud notice on the CPU; explicit choices are checked.

    `cuda` / `mps`: whether each backend is usable (None: ask torch, `gpen_tune.tune.hardware.mps_available`);
    given, the choice is decided from them alone (how the rule is tested without the hardware). `model` is the one
    the CPU notice names."""
    has_cuda = torch.cuda.is_available() if cuda is None else cuda
    has_mps = mps_available() if mps is None else mps
    if name == "auto":
        if has_cuda:
            return torch.device("cuda")
        if has_mps:
            notify("Apple MPS: running on the Mac's GPU (preset auto takes fp16 there; bf16 needs macOS 14+).")
            return torch.device("mps")
        notify(f"NO GPU FOUND: running on the CPU, expect seconds per face ({model}). "
               "Pass --device cpu to silence this, or check `gpen-tune doctor`.")
        return torch.device("cpu")
    if name.startswith("cuda") and not has_cuda:
        raise ValueError(f"--device {name}: no CUDA GPU is visible to PyTorch (check the driver / "
                         "CUDA_VISIBLE_DEVICES)")
    if name == "mps" and not has_mps:
        raise ValueError("--device mps: Apple MPS is not available on this machine (it needs macOS 12.3+ and a "
                         "PyTorch built with MPS); use --device cpu")
    return torch.device(name)


def resolve_weights(settings: EnhanceSettings, notify: Callable[[str], None] = default_notify) -> str:
    """The weights argument for load_model: as given (synthetic said loudly), else the cached registry file.

    Without `weights` and without the cached official file this raises WeightsNotFoundError: random weights
    would write coloured blobs over every face and exit 0, so synthetic weights are only ever taken when asked for
    (`weights="synthetic"`, a dry run)."""
    if settings.weights:
        if settings.weights == "synthetic":
            synthetic_notice(settings.model, notify)
        return settings.weights
    check_weights(settings)
    return settings.model


def check_weights(settings: EnhanceSettings) -> None:
    """Raise WeightsNotFoundError (one line: the model, its URL, the cache path, the ways out) when no weights are
    given and the official file is not cached; quiet otherwise. Called before any work."""
    if settings.weights:
        return
    info = model_info(settings.model)
    path = cached_file(info.filename)
    if path.is_file():
        return
    source = f"; {info.name} is {info.source_note}" if "modelscope" in info.source_note.lower() else ""
    raise WeightsNotFoundError(
        f"no weights for {info.name}: {info.filename} is not in the cache ({path}). Download it with "
        f"`gpen-tune weights download {info.name}` (from {info.urls[0]}) or pass --weights PATH; for a dry run "
        f"with random weights (faces not restored) pass --weights synthetic{source}")


def synthetic_notice(model: str, notify: Callable[[str], None]) -> None:
    notify(f"SYNTHETIC WEIGHTS: the output is NOT a real restoration (random {model} network). "
           f"Run `gpen-tune weights download {model}` or pass --weights PATH.")


def detection_size(given: int | None, face_crop: bool) -> int | None:
    """The detection copy's long side: as given (0 = native), else DEFAULT_DET_SIZE with face_crop and the native
    size without it (the upstream-like comparison detects on the whole image)."""
    if given is not None:
        return given or None
    return DEFAULT_DET_SIZE if face_crop else None
