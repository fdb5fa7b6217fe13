"""Key frames of a video: the full detector runs on every `every`-th frame, and the frames between follow the
faces found in their key frame (`follow_faces`: the detector's last stages on those boxes, not its whole-image
search).

Why: in a video the detector is the busiest step (MTCNN's P-Net searches the whole frame at every scale), while
a face moves a few pixels a frame. Following known boxes (R-Net and O-Net on each box and a wider copy of it)
gives the same kind of landmarks as a detection, from the same last network, at a fraction of its cost.

What it changes: a face that enters between two key frames is found at the next key frame; a face that moves
more than about a third of its width since its key frame is lost until the next one (the tracker fills up to
`video.track.MAX_GAP` missed frames). A frame between waits for its key frame's detection (a key frame is read
from the source before the frames after it, so no frame waits on a later one); when the key frame failed, or
its answer did not come within `wait_s`, the frame is detected in full.
"""

from __future__ import annotations

import threading

import numpy as np

KEEP_KEYS = 256          # key frames whose faces are kept (frames in flight never reach this far back)
WAIT_S = 60.0            # how long a frame between waits for its key frame before it is detected in full


class KeyFrames:
    """The faces of the last key frames, published by their detection, read by the frames after them."""

    def __init__(self, every: int, wait_s: float = WAIT_S):
        if every < 1:
            raise ValueError(f"detect every {every} frames: must be at least 1")
        self.every = every
        self.wait_s = wait_s
        self._boxes: dict[int, np.ndarray | None] = {}
        self._ready: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def is_key(self, index: int) -> bool:
        return index % self.every == 0

    def _event(self, key: int) -> threading.Event:
        with self._lock:
            event = self._ready.get(key)
            if event is None:
                event = self._ready[key] = threading.Event()
            return event

    def publish(self, index: int, boxes: np.ndarray | None) -> None:
        """A key frame's face boxes [K, 4] (None: it has no detection, its frames detect in full)."""
        with self._lock:
            self._boxes[index] = boxes
            for old in [k for k in self._ready if k < index - KEEP_KEYS * self.every]:
                self._ready.pop(old, None)
                self._boxes.pop(old, None)
        self._event(index).set()

    def give_up(self, index: int) -> None:
        """A key frame ends its prepare step unpublished (it failed): its frames detect in full."""
        if self.is_key(index) and not self._event(index).is_set():
            self.publish(index, None)

    def boxes_for(self, index: int) -> np.ndarray | None:
        """The boxes frame `index` follows (its key frame's, waited for), or None: detect it in full."""
        key = index - index % self.every
        if not self._event(key).wait(self.wait_s):
            return None
        with self._lock:
            return self._boxes.get(key)
