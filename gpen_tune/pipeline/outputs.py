"""Inputs and outputs on disk: which files a command names, where each output goes, what may be replaced.

* `collect_inputs`: files, folders and glob patterns -> (path, output stem) pairs, plus one line for every
  name that gave nothing and every file a folder walk passed over (with the reason).
* `OutputNaming`: the output path of each input from a pattern with only {name}, {suffix} and {ext}.
* `plan_outputs`: every output path before any work: two inputs on one output, or an output onto an input, are
  refused up front; an existing file is refused (default), replaced (`overwrite`) or skipped (`skip`).
"""

from __future__ import annotations

import glob
import os
import string
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpen_tune.imageio import EXT_TO_FORMAT, INPUT_EXTENSIONS, Picture, output_format

PATTERN_FIELDS = ("name", "suffix", "ext")
VIDEO_INPUTS = ("mp4", "mkv", "mov", "webm", "avi", "m4v")      # read through PyAV
VIDEO_OUTPUTS = ("mp4", "mkv", "mov", "webm")
ALL_INPUTS = (*INPUT_EXTENSIONS, *VIDEO_INPUTS)


def is_video(path: Path) -> bool:
    return path.suffix.lower().lstrip(".") in VIDEO_INPUTS
EXISTING_POLICIES = ("refuse", "overwrite", "skip")


class OutputError(ValueError):
    """A problem with the outputs that stops the whole command before any work (one line)."""


# ---------------------------------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    files: list[tuple[Path, str]] = field(default_factory=list)   # (path, output stem)
    missing: list[str] = field(default_factory=list)              # one line per name that gave nothing
    passed_over: list[str] = field(default_factory=list)          # one line per file a folder walk skipped


def _passed_over_reason(p: Path) -> str | None:
    """Why a folder entry that looks like an input is not one (None: it is an input, or not image-like)."""
    suffix = p.suffix.lower().lstrip(".")
    if p.is_symlink() and not p.exists():
        return "dangling or looping symbolic link" if suffix in ALL_INPUTS else None
    if p.is_dir():
        return "a folder with an image name" if suffix in ALL_INPUTS else None
    if suffix in ("gif",):
        return "GIF is not an input format (convert it to PNG)"
    if suffix in ALL_INPUTS and not os.access(p, os.R_OK):
        return "not readable (permission denied)"
    return None


def _walk(folder: Path, recursive: bool, passed_over: list[str]) -> list[Path]:
    found = []
    for root, dirs, names in os.walk(folder, onerror=lambda e: passed_over.append(
            f"{e.filename}: folder not readable ({e.strerror})"), followlinks=False):
        base = Path(root)
        dirs.sort()
        for d in list(dirs):
            reason = _passed_over_reason(base / d)
            if reason:
                passed_over.append(f"{base / d}: {reason}")
        for name in sorted(names):
            if name.startswith("."):
                continue
            p = base / name
            reason = _passed_over_reason(p)
            if reason:
                passed_over.append(f"{p}: {reason}")
            elif p.is_file() and p.suffix.lower().lstrip(".") in ALL_INPUTS:
                found.append(p)
        if not recursive:
            break
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    return sorted(found)


def collect_inputs(inputs: list[str], recursive: bool = False) -> Inputs:
    """(path, output stem) for every image named by files, folders and globs, in the order given.

    Folder inputs keep their sub-folder layout in the stem ("sub/name") so equal names do not collide; the same
    file named twice is taken once; equal stems from different places get "_1", "_2" appended.
    """
    result = Inputs()
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            files = _walk(path, recursive, result.passed_over)
            if not files:
                result.missing.append(f"{item}: folder has no images or videos (jpg/png/webp/bmp/tiff, "
                                      "mp4/mkv/mov/webm)"
                                      + ("" if recursive else " (use --recursive for sub-folders)"))
            result.files += [(p, p.relative_to(path).with_suffix("").as_posix()) for p in files]
        elif path.is_file():
            result.files.append((path, path.stem))
        elif glob.has_magic(item):
            files = sorted(Path(p) for p in glob.glob(os.path.expanduser(item), recursive=recursive))
            images = [p for p in files if p.is_file() and p.suffix.lower().lstrip(".") in ALL_INPUTS]
            if not images:
                result.missing.append(f"{item}: no image matches this pattern")
            result.files += [(p, p.stem) for p in images]
        elif path.is_symlink():
            result.missing.append(f"{item}: dangling or looping symbolic link")
        else:
            result.missing.append(f"{item}: no such file or folder")
    result.files = _dedupe(result.files)
    return result


