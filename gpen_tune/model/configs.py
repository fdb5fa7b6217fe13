"""GPEN generator configurations: the released BFR models and any (size, channel_multiplier, narrow).

Numbers come from the upstream GPEN repository (commit 2c73670)
sections 3.1 and 3.6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPENConfig:
    """Hyper-parameters of one GPEN `FullGenerator`."""

    size: int                      # input = output resolution (square), a power of two >= 16
    style_dim: int = 512           # width of the latent code w
    n_mlp: int = 8                 # layers of the mapping network
    channel_multiplier: int = 2    # widens the levels >= 64 px
    narrow: float = 1.0            # scales every level's channel count
    lr_mlp: float = 0.01           # equalised-LR multiplier of the mapping network
    blur_kernel: tuple[int, ...] = (1, 3, 3, 1)  # 1-D FIR of every up/down-sampling step

    def __post_init__(self) -> None:
        if self.size < 16 or self.size & (self.size - 1):
            raise ValueError(f"GPEN size must be a power of two >= 16, got {self.size}")

    @property
    def log_size(self) -> int:
        return int(math.log2(self.size))

    @property
    def channels(self) -> dict[int, int]:
        """Channels per resolution: 512 up to 32 px, then 256*cm at 64 px halving each level."""
        base = {4: 512, 8: 512, 16: 512, 32: 512}
        width = 256 * self.channel_multiplier
        res = 64
        while res <= max(self.size, 64):
            base[res] = width
            width //= 2
            res *= 2
        return {r: int(c * self.narrow) for r, c in base.items() if r <= self.size}

    @property
    def n_latent(self) -> int:
        return 2 * self.log_size - 2

    def flops_per_face(self) -> float:
        """Multiply-adds x 2 of one forward pass (convs, transposed convs, linears; FIRs excluded)."""
        ch = self.channels
        s = self.size
        macs = 3 * ch[s] * s * s  # ecd0 1x1
        res = s
        while res > 4:  # encoder downsampling convs
            macs += ch[res] * ch[res // 2] * 9 * (res // 2) ** 2
            res //= 2
        macs += 16 * ch[4] * self.style_dim + self.n_mlp * self.style_dim**2
        macs += ch[4] * ch[4] * 9 * 16  # conv1 on the constant input
        macs += 2 * ch[4] * 3 * 16
        res = 8
        while res <= s:
            cin_up = 2 * ch[res // 2]
            macs += cin_up * ch[res] * 9 * (res // 2) ** 2  # transposed conv, counted at input res
            macs += 2 * ch[res] * ch[res] * 9 * res * res
            macs += 2 * ch[res] * 3 * res * res
            res *= 2
        return 2.0 * macs


@dataclass(frozen=True)
class ModelInfo:
    """A released checkpoint: where it comes from and which generator it needs."""

    name: str
    config: GPENConfig
    task: str
    filename: str
    urls: tuple[str, ...]
    sha256: str | None = None     # None: not published; pinned on first verified download
    source_note: str = ""
    licence: str = "GPEN weights: research / non-commercial use only (per upstream yangxy/GPEN)."
    extra: dict = field(default_factory=dict)


_OSS = "https://public-vigen-video.oss-cn-shanghai.aliyuncs.com/robin/models/"
_MS_HIRES = "https://modelscope.cn/models/damo/cv_gpen_image-portrait-enhancement-hires"
_MS_API = "https://modelscope.cn/api/v1/models/damo/cv_gpen_image-portrait-enhancement-hires/repo?Revision=master&FilePath="

MODELS: dict[str, ModelInfo] = {
    "GPEN-BFR-256": ModelInfo(
        name="GPEN-BFR-256",
        config=GPENConfig(256, channel_multiplier=1, narrow=0.5),
        task="blind face restoration, 256 px (lighter, faster)",
        filename="GPEN-BFR-256.pth",
        urls=(_OSS + "GPEN-BFR-256.pth",),
        source_note="upstream README download link",
    ),
    "GPEN-BFR-512": ModelInfo(
        name="GPEN-BFR-512",
        config=GPENConfig(512, channel_multiplier=2, narrow=1),
        task="blind face restoration, 512 px (upstream default)",
        filename="GPEN-BFR-512.pth",
        urls=(_OSS + "GPEN-BFR-512.pth",),
        source_note="upstream README download link",
    ),
    "GPEN-BFR-1024": ModelInfo(
        name="GPEN-BFR-1024",
        config=GPENConfig(1024, channel_multiplier=2, narrow=1),
        task="blind face restoration, 1024 px",
        filename="GPEN-BFR-1024.pth",
        urls=(_MS_HIRES + "/resolve/master/pytorch_model.pt", _MS_API + "pytorch_model.pt"),
        source_note=(
            "distributed through ModelScope 'damo/cv_gpen_image-portrait-enhancement-hires' as pytorch_model.pt; "
            "download it there and pass the file with --weights PATH or put it into the cache as GPEN-BFR-1024.pth"
        ),
    ),
    "GPEN-BFR-2048": ModelInfo(
        name="GPEN-BFR-2048",
        config=GPENConfig(2048, channel_multiplier=2, narrow=1),
        task="blind face restoration, 2048 px (selfies)",
        filename="GPEN-BFR-2048.pth",
        urls=(_MS_HIRES + "/resolve/master/pytorch_model-2048.pt", _MS_API + "pytorch_model-2048.pt"),
        source_note=(
            "distributed through ModelScope 'damo/cv_gpen_image-portrait-enhancement-hires' as "
            "pytorch_model-2048.pt; download it there and pass the file with --weights PATH or put it into "
            "the cache as GPEN-BFR-2048.pth"
        ),
    ),
}


def model_info(name: str) -> ModelInfo:
    """Registry lookup that lists the valid names on a miss."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None
