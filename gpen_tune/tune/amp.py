"""--amp bf16|fp16: cast the generator's conv weights to half precision, keep fp32 islands where it matters.

What changes: every conv weight and the activations run in bf16/fp16 (half the bytes, tensor-core rate).
What stays fp32: the mapping network and `final_linear` (the style path), the per-layer styles and demodulation
coefficients (a sum of cin*k*k squares overflows fp16), the RGB skip accumulation (ToRGB returns fp32).
Inputs are converted once at the model's entry, outputs are fp32. Not autocast: autocast re-casts weights on
every call and GPEN's fp32 biases promote activations back to fp32 (upstream on an H200: 3-5x slower, more memory).
Why it helps: half the bytes per activation (the network is memory-bound) and tensor-core convolutions.
Tolerance: >= 40 dB PSNR vs fp32 on the same faces (synthetic weights: fp16 64 dB, bf16 50 dB; fp16
keeps 3 more mantissa bits, bf16 has fp32's exponent range and cannot overflow).
Fallback: the restorer checks every output; a non-finite value (fp16 overflow in a conv output) re-runs that batch
in fp32 with the original weights (kept as a host copy by `Fp32Reserve`, moved to the device only when needed;
not kept for bf16 on the CPU, see `keeps_fp32_originals`: there the half weights are up-cast) and records it.
No conv clamp (NVlabs' conv_clamp=256): the fp32 re-run is exact where a clamp changes pixels.
"""

from __future__ import annotations

import copy
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.model.layers import Blur, EqualLinear, ToRGB
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.hardware import CpuCapabilities, cpu_capabilities
from gpen_tune.tune.options import TuneConfig

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": torch.float32}


def fp32_islands(model: nn.Module) -> set[int]:
    """ids of the parameters that stay fp32: every EqualLinear (style path) and the ToRGB biases (skip path)."""
    keep: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, EqualLinear):
            keep.update(id(p) for p in mod.parameters(recurse=False))
        if isinstance(mod, ToRGB):
            keep.add(id(mod.bias))
    return keep


