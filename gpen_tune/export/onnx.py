"""`export_onnx`: a GPEN generator as an ONNX file for the tools that run GPEN on ONNX Runtime or TensorRT.

The file follows the convention of facefusion's and ReActor's GPEN-BFR files: one input `input` and one output
`output`, both RGB, NCHW, float32 in [-1, 1]; the batch axis is dynamic unless a batch size is asked for. The
graph comes from PyTorch's exporter (torch.export, opset `OPSET`) on our own generator: standard ONNX operators
only (no custom ops, no ATen fallback). An fp16 file keeps float32 input and output (the convention) and runs the
convolutions in fp16; the style path and the RGB skip stay fp32, as in `--amp fp16`.

Every file is checked before it is kept: ONNX Runtime runs the written graph on real aligned faces (the sample
photos through our aligner) and is compared with the PyTorch fp32 generator; the figures and the source weights'
sha256 go into the file's metadata (`metadata_props`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpen_tune.extras import import_part

OPSET = 18
INPUT_NAME, OUTPUT_NAME = "input", "output"
IO_CONVENTION = "input/output: RGB, NCHW, float32 in [-1, 1] (facefusion/ReActor GPEN-BFR convention)"
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16}
FP32_MAX_ABS = 1e-4          # ONNX Runtime fp32 vs PyTorch fp32, on the [-1, 1] scale
HALF_MIN_PSNR_DB = 40.0      # an fp16 file vs PyTorch fp32
FOLD_LIMIT = 2**31           # elements: constant-fold weight expressions of any size


class ExportCheckFailed(RuntimeError):
    """The written graph does not reproduce the PyTorch generator within the tolerance (nothing is kept)."""


@dataclass
class ExportReport:
    """What `export_onnx` wrote and measured."""

    path: Path
    model: str
    dtype: str
    batch: int | None                  # None: dynamic
    opset: int
    weights_sha256: str
    faces: int                         # real face crops compared
    max_abs: float                     # ONNX Runtime vs PyTorch fp32, [-1, 1] scale
    psnr_db: float
    seconds: float
    op_types: list[str] = field(default_factory=list)

    def metadata(self) -> dict[str, str]:
        from gpen_tune import __version__

        return {"producer": f"gpen-tune {__version__}", "model": self.model, "dtype": self.dtype,
                "batch": "dynamic" if self.batch is None else str(self.batch), "io": IO_CONVENTION,
                "weights_sha256": self.weights_sha256, "verify_faces": str(self.faces),
                "verify_max_abs": f"{self.max_abs:.3e}", "verify_psnr_db": f"{self.psnr_db:.2f}",
                "verify_reference": "PyTorch fp32 generator, real aligned face crops (astronaut, grace_hopper)"}

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


def onnx_graph(model: torch.nn.Module, dtype: str = "fp32", batch: int | None = None) -> Any:
    """The generator as an onnx.ModelProto: input `input`, output `output`, the batch axis dynamic (None) or
    fixed. `model` is a fp32 FullGenerator in eval mode (not modified; fp16 works on a cast copy)."""
    import_part("onnx", "ONNX export")
    import_part("onnxscript", "ONNX export")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if batch is not None and batch < 1:
        raise ValueError(f"--batch {batch}: give a positive number or 'dynamic'")
    from gpen_tune.tune.amp import cast_model

    net = model if dtype == "fp32" else cast_model(copy.deepcopy(model), DTYPES[dtype])
    # traced at batch 2: the generator's batch-1 path writes into preallocated buffers; the general path is the
    # same function for every batch size, so one graph serves all (a fixed batch only pins the declared shape)
    example = torch.zeros(2, 3, net.size, net.size)
    with torch.inference_mode(False), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # its progress
        program = torch.onnx.export(
            net, (example,), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], opset_version=OPSET,
            dynamo=True, dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, external_data=False,
            optimize=True, verbose=False)
    # fold every weight-only expression (equalised-LR scales, the shared modulated-conv weights, transposes) into
    # initializers: the exporter's pass stops at 256 K elements, and TensorRT's parser wants constant conv weights
    import onnxscript.optimizer

    proto = onnxscript.optimizer.optimize(program.model_proto, input_size_limit=FOLD_LIMIT,
                                          output_size_limit=FOLD_LIMIT)
    if batch is not None:
        for value in (*proto.graph.input, *proto.graph.output):
            value.type.tensor_type.shape.dim[0].dim_value = batch
    return proto


def ort_session(model: str | bytes | Path, threads: int | None = None, optimization: str = "all") -> Any:
    """An ONNX Runtime CPU session (`threads` intra-op threads, default: torch's thread count)."""
    ort = import_part("onnxruntime", "The onnxruntime backend")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    levels = ort.GraphOptimizationLevel
    opts.graph_optimization_level = {"basic": levels.ORT_ENABLE_BASIC, "extended": levels.ORT_ENABLE_EXTENDED,
                                     "all": levels.ORT_ENABLE_ALL}[optimization]
    opts.log_severity_level = 4                  # errors come back as exceptions (an OOM is split, not logged)
    # no busy-waiting of the intra-op threads after a run: on a 2-core CPU they took the cores from whatever ran
    # next (the PyTorch generator timed after ONNX Runtime in one process: 84.6 instead of 51.2 ms)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model) if isinstance(model, Path) else model, opts,
                                providers=["CPUExecutionProvider"])


