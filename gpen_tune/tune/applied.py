"""`Applied`: what every switch's `apply(done)` reads and extends, and in the end what `apply_switches` returns.

A module of its own so that each switch module can take it without importing `apply.py` (which imports them all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from torch import nn

from gpen_tune.tune.options import TuneConfig

# each switch's "off" value: what `effective` holds for a skipped switch
OFF_VALUES = {"act_checkpoint": False, "amp": "off", "fused": False, "onednn": False, "compile": None,
              "cuda_graph": False, "lazy_detector": False, "face_crop": False}


class Reserve(Protocol):
    """What the restorer's NaN fallback needs of a reserve (`amp.Fp32Reserve`, which imports this module)."""

    exact: bool

    def fp32_model(self, cast: nn.Module) -> nn.Module: ...


@dataclass
class Applied:
    """The composed forward (graphs over compiled over cast model) and the report of how it was built.

    forward: what the restorer calls; model: the (cast) FullGenerator, template of the fp32 re-run; reserve: its
    fp32 weights (amp only); skipped: switch -> why it did not run; log: every skip and fallback, in order (later
    fallbacks append to it too); notes: how switches composed. device, buckets (the CUDA-graph batch buckets) and
    compile_backend are the build's inputs.
    """

    forward: Callable[[torch.Tensor], torch.Tensor]
    model: nn.Module
    cfg: TuneConfig
    device: torch.device
    buckets: tuple[int, ...] = ()
    compile_backend: str | Callable = "inductor"
    reserve: Reserve | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def on(self, name: str) -> bool:
        """The switch is asked for in cfg and has not been skipped."""
        return getattr(self.cfg, name) not in (False, None, "off") and name not in self.skipped

    def skip(self, name: str, reason: str) -> None:
        self.skipped[name] = reason
        self.log.append(f"{name} skipped: {reason}")

    @property
    def effective(self) -> TuneConfig:
        """cfg with the skipped switches off."""
        return replace(self.cfg, **{name: OFF_VALUES[name] for name in self.skipped})
