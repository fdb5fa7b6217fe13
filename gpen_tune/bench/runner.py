"""`run_bench`: every selected row on the same real face crops, against the fp32 eager default.

Per row: a fresh copy of the fp32 model on the device, `build_restorer(row config)`, then
1. the faces one at a time (batch 1): these outputs are the row's reference for batch consistency, and are compared
   with the default row's (PSNR, max-abs);
2. per batch size: one first call (compile / graph capture / cuDNN search: reported as warm-up, excluded from the
   averages), `warmup` more calls, then `repeats` timed calls (CUDA events, synchronised), median and relative IQR;
   peak allocated / reserved memory of the timed calls; max-abs of the batch output vs the same faces at batch 1;
3. on CUDA with the pipeline present: detector + generator in one process (see detector_memory).
With `parse_mask`, the pipeline's ParseNet paste mask is timed first on the same crops and batch sizes, and every
row also reports generator + parse mask (see parse_cost).
A row whose switches do not apply on the device is skipped with the reason.

`on_progress(result)` is called after every row with the rows so far (table order, `meta.complete` False), so
the caller can write them: a run killed by an outer timeout keeps its finished rows.

Precision of the fp32 default: PyTorch's defaults unless `tf32` is set (cuDNN convs may use TF32 tensor cores,
matmuls do not); the flags in effect are recorded in meta (cudnn_allow_tf32, matmul_allow_tf32,
float32_matmul_precision, tf32).
"""

from __future__ import annotations

import copy
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import torch

from gpen_tune.bench import detector_memory
from gpen_tune.bench.inputs import load_faces
from gpen_tune.bench.measure import MiB, peaks, reset_memory, reset_peak, summary, time_calls, timed_once
from gpen_tune.bench.parse_cost import add_parse_mask, measure_parser
from gpen_tune.bench.rows import Row, select_rows
from gpen_tune.load import load_model
from gpen_tune.model.configs import MODELS, GPENConfig
from gpen_tune.model.io import max_abs, psnr
from gpen_tune.restore.restorer import build_restorer
from gpen_tune.tune import amp
from gpen_tune.tune.apply import SWITCH_MODULES
from gpen_tune.tune.hardware import CpuCapabilities
from gpen_tune.tune.live_memory import generator_activation_peak
from gpen_tune.tune.options import TuneConfig

SCHEMA = "gpen-tune-bench/1"
TINY_MODELS = {"tiny": GPENConfig(64, narrow=0.25), "tiny32": GPENConfig(32, narrow=0.25)}  # tests / smoke runs


@dataclass
class BenchSettings:
    model: str = "GPEN-BFR-512"
    weights: str = "synthetic"
    device: str = "cuda"
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    rows: list[str] | None = None          # None = rows.DEFAULT_ROWS
    repeats: int = 20
    warmup: int = 3
    inputs: str | None = None              # folder of aligned crops; None = bundled photos (pipeline part)
    max_faces: int = 16
    compile_mode: str = "default"
    amp: str = "bf16"
    cudnn_benchmark: bool = True
    detector: str = "retinaface-synthetic"  # for the detector+generator memory scenario (CUDA only)
    max_minutes: float | None = None       # rows left when the budget is spent are skipped (reason recorded)
    custom: TuneConfig | None = None       # an extra row from --preset / switch flags
    custom_label: str = "custom"
    tf32: bool | None = None               # None = PyTorch's defaults (recorded); False = true fp32 convs/matmuls
    parse_mask: bool = False               # also time the ParseNet paste mask (the pipeline's parser and dtype)
    parse_weights: str | None = None       # its weights: None = the cached official file, else synthetic
    command: str = field(default_factory=lambda: " ".join(sys.argv))


def model_config(name: str) -> tuple[str | GPENConfig, GPENConfig]:
    if name in TINY_MODELS:
        return TINY_MODELS[name], TINY_MODELS[name]
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join([*MODELS, *TINY_MODELS])}")
    return name, MODELS[name].config


def environment(device: torch.device) -> dict:
    info = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device_type": device.type,
        # the fp32 default is PyTorch's default fp32: cuDNN convs may use TF32 tensor cores unless turned off
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, device_memory_gib=round(props.total_memory / 1024**3, 1),
                    compute_capability=f"{props.major}.{props.minor}")
    else:
        info.update(device_name=f"CPU ({platform.processor() or platform.machine()}, "
                                f"{torch.get_num_threads()} threads)")
    return info


