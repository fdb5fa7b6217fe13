"""`load_model`: a GPEN generator in eval mode from a weights file, a registry name or synthetic weights.

Above model/, weights/ and tune/ (it uses all three), so that model/ imports neither of the others.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gpen_tune.model.configs import MODELS, GPENConfig, model_info
from gpen_tune.model.gpen import FullGenerator
from gpen_tune.tune.amp import cast_model
from gpen_tune.weights.checkpoint import check_state_dict, read_state_dict, synthetic_state_dict
from gpen_tune.weights.registry import ensure_weights

SYNTHETIC = "synthetic"


def load_model(
    weights: str | Path,
    model: str | GPENConfig = "GPEN-BFR-512",
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    key: str | None = None,
    download: bool = False,
) -> FullGenerator:
    """Build a GPEN generator, load its weights with strict=True and return it in eval mode.

    Args:
        weights: a checkpoint path, a registry name whose file is in the cache (e.g. "GPEN-BFR-512"), or
            "synthetic" for deterministic random weights (benchmarks and pipeline tests; not a face restorer).
        model: registry name of the architecture, or a GPENConfig for any (size, channel_multiplier, narrow).
        device: where the module lives.
        dtype: None keeps fp32; bf16/fp16 goes through `gpen_tune.tune.amp.cast_model` (fp32 islands kept).
        key: sub-dict of the checkpoint to use (e.g. "g_ema" for train_simple.py checkpoints).
        download: for a registry name whose file is not cached, download it (verified, sha256-pinned) instead of
            raising WeightsNotFoundError. Off by default: loading never touches the network unless asked.
    Returns:
        FullGenerator with `.weights_source` set to "synthetic" or the resolved file path.
    """
    cfg = model if isinstance(model, GPENConfig) else model_info(model).config
    if str(weights) == SYNTHETIC:
        sd = synthetic_state_dict(cfg)
        source = SYNTHETIC
    else:
        path = resolve_weights(weights, download=download)
        sd = read_state_dict(path, key=key)
        check_state_dict(sd, cfg, source=str(path))
        sd = {k: v.float() if v.dtype != torch.float32 else v for k, v in sd.items()}   # fp16/fp64 files: fp32 values
        source = str(path)
    with torch.device("meta"):
        net = FullGenerator(cfg)
    net.load_state_dict(sd, strict=True, assign=True)
    net.weights_source = source
    net = net.to(device).eval().requires_grad_(False)
    if dtype is not None and dtype != torch.float32:
        net = cast_model(net, dtype)
    return net


def resolve_weights(weights: str | Path, download: bool = False) -> Path:
    """A path as given, or the verified cached file of a registry name (see `gpen_tune.weights.registry`).

    A registry name whose file is missing raises WeightsNotFoundError naming the URL and the exact path to put
    the file at, unless `download` is set; a cached file whose sha256 differs from its pin is refused.
    """
    name = str(weights)
    if name in MODELS:
        return ensure_weights(name, download=download)
    return Path(weights).expanduser()
