"""The optimization switches as reusable Typer options (panel "Optimizations"), and the TuneConfig they build.

Every flag is tri-state: not given (None) keeps the preset's value, given overrides it. Help text comes from
TuneConfig's field metadata, so the CLI, the docs and the bench say the same thing.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from gpen_tune.tune.options import TuneConfig, resolve_preset, switch_short, with_overrides

PANEL = "Optimizations"


def panel_option(*names: str, panel: str, help: str, **kw):
    """A Typer option listed under its help panel (commands group their options by what they are for)."""
    return typer.Option(*names, help=help, rich_help_panel=panel, **kw)


class Preset(str, Enum):
    auto = "auto"
    speed = "speed"
    balanced = "balanced"
    low_memory = "low-memory"
    cpu = "cpu"
    mps = "mps"


class CompileMode(str, Enum):
    off = "off"
    default = "default"
    reduce_overhead = "reduce-overhead"
    max_autotune = "max-autotune"


class BackendChoice(str, Enum):
    torch = "torch"
    onnxruntime = "onnxruntime"


class AmpMode(str, Enum):
    off = "off"
    bf16 = "bf16"
    fp16 = "fp16"


PresetOpt = Annotated[Preset | None, typer.Option(
    "--preset", metavar="NAME", help="auto, speed, balanced, low-memory, cpu or mps (flags below override it).",
    rich_help_panel=PANEL, case_sensitive=False)]
LazyDetectorOpt = Annotated[bool | None, typer.Option(
    "--lazy-detector/--no-lazy-detector", help=switch_short("lazy_detector"), rich_help_panel=PANEL,
    show_default=False)]
CompileOpt = Annotated[CompileMode | None, typer.Option(
    "--compile", metavar="MODE", help=switch_short("compile"), rich_help_panel=PANEL, case_sensitive=False,
    show_default=False)]
AmpOpt = Annotated[AmpMode | None, typer.Option(
    "--amp", metavar="off|bf16|fp16", help=switch_short("amp"), rich_help_panel=PANEL, case_sensitive=False,
    show_default=False)]
CheckpointOpt = Annotated[bool | None, typer.Option(
    "--checkpoint/--no-checkpoint", help=switch_short("act_checkpoint"), rich_help_panel=PANEL, show_default=False)]
FaceCropOpt = Annotated[bool | None, typer.Option(
    "--face-crop/--no-face-crop", help=switch_short("face_crop"), rich_help_panel=PANEL, show_default=False)]
CudaGraphOpt = Annotated[bool | None, typer.Option(
    "--cuda-graph/--no-cuda-graph", help=switch_short("cuda_graph"), rich_help_panel=PANEL, show_default=False)]
FusedOpt = Annotated[bool | None, typer.Option(
    "--fused/--no-fused", help=switch_short("fused"), rich_help_panel=PANEL, show_default=False)]
BackendOpt = Annotated[BackendChoice | None, typer.Option(
    "--backend", metavar="torch|onnxruntime", help=switch_short("backend"), rich_help_panel=PANEL,
    case_sensitive=False, show_default=False)]


def tune_config_from_options(
    preset: Preset | str | None = None,
    lazy_detector: bool | None = None,
    compile: CompileMode | str | None = None,
    amp: AmpMode | str | None = None,
    checkpoint: bool | None = None,
    face_crop: bool | None = None,
    cuda_graph: bool | None = None,
    fused: bool | None = None,
    backend: BackendChoice | str | None = None,
    device: str = "cuda",
    base: TuneConfig | None = None,
) -> tuple[TuneConfig, str]:
    """The TuneConfig the flags ask for, and a line saying where it came from (print it: `auto` explains itself).

    Without a preset the start is `base` (default: all off, except face_crop on: the enhance default).
    """
    def value(v):
        return v.value if isinstance(v, Enum) else v

    if preset is None:
        start = base if base is not None else TuneConfig(face_crop=True)
        origin = "no preset"
    else:
        name, start, origin = resolve_preset(value(preset), device)
    cfg = with_overrides(start, lazy_detector=lazy_detector, compile=value(compile), amp=value(amp),
                         act_checkpoint=checkpoint, face_crop=face_crop, cuda_graph=cuda_graph, fused=fused,
                         backend=value(backend))
    return cfg, f"{origin}; switches: {cfg.describe()}"
