"""The face restoration pipeline as three stages a runner can overlap:

1. `Enhancer.prepare(sources)`: decode, detect (batched over same-size images), align -> `ImageJob`s holding
   the picture and its `FaceCrop`s (crop [S, S, 3] uint8 RGB, affine, inverse, detection).
2. `Enhancer.restore(jobs)`: every crop of one or several images through the generator in batches of
   `batch_size` (HWC uint8 <-> NCHW [-1, 1] converted once per batch, in the model's dtype, on its device).
3. `Enhancer.finish(job)` / `Enhancer.write(job, path)`: paste back, encode, atomic write.

`enhance_paths` is the serial driver used by `gpen-tune enhance`; `enhance_image` handles one image.
The generator is reached only through a `restore(batch) -> batch` callable: the seam where the tune part plugs
in compiled / CUDA-graph / fused restorers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

from gpen_tune.face.align import alignment, warp_crop
from gpen_tune.face.detect import DEFAULT_DET_SIZE, Detection, default_notify, init_detector
from gpen_tune.face.paste import PasteFace, is_small_face, paste_faces, paste_faces_full_frame, soften
from gpen_tune.imageio import ImageReadError, Picture, copy_file, picture_from_array, read_image, write_image
from gpen_tune.restore.restorer import as_restorer

Restore = Callable[[torch.Tensor], torch.Tensor]
DEVICES = ("auto", "cuda", "cpu", "mps")
STAGES = ("decode", "detect", "align", "restore", "paste", "encode")


@dataclass
class EnhanceSettings:
    """Everything `gpen-tune enhance` lets a user choose (tune switches come through the restore callable)."""

    model: str = "GPEN-BFR-512"          # registry name: fixes the architecture and the crop size
    weights: str | None = None           # path | registry name | "synthetic"; None = cached file, else synthetic
    template: str = "gpen"               # "gpen" (upstream) or "ffhq" (GFPGAN / facefusion)
    detector: str = "auto"
    detector_weights: str | None = None  # RetinaFace file or URL
    det_size: int | None = DEFAULT_DET_SIZE   # long side for detection; None = native resolution
    det_threshold: float | None = None   # None = 0.9
    strength: float = 1.0                # 0 = input unchanged, 1 = fully restored
    only_center_face: bool = False
    aligned: bool = False                # inputs are already aligned face crops
    parse_mask: bool = False             # ParseNet mask instead of the feathered square
    parse_weights: str | None = None
    face_crop: bool = True               # False: upstream-like full-frame paste (comparison only)
    batch_size: int = 8                  # faces per generator call, across images
    device: str = "auto"
    soften_small_faces: bool = True      # upstream's 3x3 softening of faces with a box under 100 px

    def __post_init__(self) -> None:
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1], got {self.strength}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.template not in ("gpen", "ffhq"):
            raise ValueError(f"template must be 'gpen' or 'ffhq', got {self.template!r}")


@dataclass
class FaceCrop:
    crop: np.ndarray | None              # [S, S, 3] uint8 RGB (None until cut: `Enhancer.prepare(warp=False)`)
    affine: np.ndarray                   # 2x3 image -> crop
    inverse: np.ndarray                  # 2x3 crop -> image
    detection: Detection | None          # None for --aligned inputs
    restored: np.ndarray | None = None   # [S, S, 3] uint8 RGB after stage 2


@dataclass
class ImageJob:
    source: str
    picture: Picture | None = None
    faces: list[FaceCrop] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    status: str = "pending"              # pending | ok | no_face | error
    error: str | None = None
    result: Picture | None = None
    output: Path | None = None
    size: tuple[int, int] | None = None  # (width, height) once decoded

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def report(self) -> dict:
        return {
            "input": self.source,
            "output": None if self.output is None else str(self.output),
            "status": self.status,
            "error": self.error,
            "size": None if self.size is None else list(self.size),
            "faces": [f.detection.to_dict() for f in self.faces if f.detection is not None],
            "n_faces": len(self.faces),
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
        }


# ---------------------------------------------------------------------------------------------------- helpers


def resolve_device(name: str = "auto", notify: Callable[[str], None] = default_notify) -> torch.device:
    """auto: cuda > mps > cpu, with a loud notice on the CPU; explicit choices are checked."""
    mps = getattr(torch.backends, "mps", None)
    has_mps = bool(mps and mps.is_available())
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if has_mps:
            return torch.device("mps")
        notify("NO GPU FOUND: running on the CPU, expect seconds per face (GPEN-BFR-512). "
               "Pass --device cpu to silence this, or check `gpen-tune doctor`.")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is visible to PyTorch (check the driver / CUDA_VISIBLE_DEVICES)")
    if name == "mps" and not has_mps:
        raise ValueError("--device mps: Apple MPS is not available on this machine")
    return torch.device(name)


def resolve_weights(settings: EnhanceSettings, notify: Callable[[str], None] = default_notify) -> str:
    """The weights argument for load_model: as given, else the cached registry file, else synthetic (loudly)."""
    if settings.weights:
        if settings.weights == "synthetic":
            _synthetic_notice(settings.model, notify)
        return settings.weights
    from gpen_tune.model.configs import model_info
    from gpen_tune.weights.cache import cached_file

    info = model_info(settings.model)
    if cached_file(info.filename).is_file():
        return settings.model
    _synthetic_notice(settings.model, notify)
    return "synthetic"


def _synthetic_notice(model: str, notify: Callable[[str], None]) -> None:
    notify(f"SYNTHETIC WEIGHTS: the output is NOT a real restoration (random {model} network). "
           f"Run `gpen-tune weights download {model}` or pass --weights PATH.")


def center_face(detections: list[Detection], width: int, height: int) -> list[Detection]:
    """The face whose box centre is closest to the image centre (as facexlib's only_center_face)."""
    if len(detections) <= 1:
        return detections
    c = np.array([width / 2, height / 2])
    dist = [np.linalg.norm((d.box[:2] + d.box[2:]) / 2 - c) for d in detections]
    return [detections[int(np.argmin(dist))]]


def _model_restore(model: torch.nn.Module) -> Restore:
    def restore(batch: torch.Tensor) -> torch.Tensor:
        return model(batch)

    return restore


# ---------------------------------------------------------------------------------------------------- stages


class Enhancer:
    """Holds the generator, the restore callable, the detector and the optional parser for many images."""

    def __init__(
        self,
        settings: EnhanceSettings | None = None,
        *,
        model: torch.nn.Module | None = None,
        restore: Restore | None = None,
        detector=None,
        size: int | None = None,
        notify: Callable[[str], None] = default_notify,
    ):
        """Args:
            settings: pipeline choices.
            model: a loaded generator; None loads one from settings (unless `restore` and `size` are given).
            restore: the callable the batches go through (default: the model's forward).
            detector: a FaceDetector (or LazyDetector); None builds one from settings when needed.
            size: crop size when no model is given (tests with an identity restore).
        """
        self.settings = settings or EnhanceSettings()
        self.notify = notify
        if model is not None:
            self.device = next(model.parameters()).device
        else:
            self.device = resolve_device(self.settings.device, notify)
        if model is None and not (restore is not None and size is not None):
            from gpen_tune.load import load_model

            model = load_model(resolve_weights(self.settings, notify), model=self.settings.model, device=self.device)
        self.model = model
        self.size = size or model.cfg.size
        self.dtype = getattr(model, "compute_dtype", torch.float32) if model is not None else torch.float32
        self.restore_fn: Restore = restore or _model_restore(model)
        self.restorer = as_restorer(self.restore_fn, device=self.device, dtype=self.dtype, size=self.size,
                                    max_batch=self.settings.batch_size)
        self._detector = detector
        self._parser = None

    # -- lazily built helpers
    @property
    def detector(self):
        if self._detector is None:
            s = self.settings
            self._detector = init_detector(s.detector, device=self.device, weights=s.detector_weights,
                                           threshold=s.det_threshold, det_size=s.det_size, notify=self.notify)
        return self._detector

    @property
    def parser(self):
        if self._parser is None:
            from gpen_tune.face.parse import FaceParser

            self._parser = FaceParser(self.device, self.settings.parse_weights)
        return self._parser

    # -- stage 1
    def prepare(self, sources: Iterable[str | Path | np.ndarray | Picture], warp: bool = True) -> list[ImageJob]:
        """Decode every source, detect faces in all of them at once (batched), align. Errors stay per job.

        `warp=False`: the faces get their affines but no crop yet (the folder runner cuts them on the GPU, or
        later with `cut_faces`)."""
        jobs: list[ImageJob] = []
        for src in sources:
            job = ImageJob(source=str(src) if not isinstance(src, np.ndarray | Picture) else "<array>")
            t = time.perf_counter()
            try:
                if isinstance(src, Picture):
                    job.picture = src
                elif isinstance(src, np.ndarray):
                    job.picture = picture_from_array(src)
                else:
                    job.picture = read_image(src)
                job.size = job.picture.size
            except (ImageReadError, ValueError) as e:
                job.status, job.error = "error", str(e)
            job.add_time("decode", time.perf_counter() - t)
            jobs.append(job)
        live = [j for j in jobs if j.status != "error"]
        if self.settings.aligned:
            for job in live:
                self._align_whole(job)
            return jobs
        if live:
            t = time.perf_counter()
            found = self.detector.detect([j.picture.rgb8() for j in live])
            share = (time.perf_counter() - t) / len(live)
            for job, dets in zip(live, found, strict=True):
                job.add_time("detect", share)
                self._align(job, dets, warp)
        return jobs

    def _align(self, job: ImageJob, dets: list[Detection], warp: bool = True) -> None:
        t = time.perf_counter()
        pic = job.picture
        if self.settings.only_center_face:
            dets = center_face(dets, *pic.size)
        for det in dets:
            affine, inverse = alignment(det.landmarks, self.size, self.settings.template)
            job.faces.append(FaceCrop(None, affine, inverse, det))
        job.add_time("align", time.perf_counter() - t)
        if warp:
            self.cut_faces(job)

    def cut_faces(self, job: ImageJob) -> None:
        """Cut the crops that `prepare(warp=False)` left out, on the CPU."""
        t = time.perf_counter()
        rgb8 = None
        for face in job.faces:
            if face.crop is None:
                rgb8 = job.picture.rgb8() if rgb8 is None else rgb8
                face.crop = warp_crop(rgb8, face.affine, self.size)
        job.add_time("align", time.perf_counter() - t)

    def _align_whole(self, job: ImageJob) -> None:
        """--aligned: the whole image is the face crop (resized to the model size)."""
        t = time.perf_counter()
        w, h = job.picture.size
        affine = np.array([[self.size / w, 0, 0], [0, self.size / h, 0]], dtype=np.float64)
        inverse = np.array([[w / self.size, 0, 0], [0, h / self.size, 0]], dtype=np.float64)
        interp = cv2.INTER_AREA if max(w, h) > self.size else cv2.INTER_LINEAR
        crop = cv2.resize(job.picture.rgb8(), (self.size, self.size), interpolation=interp)
        job.faces.append(FaceCrop(crop, affine, inverse, None))
        job.add_time("align", time.perf_counter() - t)

    # -- stage 2
    def restore(self, jobs: Sequence[ImageJob]) -> None:
        """Restore every face of `jobs` in batches of `batch_size` that may span several images."""
        faces = [(job, face) for job in jobs if job.status != "error" for face in job.faces]
        bs = self.settings.batch_size
        if self.settings.strength <= 0:
            return
        for start in range(0, len(faces), bs):
            chunk = faces[start:start + bs]
            hook = getattr(self._detector, "before_restore", None)
            if hook:
                hook()
            t = time.perf_counter()
            out = self.restore_crops([f.crop for _, f in chunk])
            share = (time.perf_counter() - t) / len(chunk)
            for (job, face), restored in zip(chunk, out, strict=True):
                face.restored = restored
                job.add_time("restore", share)

    @torch.inference_mode()
    def restore_crops(self, crops: Sequence[np.ndarray]) -> np.ndarray:
        """[B, S, S, 3] uint8 -> restored [B, S, S, 3] uint8, one generator call."""
        return self.restorer.restore_crops(crops)

    # -- stage 3
    def finish(self, job: ImageJob) -> Picture | None:
        """Paste the restored faces back into the picture (the result is also stored on the job)."""
        if job.status == "error":
            return None
        t = time.perf_counter()
        pic = job.picture
        s = self.settings
        if not job.faces or s.strength <= 0:
            job.result = pic
        elif s.aligned:
            job.result = pic.with_pixels(self._blend_aligned(pic, job.faces[0]))
        else:
            masks = self.parser.masks([f.restored for f in job.faces]) if s.parse_mask else [None] * len(job.faces)
            paste = []
            for face, mask in zip(job.faces, masks, strict=True):
                restored = face.restored
                if s.soften_small_faces and is_small_face(face.detection.box):
                    restored = soften(restored)
                paste.append(PasteFace(restored, face.inverse, mask))
            fn = paste_faces if s.face_crop else paste_faces_full_frame
            job.result = pic.with_pixels(fn(pic.rgb, paste, s.strength))
        job.status = "ok" if job.faces else "no_face"
        job.add_time("paste", time.perf_counter() - t)
        return job.result

    def _blend_aligned(self, pic: Picture, face: FaceCrop) -> np.ndarray:
        w, h = pic.size
        restored = face.restored
        if (w, h) != (self.size, self.size):
            restored = cv2.resize(restored, (w, h), interpolation=cv2.INTER_AREA if w < self.size else cv2.INTER_LINEAR)
        scale, top = (257.0, 65535) if pic.bits == 16 else (1.0, 255)
        bg = pic.rgb.astype(np.float32)
        out = bg + self.settings.strength * (restored.astype(np.float32) * scale - bg)
        return np.clip(np.rint(out), 0, top).astype(pic.rgb.dtype)

    def write(self, job: ImageJob, path: str | Path, fmt: str) -> Path:
        """Encode atomically; an untouched picture in its own format is copied byte for byte (no re-encoding)."""
        t = time.perf_counter()
        pic = job.picture
        if job.result is pic and pic is not None and pic.path is not None and fmt == pic.format:
            job.output = copy_file(pic.path, path)
        else:
            job.output = write_image(job.result, path, fmt)
        job.add_time("encode", time.perf_counter() - t)
        return job.output

    def close(self) -> None:
        for part in (self._detector, self._parser):
            if part is not None and hasattr(part, "close"):
                part.close()
        self._detector = self._parser = None


# ---------------------------------------------------------------------------------------------------- drivers


@dataclass
class OutputNaming:
    """Where each output goes: `pattern` with {name} (input stem), {suffix} and {ext}."""

    outdir: Path
    ext: str | None = None               # None: same format as the input
    suffix: str = ""
    pattern: str = "{name}{suffix}.{ext}"

    def path_for(self, job: ImageJob, stem: str) -> tuple[Path, str]:
        from gpen_tune.imageio import output_format

        fmt, ext = output_format(self.ext, job.picture)
        path = self.outdir / self.pattern.format(name=stem, suffix=self.suffix, ext=ext)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path, fmt


def enhance_paths(
    paths: Sequence[str | Path],
    naming: OutputNaming,
    enhancer: Enhancer,
    *,
    images_per_step: int = 8,
    stems: Sequence[str] | None = None,
    on_job: Callable[[ImageJob], None] | None = None,
    save_faces: bool = False,
    save_comparison: bool = False,
) -> list[ImageJob]:
    """Serial driver: prepare a few images, restore all their faces across images, finish and write them."""
    stems = list(stems) if stems is not None else [Path(p).stem for p in paths]
    jobs: list[ImageJob] = []
    for start in range(0, len(paths), images_per_step):
        step = enhancer.prepare(paths[start:start + images_per_step])
        enhancer.restore(step)
        for job, stem in zip(step, stems[start:start + images_per_step], strict=True):
            if job.status != "error":
                try:
                    enhancer.finish(job)
                    out, fmt = naming.path_for(job, stem)
                    enhancer.write(job, out, fmt)
                    if save_faces:
                        _save_faces(job, naming, stem, fmt)
                    if save_comparison:
                        _save_comparison(job, naming, stem, fmt)
                except (OSError, ValueError) as e:
                    job.status, job.error = "error", f"{job.source}: {e}"
            if on_job:
                on_job(job)
            job.picture = job.result = None              # free the pixels; the report keeps the rest
            for face in job.faces:
                face.crop = face.restored = None
            jobs.append(job)
    return jobs


def _save_faces(job: ImageJob, naming: OutputNaming, stem: str, fmt: str) -> None:
    from gpen_tune.imageio import FORMAT_TO_EXT

    for i, face in enumerate(job.faces):
        if face.restored is None:
            continue
        path = naming.outdir / "faces" / f"{stem}_face{i:02d}.{FORMAT_TO_EXT[fmt]}"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_image(Picture(np.hstack([face.crop, face.restored])), path, fmt)


def _save_comparison(job: ImageJob, naming: OutputNaming, stem: str, fmt: str) -> None:
    from gpen_tune.imageio import FORMAT_TO_EXT

    path = naming.outdir / "comparisons" / f"{stem}.{FORMAT_TO_EXT[fmt]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_image(Picture(np.hstack([job.picture.rgb8(), job.result.rgb8()])), path, fmt)


def enhance_image(
    image: str | Path | np.ndarray,
    settings: EnhanceSettings | None = None,
    *,
    enhancer: Enhancer | None = None,
    **overrides,
) -> np.ndarray:
    """Restore every face of one image; returns the result as an array (gray, RGB or RGBA, as the input).

    Example: `gpen_tune.enhance_image("photo.jpg", weights="GPEN-BFR-512", device="cuda")`.
    """
    from gpen_tune.imageio import to_array

    if settings is None:
        settings = EnhanceSettings(**overrides)
    elif overrides:
        settings = EnhanceSettings(**{**asdict(settings), **overrides})
    own = enhancer is None
    enhancer = enhancer or Enhancer(settings)
    try:
        (job,) = enhancer.prepare([image])
        if job.status == "error":
            raise ImageReadError(job.error)
        enhancer.restore([job])
        return to_array(enhancer.finish(job))
    finally:
        if own:
            enhancer.close()
