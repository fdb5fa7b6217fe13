"""What the host's CPU can do natively, read once: the facts `--preset auto` decides the CPU path from.

bf16 pays on a CPU only with native bf16 dot products (x86: AVX512-BF16 or AMX-BF16, ARM: the BF16 extension);
without them oneDNN emulates bf16 through fp32 and it is slower than fp32. fp16 needs AVX512-FP16 / AMX-FP16 (x86)
or ARM's half-precision arithmetic; elsewhere PyTorch's CPU fp16 convolutions are scalar fallbacks (measured
155x slower than fp32 on an AVX-512 CPU without them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# /proc/cpuinfo flag names (x86 "flags", ARM "Features")
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "fphp", "asimdhp"})


@dataclass(frozen=True)
class CpuCapabilities:
    """cores: CPUs this process may run on; isa: torch's vector level (e.g. "AVX512"); bf16_dot / fp16_dot:
    native half-precision dot products; onednn: PyTorch's oneDNN (mkldnn) convolutions are available."""

    cores: int
    isa: str
    bf16_dot: bool
    fp16_dot: bool
    onednn: bool
    flags: tuple[str, ...] = ()

    def describe(self) -> str:
        native = [name for name, ok in (("bf16", self.bf16_dot), ("fp16", self.fp16_dot)) if ok]
        return (f"{self.cores} cores, {self.isa}, native {'/'.join(native) if native else 'fp32 only'}"
                f"{', oneDNN' if self.onednn else ''}")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (x86 "flags" or ARM "Features")."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def usable_cores() -> int:
    """CPUs this process is allowed to run on (affinity / cgroup pinning), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows have no affinity call
        return os.cpu_count() or 1


def cpu_capabilities(cpuinfo: str | None = None, cores: int | None = None) -> CpuCapabilities:
    """This host's CPU (or the one described by a given /proc/cpuinfo text and core count)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    import torch  # on use: `gpen_tune.tune.options` (and the CLI's --help) import this module without torch

    flags = cpu_flags(cpuinfo)
    return CpuCapabilities(
        cores=cores or usable_cores(),
        isa=torch.backends.cpu.get_cpu_capability(),
        bf16_dot=bool(flags & BF16_FLAGS),
        fp16_dot=bool(flags & FP16_FLAGS),
        onednn=torch.backends.mkldnn.is_available(),
        flags=tuple(sorted(flags & (BF16_FLAGS | FP16_FLAGS))),
    )


def mps_available() -> bool:
    """Apple's Metal backend is built into this PyTorch and usable (macOS 12.3+ on Apple silicon or AMD)."""
    import torch  # on use, as above

    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())
