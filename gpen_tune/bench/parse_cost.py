"""`bench --parse-mask`: the ParseNet paste mask's cost next to the generator's.

The parser is the pipeline's (`gpen_tune.face.parse.load_parser`, so its dtype rule: bf16 on CUDA, fp32 on the
CPU), timed on the bench's face crops at every batch size, on the bench's device, as the device paste calls it:
uint8 crops on the device -> soft masks there (resize to 512, forward, argmax, class mask, feather, resize back).
Weights: --parse-weights, else the cached official file, else a seeded random ParseNet in the official layout
(said in the log and the results; the cost does not depend on the weights).

In the pipeline the parser runs after the generator on the same device, so a row's "+ parse mask" numbers are the
sum of the two medians at the same batch size (ms/face) and its inverse (faces/s). The parser is measured once
(the generator's switches do not change it), before the rows, and freed before them so that their memory peaks
stay the generator's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from gpen_tune.bench.measure import peaks, reset_memory, reset_peak, summary, time_calls, timed_once
from gpen_tune.face.parse import (
    PARSE_SIZE,
    SYNTHETIC,
    FaceParser,
    build_parse_net,
    load_parser,
    mask_area_iou,
    timing_parse_weights,
)
from gpen_tune.model.io import to_uint8_nhwc


def parse_gflop_per_face() -> float:
    """ParseNet's GFLOP per 512 px face (counted on the meta device: no memory, no compute)."""
    with torch.device("meta"):
        net = build_parse_net()
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        net(torch.empty(1, 3, PARSE_SIZE, PARSE_SIZE, device="meta"))
    return counter.get_total_flops() / 1e9


def weights_label(weights: Path | str) -> str:
    if weights == SYNTHETIC:
        return ("synthetic (seeded random ParseNet in the official layout: no ParseNet-latest.pth or "
                "parsing_parsenet.pth cached; the cost does not depend on the weights)")
    return str(weights)


def measure_parser(faces: torch.Tensor, device: torch.device, batch_sizes: Sequence[int], repeats: int,
                   warmup: int, weights: str | None = None, log: Callable[[str], None] = print) -> dict:
    """The parser alone per batch size (median, IQR, memory peaks, warm-up), its dtype and, where that is not
    fp32, its masks' IoU against fp32's on the same crops. Bad weights raise ParseMaskError (one line)."""
    chosen = weights if weights is not None else timing_parse_weights()
    parser = load_parser(True, device, chosen)
    info = {"weights": weights_label(parser.weights), "synthetic": parser.weights == SYNTHETIC,
            "dtype": str(parser.dtype).removeprefix("torch."), "size": PARSE_SIZE,
            "gflop_per_face": round(parse_gflop_per_face(), 1)}
    log(f"parse mask: ParseNet {PARSE_SIZE} px, {info['dtype']} on {device}, weights: {info['weights']}")
    crops = to_uint8_nhwc(faces.to(device))
    try:
        per_batch = {str(bs): _time_batch(parser, crops, bs, device, repeats, warmup, log) for bs in batch_sizes}
        info["mask_iou_vs_fp32"] = _iou_vs_fp32(parser, crops, log)
    except Exception as e:  # a broken parser must not lose the generator's rows
        log(f"  parse mask error: {type(e).__name__}: {str(e)[:300]}")
        return info | {"status": "error", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
    finally:
        del parser, crops
        reset_memory(device)
    timed = {bs: b for bs, b in per_batch.items() if "error" not in b}
    best = max(timed, key=lambda b: timed[b]["faces_per_s"]) if timed else None
    return info | {"status": "ok", "per_batch": per_batch,
                   "ms_per_face_bs1": timed["1"]["ms_per_face"] if "1" in timed else None,
                   "best_batch": int(best) if best else None,
                   "best_faces_per_s": timed[best]["faces_per_s"] if best else None}


def _iou_vs_fp32(parser: FaceParser, crops: torch.Tensor, log: Callable[[str], None]) -> float | None:
    """IoU of the parser's masks against an fp32 parser's on the same crops (None when it computes in fp32)."""
    if parser.dtype == torch.float32:
        return None
    masks = parser.masks_device(crops)
    reference = FaceParser(parser.device, parser.weights, precision="fp32", download=False)
    iou = mask_area_iou(reference.masks_device(crops), masks)
    log(f"  mask IoU {str(parser.dtype).removeprefix('torch.')} vs fp32 on {crops.shape[0]} crops: {iou:.4f}")
    return iou


def _time_batch(parser: FaceParser, crops: torch.Tensor, bs: int, device: torch.device, repeats: int, warmup: int,
                log: Callable[[str], None]) -> dict:
    """One batch size: a first call (cuDNN search, reported as warm-up), `warmup` more, `repeats` timed."""
    n = crops.shape[0]
    x = crops[[i % n for i in range(bs)]]
    try:
        reset_peak(device)
        _, warm_s = timed_once(lambda: parser.masks_device(x), device)
        for _ in range(warmup):
            parser.masks_device(x)
        reset_peak(device)
        times = time_calls(lambda: parser.masks_device(x), device, repeats)
    except torch.OutOfMemoryError as e:
        log(f"  parse mask bs {bs:>3}: out of memory")
        reset_memory(device)
        return {"error": f"OutOfMemoryError: {str(e).splitlines()[0][:200]}"}
    stats = summary(times)
    entry = {**stats, "ms_per_face": stats["median_ms"] / bs, "faces_per_s": 1000.0 * bs / stats["median_ms"],
             **peaks(device), "warmup_s": warm_s, "times_ms": [round(t, 4) for t in times]}
    log(f"  parse mask bs {bs:>3}: {stats['median_ms']:.2f} ms/call, {entry['ms_per_face']:.2f} ms/face, "
        f"rel IQR {stats['rel_iqr']:.3f}, warm-up {warm_s:.2f} s")
    return entry


def add_parse_mask(entry: dict, parse: dict) -> None:
    """A measured row's generator + parse mask numbers (sum of the medians at each batch size both measured)."""
    both = {}
    for bs, gen in entry["per_batch"].items():
        mask = parse["per_batch"].get(bs)
        if mask is not None and "error" not in mask:
            ms = gen["ms_per_face"] + mask["ms_per_face"]
            both[bs] = {"ms_per_face": ms, "faces_per_s": 1000.0 / ms}
    best = max(both, key=lambda b: both[b]["faces_per_s"]) if both else None
    entry["with_parse_mask"] = {"per_batch": both,
                                "ms_per_face_bs1": both["1"]["ms_per_face"] if "1" in both else None,
                                "best_batch": int(best) if best else None,
                                "best_faces_per_s": both[best]["faces_per_s"] if best else None}
