"""Patch `face-crop` for upstream yangxy/GPEN 2c73670 (face_enhancement.py).

Upstream detects on the full image (only above 1500 px does RetinaFace shrink it to 1000) and, for every face,
warps the mask and the face onto full-frame canvases and runs four full-frame np.where passes and a full-frame
float64 blend: CPU time grows with the photo, not with the faces (upstream on an H200: 1.25 s of 2.39 s on Solvay).
Edit: FaceEnhancement.process starts with
`if gpen_tune_runtime.face_crop_on() and not aligned: return gpen_tune_runtime.face_crop_process(self, img)`,
which runs the same per-face steps through the same objects (self.facedetector, facegan, faceparser,
mask_postprocess, kernel, alpha, threshold, reference_5pts, align_faces.warp_and_crop_face), but detects on a
copy whose long side is at most GPEN_TUNE_DET_SIZE (default 1024; boxes and landmarks scaled back) and limits
warps, compositing and the final blend to each face's region (identical pixels outside: the mask is 0 there).
Switch: GPEN_TUNE_FACE_CROP=1 (+ GPEN_TUNE_DET_SIZE=N), or demo.py --face_crop [--det_size N]. Off: upstream.
"""

from __future__ import annotations

import libcst as cst

from gpen_tune.patcher.cst_tools import (
    RUNTIME,
    add_import,
    assigned_self_attrs,
    code,
    expected,
    method,
    param_names,
    prepend,
    replace_top,
    statements,
    top_level_class,
    top_level_imports,
)
from gpen_tune.patcher.spec import EditContext, FileEdit, Patch

USED_ATTRS = ("facedetector", "facegan", "faceparser", "srmodel", "use_sr", "in_size", "out_size", "threshold",
              "alpha", "kernel", "reference_5pts")


def edit_face_enhancement(module: cst.Module, ctx: EditContext) -> cst.Module:
    module = add_import(module, ctx.path)
    names = [i for i in top_level_imports(module) if isinstance(i, cst.ImportFrom)
             and not isinstance(i.names, cst.ImportStar) and any(code(a.name) == "warp_and_crop_face" for a in i.names)]
    if not names:
        raise expected(ctx.path, "`from align_faces import warp_and_crop_face, ...`")
    cls = top_level_class(module, "FaceEnhancement", ctx.path)
    have = assigned_self_attrs(method(cls, "__init__", ctx.path))
    missing = [a for a in USED_ATTRS if a not in have]
    if missing:
        raise expected(ctx.path, f"FaceEnhancement.__init__ to set self.{', self.'.join(missing)}")
    method(cls, "mask_postprocess", ctx.path)
    process = method(cls, "process", ctx.path)
    params = param_names(process)
    if len(params) != 3 or params[2] != "aligned":
        raise expected(ctx.path, "`FaceEnhancement.process(self, img, aligned=False)`")
    hook = statements(
        f"if {RUNTIME}.face_crop_on() and not {params[2]}:  # gpen-tune: GPEN_TUNE_FACE_CROP\n"
        f"    return {RUNTIME}.face_crop_process(self, {params[1]})\n")
    new_cls = cls.with_changes(body=cls.body.with_changes(body=[
        prepend(s, hook) if s is process else s for s in cls.body.body]))
    return replace_top(module, cls, new_cls)


PATCH = Patch(
    name="face-crop",
    summary="detection on a downscaled copy; paste-back limited to each face's region",
    switches=("GPEN_TUNE_FACE_CROP", "GPEN_TUNE_DET_SIZE"),
    edits=(FileEdit("face_enhancement.py", edit_face_enhancement, "process(): optional region-limited path"),),
    requires=("runtime",),
)
