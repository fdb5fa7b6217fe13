"""The benchmarks' test clips: frames made from a photo, written as H.264 and decoded back (numpy, OpenCV and
PyAV only, so a child process timing any checkout can import it)."""

from __future__ import annotations

from pathlib import Path

import av
import cv2
import numpy as np


def pan_frames(src: np.ndarray, n: int, size: tuple[int, int], noise: float = 0.0, still: bool = False):
    """n frames: `src` scaled to the frame height on a grey canvas, drifting sideways and zooming a little (the
    faces stay in view); `noise`: per-frame Gaussian sensor noise; `still`: no motion."""
    w, h = size
    rng = np.random.default_rng(0)
    for i in range(n):
        t = 0.0 if still else i / max(n - 1, 1)
        zoom = 0.9 + 0.08 * np.sin(2 * np.pi * t)
        k = min(h / src.shape[0], w / src.shape[1]) * zoom
        img = cv2.resize(src, None, fx=k, fy=k, interpolation=cv2.INTER_AREA if k < 1 else cv2.INTER_CUBIC)
        canvas = np.full((h, w, 3), 128, np.uint8)
        x0 = int((w - img.shape[1]) * (0.5 + 0.3 * np.sin(2 * np.pi * t)))
        y0 = (h - img.shape[0]) // 2
        canvas[y0:y0 + img.shape[0], x0:x0 + img.shape[1]] = img
        if noise:
            canvas = np.clip(canvas.astype(np.int16) + rng.normal(0, noise, canvas.shape), 0, 255).astype(np.uint8)
        yield canvas


def write_clip(path: Path, frames, fps: int = 25, crf: int = 18, preset: str | None = None,
               options: dict[str, str] | None = None) -> Path:
    """RGB frames into an H.264 file (libx264 at `crf`, its speed `preset`; swscale's default conversion);
    `options`: libx264's options as given instead (crf and preset then unused)."""
    if options is None:
        options = {"crf": str(crf)} | ({"preset": preset} if preset else {})
    with av.open(str(path), "w") as out:
        stream = None
        for i, img in enumerate(frames):
            if stream is None:
                stream = out.add_stream("libx264", rate=fps, options=options)
                stream.width, stream.height, stream.pix_fmt = img.shape[1], img.shape[0], "yuv420p"
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two uint8 images in dB (inf when equal)."""
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return round(10 * np.log10(255.0**2 / mse), 2) if mse else float("inf")
