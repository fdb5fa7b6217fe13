"""The gpen-tune patch set for an upstream GPEN checkout (yangxy/GPEN, commit 2c73670).

One module per optimization (lazy_detector, torch_compile, amp, act_checkpoint, face_crop, cuda_graph), each
with a docstring saying what it changes and why, plus three internal pieces they pull in (runtime_base,
native_ops, generator_runner). Every edit is a libcst transform; the run-time switch logic is our own module
runtime/gpen_tune_runtime.py, copied into the checkout. Applied by `gpen-tune apply-patches`.
"""

from __future__ import annotations

from . import (
    act_checkpoint,
    amp,
    cuda_graph,
    face_crop,
    generator_runner,
    lazy_detector,
    native_ops,
    runtime_base,
    torch_compile,
)

# canonical order: edits of one file are always composed in this order, starting from the pristine file
ALL = (
    runtime_base.PATCH,
    native_ops.PATCH,
    generator_runner.PATCH,
    lazy_detector.PATCH,
    torch_compile.PATCH,
    amp.PATCH,
    act_checkpoint.PATCH,
    face_crop.PATCH,
    cuda_graph.PATCH,
)
BY_NAME = {p.name: p for p in ALL}
PUBLIC = tuple(p.name for p in ALL if p.public)
