"""`gpen-tune export MODEL --format onnx --weights FILE -o FILE`: the generator as an ONNX file for the tools that
run GPEN on ONNX Runtime or TensorRT (a thin layer over `gpen_tune.export.onnx.export_onnx`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gpen_tune.cli import app
from gpen_tune.cli._console import fail, failure, out, user_errors
from gpen_tune.extras import ONNX_INSTALL, ONNX_PARTS, missing

EXAMPLES = """
Examples:\n
  gpen-tune export GPEN-BFR-512 --weights GPEN-BFR-512.pth -o gpen_bfr_512.onnx\n
  gpen-tune export GPEN-BFR-256 --weights GPEN-BFR-256.pth --dtype fp16 --batch 4 -o gpen_bfr_256_fp16.onnx
"""


class ExportFormat(str, Enum):
    onnx = "onnx"


class ExportDtype(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"


@app.command("export", epilog=EXAMPLES)
def export(
    model: Annotated[str, typer.Argument(help="GPEN-BFR-256, GPEN-BFR-512, GPEN-BFR-1024 or GPEN-BFR-2048.",
                                         metavar="MODEL", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", show_default=False,
                                         help="The file to write, e.g. gpen_bfr_512.onnx.")],
    weights: Annotated[str, typer.Option("--weights", metavar="PATH|NAME", show_default=False,
                                         help="A checkpoint (loaded strictly), a registry name or 'synthetic'.")],
    format: Annotated[ExportFormat, typer.Option("--format", help="The file format.")] = ExportFormat.onnx,
    dtype: Annotated[ExportDtype, typer.Option("--dtype", help="fp16: half-precision convolutions, float32 "
                                                "input and output.")] = ExportDtype.fp32,
    batch: Annotated[str, typer.Option("--batch", metavar="N|dynamic", help="Faces per call the file "
                                       "takes.")] = "dynamic",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the file if it exists.")] = False,
) -> None:
    """Export the generator to ONNX (RGB, NCHW, float32 in [-1, 1] in and out), checked with ONNX Runtime on real
    faces against PyTorch; the figures and the weights' sha256 go into the file's metadata."""
    absent = missing(ONNX_PARTS)
    if absent:
        raise fail(f"export needs {', '.join(absent)}, part of the onnx extra: {ONNX_INSTALL}")
    if batch != "dynamic" and not (batch.isdigit() and int(batch) > 0):
        raise fail(f"--batch {batch}: give a positive number or 'dynamic'")
    if output.exists() and not overwrite:
        raise fail(f"{output}: exists; pass --overwrite to replace it or choose another -o")
    from gpen_tune.export.onnx import FP32_MAX_ABS, HALF_MIN_PSNR_DB, export_onnx  # heavy: torch (fast --help)

    try:
        report = export_onnx(model, weights, output, dtype=dtype.value,
                             batch=None if batch == "dynamic" else int(batch))
    except user_errors() as e:
        raise failure(e) from None
    limit = f"limit {FP32_MAX_ABS:g}" if dtype == ExportDtype.fp32 else f"limit {HALF_MIN_PSNR_DB:g} dB"
    out.print(f"checked with ONNX Runtime on {report.faces} real faces against PyTorch fp32: max-abs "
              f"{report.max_abs:.2e}, PSNR {report.psnr_db:.1f} dB ({limit})", highlight=False, soft_wrap=True)
    out.print(f"weights sha256: {report.weights_sha256}", highlight=False, soft_wrap=True)
    size_mb = report.path.stat().st_size / 1e6
    out.print(f"wrote {report.path} ({size_mb:.1f} MB, opset {report.opset}, {report.dtype}, batch "
              f"{batch}, {len(report.op_types)} operator types) in {report.seconds:.1f} s", highlight=False,
              soft_wrap=True)
