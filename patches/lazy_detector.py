"""Patch `lazy-detector` for upstream yangxy/GPEN 2c73670 (face_enhancement.py).

Upstream's FaceEnhancement.__init__ builds RetinaFace, the GPEN wrapper, RealESRNet and ParseNet, always: the SR
model (and its weight file) is needed even without --use_sr, and the detector stays resident next to the GAN.
Edits:
  * `self.facedetector = ...`, `self.srmodel = ...`, `self.faceparser = ...` become
    `gpen_tune_runtime.lazy('<name>', lambda: <upstream expression>)`: with GPEN_TUNE_LAZY_DETECTOR on, each is
    built on first attribute access (SR only with --use_sr, the parser only when a face is pasted back);
  * after `facebs, landms = self.facedetector.detect(img)` a call `gpen_tune_runtime.after_detect(self)` frees
    the detector when GPEN_TUNE_LAZY_DETECTOR=release (re-built for the next image);
  * a method `FaceEnhancement.release_detector()` for user scripts.
Switch off (default): `lazy()` returns the upstream object itself, built in __init__ as before.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from gpen_tune.patcher.cst_tools import (
    RUNTIME,
    add_import,
    add_to_class,
    code,
    expected,
    insert_around,
    method,
    replace_top,
    self_assignments,
    statements,
    top_level_class,
)
from gpen_tune.patcher.spec import EditContext, FileEdit, Patch

LAZY_ATTRS = ("facedetector", "srmodel", "faceparser")


def _is_detect(stmt: cst.BaseStatement) -> bool:
    detect = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("facedetector")),
                                     attr=m.Name("detect")))
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(value=detect)]))


def edit_face_enhancement(module: cst.Module, ctx: EditContext) -> cst.Module:
    module = add_import(module, ctx.path)
    cls = top_level_class(module, "FaceEnhancement", ctx.path)
    init = method(cls, "__init__", ctx.path)
    new_init = init
    for attr in LAZY_ATTRS:
        found = self_assignments(new_init, attr)
        if len(found) != 1:
            raise expected(ctx.path, f"exactly one `self.{attr} = ...` in FaceEnhancement.__init__")
        value = found[0].value
        wrapped = cst.parse_expression(f"{RUNTIME}.lazy({attr!r}, lambda: {code(value)})")
        new_init = new_init.deep_replace(found[0], found[0].with_changes(value=wrapped))
    process = method(cls, "process", ctx.path)
    new_process, n = insert_around(process, _is_detect, after=lambda s: statements(
        f"{RUNTIME}.after_detect(self)  # gpen-tune: GPEN_TUNE_LAZY_DETECTOR=release frees the detector here\n"))
    if n != 1:
        raise expected(ctx.path, "one `... = self.facedetector.detect(img)` in FaceEnhancement.process")
    mapping = {id(init): new_init, id(process): new_process}
    new_cls = cls.with_changes(body=cls.body.with_changes(body=[mapping.get(id(s), s) for s in cls.body.body]))
    new_cls = add_to_class(new_cls, statements(
        "def release_detector(self):\n"
        "    '''gpen-tune: free the face detector now (with GPEN_TUNE_LAZY_DETECTOR on it is re-built on use).'''\n"
        f"    {RUNTIME}.release(self.facedetector)\n"))
    return replace_top(module, cls, new_cls)


PATCH = Patch(
    name="lazy-detector",
    summary="detector, SR model and face parser built on first use; detector releasable",
    switches=("GPEN_TUNE_LAZY_DETECTOR",),
    edits=(FileEdit("face_enhancement.py", edit_face_enhancement,
                    "lazy detector/SR/parser; after_detect(); release_detector()"),),
    requires=("runtime",),
)
