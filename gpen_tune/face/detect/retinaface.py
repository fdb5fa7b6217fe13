"""RetinaFace (`retinaface_resnet50` / `retinaface_mobile0.25`): facexlib's networks, the detector upstream GPEN
uses, with our own batched pre/post-processing. Weights come from facexlib's GitHub release into
`cache_dir()/detectors/` (weights.py), or from a local file (upstream GPEN's `RetinaFace-R50.pth` has the same
layout). Same-size images are detected in one forward pass."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from gpen_tune.face.detect.base import DEFAULT_DET_SIZE, DetectorError, FaceDetector

NMS_IOU = 0.4                    # RetinaFace NMS overlap, as upstream
_RETINAFACE_NET = {"retinaface_resnet50": "resnet50", "retinaface_mobile0.25": "mobile0.25"}


class RetinaFaceDetector(FaceDetector):
    """facexlib's RetinaFace network with our own batched pre/post-processing.

    Input convention (as facexlib/upstream): BGR float, minus the mean (104, 117, 123), no scaling, NCHW.
    """

    name = "retinaface_resnet50"
    _VARIANCE = (0.1, 0.2)
    _MIN_SIZES = ((16, 32), (64, 128), (256, 512))
    _STEPS = (8, 16, 32)

    def __init__(self, name: str, weights_path: Path, device="cpu", threshold=None, det_size=DEFAULT_DET_SIZE):
        super().__init__(device, threshold, det_size)
        self.name = name
        self.weights_path = Path(weights_path)
        from facexlib.detection.retinaface import RetinaFace  # optional heavy dependency: facexlib

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision's deprecated `pretrained=` argument inside facexlib
            net = RetinaFace(network_name=_RETINAFACE_NET[name], half=False, device="cpu")
        sd = _read_detector_state(weights_path)
        try:
            net.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            first = str(e).splitlines()[0]
            raise DetectorError(f"{weights_path}: not {name} weights ({first})") from None
        self.net = net.to(self.device).eval().requires_grad_(False)
        self._mean = torch.tensor([104.0, 117.0, 123.0]).view(1, 3, 1, 1)
        self._priors: dict[tuple[int, int], torch.Tensor] = {}

    def _networks(self):
        return [self.net] if self.net is not None else []

    def _drop_networks(self):
        self.net = None
        self._priors.clear()

    def priors(self, h: int, w: int) -> torch.Tensor:
        """Anchors [P, 4] (cx, cy, w, h) relative to the image, in the order of the network's outputs."""
        key = (h, w)
        if key not in self._priors:
            parts = []
            for step, sizes in zip(self._STEPS, self._MIN_SIZES, strict=True):
                fh, fw = -(-h // step), -(-w // step)
                cy, cx = np.meshgrid((np.arange(fh) + 0.5) * step / h, (np.arange(fw) + 0.5) * step / w, indexing="ij")
                per_size = [np.stack([cx, cy, np.full_like(cx, s / w), np.full_like(cx, s / h)], -1) for s in sizes]
                parts.append(np.stack(per_size, axis=2).reshape(-1, 4))      # [fh*fw*len(sizes), 4]
            self._priors[key] = torch.from_numpy(np.concatenate(parts).astype(np.float32))
        return self._priors[key].to(self.device)

    def _detect_batch(self, batch):
        from facexlib.detection.retinaface_utils import (  # optional heavy dependency: facexlib
            batched_decode,
            batched_decode_landm,
        )

        if self.net is None:
            raise DetectorError("detector was closed")
        b, h, w, _ = batch.shape
        x = torch.from_numpy(batch).to(self.device)                          # [B, H, W, 3] uint8 RGB
        x = x.flip(-1).permute(0, 3, 1, 2).float() - self._mean.to(self.device)   # [B, 3, H, W] BGR - mean
        loc, conf, landm = self.net(x)
        priors = self.priors(h, w)[None]
        boxes = batched_decode(loc.float(), priors, self._VARIANCE) * torch.tensor([w, h, w, h], device=self.device)
        lms = batched_decode_landm(landm.float(), priors, self._VARIANCE) * torch.tensor([w, h] * 5,
                                                                                          device=self.device)
        scores = conf[..., 1].float()
        import torchvision  # here, not at module level: facexlib needs it anyway, a run without RetinaFace does not

        out = []
        for i in range(b):
            keep = scores[i] >= self.threshold
            bi, si, li = boxes[i][keep], scores[i][keep], lms[i][keep]
            k = torchvision.ops.nms(bi, si, NMS_IOU)
            out.append((bi[k].cpu().numpy(), si[k].cpu().numpy(), li[k].cpu().numpy().reshape(-1, 5, 2)))
        return out


def _read_detector_state(path: Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise DetectorError(f"{path}: detector weights file not found")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line message
        raise DetectorError(f"{path}: cannot read detector weights ({type(e).__name__}: {e})") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise DetectorError(f"{path}: expected a state dict of tensors")
    return {(k[7:] if k.startswith("module.") else k): v for k, v in sd.items()}
