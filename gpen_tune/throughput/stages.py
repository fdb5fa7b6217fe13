"""The face pipeline's stages (gpen_tune.face.pipeline.Enhancer) cut per image for the folder runner.

The serial driver `enhance_paths` calls `Enhancer.prepare / restore / finish / write` on a few images at a time;
here the same calls run one image at a time in worker threads, and the restore step is replaced by the runner's
cross-image batches (same tensors in, same conversion out). Output names come from the same `OutputNaming`.
Paste-back runs on the GPU (`gpu_paste.paste_faces_device`) for 8-bit images when the generator is on CUDA and
the default feathered mask is used (every size with the one-kernel Triton paste, else from GPU_PASTE_MIN_PIXELS);
everything else uses the CPU paste of the face part. Images that take the GPU paste also have their faces cut on
the GPU (`face.warp_triton`, same bits as the CPU crop): the prepare thread uploads the image once, one kernel
cuts all its faces, the GPU stage stacks the device crops into its batch, and the paste reads the same upload.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PASTE_MODES = ("auto", "cpu", "gpu")
# GPEN_TUNE_CUT=cpu: cut every face on the CPU even where the GPU could (A/B measurements)
CUT_ON_DEVICE = os.environ.get("GPEN_TUNE_CUT", "") != "cpu"
GPU_PASTE_MIN_PIXELS = 2_000_000     # auto: GPU paste from about 1920x1080 up (smaller frames paste fast on the CPU)


@dataclass
class _Item:
    index: int
    job: Any                         # gpen_tune.face.pipeline.ImageJob
    image_device: Any = None         # [H, W, 3] uint8 on the GPU when the faces were cut there (GPU paste reuses it)
    crops_device: Any = None         # [F, S, S, 3] uint8 on the GPU: the faces cut there


class EnhancerStages:
    """prepare / crops / finish of an `Enhancer`, thread-safe, one image per call.

    Args:
        enhancer: a built Enhancer (its detector is created here, before the worker threads start).
        naming: where outputs go (`OutputNaming`, as the serial driver).
        stems: output stem per input index (default: each input's stem).
        paste: "auto" (GPU on CUDA: every frame with the Triton paste, else frames >= GPU_PASTE_MIN_PIXELS),
            "cpu" or "gpu".
        save_faces / save_comparison: the serial driver's extra outputs.
        detector_process: run the detector in a process of its own (service "process" of
            `gpen_tune.face.detect.init_detector`, opt-in:
            its start costs ~10 s; H200, 4,096 photos: 693 vs 625 faces/s with the detector thread,
            benchmarks/results/20261201-081014) instead of a thread of this one (service "thread"); refused with
            a lazy detector.

    Attribute `cut_on_device` (default: wherever the GPU paste and the crop kernel can run, unless the module's
    CUT_ON_DEVICE is off): cut the faces of GPU-pasted images on the GPU; False cuts every crop on the CPU.
    """

    def __init__(self, enhancer: Any, naming: Any, paths: Sequence[Path], stems: Sequence[str] | None = None,
                 paste: str = "auto", save_faces: bool = False, save_comparison: bool = False,
                 detector_process: bool = False):
        if paste not in PASTE_MODES:
            raise ValueError(f"paste must be one of {', '.join(PASTE_MODES)}, got {paste!r}")
        self.enhancer = enhancer
        self.naming = naming
        self.stems = list(stems) if stems is not None else [Path(p).stem for p in paths]
        self.paste = paste
        self.save_faces = save_faces
        self.save_comparison = save_comparison
        # build lazily-created parts once, here: their properties are not safe to race from worker threads
        if not enhancer.settings.aligned:
            enhancer.serve_detector("process" if detector_process else "thread")
            _ = enhancer.detector
        if enhancer.settings.parse_mask and not enhancer.settings.aligned and enhancer.settings.strength > 0:
            _ = enhancer.parser
        self.cut_on_device = False
        if self.device_paste_possible:
            from gpen_tune.face import warp_triton
            from gpen_tune.throughput import paste_triton

            paste_triton.warm_up(enhancer.device)        # compile the kernels before the workers need them
            warp_triton.warm_up(enhancer.device)
            self.cut_on_device = CUT_ON_DEVICE and warp_triton.available(enhancer.device)

    @property
    def device_paste_possible(self) -> bool:
        """Whether any image can take the GPU paste (the runner then keeps restored crops on the device)."""
        s = self.enhancer.settings
        return (self.paste != "cpu" and self.enhancer.device.type == "cuda" and s.face_crop and not s.aligned
                and not s.parse_mask and s.strength > 0)

    def before_restore(self) -> None:
        if not self.enhancer.settings.aligned:
            self.enhancer.detector.before_restore()

    # -- stages -------------------------------------------------------------------------------------------------
    def prepare(self, index: int, path: Path) -> _Item:
        from gpen_tune.imageio import ImageReadError

        (job,) = self.enhancer.prepare([path], warp=not self.cut_on_device)
        if job.status == "error":
            raise ImageReadError(job.error)
        return self._cut(_Item(index, job))

    def prepare_many(self, indices: Sequence[int], paths: Sequence[Path]) -> list[_Item | Exception]:
        """Several images with one detector call (same-size images share a forward pass on the GPU)."""
        from gpen_tune.imageio import ImageReadError

        jobs = self.enhancer.prepare(list(paths), warp=not self.cut_on_device)
        out: list[_Item | Exception] = []
        for i, job in zip(indices, jobs, strict=True):
            if job.status == "error":
                out.append(ImageReadError(job.error))
                continue
            try:
                out.append(self._cut(_Item(i, job)))
            except Exception as exc:    # noqa: BLE001 - one image's failure is reported for that image only
                out.append(exc)
        return out

    def _cut(self, item: _Item) -> _Item:
        """Cut the faces left uncut by `prepare(warp=False)`: on the GPU for images the GPU will paste (the upload
        serves both), else on the CPU (also with --save-faces, which writes each host crop beside its restoration)."""
        job = item.job
        if not self.cut_on_device or not job.faces or self.enhancer.settings.strength <= 0:
            return item
        if not self._use_device_paste(job) or self.save_faces:
            self.enhancer.cut_faces(job)
            return item
        import time

        import torch

        from gpen_tune.face import warp_triton
        from gpen_tune.ops.transfer import thread_stream

        t = time.perf_counter()
        dev = self.enhancer.device
        tables = warp_triton.face_tables([f.affine for f in job.faces], self.enhancer.size)
        stream = thread_stream(dev)
        with torch.cuda.stream(stream):
            # a pageable copy: through page-locked staging measured slower (569 vs 616 / 628 faces/s,
            # benchmarks/results/20261201-075538)
            item.image_device = torch.from_numpy(np.ascontiguousarray(job.picture.rgb)).to(dev, non_blocking=True)
            item.crops_device = warp_triton.warp_crops(item.image_device,
                                                       torch.from_numpy(tables).to(dev, non_blocking=True))
        stream.synchronize()          # the GPU stage reads the crops on the generator's stream
        job.add_time("align", time.perf_counter() - t)
        return item

    def crops(self, item: _Item) -> Sequence[Any]:
        """Host crops [S,S,3] uint8, or device crops when they were cut on the GPU."""
        if self.enhancer.settings.strength <= 0:
            return []
        if item.crops_device is not None:
            return list(item.crops_device.unbind(0))
        return [f.crop for f in item.job.faces]

    def needs_host_restored(self, item: _Item) -> bool:
        """Whether `finish` reads the restored crops on the host (CPU paste, saved faces or comparisons); the GPU
        stage skips their download when no image of a batch does."""
        return item.image_device is None or self.save_faces or self.save_comparison

    def restored(self, item: _Item, seconds: float) -> None:
        """The runner's per-face share of its batch's time, as the serial path's "restore" timing."""
        item.job.add_time("restore", seconds)

    def finish(self, item: _Item, restored: list[np.ndarray], restored_device: list[Any] | None = None) -> Path:
        job = item.job
        for face, crop in zip(job.faces, restored, strict=False):   # empty when strength is 0
            face.restored = crop
        if restored_device is not None and self._use_device_paste(job):
            self._finish_on_device(job, restored_device, item.image_device)
        else:
            self.enhancer.finish(job)
        stem = self.stems[item.index]
        out, fmt = self.naming.path_for(job, stem)
        self.enhancer.write(job, out, fmt)
        if self.save_faces or self.save_comparison:
            from gpen_tune.face import pipeline

            if self.save_faces:
                pipeline._save_faces(job, self.naming, stem, fmt)
            if self.save_comparison:
                pipeline._save_comparison(job, self.naming, stem, fmt)
        job.picture = job.result = None                  # free the pixels; the report keeps the rest
        item.image_device = item.crops_device = None
        for face in job.faces:
            face.crop = face.restored = None
        return out

    # -- GPU paste ----------------------------------------------------------------------------------------------
    def _use_device_paste(self, job: Any) -> bool:
        if not self.device_paste_possible or not job.faces or job.picture.bits != 8:
            return False
        w, h = job.picture.size
        return self.paste == "gpu" or self._one_kernel_paste or w * h >= GPU_PASTE_MIN_PIXELS

    @property
    def _one_kernel_paste(self) -> bool:
        """auto: with the one-kernel Triton paste the GPU pastes every size (H200 A/B/A, 20261201-044008:
        459 vs 391/439 faces/s); GPU_PASTE_MIN_PIXELS is for the PyTorch version's per-call costs."""
        from gpen_tune.throughput import gpu_paste, paste_triton

        return gpu_paste.USE_TRITON and paste_triton.available(self.enhancer.device)

    def _finish_on_device(self, job: Any, restored_device: list[Any], image_device: Any = None) -> None:
        import time

        import torch

        from gpen_tune.face.paste import face_mask, is_small_face
        from gpen_tune.ops.transfer import thread_stream
        from gpen_tune.throughput.gpu_paste import DeviceFace, paste_faces_device

        t = time.perf_counter()
        s = self.enhancer.settings
        faces = [DeviceFace(dev, face.inverse, face_mask(dev.shape[0]),
                            soften=s.soften_small_faces and face.detection is not None
                            and is_small_face(face.detection.box))
                 for face, dev in zip(job.faces, restored_device, strict=True)]
        stream = thread_stream(restored_device[0].device)          # off the generator's stream
        with torch.cuda.stream(stream):
            pixels = paste_faces_device(job.picture.rgb, faces, s.strength, base_device=image_device)
        stream.synchronize()
        job.result = job.picture.with_pixels(pixels)
        job.status = "ok"
        job.add_time("paste", time.perf_counter() - t)
