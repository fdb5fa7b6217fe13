"""The benchmark's rows: the fp32 default, the six steps cumulatively, each step alone, the onnxruntime backend
(and optional extras)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpen_tune.tune.options import PRESETS, STEPS, TuneConfig, cli_flags

ALL_OFF = TuneConfig(face_crop=False)   # a row's switches are exactly its steps (TuneConfig() has face_crop on)


@dataclass(frozen=True)
class Row:
    name: str            # stable id used by --rows and in the JSON
    label: str           # what the table and the plot show: the CLI flags of the row
    steps: tuple[str, ...]  # switch names that are on (TuneConfig field names)
    cfg: TuneConfig


def step_config(steps: tuple[str, ...], compile_mode: str, amp: str) -> TuneConfig:
    values: dict[str, object] = {}
    for step in steps:
        values[step] = compile_mode if step == "compile" else amp if step == "amp" else True
    return replace(ALL_OFF, **values)


def all_rows(compile_mode: str = "default", amp: str = "bf16") -> list[Row]:
    """Every row the bench knows, in table order."""
    rows = [Row("default", "default (fp32 eager, all off)", (), ALL_OFF)]
    cumulative = [("1", 1), ("1+2", 2), ("1+2+3", 3), ("1-4", 4), ("1-6", 6)]
    for name, n in cumulative:
        steps = STEPS[:n]
        cfg = step_config(steps, compile_mode, amp)
        rows.append(Row(name, f"{name}: {cli_flags(cfg, generator_only=True)}", steps, cfg))
    for step in STEPS:
        cfg = step_config((step,), compile_mode, amp)
        label = "--face-crop" if step == "face_crop" else cli_flags(cfg, generator_only=True)
        rows.append(Row(step, label, (step,), cfg))
    other_amp = "fp16" if amp == "bf16" else "bf16"
    rows.append(Row(f"amp_{other_amp}", f"--amp {other_amp}", ("amp",), replace(ALL_OFF, amp=other_amp)))
    rows.append(Row("fused", "--fused", ("fused",), replace(ALL_OFF, fused=True)))
    rows.append(Row("onednn", "--fused --onednn", ("fused", "onednn"), replace(ALL_OFF, fused=True, onednn=True)))
    ort = replace(ALL_OFF, backend="onnxruntime")
    rows.append(Row("onnxruntime", "--backend onnxruntime", (), ort))
    rows.append(Row("onnxruntime_fp16", "--backend onnxruntime --amp fp16", ("amp",), replace(ort, amp="fp16")))
    for preset, cfg in PRESETS.items():
        rows.append(Row(f"preset:{preset}", f"--preset {preset}", tuple(cfg.enabled()), cfg))
    return rows


DEFAULT_ROWS: tuple[str, ...] = ("default", "1", "1+2", "1+2+3", "1-4", "1-6", *STEPS, "amp_fp16", "fused",
                                 "onednn", "onnxruntime")


def select_rows(names: list[str] | None, compile_mode: str = "default", amp: str = "bf16") -> list[Row]:
    """Rows by id (None = DEFAULT_ROWS); unknown ids raise with the valid list."""
    rows = {r.name: r for r in all_rows(compile_mode, amp)}
    wanted = list(names) if names else [n for n in DEFAULT_ROWS if n in rows]
    if not names and amp == "fp16":
        wanted = [n if n != "amp_fp16" else "amp_bf16" for n in wanted]
    unknown = [n for n in wanted if n not in rows]
    if unknown:
        raise ValueError(f"unknown bench rows {unknown}; choose from {', '.join(rows)}")
    return [rows[n] for n in wanted]
