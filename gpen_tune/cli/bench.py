"""`gpen-tune bench`: time and memory of every optimization row on real face crops, vs the fp32 default."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from gpen_tune.cli import app
from gpen_tune.cli._console import err, fail, out
from gpen_tune.cli._options import (
    ActCheckpointOpt,
    AmpOpt,
    BackendOpt,
    CheckpointAliasOpt,
    CompileOpt,
    CudaGraphOpt,
    FaceCropOpt,
    FusedOpt,
    LazyDetectorOpt,
    OnednnOpt,
    PresetOpt,
    choice,
    either,
    tune_config_from_options,
)
from gpen_tune.cli._options import panel_option as _opt  # short: it is on every option line
from gpen_tune.tune import TuneConfig
from gpen_tune.tune.options import COMPILE_MODES, cli_flags

EXAMPLES = """
Examples:\n
  gpen-tune bench --model GPEN-BFR-512 --device cuda -o benchmarks/results\n
  gpen-tune bench --model GPEN-BFR-256 --device cpu --rows default,amp,act_checkpoint --batch-sizes 1,2 -o out\n
  gpen-tune bench --model GPEN-BFR-512 --device cuda --rows default,preset:speed --parse-mask -o out
"""


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise typer.BadParameter(f"expected positive batch sizes, got {text!r}")
    return values


def _command_line(ctx: typer.Context) -> str:
    """The command as given (options set on the command line, in declaration order), shell-quoted."""
    parts = ["gpen-tune", "bench"]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if getattr(source, "name", None) != "COMMANDLINE":
            continue
        value = ctx.params[param.name]
        long_opt = max(param.opts, key=len)
        if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
            parts.append(long_opt if value else max(param.secondary_opts, key=len))
        elif getattr(param, "is_flag", False):
            parts += [long_opt] if value else []
        else:
            parts += [long_opt, str(getattr(value, "value", value))]
    return shlex.join(parts)


RUN_PANEL = "Model and inputs"
MEASURE_PANEL = "Measurement"
BACKEND_PANEL = "Backend"


@app.command(epilog=EXAMPLES)
def bench(
    ctx: typer.Context,
    output: Annotated[Path, _opt("-o", "--output", panel=RUN_PANEL, metavar="DIR",
                                 help="Folder for the JSON, markdown table and PNG plot.")],
    model: Annotated[str, _opt("--model", panel=RUN_PANEL, metavar="NAME",
                               help="GPEN-BFR-256, -512, -1024 or -2048 ('tiny' for a smoke test).")]
    = "GPEN-BFR-512",
    device: Annotated[str, _opt("--device", panel=RUN_PANEL, metavar="DEV", show_default=False,
                                help="cuda, cuda:N or cpu (default: cuda when available).")] = "",
    weights: Annotated[str, _opt("--weights", panel=RUN_PANEL, metavar="W",
                                 help="'synthetic' (timing does not depend on weights), a registry name or a .pth.")]
    = "synthetic",
    inputs: Annotated[Path | None, _opt("--inputs", panel=RUN_PANEL, metavar="DIR",
                                        help="Folder of aligned face crops (default: faces in the bundled photos).")]
    = None,
    max_faces: Annotated[int, _opt("--max-faces", panel=RUN_PANEL, min=1, metavar="N",
                                   help="Use at most this many input faces.")] = 16,
    batch_sizes: Annotated[str, _opt("--batch-sizes", panel=MEASURE_PANEL, metavar="LIST",
                                     help="Comma-separated batch sizes.")] = "1,4,16,64",
    rows: Annotated[str | None, _opt("--rows", panel=MEASURE_PANEL, metavar="LIST", show_default=False,
                                     help="Comma-separated row ids, e.g. default,amp,1+2,preset:speed (default: "
                                          "the rows that can be faster on this device).")] = None,
    repeats: Annotated[int, _opt("--repeats", panel=MEASURE_PANEL, min=1, metavar="N",
                                 help="Timed calls per batch size (the median is reported).")] = 20,
    warmup: Annotated[int, _opt("--warmup", panel=MEASURE_PANEL, min=0, metavar="N",
                                help="Untimed calls after the first one.")] = 3,
    max_minutes: Annotated[float | None, _opt("--max-minutes", panel=MEASURE_PANEL, metavar="MIN",
                                              help="Skip the rows left after this many minutes (recorded).")]
    = None,
    compile_mode: Annotated[str, _opt("--compile-mode", panel=MEASURE_PANEL, metavar="MODE",
                                      parser=choice(("off", *COMPILE_MODES), case_sensitive=False),
                                      help="default, reduce-overhead or max-autotune: the compile rows' mode.")]
    = "default",
    amp_dtype: Annotated[str, _opt("--amp-dtype", panel=MEASURE_PANEL, metavar="DTYPE",
                                   parser=choice(("bf16", "fp16"), case_sensitive=False),
                                   help="bf16 or fp16 for the amp rows (the other dtype gets its own row).")]
    = "bf16",
    parse_mask: Annotated[bool, _opt("--parse-mask", panel=MEASURE_PANEL,
                                     help="Also time the ParseNet paste mask on the same crops.")] = False,
    parse_weights: Annotated[str | None, _opt("--parse-weights", panel=MEASURE_PANEL, metavar="PATH",
                                              help="ParseNet .pth or 'synthetic' (default: the cached official "
                                                   "file); implies --parse-mask.")] = None,
    cudnn_benchmark: Annotated[bool, _opt("--cudnn-benchmark/--no-cudnn-benchmark", panel=BACKEND_PANEL,
                                          help="Let cuDNN search for the fastest algorithms.")] = True,
    tf32: Annotated[bool | None, _opt("--tf32/--no-tf32", panel=BACKEND_PANEL, show_default=False,
                                      help="TF32 for fp32 convs and matmuls (default: PyTorch's, recorded in the "
                                           "JSON).")] = None,
    preset: PresetOpt = None,
    lazy_detector: LazyDetectorOpt = None,
    compile: CompileOpt = None,
    amp: AmpOpt = None,
    act_checkpoint: ActCheckpointOpt = None,
    checkpoint: CheckpointAliasOpt = None,
    face_crop: FaceCropOpt = None,
    cuda_graph: CudaGraphOpt = None,
    fused: FusedOpt = None,
    backend: BackendOpt = None,
    onednn: OnednnOpt = None,
) -> None:
    """Benchmark the generator with each optimization: ms/face, faces/s, peak memory, stability, PSNR vs fp32.

    Row ids: default, a step's name (amp, act_checkpoint, ...), amp_fp16, fused, onnxruntime, onnxruntime_fp16,
    the cumulative rows 1, 1+2, 1+2+3, 1-4, 1-6 and preset:NAME; rows that cannot be faster on the device are
    skipped unless --rows names them. With --preset or any optimization flag, the table is the fp32 default plus
    that configuration ("custom").
    """
    # Long for its Typer signature (one annotated parameter per flag); the body itself is short.
    import torch  # heavy: torch (fast --help)

    from gpen_tune.bench import BenchSettings, run_bench, write_outputs  # heavy: torch (fast --help)
    from gpen_tune.bench.inputs import InputError  # heavy: torch (fast --help)

    if output.exists() and not output.is_dir():
        raise fail(f"{output}: exists and is not a folder; pass -o/--output with a folder for the results")
    if compile_mode == "off":
        raise fail("--compile-mode off: the compile rows need a mode; leave them out with --rows instead")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise fail(f"--device {dev}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
    if dev == "cpu" and not device:
        err.print("[bold yellow]notice:[/] no CUDA device: benchmarking on the CPU (GPU-only rows are skipped)")
    custom, custom_label = None, "custom"
    switches = (lazy_detector, compile, amp, either(act_checkpoint, checkpoint), face_crop, cuda_graph, fused,
                backend, onednn)
    if preset is not None or any(v is not None for v in switches):
        custom, line = tune_config_from_options(preset, *switches, device=dev, base=TuneConfig())
        err.print(f"[bold]optimizations:[/] {line}", highlight=False)
        custom_label = f"--preset {preset}" if preset is not None else "custom"
        custom_label += f": {cli_flags(custom, generator_only=True)}"
    settings = BenchSettings(
        model=model, weights=weights, device=dev, batch_sizes=_int_list(batch_sizes),
        rows=[r.strip() for r in rows.split(",") if r.strip()] if rows else None, repeats=repeats, warmup=warmup,
        inputs=str(inputs) if inputs is not None else None, max_faces=max_faces, compile_mode=compile_mode,
        amp=amp_dtype, cudnn_benchmark=cudnn_benchmark, max_minutes=max_minutes, custom=custom,
        custom_label=custom_label, tf32=tf32, parse_mask=parse_mask or parse_weights is not None,
        parse_weights=parse_weights,
        command=_command_line(ctx),
    )

    def after_row(partial: dict) -> None:
        """Every finished row on disk at once (JSON, markdown, plot): an outer timeout loses only the current row."""
        try:
            write_outputs(partial, output)
        except (OSError, ValueError, RuntimeError) as e:  # a failed plot must not end the run; the JSON matters
            err.print(f"[bold yellow]notice:[/] partial results not fully written ({e})", highlight=False)
            write_outputs(partial, output, png=False)

    try:
        result = run_bench(settings, log=lambda msg: err.print(msg, highlight=False), on_progress=after_row)
    except (InputError, ValueError, RuntimeError, FileNotFoundError) as e:
        raise fail(str(e)) from None
    paths = write_outputs(result, output)
    from gpen_tune.bench.report import markdown_table  # heavy: torch (fast --help)

    out.print(markdown_table(result), highlight=False, soft_wrap=True)
    out.print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", highlight=False)