def _dedupe(found: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    seen_paths: set[Path] = set()
    seen_stems: dict[str, int] = {}
    out = []
    for path, stem in found:
        key = path.resolve()
        if key in seen_paths:
            continue
        seen_paths.add(key)
        n = seen_stems.get(stem, 0)
        seen_stems[stem] = n + 1
        out.append((path, stem if n == 0 else f"{stem}_{n}"))
    return out


# ---------------------------------------------------------------------------------------------------- outputs


def check_pattern(pattern: str) -> None:
    """Only {name}, {suffix} and {ext}, as plain fields; no folders; not empty, '.' or '..'."""
    fields = "{name}, {suffix}, {ext}"
    try:
        parsed = list(string.Formatter().parse(pattern))
    except ValueError as e:
        raise OutputError(f"--name-pattern {pattern!r} is invalid ({e}); fields are {fields}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PATTERN_FIELDS or spec or conversion:
            raise OutputError(f"--name-pattern {pattern!r}: unknown field {{{name}}}; fields are {fields}")
    probe = pattern.format(name="x", suffix="", ext="png")
    if "/" in probe or "\\" in probe:
        raise OutputError(f"--name-pattern {pattern!r} must not contain folders")
    if probe.strip() in ("", ".", ".."):
        raise OutputError(f"--name-pattern {pattern!r} gives no file name")


def check_ext(ext: str | None) -> None:
    if ext is not None and ext.lower().lstrip(".") not in (*EXT_TO_FORMAT, *VIDEO_OUTPUTS):
        raise OutputError(f"--ext {ext}: unsupported; use one of {', '.join((*EXT_TO_FORMAT, *VIDEO_OUTPUTS))}")


@dataclass
class OutputNaming:
    """Where each output goes: `pattern` with {name} (input stem), {suffix} and {ext}."""

    outdir: Path
    ext: str | None = None               # None: same format as the input
    suffix: str = ""
    pattern: str = "{name}{suffix}.{ext}"

    def __post_init__(self) -> None:
        self.outdir = Path(self.outdir)
        check_pattern(self.pattern)
        check_ext(self.ext)

    @property
    def photo_ext(self) -> str | None:
        """--ext when it names a photo format (a video format applies to videos only)."""
        return self.ext if self.ext and self.ext.lower().lstrip(".") in EXT_TO_FORMAT else None

    @property
    def video_ext(self) -> str | None:
        return self.ext.lower().lstrip(".") if self.ext and self.ext.lower().lstrip(".") in VIDEO_OUTPUTS else None

    def planned(self, stem: str, source: Path | None) -> Path:
        """The output path known before decoding: the extension comes from --ext (when it names the input's
        kind, photo or video) or the input's own suffix."""
        own = (source.suffix.lstrip(".") if source is not None else "").lower()
        if source is not None and is_video(source):
            ext = self.video_ext or (own if own in VIDEO_OUTPUTS else "mp4")
        else:
            ext = (self.photo_ext or own or "png").lower().lstrip(".")
            if ext not in EXT_TO_FORMAT:
                ext = "png"
        return self.path(stem, ext)

    def path(self, stem: str, ext: str) -> Path:
        name = self.pattern.format(name=Path(stem).name, suffix=self.suffix, ext=ext)
        return self.outdir / Path(stem).parent / name

    def path_for(self, picture: Picture, stem: str) -> tuple[Path, str]:
        """(path, Pillow format) once the picture is decoded (its format decides when --ext is not given)."""
        fmt, ext = output_format(self.photo_ext, picture)
        return self.path(stem, ext), fmt


def check_output_dir(outdir: Path) -> None:
    """Create OUTDIR or explain why it cannot be used, before any work is done."""
    if outdir.exists() and not outdir.is_dir():
        raise OutputError(f"output {outdir} is a file, not a folder: pass a folder with -o")
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=outdir, prefix=".gpen-tune-write-test-"):
            pass
    except OSError as e:
        raise OutputError(f"output folder {outdir} is not writable ({e.strerror or e}): choose another -o") from None


@dataclass
class Plan:
    """Output paths decided before any work: which inputs run, which are skipped or refused (one line each)."""

    run: list[int] = field(default_factory=list)                   # indices of the inputs to process
    skipped: dict[int, str] = field(default_factory=dict)          # index -> why (existing output kept)
    refused: dict[int, str] = field(default_factory=dict)          # index -> one-line error


def plan_outputs(files: list[tuple[Path, str]], naming: OutputNaming, existing: str = "refuse") -> Plan:
    """Decide every output before work. Raises OutputError when two inputs share an output or one would replace
    an input; an existing output is refused (one line naming it and the flags), replaced, or skipped."""
    if existing not in EXISTING_POLICIES:
        raise ValueError(f"existing must be one of {', '.join(EXISTING_POLICIES)}, got {existing!r}")
    inputs = {p.resolve() for p, _ in files}
    owner: dict[Path, Path] = {}
    plan = Plan()
    for i, (path, stem) in enumerate(files):
        target = naming.planned(stem, path)
        key = target.resolve()
        if key in inputs:
            raise OutputError(f"output {target} would overwrite the input {path}: use --suffix or another -o "
                              "folder")
        if key in owner:
            raise OutputError(f"{owner[key]} and {path} would both be written to {target}: change "
                              "--name-pattern (keep {name}) or --suffix")
        owner[key] = path
        if target.exists() or target.is_symlink():
            if existing == "skip":
                plan.skipped[i] = f"{target} exists (--skip-existing)"
                continue
            if existing == "refuse":
                plan.refused[i] = (f"{path}: output {target} already exists: pass --overwrite to replace it or "
                                   "--skip-existing to keep it")
                continue
        plan.run.append(i)
    return plan