def cast_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast in place every parameter except EqualLinear's and ToRGB biases to `dtype`; returns the model.

    The FIR kernels of `Blur` (which only ever filter half-precision activations) are cast too: their values
    (k/64, k in 1, 3, 9) are exact in bf16/fp16, and left fp32 they were re-cast on every call (12 small copies
    per GPEN-256 forward: launch overhead that made bf16 slower than fp32 at batch 1). `Upsample`'s kernel filters
    the fp32 RGB skip and stays fp32.
    """
    keep = fp32_islands(model)
    for mod in model.modules():
        for p in list(mod.parameters(recurse=False)):
            if id(p) not in keep and p.dtype != dtype:
                p.data = p.data.to(dtype)
        if isinstance(mod, Blur) and mod.kernel.dtype != dtype:
            half = mod.kernel.to(dtype)
            if torch.equal(half.float(), mod.kernel.float()):  # exact in dtype: same filter, no per-call cast
                mod.kernel = half
    return model


@cache
def _half_convs_work(device_type: str, device_index: int | None, dtype: torch.dtype) -> str | None:
    """Run the ops the generator needs once in `dtype` on the device; the error text when they are missing."""
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    try:
        x = torch.randn(1, 4, 6, 6, device=device, dtype=dtype)
        w = torch.randn(4, 4, 3, 3, device=device, dtype=dtype)
        F.conv2d(x, w, padding=1)
        F.conv_transpose2d(x, w, stride=2)
        F.conv2d(x, w[:, :1], groups=4)
        F.leaky_relu(x, 0.2)
    except (RuntimeError, NotImplementedError) as e:
        return (str(e).splitlines() or [type(e).__name__])[0][:200]
    return None


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    if cfg.amp == "off":
        return None
    device = torch.device(device)
    dtype = AMP_DTYPES[cfg.amp]
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            name = torch.cuda.get_device_name(device)
            return f"{name} has no bf16 support (needs compute capability 8.0+); use --amp fp16"
    problem = _half_convs_work(device.type, device.index, dtype)
    if problem:
        return f"{cfg.amp} convolutions do not run on {device}: {problem}"
    return None


def pays_off(device: str | torch.device, cfg: TuneConfig, cpu: CpuCapabilities | None = None) -> str | None:
    """Why cfg.amp runs but cannot be faster than fp32 on `device` (None: it can). `is_supported` says whether it
    runs at all; this is the bench's and the auto preset's question.

    Rules: on the CPU half precision pays only with native dot products for it (`gpen_tune.tune.hardware`:
    AVX512-BF16/AMX or ARM BF16 for bf16; AVX512-FP16/AMX-FP16 or ARM fp16 for fp16), else PyTorch emulates it
    through fp32 (fp16 measured 155x slower than fp32 on an AVX-512 CPU without AVX512-FP16). On CUDA and Apple MPS
    both run natively where `is_supported` passes (MPS: fp16 always, bf16 from macOS 14)."""
    if cfg.amp == "off" or torch.device(device).type != "cpu":
        return None
    cpu = cpu or cpu_capabilities()
    native = cpu.bf16_dot if cfg.amp == "bf16" else cpu.fp16_dot
    if native:
        return None
    need = "AVX512-BF16 / AMX-BF16" if cfg.amp == "bf16" else "AVX512-FP16 / AMX-FP16"
    return f"this CPU has no native {cfg.amp} dot products ({need}): {cfg.amp} is emulated, slower than fp32"


class Fp32Reserve:
    """The fp32 weights of the parameters `cast_model` is about to cast, kept on the host for the NaN fallback.

    `fp32_model(cast)` builds (once) a copy of the cast model with the original fp32 weights on its device.
    A model that was already cast before (load_model(dtype=...)) has no fp32 originals: the fallback then
    up-casts the half weights (still fixes overflow; the weights keep their half-precision rounding).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        keep = fp32_islands(model)
        self.saved = {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters()
                      if p.dtype == torch.float32 and id(p) not in keep}
        self.exact = True
        self._model: nn.Module | None = None

    @classmethod
    def upcast_only(cls) -> Fp32Reserve:
        reserve = cls.__new__(cls)
        reserve.saved, reserve.exact, reserve._model = {}, False, None
        return reserve

    def fp32_model(self, cast: nn.Module) -> nn.Module:
        if self._model is None:
            with torch.inference_mode(False):  # first needed inside a pipeline's inference_mode: normal tensors
                fp32 = copy.deepcopy(cast)  # same structure and flags (release_features), half weights replaced
                for name, p in fp32.named_parameters():
                    original = self.saved.get(name)
                    p.data = original.to(p.device) if original is not None else p.data.float()
            self._model = fp32
        return self._model


def keeps_fp32_originals(device: str | torch.device, cfg: TuneConfig) -> bool:
    """Whether the NaN fallback keeps the fp32 originals (`Fp32Reserve`) or only up-casts the half weights.

    Kept on a GPU (the copy lives in host memory, not the device's) and for fp16 everywhere (fp16 overflows: the
    originals make its re-run exact). Not kept for bf16 on the CPU: bf16 has fp32's exponent range and does not
    overflow, and there the copy would be a second resident set of weights in the memory the model runs in
    (GPEN-BFR-512: 284 MB)."""
    return not (torch.device(device).type == "cpu" and cfg.amp == "bf16")


def cast_with_reserve(model: nn.Module, cfg: TuneConfig, keep_fp32: bool = True
                      ) -> tuple[nn.Module, Fp32Reserve | None]:
    """Cast `model` in place to cfg.amp's dtype; returns it and the fp32 reserve for the NaN fallback
    (`keep_fp32=False`: an up-cast-only reserve, no copy of the originals)."""
    dtype = AMP_DTYPES[cfg.amp]
    if dtype == torch.float32:
        return model, None
    reserve = Fp32Reserve(model, dtype) if keep_fp32 else Fp32Reserve.upcast_only()
    if not reserve.saved:
        reserve = Fp32Reserve.upcast_only()
    return cast_model(model, dtype), reserve


def apply(done: Applied) -> None:
    """Cast the generator; with --fused the fused build casts after it reads the fp32 weights (`fused.apply`)."""
    if done.on("fused"):
        return
    done.model, done.reserve = cast_with_reserve(done.model, done.cfg, keeps_fp32_originals(done.device, done.cfg))
    done.forward = done.model
