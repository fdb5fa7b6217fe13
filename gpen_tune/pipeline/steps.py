"""The contract between an executor and the steps: three calls, the same for every executor (the serial loop, the
threaded scheduler, the device lanes and worker processes of `gpen_tune.distributed`, the Ray Data stages, a
service).

    steps = pipeline.steps(sink)                  # one per run: the detector, restorer, parser and sink it drives
    jobs = steps.prepare(jobs)                    # decode, detect, track (ordered sources), align, cut; the
                                                  #   placement (host or device paste) decided once, on the job
    batch = steps.restore(faces)                  # a generator batch of faces [(job, k), ...] of any images, with
    done = batch.collect()                        #   its parse masks; `collect` returns the jobs it completed
    steps.finish(job)                             # paste, and hand the job to the sink (every job, failed too)

Each call is safe from several threads at once. A failure of an image (`IMAGE_ERRORS`) stays on its job (status
"error", one line naming the input; anything else is a bug and propagates): `collect` returns the jobs a failed
batch failed, and `finish` passes a failed job to an ordered sink (a
video writes that frame as it came in) and frees its pixels. An ordered source's tracker runs inside `prepare`
in source order whichever thread prepared the frame; an ordered sink is written in source order by `finish`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import cv2
import numpy as np
import torch

from gpen_tune.background.upscale import scale_inverse, upscale_alpha
from gpen_tune.device_memory import cuda_total
from gpen_tune.face.align import alignment, cut_faces, cut_faces_device
from gpen_tune.face.detect import Detection
from gpen_tune.face.detect.services import follow_faces
from gpen_tune.face.paste import RestoredFace, blend_aligned, is_small_face, paste_image
from gpen_tune.imageio import Picture, picture_from_array, read_image
from gpen_tune.ops import paste as paste_op
from gpen_tune.ops import warp_crop
from gpen_tune.ops.transfer import thread_stream
from gpen_tune.pipeline.job import IMAGE_ERRORS, FaceCrop, ImageJob, one_line
from gpen_tune.pipeline.keyframes import KeyFrames
from gpen_tune.pipeline.settings import EnhanceSettings

FaceRef = tuple[ImageJob, int]          # face k of a job

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


def as_picture(item: Picture | np.ndarray | str) -> Picture:
    """A decoded picture from what a source's loader returns: a Picture, an array, or a path to read."""
    if isinstance(item, Picture):
        return item
    if isinstance(item, np.ndarray):
        return picture_from_array(item)
    return read_image(item)


