"""The per-image steps of the pipeline, each calling the one home of its work:

    decode  gpen_tune.imageio.read_image (photos) or a source's frames
    detect  gpen_tune.face.detect (a detector service shared by the scheduler's threads)
    align   gpen_tune.face.align (template, similarity; crops cut on the host or on the device)
    restore gpen_tune.restore.Restorer (called by the scheduler, which batches faces across images)
    parse   gpen_tune.face.parse (optional mask): each generator batch, on its device (`parse_batch`/`keep_masks`)
    paste   gpen_tune.face.paste (host or device)
    encode  a sink (gpen_tune.pipeline.sinks)

`Stages` holds no scheduling: the scheduler (gpen_tune.pipeline.scheduler) calls `prepare` / `crops` /
`parse_batch` + `keep_masks` (around each restorer batch) / `finish` from its threads, or inline for the serial
path; every method is safe to call from several threads.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import cv2
import numpy as np
import torch

from gpen_tune.background.upscale import scale_inverse, upscale_alpha
from gpen_tune.device_memory import cuda_total
from gpen_tune.face.align import alignment, cut_faces, cut_faces_device
from gpen_tune.face.detect import Detection, default_notify
from gpen_tune.face.parse import PendingMasks
from gpen_tune.face.paste import (
    DeviceFace,
    PasteFace,
    blend_weights,
    default_mask,
    is_small_face,
    paste_faces,
    paste_faces_device,
    paste_faces_full_frame,
    soften,
)
from gpen_tune.imageio import ImageReadError, Picture, picture_from_array, read_image
from gpen_tune.ops import paste as paste_op
from gpen_tune.ops import warp_crop
from gpen_tune.ops.transfer import thread_stream
from gpen_tune.pipeline.job import FaceCrop, ImageJob, one_line_text
from gpen_tune.pipeline.settings import EnhanceSettings

# auto paste without the one-kernel paste: on the GPU from about 1920x1080 up (smaller frames paste fast on the
# CPU; the PyTorch twin's per-face calls cost more than the host paste below that)
GPU_PASTE_MIN_PIXELS = 2_000_000
# paste "auto" keeps images and crops on the device only where this process may use at least this much of it:
# on a small GPU the images in flight (up to the scheduler's bound, each with its crops and restorations) would
# outgrow the 4 GiB mode's 700 MiB budget (benchmarks/results/20261202-010124_low_memory_low-memory.json:
# device crops and kept restorations 96 MiB of the peak); there faces are cut and pasted on the CPU
DEVICE_PASTE_MIN_BYTES = 8 * 2**30


def center_face(detections: list[Detection], width: int, height: int) -> list[Detection]:
    """The face whose box centre is closest to the image centre (as facexlib's only_center_face)."""
    if len(detections) <= 1:
        return detections
    c = np.array([width / 2, height / 2])
    dist = [np.linalg.norm((d.box[:2] + d.box[2:]) / 2 - c) for d in detections]
    return [detections[int(np.argmin(dist))]]


@dataclass
class BatchParse:
    """The parse masks of one generator batch in flight: its faces (job, face index), their paste inverses, and
    whether the scheduler hands this batch's restored crops on the device to `finish` (`device_paste`)."""

    faces: list[tuple[ImageJob, int]]
    inverses: list[np.ndarray]
    device_paste: bool
    pending: PendingMasks


class Stages:
    """decode + detect + align (`prepare`), the crops for the restorer (`crops`), paste (`finish`).

    Args:
        settings: the pipeline's choices.
        size: the generator's crop size.
        device: where the generator runs (device crops and the device paste use it).
        detector: a face detector (`gpen_tune.face.detect`), None for aligned inputs.
        parser: a FaceParser (`gpen_tune.face.parse.load_parser`), None for the feathered mask.
        upscaler: a BackgroundUpscaler (`gpen_tune.background.upscale.load_upscaler`) or None.
        save_mask: keep the paste's blend weights on the job (`job.blend_weights`) for the sink.
        face_crop: False = the upstream-like full-frame paste (comparison only).
        cut_on_device: cut the faces of device-pasted images on the device (one upload serves crop and paste).
        paste_impl: implementation of the device paste / crop kernels ("auto" | "triton" | "torch").
        save_faces: the sink writes host crops beside their restorations, so crops stay on the host.
        tracker: for ordered sources (video): `update(detections, meta) -> detections` called in source order
            (tracking, landmark smoothing, gap filling) between detection and alignment, by `sequence`.
    """

    def __init__(self, settings: EnhanceSettings, size: int, device: torch.device, detector: Any = None,
                 parser: Any = None, *, face_crop: bool = True, cut_on_device: bool = True,
                 paste_impl: str = "auto", save_faces: bool = False, tracker: Any = None, upscaler: Any = None,
                 save_mask: bool = False, notify: Callable[[str], None] = default_notify):
        self.settings = settings
        self.size = size
        self.device = device
        self.detector = detector
        self.parser = parser
        self.upscaler = upscaler
        self.save_mask = save_mask
        self.face_crop = face_crop
        self.paste_impl = paste_impl
        self.save_faces = save_faces
        self.tracker = tracker
        self.notify = notify
        self.one_kernel_paste = self.device_paste_possible and (
            paste_impl == "triton" or (paste_impl == "auto" and paste_op.available(device)))
        self.cut_on_device = (cut_on_device and self.device_paste_possible and not save_faces
                              and (paste_impl != "auto" or warp_crop.available(device)))
        if self.one_kernel_paste:
            paste_op.warm_up(device)             # compile the kernels before the workers need them
        if self.cut_on_device:
            warp_crop.warm_up(device)

    @property
    def restoring(self) -> bool:
        return self.settings.strength > 0

    @functools.cached_property
    def device_paste_possible(self) -> bool:
        """Whether any image can take the device paste (the scheduler then keeps restored crops there). Fixed for
        the stages' life, read once: `uses_device_paste` asks it for every image."""
        s = self.settings
        if s.paste == "cpu" or self.device.type != "cuda" or not self.face_crop or s.aligned:
            return False
        if s.paste == "auto" and (cuda_total(self.device) or 0) < DEVICE_PASTE_MIN_BYTES:
            return False
        return self.upscaler is None and self.restoring

    def uses_device_paste(self, job: ImageJob) -> bool:
        if not self.device_paste_possible or not job.faces or job.picture is None or job.picture.bits != 8:
            return False
        w, h = job.picture.size
        return self.settings.paste == "gpu" or self.one_kernel_paste or w * h >= GPU_PASTE_MIN_PIXELS

    # -- decode, detect, align ---------------------------------------------------------------------------------
    def prepare(self, jobs: Sequence[ImageJob], loaders: Sequence[Callable[[], Picture | np.ndarray | str]]
                ) -> list[ImageJob]:
        """Decode every job (through its loader), detect faces in all of them with one detector call, align and
        cut. A failure stays on its job (status "error", one line naming the input)."""
        for job, load in zip(jobs, loaders, strict=True):
            t = time.perf_counter()
            try:
                job.picture = as_picture(load())
                job.size = job.picture.size
            except IMAGE_ERRORS as e:
                job.fail(one_line(job.source, e))
            job.add_time("decode", time.perf_counter() - t)
        live = [j for j in jobs if j.status != "error"]
        if self.settings.aligned:
            for job in live:
                self._align_whole(job)
            return list(jobs)
        if live:
            t = time.perf_counter()
            found = self.detector.detect([j.picture.rgb8() for j in live])
            share = (time.perf_counter() - t) / len(live)
            for job, dets in zip(live, found, strict=True):
                job.add_time("detect", share)
                if self.tracker is None:
                    self.align(job, dets)
                else:
                    job.detections = dets            # aligned by `sequence`, in source order
        return list(jobs)

    def sequence(self, job: ImageJob) -> None:
        """The ordered step of a tracked source: smooth this frame's detections against the earlier frames,
        then align and cut. The scheduler calls it once per job, in source order."""
        if job.status == "error" or job.detections is None:
            return
        dets, job.detections = job.detections, None
        t = time.perf_counter()
        dets = self.tracker.update(dets, job.meta)
        job.add_time("align", time.perf_counter() - t)
        self.align(job, dets)

    def align(self, job: ImageJob, dets: list[Detection]) -> None:
        """Faces of `dets` aligned to the template, then cut (host or device)."""
        t = time.perf_counter()
        if self.settings.only_center_face:
            dets = center_face(dets, *job.picture.size)
        for det in dets:
            affine, inverse = alignment(det.landmarks, self.size, self.settings.template)
            job.faces.append(FaceCrop(None, affine, inverse, det))
        job.add_time("align", time.perf_counter() - t)
        self._cut(job)

    def _cut(self, job: ImageJob) -> None:
        """On the device for images the device will paste (the upload serves both), else on the host."""
        if not job.faces or not self.restoring:
            return
        t = time.perf_counter()
        affines = [f.affine for f in job.faces]
        if self.cut_on_device and self.uses_device_paste(job):
            stream = thread_stream(self.device)
            with torch.cuda.stream(stream):
                # a pageable copy: through page-locked staging measured slower (569 vs 616 / 628 faces/s,
                # benchmarks/results/20261201-075538)
                job.image_device = torch.from_numpy(np.ascontiguousarray(job.picture.rgb)).to(self.device,
                                                                                              non_blocking=True)
                job.crops_device = cut_faces_device(job.image_device, affines, self.size, impl=self.paste_impl)
            stream.synchronize()          # the restorer reads the crops on its own stream
        else:
            for face, crop in zip(job.faces, cut_faces(job.picture.rgb8(), affines, self.size), strict=True):
                face.crop = crop
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

    # -- restore (the scheduler batches) -----------------------------------------------------------------------
    def crops(self, job: ImageJob) -> list[Any]:
        """The job's crops for the restorer: host [S,S,3] uint8, or device tensors when cut there."""
        if not self.restoring:
            return []
        if job.crops_device is not None:
            return list(job.crops_device.unbind(0))
        return [f.crop for f in job.faces]

    def needs_host_restored(self, job: ImageJob) -> bool:
        """Whether `finish` reads the restored crops on the host; the scheduler skips their download when no
        image of a batch does."""
        return job.image_device is None or self.save_faces

    # -- parse (each generator batch) -------------------------------------------------------------------------
    def parse_batch(self, faces: Sequence[tuple[ImageJob, int]], restored: Any, device_paste: bool
                    ) -> BatchParse | None:
        """Start the parse masks of a restored batch [B, S, S, 3] uint8 (the restorer's `device_out`, still on its
        device) behind it on the same stream, one batch for all its faces; None without a parser (or nothing to
        parse). `device_paste`: the scheduler hands the batch to `finish` on the device (its device-pasted images
        keep device masks; the others get a host copy, downloaded once for the batch)."""
        if self.parser is None or not self.restoring or self.settings.aligned or restored is None or not faces:
            return None
        inverses = [self._paste_inverse(job.faces[k].inverse) for job, k in faces]
        download = any(not (device_paste and self.uses_device_paste(job)) for job, _ in faces)
        return BatchParse(list(faces), inverses, device_paste, self.parser.start(restored, inverses, download))

    def keep_masks(self, parse: BatchParse | None, restored: Any) -> None:
        """After the batch's result: each face's mask on its FaceCrop, each image the share of the parse time of
        its faces. `restored` is the batch as collected: when the restorer replaced it (the fp32 re-run of a
        non-finite batch) the masks are parsed again from the replacement."""
        if parse is None:
            return
        if restored is not parse.pending.source:
            parse.pending = self.parser.start(restored, parse.inverses, parse.pending.downloads)
        device, host, seconds = parse.pending.result()
        share = seconds / len(parse.faces)
        for i, (job, k) in enumerate(parse.faces):
            face = job.faces[k]
            if parse.device_paste and self.uses_device_paste(job):
                face.parse_mask_device = device[i]
            else:
                face.parse_mask = host[i]
            job.add_time("parse", share)

    def _parse_image(self, job: ImageJob, restored: Sequence[Any], device_paste: bool) -> None:
        """The masks of an image whose faces came without them (a caller that restores without `parse_batch`,
        e.g. the Ray Data path): its faces as one batch."""
        have = [f.parse_mask_device if device_paste else f.parse_mask for f in job.faces]
        if self.parser is None or all(m is not None for m in have):
            return
        batch = torch.stack(list(restored)) if device_paste else torch.from_numpy(np.stack(restored))
        self.keep_masks(self.parse_batch([(job, k) for k in range(len(job.faces))], batch, device_paste), batch)

    def _paste_inverse(self, inverse: np.ndarray) -> np.ndarray:
        """A face's crop -> output affine: the image's, or the upscaled background's."""
        return inverse if self.upscaler is None else scale_inverse(inverse, self.upscaler.scale)

    # -- paste -------------------------------------------------------------------------------------------------
    def finish(self, job: ImageJob, restored: Sequence[np.ndarray | None],
               restored_device: Sequence[Any] | None = None) -> Picture:
        """Paste the restored faces back; the result is stored on the job (and returned)."""
        for face, crop in zip(job.faces, restored, strict=False):   # empty when strength is 0
            face.restored = crop
        t = time.perf_counter()
        pic, s = job.picture, self.settings
        if not job.faces or not self.restoring:
            job.result = pic if self.upscaler is None else self._upscaled(pic)
        elif restored_device is not None and self.uses_device_paste(job):
            job.result = pic.with_pixels(self._paste_device(job, restored_device))
        elif s.aligned:
            job.result = pic.with_pixels(self._blend_aligned(pic, job.faces[0]))
        else:
            job.result = self._paste_host(job)
        job.status = "ok" if job.faces else "no_face"
        job.add_time("paste", time.perf_counter() - t)
        return job.result

    def _upscaled(self, pic: Picture) -> Picture:
        """The whole frame through the background upscaler (a photo without faces too, as upstream)."""
        alpha = None if pic.alpha is None else upscale_alpha(pic.alpha, self.upscaler.scale)
        return replace(pic.with_pixels(self.upscaler.upscale(pic.rgb)), alpha=alpha)

    def _paste_host(self, job: ImageJob) -> Picture:
        """Host paste: the faces' parse masks (from their batches), optional background upscale, blend."""
        pic, s = job.picture, self.settings
        restored = [f.restored for f in job.faces]
        self._parse_image(job, restored, device_paste=False)
        base, alpha = pic.rgb, pic.alpha
        if self.upscaler is not None:
            base = self.upscaler.upscale(base)
            alpha = None if alpha is None else upscale_alpha(alpha, self.upscaler.scale)
        paste = []
        for face, crop in zip(job.faces, restored, strict=True):
            if s.soften_small_faces and face.detection is not None and is_small_face(face.detection.box):
                crop = soften(crop)
            paste.append(PasteFace(crop, self._paste_inverse(face.inverse), face.parse_mask))
        if self.save_mask:
            job.blend_weights = blend_weights(base.shape[:2], paste, s.strength)
        fn = paste_faces if self.face_crop else paste_faces_full_frame
        result = pic.with_pixels(fn(base, paste, s.strength))
        return result if alpha is pic.alpha else replace(result, alpha=alpha)

    def _paste_device(self, job: ImageJob, restored_device: Sequence[Any]) -> np.ndarray:
        """Paste on one stream off the generator's, through the faces' device parse masks (finished: the scheduler
        collected their batch) or the feathered square; one synchronisation."""
        s = self.settings
        self._parse_image(job, restored_device, device_paste=True)
        stream = thread_stream(restored_device[0].device)
        with torch.cuda.stream(stream):
            faces = [DeviceFace(dev, face.inverse,
                                default_mask(dev.shape[0], face.inverse) if self.parser is None
                                else face.parse_mask_device,
                                soften=s.soften_small_faces and face.detection is not None
                                and is_small_face(face.detection.box))
                     for face, dev in zip(job.faces, restored_device, strict=True)]
            if self.save_mask:
                job.blend_weights = blend_weights(job.picture.rgb.shape[:2], faces, s.strength)
            pixels = paste_faces_device(job.picture.rgb, faces, s.strength, base_device=job.image_device,
                                        impl=self.paste_impl)
        stream.synchronize()
        return pixels

    def _blend_aligned(self, pic: Picture, face: FaceCrop) -> np.ndarray:
        w, h = pic.size
        restored = face.restored
        if (w, h) != (self.size, self.size):
            restored = cv2.resize(restored, (w, h), interpolation=cv2.INTER_AREA if w < self.size else cv2.INTER_LINEAR)
        scale, top = (257.0, 65535) if pic.bits == 16 else (1.0, 255)
        bg = pic.rgb.astype(np.float32)
        out = bg + self.settings.strength * (restored.astype(np.float32) * scale - bg)
        return np.clip(np.rint(out), 0, top).astype(pic.rgb.dtype)


def as_picture(item: Picture | np.ndarray | str) -> Picture:
    """A decoded picture from what a source's loader returns: a Picture, an array, or a path to read."""
    if isinstance(item, Picture):
        return item
    if isinstance(item, np.ndarray):
        return picture_from_array(item)
    return read_image(item)


# What fails one image and not the run, on either scheduler: a bad file, a failed step, memory running out (the
# threaded scheduler also fails its whole prepare group on anything else)
IMAGE_ERRORS = (ImageReadError, ValueError, OSError, RuntimeError, MemoryError, cv2.error)


def one_line(source: str, exc: BaseException) -> str:
    """One line naming the input: the exception's own message when it already does (ImageReadError)."""
    shown = one_line_text(source)                  # a file name with a line break stays on the line
    text = str(exc).strip().replace(source, shown)
    msg = text.splitlines()[0] if text else ""
    if shown in msg:
        return msg
    return f"{shown}: {type(exc).__name__}" + (f": {msg}" if msg else "")
