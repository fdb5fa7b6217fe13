"""`gpen-tune demo`: the main job on a default that works offline.

Restores every face of real photos that ship inside installed packages (scikit-image's astronaut, matplotlib's
grace_hopper, and a mosaic of both), with the official weights when they are cached or downloadable and otherwise
synthetic weights (said loudly), then prints the per-stage timing table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpen_tune.choices import DETECTOR_NAMES, DEVICES, spelled
from gpen_tune.cli import app
from gpen_tune.cli._console import failure, notice, one_line, out
from gpen_tune.cli._options import choice, preset_option, tune_config_from_options
from gpen_tune.cli._run import RunOptions, run_command


def write_bundled_photos(folder: Path) -> list[Path]:
    """The bundled real photos as files (PNG), so the demo exercises decode/encode like a user's run."""
    from PIL import Image  # heavy: PIL (fast --help)

    from gpen_tune.face import samples  # heavy: cv2 (fast --help)

    folder.mkdir(parents=True, exist_ok=True)
    photos = {"astronaut": samples.astronaut(), "grace_hopper": samples.grace_hopper(), "mosaic": samples.mosaic()}
    paths = []
    for name, pixels in photos.items():
        path = folder / f"{name}.png"
        if not path.exists():
            tmp = path.with_suffix(".tmp.png")
            Image.fromarray(pixels).save(tmp)
            tmp.replace(path)
        paths.append(path)
    return paths


def official_weights_or_synthetic(model: str) -> str:
    """The cached (or freshly downloaded) official file; synthetic when neither works (a loud notice)."""
    from gpen_tune.weights.registry import ensure_weights  # heavy: torch (fast --help)

    try:
        return str(ensure_weights(model, download=True, timeout=10.0, retries=1))
    except Exception as e:  # offline, mirror down, refused pin: the demo still runs, on synthetic weights
        notice(f"official {model} weights unavailable ({one_line(e)}): using synthetic weights")
        return "synthetic"


@app.command()
def demo(
    output: Annotated[Path, typer.Option("-o", "--output", help="Where inputs and results go.")] = Path(
        "gpen-tune-demo"),
    model: Annotated[str, typer.Option(help="GPEN model.")] = "GPEN-BFR-512",
    device: Annotated[str, typer.Option(parser=choice(DEVICES), help=f"{spelled(DEVICES, 'auto')}.")] = "auto",
    weights: Annotated[str | None, typer.Option(help="Weights file, registry name or 'synthetic' (default: the "
                                                "official file, cached or downloaded, else synthetic).")] = None,
    detector: Annotated[str, typer.Option(parser=choice(DETECTOR_NAMES), help=f"{spelled(DETECTOR_NAMES, 'auto')}.")]
    = "auto",
    preset: Annotated[str, preset_option("auto")] = "auto",
) -> None:
    """Restore the faces of bundled real photos and print the per-stage timings (works offline)."""
    from gpen_tune.model.configs import model_info  # heavy: torch (fast --help)
    from gpen_tune.pipeline.settings import EnhanceSettings, resolve_device  # heavy: torch (fast --help)

    try:                                  # arguments first: an unknown model fails before any notice
        model_info(model)
        dev = resolve_device(device, notice, model=model)
        cfg, line = tune_config_from_options(preset, device=dev.type)
        EnhanceSettings(model=model, device=str(dev), detector=detector)
    except (ValueError, KeyError, RuntimeError) as e:
        raise failure(e) from None
    results = output / "results"
    inputs = write_bundled_photos(output / "inputs")
    weights = weights or official_weights_or_synthetic(model)
    settings = EnhanceSettings(model=model, weights=weights, device=str(dev), detector=detector)
    out.print(f"demo: {len(inputs)} bundled photos -> {results}")
    out.print(f"optimizations: {line}", highlight=False, soft_wrap=True)
    options = RunOptions(existing="overwrite", save_comparison=True)
    raise typer.Exit(run_command([str(p) for p in inputs], results, settings, cfg, options,
                                 report=output / "report.json"))