class Steps:
    """decode + detect + track + align (`prepare`), generator + parse mask (`restore`), paste + sink (`finish`).

    Args:
        settings: the pipeline's choices.
        restorer: the Restorer (None for a caller that only prepares or finishes, e.g. a Ray CPU stage).
        sink: where `finish` hands jobs (None for a caller that writes itself).
        size, device: the crop size and the generator's device (default: the restorer's).
        detector: a face detector service (`gpen_tune.face.detect`), None for aligned inputs.
        parser: a FaceParser (`gpen_tune.face.parse.load_parser`), None for the feathered mask.
        upscaler: a BackgroundUpscaler (`gpen_tune.background.upscale.load_upscaler`) or None.
        face_crop: False = the upstream-like full-frame paste (comparison only).
        cut_on_device: cut the faces of device-pasted images on the device (one upload serves crop and paste).
        paste_impl: implementation of the device paste / crop kernels ("auto" | "triton" | "torch").
        save_faces: the sink writes host crops beside their restorations, so crops stay on the host.
        save_mask: keep the paste's blend weights on the job (`job.blend_weights`) for the sink.
        tracker: for ordered sources (video): `update(detections, meta) -> detections`, called by `prepare` in
            source order between detection and alignment (tracking, landmark smoothing, gap filling).
        before_restore: called before each generator batch (the lazy detector's release).
    """

    def __init__(self, settings: EnhanceSettings, restorer: Any = None, sink: Any = None, *, size: int | None = None,
                 device: torch.device | None = None, detector: Any = None, parser: Any = None, upscaler: Any = None,
                 face_crop: bool = True, cut_on_device: bool = True, paste_impl: str = "auto",
                 save_faces: bool = False, save_mask: bool = False, tracker: Any = None,
                 before_restore: Callable[[], None] | None = None):
        self.settings, self.restorer, self.sink = settings, restorer, sink
        self.size = size or restorer.size
        self.device = device if device is not None else restorer.device
        self.detector, self.parser, self.upscaler = detector, parser, upscaler
        self.face_crop, self.paste_impl = face_crop, paste_impl
        self.save_faces, self.save_mask = save_faces, save_mask
        self.tracker, self.before_restore = tracker, before_restore
        self.one_kernel_paste = self.device_paste_possible and (
            paste_impl == "triton" or (paste_impl == "auto" and paste_op.available(self.device)))
        self.cut_on_device = (cut_on_device and self.device_paste_possible and not save_faces
                              and (paste_impl != "auto" or warp_crop.available(self.device)))
        if self.one_kernel_paste:
            paste_op.warm_up(self.device)       # compile the kernels before the workers need them
        if self.cut_on_device:
            warp_crop.warm_up(self.device)
        self._turn = _InTurn()
        self._written = _InOrder(sink) if sink is not None and getattr(sink, "ordered", False) else None

    @property
    def restoring(self) -> bool:
        return self.settings.strength > 0

    @functools.cached_property
    def device_paste_possible(self) -> bool:
        """Whether any image can take the device paste. Fixed for the run's life."""
        s = self.settings
        if s.paste == "cpu" or self.device.type != "cuda" or not self.face_crop or s.aligned:
            return False
        if s.paste == "auto" and (cuda_total(self.device) or 0) < DEVICE_PASTE_MIN_BYTES:
            return False
        return self.upscaler is None and self.restoring

    def _placement(self, job: ImageJob) -> bool:
        """The placement of one image, decided once (in `prepare`): whether its faces are pasted on the device."""
        if not self.device_paste_possible or not job.faces or job.picture is None or job.picture.bits != 8:
            return False
        w, h = job.picture.size
        return self.settings.paste == "gpu" or self.one_kernel_paste or w * h >= GPU_PASTE_MIN_PIXELS

    # -- prepare: decode, detect, track, align, cut ------------------------------------------------------------
    def prepare(self, jobs: Sequence[ImageJob]) -> list[ImageJob]:
        """Decode every job (through its loader), detect faces in all of them with one detector call, track them
        (an ordered source: in source order), align and cut. A failure stays on its job."""
        tracked: set[int] = set()
        keys = self._key_frames
        try:
            for job in jobs:
                self._decode(job)
            live = [j for j in jobs if j.status != "error"]
            if self.settings.aligned:
                for job in live:
                    self._align_whole(job)
                return list(jobs)
            found = self._detect(live) if keys is None else self._detect_keyed(live, keys)
            for job in jobs:
                dets = found.get(id(job))
                if self.tracker is not None:
                    dets = self._track(job, dets)
                    tracked.add(id(job))
                if dets is not None:
                    self._align(job, dets)
            return list(jobs)
        finally:
            if self.tracker is not None:            # frames that never reached the tracker: later ones go on
                self._turn.skip([j.index for j in jobs if id(j) not in tracked])
            if keys is not None:                    # key frames with no detection: their frames detect in full
                for job in jobs:
                    keys.give_up(job.index)

    def _decode(self, job: ImageJob) -> None:
        t = time.perf_counter()
        try:
            job.picture = as_picture(job.load())
            job.size = job.picture.size
        except IMAGE_ERRORS as e:
            job.fail(one_line(job.source, e))
        job.load = None
        job.add_time("decode", time.perf_counter() - t)

    def _detect(self, jobs: list[ImageJob]) -> dict[int, list[Detection]]:
        if not jobs:
            return {}
        t = time.perf_counter()
        found = self.detector.detect([j.picture.rgb8() for j in jobs])
        share = (time.perf_counter() - t) / len(jobs)
        for job in jobs:
            job.add_time("detect", share)
        return {id(job): dets for job, dets in zip(jobs, found, strict=True)}

    @property
    def _key_frames(self) -> KeyFrames | None:
        return getattr(self.tracker, "key_frames", None)

    def _detect_keyed(self, jobs: list[ImageJob], keys: KeyFrames) -> dict[int, list[Detection]]:
        """A video with key frames: key frames detected in full (their faces published at once), the frames
        between following their key frame's faces; one whose key frame has no answer is detected in full."""
        t = time.perf_counter()
        key_jobs = [j for j in jobs if keys.is_key(j.index)]
        found = dict(zip(map(id, key_jobs), self.detector.detect([j.picture.rgb8() for j in key_jobs]),
                         strict=True)) if key_jobs else {}
        for job in key_jobs:
            keys.publish(job.index, np.array([d.box for d in found[id(job)]]).reshape(-1, 4))
        full, follow = [], []
        for job in jobs:
            if id(job) not in found:
                boxes = keys.boxes_for(job.index)
                if boxes is None:
                    full.append(job)
                elif len(boxes):
                    follow.append((job, boxes))
                else:
                    found[id(job)] = []
        if follow:
            images = [j.picture.rgb8() for j, _ in follow]
            for (job, boxes), dets in zip(follow, follow_faces(self.detector, images, [b for _, b in follow]),
                                          strict=True):
                if len(dets) < len(boxes):      # a face lost (moved too far, or left): this frame in full
                    full.append(job)
                else:
                    found[id(job)] = dets
        if full:
            found.update(zip(map(id, full), self.detector.detect([j.picture.rgb8() for j in full]), strict=True))
        share = (time.perf_counter() - t) / len(jobs) if jobs else 0.0
        for job in jobs:
            job.add_time("detect", share)
        return found

    def _track(self, job: ImageJob, dets: list[Detection] | None) -> list[Detection] | None:
        """The ordered step of a tracked source: this frame's detections smoothed against the earlier frames',
        once every earlier frame has had its turn (a failed frame passes its turn without a call)."""
        with self._turn.of(job.index):
            if dets is None or job.status == "error":
                return None
            t = time.perf_counter()
            dets = self.tracker.update(dets, job.meta)
            job.add_time("align", time.perf_counter() - t)
            return dets

    def _align(self, job: ImageJob, dets: list[Detection]) -> None:
        """Faces of `dets` aligned to the template, the placement decided, then cut (host or device)."""
        t = time.perf_counter()
        if self.settings.only_center_face:
            dets = center_face(dets, *job.picture.size)
        for det in dets:
            affine, inverse = alignment(det.landmarks, self.size, self.settings.template)
            job.faces.append(FaceCrop(None, affine, inverse, det))
        job.on_device = self._placement(job)
        job.add_time("align", time.perf_counter() - t)
        self._cut(job)

    def _cut(self, job: ImageJob) -> None:
        """On the device for images the device will paste (the upload serves both), else on the host."""
        if not job.faces or not self.restoring:
            return
        t = time.perf_counter()
        affines = [f.affine for f in job.faces]
        if self.cut_on_device and job.on_device:
            stream = thread_stream(self.device)
            with torch.cuda.stream(stream):
                # a pageable copy: through page-locked staging measured slower (569 vs 616 / 628 faces/s,
                # benchmarks/results/20261201-075538)
                job.image_device = torch.from_numpy(np.ascontiguousarray(job.picture.rgb)).to(self.device,
                                                                                              non_blocking=True)
                crops = cut_faces_device(job.image_device, affines, self.size, impl=self.paste_impl)
            stream.synchronize()          # the restorer reads the crops on its own stream
            for face, crop in zip(job.faces, crops.unbind(0), strict=True):
                face.crop = crop
        else:
            for face, crop in zip(job.faces, cut_faces(job.picture.rgb8(), affines, self.size), strict=True):
                face.crop = crop
        job.waiting = len(job.faces)
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
        job.waiting = 1 if self.restoring else 0
        job.add_time("align", time.perf_counter() - t)

    # -- restore: generator and parse mask -----------------------------------------------------------------------
    def restore(self, faces: Sequence[FaceRef]) -> RestoreBatch:
        """Start one generator batch (at most the restorer's limit) and the parse masks right behind it on the same
        device and stream; `collect()` waits for both. Failures are the batch's (see `RestoreBatch.collect`)."""
        if self.before_restore is not None:
            self.before_restore()
        batch = RestoreBatch(self, list(faces))
        try:
            # the host copy of the restorations only when an image of the batch pastes (or saves them) on the host
            download = any(job.image_device is None for job, _ in batch.faces)
            batch.pending = self.restorer.submit([job.faces[k].crop for job, k in batch.faces], download=download)
            t = time.perf_counter()
            batch.masks = self._start_masks(batch.faces, batch.pending.device_out)
            batch.parse_s = time.perf_counter() - t     # the parse computed here (the CPU) is not the restore's time
        except KeyboardInterrupt:
            raise
        except IMAGE_ERRORS as e:
            batch.error = e
        return batch

    def _start_masks(self, faces: list[FaceRef], restored: Any) -> Any:
        """The parse masks of a restored batch [B, S, S, 3] uint8 (still on its device), queued behind it; None
        without a parser. Device-pasted images keep device masks, the others a host copy (one download)."""
        if self.parser is None or not self.restoring or self.settings.aligned or restored is None or not faces:
            return None
        inverses = [self._paste_inverse(job.faces[k].inverse) for job, k in faces]
        download = any(not job.on_device for job, _ in faces)
        return self.parser.start(restored, inverses, download)

    def keep_masks(self, faces: Sequence[FaceRef], restored: Any) -> None:
        """The parse masks of restored crops [B, S, S, 3] onto their faces, for a caller that ran the generator
        itself (the service batches the faces of requests with different options)."""
        masks = self._start_masks(list(faces), restored)
        if masks is None:
            return
        device, host, seconds = masks.result()
        for i, (job, k) in enumerate(faces):
            job.faces[k].parse_mask = device[i] if job.on_device else host[i]
            job.add_time("parse", seconds / len(faces))

    def _paste_inverse(self, inverse: np.ndarray) -> np.ndarray:
        """A face's crop -> output affine: the image's, or the upscaled background's."""
        return inverse if self.upscaler is None else scale_inverse(inverse, self.upscaler.scale)

    # -- finish: paste and sink ----------------------------------------------------------------------------------
    def finish(self, job: ImageJob) -> None:
        """Paste the restored faces back (the result on the job) and hand the job to the sink: an unordered sink
        gets the jobs that succeeded, an ordered one every job in source order. Then the pixels are freed."""
        if job.status not in ("error", "dropped"):
            try:
                self.paste(job)
                if self.sink is not None and self._written is None:
                    self.sink.write(job)
            except IMAGE_ERRORS as e:
                job.fail(one_line(job.source, e))
        if self._written is not None:
            if job.status == "error":
                job.release()                   # the frame is written as it came in (the source item's meta)
            self._written.offer(job)
        elif self.sink is not None:
            job.release(meta=True)

    def paste(self, job: ImageJob) -> Picture:
        """The faces pasted back where the placement says (`gpen_tune.face.paste`); the result on the job."""
        t = time.perf_counter()
        pic, s = job.picture, self.settings
        if not job.faces or not self.restoring:
            job.result = pic if self.upscaler is None else self._upscaled(pic)
        elif s.aligned:
            job.result = pic.with_pixels(blend_aligned(pic.rgb, job.faces[0].restored, s.strength))
        else:
            base, alpha = pic.rgb, pic.alpha
            if self.upscaler is not None:
                base = self.upscaler.upscale(base)
                alpha = None if alpha is None else upscale_alpha(alpha, self.upscaler.scale)
            faces = [RestoredFace(f.restored_device if job.on_device else f.restored,
                                  f.inverse if job.on_device else self._paste_inverse(f.inverse),
                                  f.parse_mask, s.soften_small_faces and f.detection is not None
                                  and is_small_face(f.detection.box)) for f in job.faces]
            pixels, job.blend_weights = paste_image(base, faces, s.strength, on_device=job.on_device,
                                                    base_device=job.image_device, full_frame=not self.face_crop,
                                                    impl=self.paste_impl, want_weights=self.save_mask)
            result = pic.with_pixels(pixels)
            job.result = result if alpha is pic.alpha else replace(result, alpha=alpha)
        job.status = "ok" if job.faces else "no_face"
        job.add_time("paste", time.perf_counter() - t)
        return job.result

    def _upscaled(self, pic: Picture) -> Picture:
        """The whole frame through the background upscaler (a photo without faces too, as upstream)."""
        alpha = None if pic.alpha is None else upscale_alpha(pic.alpha, self.upscaler.scale)
        return replace(pic.with_pixels(self.upscaler.upscale(pic.rgb)), alpha=alpha)


