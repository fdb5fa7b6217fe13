"""The optimization switches as reusable Typer options (panel "Optimizations"), the TuneConfig they build, and
choice options whose lists come from the library.

Every switch flag is tri-state: not given (None) keeps the preset's value, given overrides it. Help text comes
from TuneConfig's field metadata, so the CLI, the docs and the bench say the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from gpen_tune.choices import spelled
from gpen_tune.tune.options import (
    AMP_MODES,
    BACKENDS,
    COMPILE_MODES,
    PRESET_NAMES,
    TuneConfig,
    resolve_preset,
    switch_meta,
    switch_short,
    with_overrides,
)

PANEL = "Optimizations"


def panel_option(*names: str, panel: str, help: str, **kw):
    """A Typer option listed under its help panel (commands group their options by what they are for)."""
    return typer.Option(*names, help=help, rich_help_panel=panel, **kw)


def choice(names: tuple[str, ...], case_sensitive: bool = True) -> Callable[[str], str]:
    """A parser that accepts one of `names` (the library's list) and says which ones otherwise."""
    def parse(value: str) -> str:
        key = value if case_sensitive else value.lower()
        for name in names:
            if key == (name if case_sensitive else name.lower()):
                return name
        raise typer.BadParameter(f"{value!r}: choose one of {', '.join(names)}")
    return parse


def preset_option(default: str | None) -> typer.models.OptionInfo:
    """--preset NAME; `default` is said in the help (enhance: auto; bench: none given = its own rows)."""
    said = spelled(PRESET_NAMES, default)
    return typer.Option("--preset", metavar="NAME", parser=choice(PRESET_NAMES, case_sensitive=False),
                        help=f"{said}; the flags below override it.",
                        rich_help_panel=PANEL,
                        show_default=False)


PresetOpt = Annotated[str | None, preset_option(None)]
LazyDetectorOpt = Annotated[bool | None, typer.Option(
    "--lazy-detector/--no-lazy-detector", help=switch_short("lazy_detector"), rich_help_panel=PANEL,
    show_default=False)]
CompileOpt = Annotated[str | None, typer.Option(
    "--compile", metavar="MODE", parser=choice(("off", *COMPILE_MODES), case_sensitive=False),
    help=switch_short("compile"), rich_help_panel=PANEL, show_default=False)]
AmpOpt = Annotated[str | None, typer.Option(
    "--amp", metavar="off|bf16|fp16", parser=choice(AMP_MODES, case_sensitive=False), help=switch_short("amp"),
    rich_help_panel=PANEL, show_default=False)]
_ACT = switch_meta("act_checkpoint")["flag"].removeprefix("--")        # act-checkpoint: the setting's one name
ActCheckpointOpt = Annotated[bool | None, typer.Option(
    f"--{_ACT}/--no-{_ACT}", help=switch_short("act_checkpoint"), rich_help_panel=PANEL, show_default=False)]
CheckpointAliasOpt = Annotated[bool | None, typer.Option(
    "--checkpoint/--no-checkpoint", hidden=True, help="The earlier name of --act-checkpoint.", show_default=False)]
FaceCropOpt = Annotated[bool | None, typer.Option(
    "--face-crop/--no-face-crop", help=switch_short("face_crop"), rich_help_panel=PANEL, show_default=False)]
CudaGraphOpt = Annotated[bool | None, typer.Option(
    "--cuda-graph/--no-cuda-graph", help=switch_short("cuda_graph"), rich_help_panel=PANEL, show_default=False)]
FusedOpt = Annotated[bool | None, typer.Option(
    "--fused/--no-fused", help=switch_short("fused"), rich_help_panel=PANEL, show_default=False)]
OnednnOpt = Annotated[bool | None, typer.Option(
    "--onednn/--no-onednn", help=switch_short("onednn"), rich_help_panel=PANEL, show_default=False)]
BackendOpt = Annotated[str | None, typer.Option(
    "--backend", metavar="|".join(BACKENDS), parser=choice(BACKENDS, case_sensitive=False),
    help=switch_short("backend"), rich_help_panel=PANEL, show_default=False)]


def either(name: bool | None, alias: bool | None) -> bool | None:
    """A flag and its hidden alias: the flag's value when given, else the alias's."""
    return name if name is not None else alias


def tune_config_from_options(
    preset: str | None = None,
    lazy_detector: bool | None = None,
    compile: str | None = None,
    amp: str | None = None,
    act_checkpoint: bool | None = None,
    face_crop: bool | None = None,
    cuda_graph: bool | None = None,
    fused: bool | None = None,
    backend: str | None = None,
    onednn: bool | None = None,
    device: str = "cuda",
    base: TuneConfig | None = None,
) -> tuple[TuneConfig, str]:
    """The TuneConfig the flags ask for, and a line saying where it came from (print it: `auto` explains itself).

    Without a preset the start is `base` (default: all off, except face_crop on: the enhance default).
    """
    if preset is None:
        start = base if base is not None else TuneConfig(face_crop=True)
        origin = "no preset"
    else:
        name, start, origin = resolve_preset(preset, device)
    cfg = with_overrides(start, lazy_detector=lazy_detector, compile=compile, amp=amp,
                         act_checkpoint=act_checkpoint, face_crop=face_crop, cuda_graph=cuda_graph, fused=fused,
                         backend=backend, onednn=onednn)
    return cfg, f"{origin}; switches: {cfg.describe()}"
