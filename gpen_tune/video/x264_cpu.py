"""The instruction sets libx264 may use: all this CPU has but AVX-512.

On an AVX-512 CPU, libx264 (the PyAV wheels' build) wrote different pixels from the same frames from one run to the
next: 6 different outputs in 10 writes of a 480x270 clip, up to 54 grey levels apart, where the same options kept
off AVX-512 wrote one, at the same size and PSNR (benchmarks/results/20261207-191640_encoder_repeat.json); a 1080p
clip wrote one output either way, at the same 14.8 fps (20261207-191721_encoder_repeat.json).
So where the CPU has AVX-512, x264 is given the list of the other instruction sets it has (its `asm` setting), read
from /proc/cpuinfo. Only sets the CPU reports are named: a set it lacks would crash the encoder (SIGILL).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gpen_tune.tune.hardware import cpu_flags

# x264's name for an instruction set -> the /proc/cpuinfo flag that says the CPU has it (any of them), oldest first
X264_SETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("MMX2", ("mmxext", "sse")), ("SSE", ("sse",)), ("SSE2", ("sse2",)), ("SSE3", ("pni",)), ("SSSE3", ("ssse3",)),
    ("SSE4", ("sse4_1",)), ("SSE4.2", ("sse4_2",)), ("AVX", ("avx",)), ("XOP", ("xop",)), ("FMA4", ("fma4",)),
    ("FMA3", ("fma",)), ("BMI1", ("bmi1",)), ("BMI2", ("bmi2",)), ("AVX2", ("avx2",)), ("LZCNT", ("abm", "lzcnt")),
)
FAST_SSE2 = "SSE2Fast"      # x264's speed hint for CPUs whose SSE2 is not split in halves (every AVX CPU)


def x264_asm(cpuinfo: str) -> str | None:
    """x264's `asm` value for the CPU a /proc/cpuinfo text describes: its instruction sets without AVX-512; None
    where it has no AVX-512 (or is not x86): x264 picks for itself."""
    flags = cpu_flags(cpuinfo)
    if "avx512f" not in flags:
        return None
    names = [name for name, has in X264_SETS if flags & set(has)]
    if "AVX" in names:
        names.insert(names.index("SSE2") + 1, FAST_SSE2)
    return ",".join(names)


@cache
def x264_params() -> dict[str, str]:
    """The libx264 option that keeps x264 off AVX-512 on this host (empty where there is nothing to keep it off)."""
    path = Path("/proc/cpuinfo")
    asm = x264_asm(path.read_text() if path.is_file() else "")
    return {"x264-params": f"asm={asm}"} if asm else {}
