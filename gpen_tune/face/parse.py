"""Optional face-parsing paste mask (`--parse-mask`): facexlib's ParseNet on each restored face.

Upstream GPEN runs the same ParseNet (19 classes) on every restored face and pastes only skin, features, hair and
neck: classes 0 (background), 14 (hat) and 18 (cloth) are dropped (facts 2.2 step 6). It costs more compute than
GPEN-512 itself, which is why it is off by default here.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from gpen_tune.face.paste import feather

PARSENET_FILE = "parsing_parsenet.pth"
PARSENET_URL = "https://github.com/xinntao/facexlib/releases/download/v0.2.2/parsing_parsenet.pth"
PARSE_SIZE = 512
DROPPED_CLASSES = (0, 14, 18)        # background, hat, cloth


def class_mask(classes: np.ndarray, size: int) -> np.ndarray:
    """Parsing classes [512, 512] -> soft paste mask [size, size]: face classes kept, border cleared, feathered at
    512 scale, then resized (as upstream)."""
    m = feather((~np.isin(classes, DROPPED_CLASSES)).astype(np.float32))
    if m.shape[0] != size:
        m = cv2.resize(m, (size, size), interpolation=cv2.INTER_LINEAR)
    return m


class FaceParser:
    """Batched parse masks [S, S] float32 for restored crops."""

    def __init__(self, device: str | torch.device = "cpu", weights: str | Path | None = None):
        from facexlib.parsing.parsenet import ParseNet

        from gpen_tune.face.detect import DetectorError, fetch_weights

        if weights is None or str(weights).startswith(("http://", "https://")):
            path = fetch_weights(PARSENET_URL if weights is None else str(weights), PARSENET_FILE)
        else:
            path = Path(weights).expanduser()
        if not path.is_file():
            raise DetectorError(f"{path}: parsing weights file not found")
        net = ParseNet(in_size=PARSE_SIZE, out_size=PARSE_SIZE, parsing_ch=19)
        try:
            net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=True)
        except Exception as e:  # noqa: BLE001
            raise DetectorError(f"{path}: not ParseNet weights ({str(e).splitlines()[0]})") from None
        self.device = torch.device(device)
        self.net = net.to(self.device).eval().requires_grad_(False)

    @torch.inference_mode()
    def masks(self, faces: list[np.ndarray]) -> list[np.ndarray]:
        """Soft masks for restored crops [S, S, 3] uint8 RGB, each the size of its crop."""
        if not faces:
            return []
        x = np.stack([cv2.resize(f, (PARSE_SIZE, PARSE_SIZE), interpolation=cv2.INTER_LINEAR) for f in faces])
        t = torch.from_numpy(x).to(self.device).permute(0, 3, 1, 2).float() / 127.5 - 1.0   # [B,3,512,512] RGB
        classes = self.net(t)[0].argmax(1).cpu().numpy()                                     # [B, 512, 512]
        return [class_mask(c, face.shape[0]) for c, face in zip(classes, faces, strict=True)]

    def close(self) -> None:
        self.net = None
