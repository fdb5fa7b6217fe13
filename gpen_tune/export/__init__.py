"""Exports of the generator for other runtimes: `export_onnx` (ONNX, the facefusion/ReActor GPEN convention).

Needs the `[onnx]` extra (onnx, onnxscript, onnxruntime); a missing package is one line naming it.
"""
