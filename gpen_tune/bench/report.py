"""Bench result -> JSON file, markdown table and PNG plot (matplotlib, Agg), each written atomically."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from gpen_tune.file_mode import new_file_mode


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, new_file_mode())           # the user's umask, as the images (mkstemp makes 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stem(result: dict) -> str:
    meta = result["meta"]
    dev = re.sub(r"[^A-Za-z0-9]+", "-", meta.get("device_name", meta["device_type"])).strip("-").lower()
    return f"bench-{meta['model']}-{dev}"[:120]


def _num(v, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if v is None else fmt.format(v)


def _mem(row: dict, bs: str | None) -> tuple[str, str]:
    b = row["per_batch"].get(bs) if bs else None
    if b and b["peak_allocated_mib"] is None and bs == "1" and row.get("traced_activation_peak_mib_bs1"):
        return f"{row['traced_activation_peak_mib_bs1']:,.1f} (activations, traced)", "-"
    if not b or b["peak_allocated_mib"] is None:
        return "-", "-"
    return f"{b['peak_allocated_mib']:,.0f}", f"{b['peak_reserved_mib']:,.0f}"


def _stability(row: dict, bs: str) -> str:
    b = row["per_batch"].get(bs)
    if not b:
        return "-"
    return f"{b['rel_iqr'] * 100:.1f}% / {b['max_abs_vs_bs1']:.1e}"


def _quality(row: dict) -> tuple[str, str]:
    if "max_abs" not in row:
        return "-", "-"
    if row["max_abs"] == 0:
        return "identical", "0"
    return _num(row.get("psnr_db"), "{:.1f}", "identical"), f"{row['max_abs']:.1e}"


def _detector(row: dict) -> str:
    d = row.get("detector_memory")
    if not d:
        return "-"
    if "reason" in d:
        return "n/a"
    return f"{d['restore_peak_allocated_mib']:,.0f}" + (" (released)" if d["released"] else " (resident)")


def _cell(text: str) -> str:
    """One markdown table cell: no line breaks, pipes escaped (error reasons carry both)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _precision(meta: dict) -> str:
    """How the fp32 default row really computes (TF32 tensor cores or true fp32)."""
    if meta["device_type"] != "cuda":
        return "fp32"
    conv = "TF32 convs" if meta.get("cudnn_allow_tf32") else "fp32 convs"
    mm = "TF32 matmuls" if meta.get("matmul_allow_tf32") else "fp32 matmuls"
    return f"{conv}, {mm} ({meta.get('tf32', 'PyTorch defaults')})"


def _parse(result: dict) -> dict | None:
    """The parse mask's measurement when it ran (`bench --parse-mask`), else None."""
    parse = result.get("parse_mask")
    return parse if parse and parse["status"] == "ok" else None