class RestoreBatch:
    """One generator batch in flight (`Steps.restore`), with its parse masks."""

    def __init__(self, steps: Steps, faces: list[FaceRef]):
        self.steps, self.faces = steps, faces
        self.pending: Any = None
        self.masks: Any = None
        self.parse_s = 0.0
        self.error: BaseException | None = None

    def __len__(self) -> int:
        return len(self.faces)

    def done(self) -> bool:
        """Whether the device has finished this batch (never blocks)."""
        return self.pending is None or self.pending.done()

    def collect(self) -> list[ImageJob]:
        """Wait for the batch; each face's restoration (host, and on the device for device-pasted images) and parse
        mask onto its job. Returns the jobs this batch completed: every face restored (ready for `finish`), or
        failed by this batch (each failed job once, with the batch's error)."""
        if self.error is None:
            try:
                out = self.pending.result()
                self._keep(out)
            except KeyboardInterrupt:
                raise
            except IMAGE_ERRORS as e:
                self.error = e
        jobs = list({id(job): job for job, _ in self.faces}.values())
        if self.error is not None:
            failed = [job for job in jobs if job.status != "error"]
            for job in failed:
                job.fail(one_line(job.source, self.error))
            return failed
        return [job for job in jobs if job.waiting == 0 and job.status != "error"]

    def _keep(self, out: list[np.ndarray | None]) -> None:
        pending, steps = self.pending, self.steps
        share = (time.perf_counter() - pending.submitted_at - self.parse_s) / len(self.faces)
        masks = self.masks
        if masks is not None and pending.device_out is not masks.source:
            # the restorer replaced the batch (the fp32 re-run of a non-finite face): parse the replacement
            masks = steps.parser.start(pending.device_out, [steps._paste_inverse(job.faces[k].inverse)
                                                            for job, k in self.faces], masks.downloads)
        device_masks, host_masks, parse_s = masks.result() if masks is not None else (None, None, 0.0)
        for i, (job, k) in enumerate(self.faces):
            if job.status == "error":
                continue
            face = job.faces[k]
            face.restored = out[i]
            if job.on_device:
                face.restored_device = pending.device_out[i]
            if masks is not None:
                face.parse_mask = device_masks[i] if job.on_device else host_masks[i]
                job.add_time("parse", parse_s / len(self.faces))
            job.add_time("restore", share)
            job.waiting -= 1