def face_batch(size: int) -> torch.Tensor:
    """Real faces in the convention's input: the astronaut's and Grace Hopper's faces aligned by our aligner,
    [2,3,S,S] in [-1,1] (two faces keep the check of a GPEN-BFR-2048 file to minutes on a CPU)."""
    from gpen_tune.face.samples import aligned_face_crops
    from gpen_tune.model.io import to_model_input

    return to_model_input(torch.from_numpy(aligned_face_crops(size, n=2)))


def compare(session: Any, model: torch.nn.Module, faces: torch.Tensor, batch: int | None) -> tuple[float, float]:
    """(max-abs, PSNR dB) of the session's output against the PyTorch fp32 generator on `faces`."""
    from gpen_tune.model.io import max_abs, psnr

    step = batch or 1        # dynamic: one face per call, so a GPEN-BFR-2048 check holds one face's activations
    with torch.no_grad():
        ref = torch.cat([model(faces[i: i + step]).float() for i in range(0, len(faces), step)])
    outs = []
    for i in range(0, len(faces), step):
        chunk = faces[i: i + step]
        pad = step - len(chunk)
        x = torch.cat([chunk, chunk[:1].expand(pad, -1, -1, -1)]) if pad else chunk
        outs.append(torch.from_numpy(session.run(None, {INPUT_NAME: x.numpy()})[0][: len(chunk)]))
    got = torch.cat(outs)
    return max_abs(got, ref), psnr(got, ref)


def export_onnx(model: str, weights: str | Path, out: str | Path, *, dtype: str = "fp32",
                batch: int | None = None) -> ExportReport:
    """Export registry model `model` with `weights` (a checkpoint loaded strictly, or "synthetic") to `out`.

    Written to a temporary file beside `out`, checked with ONNX Runtime against the PyTorch fp32 generator on real
    faces (fp32: max-abs <= FP32_MAX_ABS; fp16: PSNR >= HALF_MIN_PSNR_DB), the figures and the weights' sha256
    stored in the metadata, then renamed to `out`; a failed check raises ExportCheckFailed and keeps nothing."""
    onnx = import_part("onnx", "ONNX export")
    import_part("onnxruntime", "Checking the exported file")
    from gpen_tune.load import SYNTHETIC, load_model

    t0 = time.perf_counter()
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"-o {out}: a folder; give a file name such as {out / (model + '.onnx')}")
    if not out.parent.exists():
        raise ValueError(f"-o {out}: the folder {out.parent} does not exist; create it first")
    net = load_model(weights, model=model, device="cpu")
    sha = SYNTHETIC if str(weights) == SYNTHETIC else _sha256(Path(net.weights_source))
    proto = onnx_graph(net, dtype, batch)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        onnx.save(proto, tmp)
        faces = face_batch(net.size)
        err, db = compare(ort_session(tmp), net, faces, batch)
        report = ExportReport(out, model, dtype, batch, OPSET, sha, len(faces), err, db, 0.0,
                              sorted({n.op_type for n in proto.graph.node}))
        if (dtype == "fp32" and not err <= FP32_MAX_ABS) or not db >= HALF_MIN_PSNR_DB:
            raise ExportCheckFailed(f"the exported {dtype} graph differs from the PyTorch generator on real faces "
                                    f"(max-abs {err:.2e}, {db:.1f} dB; needed fp32 <= {FP32_MAX_ABS:g}, "
                                    f">= {HALF_MIN_PSNR_DB:g} dB): nothing written")
        report.seconds = time.perf_counter() - t0
        onnx.helper.set_model_props(proto, {f"gpen_tune.{k}": v for k, v in report.metadata().items()})
        proto.producer_name = "gpen-tune"
        onnx.save(proto, tmp)
        onnx.checker.check_model(str(tmp))
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return report


def _sha256(path: Path) -> str:
    from gpen_tune.weights.integrity import sha256_of

    return sha256_of(path)


def read_metadata(path: str | Path) -> dict[str, str]:
    """The `gpen_tune.*` metadata of an exported file (keys without the prefix)."""
    onnx = import_part("onnx", "Reading an ONNX file")
    proto = onnx.load(str(path), load_external_data=False)
    return {p.key.removeprefix("gpen_tune."): p.value for p in proto.metadata_props if p.key.startswith("gpen_tune.")}


def run_convention(session: Any, crops_u8_rgb: np.ndarray) -> np.ndarray:
    """What a facefusion/ReActor-style caller does around the file: uint8 RGB [N,S,S,3] -> /255, (x - 0.5) / 0.5,
    NCHW float32 -> run -> clip to [-1, 1], (y + 1) / 2 * 255, rounded -> uint8 RGB [N,S,S,3]."""
    x = ((crops_u8_rgb.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(0, 3, 1, 2)
    y = session.run(None, {INPUT_NAME: np.ascontiguousarray(x)})[0]
    y = (np.clip(y, -1.0, 1.0) + 1.0) / 2.0
    return (y.transpose(0, 2, 3, 1) * 255.0).round().astype(np.uint8)
