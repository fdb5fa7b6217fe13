"""`TuneConfig`: the six optimizations (plus the fused fast path) as one frozen value, and the named presets.

This file is the single source of truth for every switch: its default, its CLI help text and its tolerance
against the fp32 eager default (field metadata). The CLI builds its "Optimizations" help panel from it, `bench`
iterates over `STEPS`, and `build_restorer` applies the switches in `APPLY_ORDER`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Literal

from gpen_tune.tune.hardware import CpuCapabilities, cpu_capabilities

CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
AmpMode = Literal["off", "bf16", "fp16"]
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune")
AMP_MODES: tuple[str, ...] = ("off", "bf16", "fp16")
Backend = Literal["torch", "onnxruntime"]
BACKENDS: tuple[str, ...] = ("torch", "onnxruntime")


def _switch(default, *, flag: str, short: str, help: str, tolerance: str, requires: str = "any device"):
    """A switch: `short` is its one-sentence CLI help; `help`, `tolerance` and `requires` are the full story
    (docs/optimizations.md table, bench reports)."""
    return field(default=default, metadata={"flag": flag, "short": short, "help": help, "tolerance": tolerance,
                                            "requires": requires})


@dataclass(frozen=True)
class TuneConfig:
    """Which optimizations run. All off (the default) = fp32 eager generator, upstream-like whole-frame pipeline."""

    lazy_detector: bool = _switch(
        False, flag="--lazy-detector",
        short="Build the detector on first use; free it before generator batches when GPU memory is tight.",
        help="Create the face detector on first use and release it (delete, empty the CUDA cache) before the "
             "generator runs when free GPU memory is tight; it is recreated when the next image needs it.",
        tolerance="identical output (memory only)", requires="CUDA (on the CPU there is no GPU memory to free)")
    compile: CompileMode | None = _switch(
        None, flag="--compile",
        short="torch.compile the generator (default | reduce-overhead | max-autotune).",
        help="torch.compile the generator (default | reduce-overhead | max-autotune), whole graph, no breaks. "
             "Costs a one-off warm-up (tens of seconds per input shape); a compile error falls back to eager.",
        tolerance="max-abs <= 1e-3 vs fp32 eager (kernel fusion reorders float sums)",
        requires="a C++ compiler on CPU, Triton on CUDA")
    amp: AmpMode = _switch(
        "off", flag="--amp",
        short="Generator convolutions in bf16 or fp16 (non-finite batches re-run in fp32).",
        help="Run the generator's convolutions in bf16 or fp16 (weights cast, not autocast); the style path, "
             "demodulation and RGB skip stay fp32. A batch with a non-finite output is re-run in fp32.",
        tolerance=">= 40 dB PSNR vs fp32 (measured: fp16 ~ 64 dB, bf16 ~ 50 dB)",
        requires="bf16: GPUs with bf16 (Ampere or newer) or the CPU; fp16: CUDA or a CPU with fp16 convs")
    act_checkpoint: bool = _switch(
        False, flag="--act-checkpoint",
        short="Lower the generator's memory peak: free encoder features early, recompute two.",
        help="Lower the generator's inference memory peak: each encoder feature is freed after its last use, the "
             "two largest are recomputed when the decoder needs them (a few % more compute), and each feature is "
             "scaled inside the concatenation buffer. This is not autograd checkpointing, which saves nothing at "
             "inference (under no_grad no activations are kept for a backward pass).",
        tolerance="same output up to float rounding (<= 1e-5 in fp32)")
    face_crop: bool = _switch(
        True, flag="--face-crop",
        short="Detect on a downscaled copy and process only the face regions (off: full frame).",
        help="Never process a large image whole: detect on a downscaled copy, cut the face regions, restore and "
             "paste back only those. Off = upstream-like full-frame processing (kept for comparison).",
        tolerance="same faces; pixels outside the face regions are untouched",
        requires="the enhance pipeline (no effect on the bare generator)")
    cuda_graph: bool = _switch(
        False, flag="--cuda-graph",
        short="Replay the generator from CUDA graphs per batch bucket.",
        help="Capture the generator into CUDA Graphs per (batch bucket 1,2,4,...,64, size, dtype) and replay them; "
             "batches are padded up to the bucket. Removes the per-kernel launch cost that dominates batch 1.",
        tolerance="identical to the module it captures", requires="CUDA")
    fused: bool = _switch(
        False, flag="--fused",
        short="The fused generator: precomputed weights, channels-last, one kernel per conv epilogue.",
        help=("Use the fused generator of gpen_tune.model.fused (precomputed weight transforms, channels-last, "
              "one Triton pass per conv for FIR + demodulation + bias + activation + next style)."),
        tolerance="max-abs <= 1e-3 vs fp32 in fp32", requires="any device (Triton kernels on CUDA)")
    onednn: bool = _switch(
        False, flag="--onednn",
        short="With --fused: fused oneDNN convolutions (CPU).",
        help=("The fused generator's CPU form (gpen_tune.model.fused_onednn): every conv one oneDNN call with its "
              "bias and leaky ReLU fused in, demodulation kept pending per channel, the style folded into the "
              "smaller of weight and input, the up-conv as one 2x2 phase conv, weights prepacked."),
        tolerance="the fused generator's: max-abs <= 1e-3 vs fp32 in fp32, >= 40 dB in bf16",
        requires="the CPU (PyTorch with oneDNN) and --fused")
    backend: Backend = _switch(
        "torch", flag="--backend",
        short="What runs the generator: torch (PyTorch) or onnxruntime (ONNX Runtime, CPU).",
        help="What runs the generator: torch (PyTorch, every switch above) or onnxruntime (the generator exported "
             "to ONNX in memory and run by ONNX Runtime's CPU provider; --amp fp16 exports an fp16 graph, the "
             "switches that change the PyTorch module are skipped). Needs the onnx extra.",
        tolerance="fp32: max-abs <= 1e-4 vs the PyTorch fp32 generator; fp16: >= 40 dB",
        requires="onnxruntime: the CPU and the onnx extra")

    def __post_init__(self) -> None:
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES} or None, got {self.compile!r}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp must be one of {AMP_MODES}, got {self.amp!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")

    def enabled(self) -> list[str]:
        """Names of the switches that are on, in APPLY_ORDER."""
        return [name for name in APPLY_ORDER if getattr(self, name) not in (False, None, "off")]

    def describe(self) -> str:
        """Short human form, e.g. 'compile=default amp=bf16 cuda_graph'."""
        parts = []
        for name in self.enabled():
            value = getattr(self, name)
            parts.append(name if value is True else f"{name}={value}")
        if self.backend != "torch":
            parts.append(f"backend={self.backend}")
        return " ".join(parts) or "all off (fp32 eager)"


def switch_short(name: str) -> str:
    """The switch's one-sentence CLI help."""
    return next(f for f in fields(TuneConfig) if f.name == name).metadata["short"]