def skip_reason(row: Row, device: torch.device, explicit: bool, cpu: CpuCapabilities | None = None) -> str | None:
    """Why a row is not measured: a switch that does not run on the device, a pipeline-level switch, or (unless
    the row was asked for with --rows) one that cannot be faster here; `cpu`: the CPU's capabilities (None: read)."""
    if row.cfg.backend == "onnxruntime":              # the exported graph: the PyTorch switches' checks do not apply
        from gpen_tune.restore.onnx_backend import unsupported_reason

        return unsupported_reason(device)
    if row.steps == ("face_crop",):
        return ("pipeline-level switch: the generator is unchanged; measured on a >= 12 MP image by "
                "benchmarks/face_crop_bench.py")
    enabled = [step for step in row.cfg.enabled() if step != "face_crop"]   # face_crop: on in every row
    for step in enabled:
        if step == "lazy_detector" and len(enabled) > 1:
            continue  # pipeline-level: cannot change the generator's numbers; the restorer notes the skip
        reason = SWITCH_MODULES[step].is_supported(device, row.cfg)
        if reason:
            return reason if step == row.name else f"{step}: {reason}"     # the row's name is said by the caller
    if explicit:
        return None
    if device.type == "cpu" and row.cfg.compile:
        return "torch.compile on the CPU takes minutes per input shape; ask for this row with --rows"
    slower = amp.pays_off(device, row.cfg, cpu)
    if slower:
        return f"--amp {row.cfg.amp}: {slower}; ask for this row with --rows"
    return None