def markdown_table(result: dict) -> str:
    """The docs' switch table (docs/optimizations.md): one line per row; skipped rows say why. With the parse
    mask measured: generator + parse mask columns, and the parser's own table below."""
    meta, parse = result["meta"], _parse(result)
    header = ["row", "ms/face bs1", "faces/s (best bs)"]
    if parse:
        header += ["ms/face bs1 + parse mask", "faces/s + parse mask (best bs)"]
    header += ["peak alloc MiB bs1 / best", "peak reserved MiB bs1 / best", "bs4 rel IQR / max-abs vs bs1",
               "bs16 rel IQR / max-abs vs bs1", "PSNR dB vs fp32", "max-abs vs fp32", "warm-up s",
               "restore peak with detector MiB"]
    lines = [
        f"**{meta['model']}** on {meta.get('device_name', meta['device_type'])}, torch {meta['torch']}"
        f"{' / CUDA ' + meta['cuda'] if meta.get('cuda') and meta['device_type'] == 'cuda' else ''}, "
        f"{meta['faces']} real face crops ({meta['inputs']}), {meta['date']}. fp32 default: {_precision(meta)}."
        + ("" if meta.get("complete", True) else " **Partial: the run has not finished (rows so far).**"),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in result["rows"]:
        if row["status"] != "ok":
            lines.append(f"| {_cell(row['label'])} | {row['status']}: {_cell(row['reason'])} |"
                         + "  |" * (len(header) - 2))
            continue
        best = str(row["best_batch"])
        a1, r1 = _mem(row, "1")
        ab, rb = _mem(row, best)
        q, m = _quality(row)
        notes = " ⚠ " + "; ".join(row["fallbacks"]) if row["fallbacks"] else ""
        cells = [_cell(row["label"] + notes), _num(row["ms_per_face_bs1"]),
                 f"{row['best_faces_per_s']:.1f} (bs {best})"]
        if parse:
            cells += _with_parse(row)
        cells += [f"{a1} / {ab}", f"{r1} / {rb}", _stability(row, "4"), _stability(row, "16"), q, m,
                  f"{row['warmup_s_total']:.1f}", _detector(row)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _parse_lines(result)
    lines += ["", f"Command: `{meta['command']}`", ""]
    return "\n".join(lines)


def _with_parse(row: dict) -> list[str]:
    both = row.get("with_parse_mask")
    if not both or both["best_batch"] is None:
        return ["-", "-"]
    return [_num(both["ms_per_face_bs1"]), f"{both['best_faces_per_s']:.1f} (bs {both['best_batch']})"]


def _parse_lines(result: dict) -> list[str]:
    """The parse mask alone: what it ran as, then one line per batch size (or why it did not run)."""
    parse = result.get("parse_mask")
    if not parse:
        return []
    if parse["status"] != "ok":
        return ["", f"Parse mask: {parse['status']}: {_cell(parse['reason'])}"]
    iou = parse.get("mask_iou_vs_fp32")
    lines = ["", f"Parse mask (`--parse-mask`): ParseNet {parse['size']} px, {parse['gflop_per_face']} GFLOP/face, "
             f"{parse['dtype']} on the same device (the pipeline's choice)"
             + (f", mask IoU vs fp32 {iou:.4f}" if iou is not None else "") + f"; weights: {_cell(parse['weights'])}. "
             "The + parse mask columns add its median ms/face at the same batch size (it runs after the generator).",
             "", "| parse mask bs | ms/call | ms/face | faces/s | rel IQR | peak alloc MiB | peak reserved MiB "
             "| warm-up s |", "|---|---|---|---|---|---|---|---|"]
    for bs, b in parse["per_batch"].items():
        if "error" in b:
            lines.append(f"| {bs} | {_cell(b['error'])} |  |  |  |  |  |  |")
            continue
        lines.append(f"| {bs} | {b['median_ms']:.2f} | {b['ms_per_face']:.2f} | {b['faces_per_s']:.1f} "
                     f"| {b['rel_iqr'] * 100:.1f}% | {_num(b['peak_allocated_mib'], '{:,.0f}')} "
                     f"| {_num(b['peak_reserved_mib'], '{:,.0f}')} | {b['warmup_s']:.1f} |")
    return lines


def plot(result: dict, path: Path) -> None:
    """Three panels per measured row: ms/face at bs1, best faces/s, peak allocated MiB at the best batch; with the
    parse mask measured, the first two also show generator + parse mask (a second, lighter bar per row)."""
    import matplotlib  # optional: matplotlib (the plot only)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional: matplotlib (the plot only)

    rows = [r for r in result["rows"] if r["status"] == "ok"]
    names = [r["label"] for r in rows]
    on_gpu = any(b["peak_allocated_mib"] is not None for r in rows for b in r["per_batch"].values())
    if on_gpu:
        memory = ("peak allocated MiB at batch 1", [r["per_batch"].get("1", {}).get("peak_allocated_mib") or 0
                                                     for r in rows], None)
    else:
        memory = ("activation peak MiB at batch 1 (traced, CPU)",
                  [r.get("traced_activation_peak_mib_bs1") or 0 for r in rows], None)
    parse = _parse(result)
    both = [r.get("with_parse_mask") or {} for r in rows]
    panels = [
        ("ms / face at batch 1 (lower is better)", [r["ms_per_face_bs1"] or 0 for r in rows],
         [b.get("ms_per_face_bs1") or 0 for b in both] if parse else None),
        ("faces / s at the best batch (higher is better)", [r["best_faces_per_s"] for r in rows],
         [b.get("best_faces_per_s") or 0 for b in both] if parse else None),
        memory,
    ]
    fig, axes = plt.subplots(1, 3, figsize=(16, (0.7 if parse else 0.45) * max(len(rows), 3) + 1.8))
    for ax, (title, values, with_parse) in zip(axes, panels, strict=True):
        _bars(ax, names, values, with_parse)
        if needs_log_scale(values + (with_parse or [])):
            ax.set_xscale("log")
            title += " [log scale]"
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    meta = result["meta"]
    fig.suptitle(f"gpen-tune bench: {meta['model']} on {meta.get('device_name', meta['device_type'])} "
                 f"(torch {meta['torch']})" + (f"; parse mask {parse['dtype']}" if parse else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def _bars(ax, names: list[str], values: list[float], with_parse: list[float] | None) -> None:
    """One bar per row, or two (generator alone, generator + parse mask) with a legend."""
    if with_parse is None:
        ax.bar_label(ax.barh(names, values, color="#4878a8"), fmt="%.4g", fontsize=7, padding=2)
        return
    ys = list(range(len(names)))
    alone = ax.barh([y - 0.2 for y in ys], values, height=0.4, color="#4878a8", label="generator")
    plus = ax.barh([y + 0.2 for y in ys], with_parse, height=0.4, color="#a8c4de", label="+ parse mask")
    for bars in (alone, plus):
        ax.bar_label(bars, fmt="%.4g", fontsize=7, padding=2)
    ax.set_yticks(ys, names)
    ax.legend(fontsize=7, loc="best")


LOG_SCALE_RATIO = 10.0


def needs_log_scale(values: list[float]) -> bool:
    """A panel whose largest bar is over LOG_SCALE_RATIO x its smallest non-zero one is drawn on a log axis, so
    one slow row (an emulated fp16 on a CPU: 155x) does not squash the others into invisible bars."""
    positive = [v for v in values if v and v > 0]
    return len(positive) > 1 and max(positive) > LOG_SCALE_RATIO * min(positive)


def write_outputs(result: dict, outdir: str | Path, png: bool = True) -> dict[str, Path]:
    """Write <stem>.json, <stem>.md (and <stem>.png) into outdir, each by atomic replace; returns the paths.

    Called after every row too (partial results, meta.complete False): a killed run keeps its finished rows.
    """
    outdir = Path(outdir)
    base = stem(result)
    paths = {"json": outdir / f"{base}.json", "md": outdir / f"{base}.md", "png": outdir / f"{base}.png"}
    text = json.dumps(result, indent=1, allow_nan=False)
    _atomic_write(paths["json"], lambda p: p.write_text(text + "\n"))
    _atomic_write(paths["md"], lambda p: p.write_text(markdown_table(result)))
    if png:
        _atomic_write(paths["png"], lambda p: plot(result, p))
    return paths
