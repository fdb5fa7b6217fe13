"""Inputs and outputs on disk: which files a command names, where each output goes, what may be replaced.

* `collect_inputs`: files, folders and glob patterns -> (path, output stem) pairs, plus one line for every
  name that gave nothing and every file a folder walk passed over (with the reason).
* `OutputNaming`: the output path of each input from a pattern with only {name}, {suffix} and {ext}.
* `plan_outputs`: every output path before any work, side images included: two inputs on one output, an output
  onto an input or the report, a name that leaves -o or is too long, are refused up front; an existing file is
  refused (default), replaced (`overwrite`) or skipped (`skip`). The writers hold to it too: without
  `OutputNaming.replace` they never replace a file that appeared after planning (another run).
* `remove_stale_temp_files`: the temp files of killed runs (our names, dead process ids) removed at start.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import string
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpen_tune.imageio import EXT_TO_FORMAT, FORMAT_TO_EXT, INPUT_EXTENSIONS, Picture, output_format, temp_owner

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
    if suffix in ALL_INPUTS and p.exists() and not p.is_file():
        return f"{special_kind(p)}, not a regular file"
    if suffix in ("gif",):
        return "GIF is not an input format (convert it to PNG)"
    if suffix in ALL_INPUTS and not os.access(p, os.R_OK):
        return "not readable (permission denied)"
    return None


def special_kind(p: Path) -> str:
    """What a path that exists but is neither a file nor a folder is (reading a FIFO would wait forever)."""
    mode = p.stat().st_mode
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


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
        elif path.exists():
            result.missing.append(f"{item}: {special_kind(path)}, not a regular file: pass image or video files")
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
    """The same file once; a repeated stem gets the first "_N" that no input's own stem has (so the renaming
    never lands on another input's name: a/x, b/x and x_1 give x, x_2 and x_1)."""
    seen_paths: set[Path] = set()
    unique = []
    for path, stem in found:
        key = path.resolve()
        if key not in seen_paths:
            seen_paths.add(key)
            unique.append((path, stem))
    taken = {stem for _, stem in unique}
    used: set[str] = set()
    out = []
    for path, stem in unique:
        new, n = stem, 0
        while new in used:
            n += 1
            new = f"{stem}_{n}"
            if new in taken and new != stem:
                new = stem            # another input's own name: try the next number
        used.add(new)
        out.append((path, new))
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


def check_suffix(suffix: str) -> None:
    """--suffix is part of a file name: no folders, no NUL (it would let an output escape -o)."""
    if "/" in suffix or "\\" in suffix or "\0" in suffix:
        raise OutputError(f"--suffix {suffix!r} must not contain '/', '\\' or NUL: it is added to each file "
                          "name (name output folders with -o)")


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
    replace: bool = False                # the writer replaces a file that exists (--overwrite); else it refuses

    def __post_init__(self) -> None:
        self.outdir = Path(self.outdir)
        check_pattern(self.pattern)
        check_suffix(self.suffix)
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

    def side_path(self, folder: str, stem: str, fmt: str) -> Path:
        """Where a side image goes: OUT/<folder>/<stem>.<ext> (folder: faces, comparisons or masks)."""
        return self.outdir / folder / f"{stem}.{FORMAT_TO_EXT[fmt]}"


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


def remove_stale_temp_files(outdir: Path, pid: int | None = None) -> list[Path]:
    """Remove the temp files this package's writers leave in `outdir` (and below) when their process was killed
    (SIGKILL, power loss); the removed paths. Only names of our own (`imageio.temp_owner`) whose process is
    gone; `pid` given: that process's temp files (its own, at a second Ctrl-C)."""
    removed = []
    for root, _, names in os.walk(outdir):
        for name in names:
            owner = temp_owner(name)
            if owner is None or (owner != pid if pid is not None else _alive(owner)):
                continue
            p = Path(root) / name
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                     # another user's process
        return True
    return True


@dataclass
class Plan:
    """Output paths decided before any work: which inputs run, which are skipped or refused (one line each)."""

    run: list[int] = field(default_factory=list)                   # indices of the inputs to process
    skipped: dict[int, str] = field(default_factory=dict)          # index -> why (existing output kept)
    refused: dict[int, str] = field(default_factory=dict)          # index -> one-line error


@dataclass(frozen=True)
class SideImages:
    """The side images a run writes beside each photo (`--save-faces`, `--save-comparison`, `--save-mask`)."""

    faces: bool = False
    comparison: bool = False
    mask: bool = False


FACE_NAME = re.compile(r"_face\d{2,}$")          # faces/<stem>_faceNN.<ext>


