"""MTCNN's three networks (Zhang et al. 2016, "Joint Face Detection and Alignment using Multi-task Cascaded
Convolutional Networks"): P-Net proposes 12x12 windows over an image pyramid, R-Net refines 24x24 crops of them,
O-Net scores 48x48 crops and places five landmarks.

The weights are facenet-pytorch's (MIT), which ship as three small files inside its wheel (`data/pnet.pt`, ...):
they are found through the installed package's location and loaded strictly into these modules, without importing
the package (its `__init__` imports torchvision and, through it, torch._dynamo: ~180 MB of resident memory for
nothing on a CPU). The module and parameter names follow the files' keys.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn

from gpen_tune.ops.max_pool import MaxPoolCeil  # nn.MaxPool2d(k, s, ceil_mode=True), the same values, faster

WEIGHTS_PACKAGE = "facenet_pytorch"
INSTALL_HINT = "pip install --no-deps facenet-pytorch==2.6.0"


class PNet(nn.Module):
    """Proposal network: fully convolutional, one 12x12 window every 2 px -> (box offsets [B,4,h,w], face
    probabilities [B,2,h,w])."""

    def __init__(self):
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.pool1 = MaxPoolCeil(2, 2)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, 1)        # face / not-face logits
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, 1)        # box offsets

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), self.softmax4_1(self.conv4_1(x))


def _flatten_hwc(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, W*H*C] in the order the dense layers were trained on (width-major, channels last)."""
    return x.permute(0, 3, 2, 1).contiguous().view(x.shape[0], -1)


class RNet(nn.Module):
    """Refinement network on 24x24 crops -> (box offsets [N,4], face probabilities [N,2])."""

    def __init__(self):
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.pool1 = MaxPoolCeil(3, 2)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.pool2 = MaxPoolCeil(3, 2)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.softmax5_1 = nn.Softmax(dim=1)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu4(self.dense4(_flatten_hwc(self.prelu3(self.conv3(x)))))
        return self.dense5_2(x), self.softmax5_1(self.dense5_1(x))


class ONet(nn.Module):
    """Output network on 48x48 crops -> (box offsets [N,4], landmarks [N,10] (5 x then 5 y, relative to the box),
    face probabilities [N,2])."""

    def __init__(self):
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.pool1 = MaxPoolCeil(3, 2)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.pool2 = MaxPoolCeil(3, 2)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.pool3 = MaxPoolCeil(2, 2)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.softmax6_1 = nn.Softmax(dim=1)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu5(self.dense5(_flatten_hwc(self.prelu4(self.conv4(x)))))
        return self.dense6_2(x), self.dense6_3(x), self.softmax6_1(self.dense6_1(x))


NETWORKS = {"pnet": PNet, "rnet": RNet, "onet": ONet}


def weights_dir() -> Path:
    """The folder of the three weight files inside the installed facenet-pytorch (found, not imported)."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the offline MTCNN detector needs facenet-pytorch's weights: {INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_networks(device: str | torch.device = "cpu") -> tuple[PNet, RNet, ONet]:
    """P-Net, R-Net and O-Net in eval mode on `device`, each loaded strictly from its file."""
    folder = weights_dir()
    nets = []
    for name, cls in NETWORKS.items():
        path = folder / f"{name}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: MTCNN weights missing from facenet-pytorch; reinstall it: {INSTALL_HINT}")
        net = cls()
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
        nets.append(net.to(device).eval().requires_grad_(False))
    return tuple(nets)