def switch_meta(name: str) -> dict:
    return dict(next(f for f in fields(TuneConfig) if f.name == name).metadata)


# The six optimization steps, in the bench's numbering (rows "1", "1+2", ...); `fused` is our seventh, off the list.
STEPS: tuple[str, ...] = ("lazy_detector", "compile", "amp", "act_checkpoint", "face_crop", "cuda_graph")

# The fixed order `build_restorer` applies switches in, and why:
#   act_checkpoint first (a flag on the FullGenerator itself, must be set before anything wraps it),
#   amp (casts the weights in place: everything downstream sees the final dtype),
#   fused (rebuilds the module from the cast weights; in its oneDNN form when onednn is on),
#   onednn (nothing of its own: fused builds its form),
#   compile (traces the final module),
#   cuda_graph (captures the compiled or eager module; skipped when compile already uses CUDA graphs),
#   lazy_detector and face_crop act on the pipeline, not on the generator.
APPLY_ORDER: tuple[str, ...] = ("act_checkpoint", "amp", "fused", "onednn", "compile", "cuda_graph", "lazy_detector",
                                "face_crop")

PRESETS: dict[str, TuneConfig] = {
    # fastest steady state: the fused bf16 path under CUDA graphs. No compile: Dynamo cannot trace the fused
    # module's Triton kernels (H200 run, bench-GPEN-BFR-512-nvidia-h200-presets.json: compile failed, fell back to
    # eager after 33 s of warm-up, and fused + graphs alone gave 1.74 ms/face at bs1 and 1,149 faces/s at bs16)
    "speed": TuneConfig(lazy_detector=False, compile=None, amp="bf16", act_checkpoint=False, face_crop=True,
                        cuda_graph=True, fused=True),
    # most of the speed without a compile warm-up; bounded memory
    "balanced": TuneConfig(lazy_detector=True, compile=None, amp="bf16", act_checkpoint=False, face_crop=True,
                           cuda_graph=True, fused=False),
    # smallest peak: detector released, features freed, half-precision activations, no graph pools
    "low-memory": TuneConfig(lazy_detector=True, compile=None, amp="bf16", act_checkpoint=True, face_crop=True,
                             cuda_graph=False, fused=False),
    # the CPU: bf16 where the CPU has native bf16 dot products (`choose_cpu_preset` turns it off elsewhere), the
    # fused generator in its oneDNN form (each conv one oneDNN call with bias and activation fused in), no GPU-only
    # switch; benchmarks/results/*_cpu_generator_*.json have the measurements. PyTorch, not ONNX Runtime: its fp32
    # graph took 2x the fused bf16 generator's CPU time on an AMX Xeon (20261204-171902_cpu_generator_GPEN-BFR-256)
    "cpu": TuneConfig(lazy_detector=False, compile=None, amp="bf16", act_checkpoint=False, face_crop=True,
                      cuda_graph=False, fused=True, onednn=True, backend="torch"),
    # Apple MPS: fp16 (Apple GPUs compute fp16 natively; bf16 needs macOS 14+, checked by amp.is_supported when
    # asked for), the fused generator's PyTorch passes
    "mps": TuneConfig(lazy_detector=False, compile=None, amp="fp16", act_checkpoint=False, face_crop=True,
                      cuda_graph=False, fused=True),
}
PRESET_NAMES: tuple[str, ...] = ("auto", *PRESETS, "none")   # none: every switch off but face_crop