class _InTurn:
    """Turns in source order across threads: `of(index)` waits until every earlier index has had its turn or
    was skipped."""

    def __init__(self) -> None:
        self.next = 0
        self.skipped: set[int] = set()
        self.cond = threading.Condition()

    def of(self, index: int) -> _Turn:
        return _Turn(self, index)

    def skip(self, indices: Sequence[int]) -> None:
        with self.cond:
            self.skipped.update(i for i in indices if i >= self.next)
            self._advance()

    def _advance(self) -> None:
        while self.next in self.skipped:
            self.skipped.discard(self.next)
            self.next += 1
        self.cond.notify_all()


class _Turn:
    def __init__(self, turns: _InTurn, index: int):
        self.turns, self.index = turns, index

    def __enter__(self) -> None:
        with self.turns.cond:
            while self.turns.next < self.index:
                self.turns.cond.wait()

    def __exit__(self, *exc: object) -> None:
        with self.turns.cond:
            self.turns.next = max(self.turns.next, self.index + 1)
            self.turns._advance()


class _InOrder:
    """An ordered sink fed from any thread: jobs are held until every earlier one has come, then written in source
    order (a failed job too: a video writes that frame as it came in) and let go, the source item's meta (a
    decoded frame) included."""

    def __init__(self, sink: Any):
        self.sink = sink
        self.next = 0
        self.held: dict[int, ImageJob] = {}
        self.lock = threading.Lock()

    def offer(self, job: ImageJob) -> None:
        with self.lock:
            self.held[job.index] = job
            while self.next in self.held:
                ready = self.held.pop(self.next)
                self.next += 1
                try:
                    self.sink.write(ready)
                except IMAGE_ERRORS as e:
                    ready.fail(one_line(ready.source, e))
                ready.release(meta=True)