def _side_outputs(naming: OutputNaming, stem: str, target: Path, sides: SideImages) -> list[Path]:
    """The side images of one photo whose names are known before its faces are found."""
    fmt = EXT_TO_FORMAT.get(target.suffix.lower().lstrip("."), "PNG")
    paths = []
    if sides.comparison:
        paths.append(naming.side_path("comparisons", stem, fmt))
    if sides.mask:
        paths.append(naming.side_path("masks", stem, "PNG"))
    return paths


def _face_images(naming: OutputNaming, stem: str, target: Path) -> list[Path]:
    """The face images of `stem` already in OUT/faces (their count is known only after detection)."""
    folder = naming.outdir / "faces" / Path(stem).parent
    ext = FORMAT_TO_EXT[EXT_TO_FORMAT.get(target.suffix.lower().lstrip("."), "PNG")]
    return sorted(folder.glob(f"{glob.escape(Path(stem).name)}_face[0-9][0-9]*.{ext}"))


def _is_face_image_name(target: Path, outdir: Path) -> bool:
    """A main output inside OUT/faces named like a face image (`<stem>_faceNN.<ext>`) could be replaced by one."""
    try:
        target.relative_to(outdir / "faces")
    except ValueError:
        return False
    return FACE_NAME.search(target.stem) is not None


def name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of `folder` takes (255 where it does not say)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _check_inside(target: Path, outdir: Path) -> None:
    """No output leaves -o (a name with '..' in it)."""
    rel = os.path.relpath(os.path.normpath(target), os.path.normpath(outdir))
    if rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
        raise OutputError(f"output {target} would be written outside {outdir}: change --suffix or --name-pattern")


def _file_key(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def plan_outputs(files: list[tuple[Path, str]], naming: OutputNaming, existing: str = "refuse",
                 sides: SideImages = SideImages(), report: Path | None = None) -> Plan:
    """Decide every output before work: each photo's or video's file and its side images (`sides`).

    Raises OutputError when two inputs share an output, an output would replace an input or the `report` file,
    the report is an input, or a name leaves -o or is too long for the file system; an existing output (a side
    image included) is refused (one line naming it and the flags), replaced, or skipped."""
    if existing not in EXISTING_POLICIES:
        raise ValueError(f"existing must be one of {', '.join(EXISTING_POLICIES)}, got {existing!r}")
    inputs = {p.resolve(): p for p, _ in files}
    input_keys = {k: p for p, _ in files if (k := _file_key(p)) is not None}
    reserved: dict[Path, str] = {}
    if report is not None:
        if os.path.lexists(report) and not Path(report).is_file():
            raise OutputError(f"--report {report} is not a regular file: name a file for the report")
        report_key = _file_key(Path(report))
        if Path(report).resolve() in inputs or (report_key is not None and report_key in input_keys):
            raise OutputError(f"--report {report} is one of the inputs: name another file for the report")
        reserved[Path(report).resolve()] = f"the --report file {report}"
    longest = name_max(naming.outdir)
    owner: dict[Path, str] = {}
    plan = Plan()
    for i, (path, stem) in enumerate(files):
        target = naming.planned(stem, path)
        outputs = [target, *([] if is_video(path) else _side_outputs(naming, stem, target, sides))]
        for out in outputs:
            _check_name(out, naming.outdir, longest)
            key = out.resolve()
            same = inputs.get(key) or (input_keys.get(_file_key(out)) if out.exists() else None)
            if same is not None:
                raise OutputError(f"output {out} would overwrite the input {same}: use --suffix or another -o "
                                  "folder")
            if key in reserved:
                raise OutputError(f"output {out} of {path} is {reserved[key]}: name another file for --report")
            if key in owner:
                raise OutputError(f"{owner[key]} and {path} would both be written to {out}: change --name-pattern "
                                  "(keep {name}), --suffix or -o")
            owner[key] = str(path)
        if sides.faces and not is_video(path) and _is_face_image_name(target, naming.outdir):
            raise OutputError(f"output {target} is named like a --save-faces image: use --suffix or another -o")
        found = [p for p in outputs if p.exists() or p.is_symlink()]
        if sides.faces and not is_video(path):
            found += _face_images(naming, stem, target)
        if found:
            if existing == "skip" and (target.exists() or target.is_symlink()):
                plan.skipped[i] = f"{target} exists (--skip-existing)"
                continue
            if existing != "overwrite":
                plan.refused[i] = (f"{path}: output {found[0]} already exists: pass --overwrite to replace it or "
                                   + ("--skip-existing to keep it" if found[0] == target else "another -o"))
                continue
        plan.run.append(i)
    return plan


def _check_name(out: Path, outdir: Path, longest: int) -> None:
    _check_inside(out, outdir)
    size = len(os.fsencode(out.name))
    if size > longest:
        raise OutputError(f"output name {out.name[:40]}... is {size} bytes, longer than the {longest} the file "
                          "system takes: shorten --suffix or --name-pattern, or rename the input")