GiB = 1024**3
# `auto` thresholds on *free* device memory (torch.cuda.mem_get_info), sized for GPEN-BFR-512: fp32 batch 16 peaks
# near 10 GiB, bf16 batch 16 near 5 GiB, the detector + bf16 batch 1 near 1.5 GiB (bench results).
AUTO_SPEED_MIN_FREE = 16 * GiB
AUTO_BALANCED_MIN_FREE = 6 * GiB


def choose_cpu_preset(caps: CpuCapabilities) -> tuple[str, TuneConfig, str]:
    """The CPU preset for a CPU: bf16 and the oneDNN form only with native bf16 dot products (emulated bf16 is slower
    than fp32; in fp32 the oneDNN form is not faster).

    Pure: the caller reads the capabilities (`gpen_tune.tune.hardware.cpu_capabilities`)."""
    cfg = PRESETS["cpu"]
    if caps.bf16_dot:
        return "cpu", cfg, f"CPU ({caps.describe()}): preset cpu (bf16, fused, oneDNN form)"
    # fp32: the oneDNN form measured no faster than the fused passes (100.2 vs 99.4 ms, GPEN-BFR-256 on an AVX-512
    # Xeon; the convolutions dominate in fp32), so it stays off where it was not measured faster
    return "cpu", replace(cfg, amp="off", onednn=False), (f"CPU ({caps.describe()}): preset cpu in fp32 (no native "
                                                          "bf16), fused")