def set_tf32(enabled: bool) -> None:
    """TF32 for fp32 convs (cuDNN) and matmuls on or off."""
    torch.backends.cudnn.allow_tf32 = enabled
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def run_bench(s: BenchSettings, log: Callable[[str], None] = print,
              on_progress: Callable[[dict], None] | None = None) -> dict:
    """Run the benchmark; returns the JSON-ready result (write it with bench.report.write_outputs).

    `on_progress(partial_result)` after every row (see the module docstring). TF32 flags changed by `s.tf32`
    are restored on return.
    """
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())
    if s.tf32 is not None:
        set_tf32(s.tf32)
    try:
        return _run_bench(s, log, on_progress)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def _bench_device(s: BenchSettings) -> torch.device:
    """The measured device, with its index (CUDA: cuDNN's benchmark mode set as asked)."""
    device = torch.device(s.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but CUDA is not available here; use --device cpu")
        torch.backends.cudnn.benchmark = s.cudnn_benchmark
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _run_bench(s: BenchSettings, log: Callable[[str], None], on_progress: Callable[[dict], None] | None) -> dict:
    device = _bench_device(s)
    model_arg, gcfg = model_config(s.model)
    if s.custom is not None and not s.rows:
        rows = select_rows(["default"])
    else:
        rows = select_rows(s.rows, s.compile_mode, s.amp)
    if s.custom is not None:
        rows.append(Row("custom", s.custom_label, tuple(s.custom.enabled()), s.custom))

    base = load_model(s.weights, model=model_arg, device="cpu")
    faces, source = load_faces(s.inputs, gcfg.size, s.max_faces)
    log(f"model {s.model} ({gcfg.size} px, weights: {s.weights}) on {device}; inputs: {source}")

    result = {"schema": SCHEMA, "meta": {**environment(device), "command": s.command, "inputs": source,
                                         "faces": int(faces.shape[0]), "model": s.model, "size": gcfg.size,
                                         "gflop_per_face": round(gcfg.flops_per_face() / 1e9, 1),
                                         "tf32": ("PyTorch defaults" if s.tf32 is None
                                                  else "on" if s.tf32 else "off (--no-tf32)"),
                                         "complete": False},
              "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(s).items()},
              "rows": []}
    det_factory, det_label = None, "GPU memory only (CUDA)"
    if device.type == "cuda":
        det_factory, det_label = detector_memory.detector_factory(s.detector, device)
        log(f"detector for the memory scenario: {det_label}")
    result["meta"]["detector"] = det_label
    parse = None
    if s.parse_mask:
        parse = result["parse_mask"] = measure_parser(faces, device, s.batch_sizes, s.repeats, s.warmup,
                                                      s.parse_weights, log)
    started = time.perf_counter()
    order = {r.name: i for i, r in enumerate(rows)}
    reference: torch.Tensor | None = None
    # the default row runs first (every other row's reference), compiled rows last: under --max-minutes a slow
    # compile can only cost compiled rows; the table keeps the requested order
    todo = [r for r in rows if r.name == "default"] or select_rows(["default"])
    todo += sorted((r for r in rows if r.name != "default"), key=lambda r: r.cfg.compile is not None)
    for row in todo:
        shown = row in rows
        # asked for by name (--rows), or the switches / preset given on the command line (the custom row)
        explicit = (s.rows is not None and row.name in s.rows) or row.name == "custom"
        reason = skip_reason(row, device, explicit)
        if reason is None and s.max_minutes is not None and reference is not None \
                and time.perf_counter() - started > 60 * s.max_minutes:
            reason = f"time budget of {s.max_minutes} min spent"
        if reason is not None:
            log(f"skip {row.name}: {reason}")
            if shown:
                result["rows"].append(_row_head(row) | {"status": "skipped", "reason": reason})
                result["rows"].sort(key=lambda entry: order[entry["name"]])
            continue
        log(f"row {row.name}: {row.cfg.describe()}")
        try:
            entry = _measure_row(row, base, faces, device, s, log, (det_factory, det_label))
        except Exception as e:  # one broken row must not lose the others
            entry = _row_head(row) | {"status": "error", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
            log(f"  error: {entry['reason']}")
        finally:
            torch._dynamo.reset()
            reset_memory(device)
        outs = entry.pop("_outputs", None)
        if parse is not None and parse["status"] == "ok" and entry["status"] == "ok":
            add_parse_mask(entry, parse)
        if row.name == "default" and outs is not None:
            reference = outs
        if outs is not None and reference is not None:
            value = psnr(outs, reference)
            entry["psnr_db"] = None if value == float("inf") else value  # None: identical to the default
            entry["max_abs"] = max_abs(outs, reference)
        if shown:
            result["rows"].append(entry)
            result["rows"].sort(key=lambda entry: order[entry["name"]])
            result["meta"]["seconds"] = round(time.perf_counter() - started, 1)
            if on_progress is not None:
                on_progress(result)
    result["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    result["meta"]["complete"] = True
    return result


def _row_head(row: Row) -> dict:
    return {"name": row.name, "label": row.label, "steps": list(row.steps), "config": asdict(row.cfg)}


def _measure_row(row: Row, base: torch.nn.Module, faces: torch.Tensor, device: torch.device, s: BenchSettings,
                 log: Callable[[str], None], detector: tuple[Callable | None, str]) -> dict:
    reset_memory(device)
    model = copy.deepcopy(base).to(device)
    t0 = time.perf_counter()
    restore = build_restorer(model, row.cfg, device=device)
    build_s = time.perf_counter() - t0
    n = faces.shape[0]
    on_device = faces.to(device)

    # batch 1, every face: the row's own reference (batch consistency) and its outputs vs the default row
    _, first_s = timed_once(lambda: restore(on_device[:1]), device)
    outs = torch.cat([restore(on_device[i:i + 1]).cpu() for i in range(n)])

    per_batch: dict[str, dict] = {}
    for bs in s.batch_sizes:
        idx = [i % n for i in range(bs)]
        x = on_device[idx]
        reset_peak(device)
        if bs == 1:
            warm_s = first_s
        else:
            _, warm_s = timed_once(lambda x=x: restore(x), device)
        warm_peaks = peaks(device)
        for _ in range(s.warmup):
            restore(x)
        reset_peak(device)
        times = time_calls(lambda x=x: restore(x), device, s.repeats)
        mem = peaks(device)
        y = restore(x).cpu()
        stats = summary(times)
        per_batch[str(bs)] = {
            **stats,
            "ms_per_face": stats["median_ms"] / bs,
            "faces_per_s": 1000.0 * bs / stats["median_ms"],
            **mem,
            "warmup_s": warm_s,
            "warmup_peak_reserved_mib": warm_peaks["peak_reserved_mib"],
            "max_abs_vs_bs1": max_abs(y, outs[idx]),
            "times_ms": [round(t, 4) for t in times],
        }
        log(f"  bs {bs:>3}: {stats['median_ms']:.2f} ms/call, {per_batch[str(bs)]['ms_per_face']:.2f} ms/face, "
            f"rel IQR {stats['rel_iqr']:.3f}, warm-up {warm_s:.2f} s"
            + (f", peak {mem['peak_allocated_mib']:.0f} MiB" if mem["peak_allocated_mib"] is not None else ""))
        del x, y

    best = max(per_batch, key=lambda b: per_batch[b]["faces_per_s"])
    entry = _row_head(row) | {
        "status": "ok",
        "effective": restore.effective.describe(),
        "fallbacks": list(restore.fallbacks),
        "notes": list(restore.notes),
        "skipped_switches": dict(restore.skipped),
        "build_s": build_s,
        "warmup_s_total": sum(b["warmup_s"] for b in per_batch.values()),
        "max_batch_after_oom": restore.max_batch,
        "per_batch": per_batch,
        "ms_per_face_bs1": per_batch["1"]["ms_per_face"] if "1" in per_batch else None,
        "best_batch": int(best),
        "best_faces_per_s": per_batch[best]["faces_per_s"],
        "_outputs": outs,
    }
    # no allocator statistics on the CPU: trace live tensors (of the PyTorch generator only)
    if device.type == "cpu" and not row.cfg.compile and row.cfg.backend == "torch":
        traced = restore.forward if isinstance(restore.forward, torch.nn.Module) else restore.model
        entry["traced_activation_peak_mib_bs1"] = generator_activation_peak(traced, on_device[:1]) / MiB
    if device.type == "cuda":
        det_batch = on_device[[i % n for i in range(4)]]
        entry["detector_memory"] = detector_memory.measure(restore, det_batch, device, row.cfg.lazy_detector,
                                                           *detector)
    return entry  # restore, model and the graphs/compiled code they hold are freed with this frame
