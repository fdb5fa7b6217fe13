"""Reading and checking GPEN checkpoint files.

Always `torch.load(..., weights_only=True)`: a checkpoint is data, and a pickle that tries to run code is refused
before anything executes. Every key and shape is checked against the model config before `load_state_dict`.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from gpen_tune.model.configs import GPENConfig


class CheckpointError(ValueError):
    """A weights file that cannot be used; the message names the file and what to do."""


def expected_shapes(cfg: GPENConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the official state dict for `cfg`, derived from our module tree (built on 'meta')."""
    from gpen_tune.model.gpen import FullGenerator

    with torch.device("meta"):
        model = FullGenerator(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def read_state_dict(path: str | Path, key: str | None = None) -> dict[str, torch.Tensor]:
    """Load a plain tensor dict from `path` safely; `key` picks a sub-dict (e.g. 'g_ema' of a training file)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, expected a .pth checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes); delete it and download again")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except zipfile.BadZipFile as e:
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({e}); delete it and download again") from None
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        if "zip" in msg.lower() or "central directory" in msg.lower() or "failed finding" in msg.lower():
            raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({msg}); delete it and download again") \
                from None
        raise CheckpointError(f"{path}: not a loadable PyTorch checkpoint ({msg})") from None
    except Exception as e:  # pickle.UnpicklingError for unsafe globals and non-checkpoint bytes, EOFError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise CheckpointError(
                f"{path}: refused, the file wants to run code or build objects on load ({first[:160]}); "
                "only plain tensor checkpoints are accepted"
            ) from None
        raise CheckpointError(f"{path}: not a PyTorch checkpoint ({type(e).__name__}: {first[:160]})") from None
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            raise CheckpointError(f"{path}: has no entry {key!r}")
        obj = obj[key]
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        hint = ""
        if isinstance(obj, Mapping) and "g_ema" in obj:
            hint = " (a training checkpoint: pass key='g_ema' / --key g_ema)"
        raise CheckpointError(f"{path}: not a state dict of tensors{hint}")
    sd = {str(k): v for k, v in obj.items()}
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def check_state_dict(sd: Mapping[str, torch.Tensor], cfg: GPENConfig, source: str = "checkpoint") -> None:
    """Raise CheckpointError listing missing, unexpected and wrongly shaped keys for `cfg`."""
    want = expected_shapes(cfg)
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    wrong = [f"{k} {tuple(sd[k].shape)}!={want[k]}" for k in want if k in sd and tuple(sd[k].shape) != want[k]]
    if missing or unexpected or wrong:
        def show(items: list[str]) -> str:
            return ", ".join(items[:6]) + (f" (+{len(items) - 6} more)" if len(items) > 6 else "")

        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys: {show(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys: {show(unexpected)}")
        if wrong:
            parts.append(f"{len(wrong)} wrong shapes: {show(wrong)}")
        raise CheckpointError(
            f"{source}: does not match GPEN size {cfg.size} (channel_multiplier {cfg.channel_multiplier}, "
            f"narrow {cfg.narrow}): " + "; ".join(parts) + ". Is it the right model (--model)?"
        )


def synthetic_state_dict(cfg: GPENConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights in the official layout, for benchmarks and tests (not a face restorer).

    The encoder-feature scalars (`noise.weight`, zero at init upstream) are set to 0.5 so that the output depends
    on the input face as it does with trained weights.
    """
    from gpen_tune.model.gpen import FullGenerator

    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = FullGenerator(cfg)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("kernel"):
            continue  # fixed FIR buffers: take the real values below
        if k.endswith("noise.weight"):
            sd[k] = torch.full(tuple(v.shape), 0.5)
        elif k.endswith("modulation.bias"):
            sd[k] = torch.ones(tuple(v.shape))
        elif k.endswith("bias"):
            sd[k] = torch.zeros(tuple(v.shape))
        else:
            t = torch.randn(tuple(v.shape), generator=gen)
            if k.startswith("generator.style."):
                t = t / cfg.lr_mlp
            sd[k] = t
    sd.update(fir_buffers(cfg))
    return {k: sd[k] for k in model.state_dict()}


def fir_buffers(cfg: GPENConfig) -> dict[str, torch.Tensor]:
    """The fixed 4x4 FIR buffers saved in the checkpoints: K for the encoder blurs, 4K for the 2x upsamplers."""
    from gpen_tune.ops.fir import make_kernel

    k = make_kernel(cfg.blur_kernel)
    return {name: (k.clone() if name.startswith("ecd") else k * 4)
            for name in expected_shapes(cfg) if name.endswith("kernel")}
