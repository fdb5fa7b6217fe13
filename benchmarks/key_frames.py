"""Key frames (`enhance --detect-every N`): what following the faces of a key frame gives against a full detection
of every frame, on frames of the benchmark clips (1080p, the face or the 9-face group panning sideways).

For each N: faces found per frame by following (and frames that fell back to a full detection because a face was
lost), the landmark distance to the full detection's (pixels, and as a share of the eye distance), and the
detector's time per frame: a full detection against a follow, one frame per call, interleaved. For scale: how far
a full detection's own landmarks move when the frame is moved by 3 px.

    python benchmarks/key_frames.py [--frames 48] [--clip-frames 240] [--every 2,4,8] [--device cpu]

The clip's motion is fastest at its start (a sine pan): the first `--frames` frames of a `--clip-frames` clip are
its worst stretch.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clip_files import pan_frames  # noqa: E402
from results_file import result_path, write_at  # noqa: E402


def match(full: list, got: list) -> list[tuple]:
    """Pairs (full, followed) by nearest box centre."""
    pairs = []
    for f in full:
        c = (f.box[:2] + f.box[2:]) / 2
        best = min(got, key=lambda g: np.linalg.norm((g.box[:2] + g.box[2:]) / 2 - c), default=None)
        if best is not None:
            pairs.append((f, best))
    return pairs


def clip_stats(detector, frames: list[np.ndarray], every: int) -> dict:
    """Following each frame from its key frame's full detection, against the full detection of that frame."""
    from gpen_tune.face.detect.services import follow_faces

    full = [detector.detect([f])[0] for f in frames]
    lost_frames, errors, rel = 0, [], []
    for i, frame in enumerate(frames):
        key = i - i % every
        if key == i:
            continue
        boxes = np.array([d.box for d in full[key]]).reshape(-1, 4)
        got = follow_faces(detector, [frame], [boxes])[0]
        if len(got) < len(boxes):
            lost_frames += 1                    # the pipeline detects this frame in full
            continue
        for f, g in match(full[i], got):
            d = np.linalg.norm(f.landmarks - g.landmarks, axis=1)
            errors.append(float(d.mean()))
            rel.append(float(d.mean() / np.linalg.norm(f.landmarks[0] - f.landmarks[1])))
    followed = len(frames) - len(range(0, len(frames), every))
    return {"every": every, "frames_between": followed, "fell_back_to_full": lost_frames,
            "faces_per_frame_full": round(statistics.mean(len(f) for f in full), 2),
            "landmark_px_mean": round(statistics.mean(errors), 3) if errors else None,
            "landmark_px_p95": round(float(np.percentile(errors, 95)), 3) if errors else None,
            "landmark_share_of_eye_distance_mean": round(statistics.mean(rel), 4) if rel else None}


def detection_noise(detector, frames: list[np.ndarray], shift: int = 3) -> dict:
    """How far a full detection's own landmarks move when the frame moves by `shift` px (shifted back): the scale
    against which following's distances are read."""
    errors = []
    for frame in frames:
        moved = np.roll(frame, (shift, shift), axis=(0, 1))
        a, b = detector.detect([frame])[0], detector.detect([moved])[0]
        for f, g in match(a, [type(d)(d.box - shift, d.score, d.landmarks - shift) for d in b]):
            errors.append(float(np.linalg.norm(f.landmarks - g.landmarks, axis=1).mean()))
    return {"shift_px": shift, "landmark_px_mean": round(statistics.mean(errors), 3) if errors else None,
            "landmark_px_p95": round(float(np.percentile(errors, 95)), 3) if errors else None}


def timing(detector, frames: list[np.ndarray], rounds: int) -> dict:
    """ms per frame: a full detection against following its own faces, one frame per call, interleaved."""
    from gpen_tune.face.detect.services import follow_faces

    boxes = [np.array([d.box for d in detector.detect([f])[0]]).reshape(-1, 4) for f in frames]
    full_ms, follow_ms = [], []
    for _ in range(rounds):
        for f, b in zip(frames, boxes, strict=True):
            t = time.perf_counter()
            detector.detect([f])
            full_ms.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            follow_faces(detector, [f], [b])
            follow_ms.append((time.perf_counter() - t) * 1e3)
    return {"full_ms": round(statistics.median(full_ms), 2), "follow_ms": round(statistics.median(follow_ms), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=48, help="frames from the start of each clip")
    ap.add_argument("--clip-frames", type=int, default=240, help="the clip's length (its pan speed)")
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--every", default="2,4,8")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args(argv)
    import torch

    from gpen_tune.face import samples
    from gpen_tune.face.detect.build import build_backend

    w, h = map(int, args.size.split("x"))
    detector = build_backend("mtcnn", device=args.device)
    clips = {"one_face": samples.astronaut(), "group": samples.mosaic(9, 4)}
    result = {"benchmark": "key_frames", "command": " ".join(["python", *sys.argv]),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": args.device,
              "torch_threads": torch.get_num_threads(), "size": [w, h], "clip_frames": args.clip_frames,
              "frames": args.frames, "clips": {}}
    for name, src in clips.items():
        frames = []
        for i, f in enumerate(pan_frames(src, args.clip_frames, (w, h))):
            if i >= args.frames:
                break
            frames.append(f)
        row = {"stats": [clip_stats(detector, frames, int(n)) for n in args.every.split(",")],
               "full_detection_moved": detection_noise(detector, frames[::6]),
               "timing": timing(detector, frames[:8], args.rounds)}
        result["clips"][name] = row
        print(name, json.dumps(row, indent=1))
    path = result_path(args.out, f"key_frames_{args.device}")
    write_at(path, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