def choose_preset(free_bytes: int | None, total_bytes: int | None,
                  cpu: CpuCapabilities | None = None) -> tuple[str, TuneConfig, str]:
    """Pick a preset from free CUDA memory; None = no CUDA device: the CPU preset for `cpu` (default: this host's
    CPU). Pure when `cpu` is given: the caller measures.

    Returns (preset name, its TuneConfig, a one-line reason to print).
    """
    if free_bytes is None:
        return choose_cpu_preset(cpu or cpu_capabilities())
    free_gib = free_bytes / GiB
    of_total = f" of {total_bytes / GiB:.1f} GiB" if total_bytes else ""
    if free_bytes >= AUTO_SPEED_MIN_FREE:
        name = "speed"
        why = f">= {AUTO_SPEED_MIN_FREE // GiB} GiB"
    elif free_bytes >= AUTO_BALANCED_MIN_FREE:
        name = "balanced"
        why = f"between {AUTO_BALANCED_MIN_FREE // GiB} and {AUTO_SPEED_MIN_FREE // GiB} GiB"
    else:
        name = "low-memory"
        why = f"< {AUTO_BALANCED_MIN_FREE // GiB} GiB"
    return name, PRESETS[name], f"{free_gib:.1f} GiB free{of_total} ({why}): preset {name}"


def device_memory(device) -> tuple[int | None, int | None]:
    """(free, total) bytes this process may use on a CUDA device (`gpen_tune.device_memory.cuda_memory`: what
    other processes use counts, and so does a per-process memory fraction); (None, None) off CUDA."""
    from gpen_tune.device_memory import cuda_memory  # heavy: torch (tune.options stays light for the CLI)

    memory = cuda_memory(device)
    return (None, None) if memory is None else memory


def resolve_preset(name: str | None, device="cuda") -> tuple[str, TuneConfig, str]:
    """A preset by name; 'auto' measures free memory on a CUDA `device`, reads the CPU's capabilities on the CPU
    and takes preset mps on Apple MPS. None or "none" = all off but face_crop (the fp32 eager generator)."""
    if name is None or name == "none":
        return "none", TuneConfig(), "no preset: all switches off unless given"
    if name == "auto" and str(device).startswith("mps"):
        return "mps", PRESETS["mps"], "Apple MPS: preset mps (fp16, fused)"
    if name == "auto":
        return choose_preset(*device_memory(device))
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    return name, PRESETS[name], f"preset {name}"


def preset(name: str = "auto", device="cuda") -> TuneConfig:
    """The TuneConfig of a named preset (`gpen_tune.preset("speed")`); "auto" decides from `device`."""
    return resolve_preset(name, device)[1]


def with_overrides(base: TuneConfig, **overrides) -> TuneConfig:
    """`base` with every override that is not None applied (CLI flags given explicitly win over the preset)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if "compile" in given and given["compile"] in ("off", "none"):
        given["compile"] = None
    return replace(base, **given)




def cli_flags(cfg: TuneConfig, generator_only: bool = False) -> str:
    """The `gpen-tune` flags that turn cfg's switches on, in APPLY_ORDER, e.g. '--act-checkpoint --amp bf16'.

    face_crop is the enhance default: it is spelled only when off (--no-face-crop), and `generator_only` leaves it
    out (bench rows time the generator, which face_crop does not touch)."""
    parts = []
    for name in cfg.enabled():
        value = getattr(cfg, name)
        flag = switch_meta(name)["flag"]
        if name != "face_crop":
            parts.append(flag if value is True else f"{flag} {value}")
    if not cfg.face_crop and not generator_only:
        parts.append("--no-face-crop")
    if cfg.backend != "torch":
        parts.append(f"--backend {cfg.backend}")
    return " ".join(parts) or "fp32, all off"
