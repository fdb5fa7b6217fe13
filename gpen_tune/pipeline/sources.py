"""Sources: what the scheduler reads, one `SourceItem` at a time, in order.

A new kind of input (video frames, a Ray batch, a webcam) is a new `Source`: an iterable of `SourceItem`s (the
input's name for messages, its output stem, and a `load()` returning a Picture, an RGB array or a path that the
decode step reads), with `len()` when the count is known (progress) and `ordered = True` when the sink must get
results in the source's order (video frames). Items are pulled lazily by the scheduler's feeder, so a source
never holds more than the scheduler's in-flight bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpen_tune.imageio import Picture


@dataclass(frozen=True)
class SourceItem:
    name: str                                          # for messages and reports (a path, or "<array>")
    stem: str                                          # output name stem; sub-folders kept ("sub/name")
    load: Callable[[], Picture | np.ndarray | str]
    meta: Any = None                                   # carried to the sink on the job (a frame's timestamp)


class Source(Protocol):
    ordered: bool

    def __iter__(self) -> Iterator[SourceItem]: ...


class FileSource:
    """Photo files (the order given is the order of the results); stems default to each file's stem."""

    ordered = False

    def __init__(self, paths: Sequence[str | Path], stems: Sequence[str] | None = None):
        self.paths = [Path(p) for p in paths]
        self.stems = list(stems) if stems is not None else [p.stem for p in self.paths]
        if len(self.stems) != len(self.paths):
            raise ValueError(f"{len(self.paths)} paths but {len(self.stems)} stems")

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self) -> Iterator[SourceItem]:
        for path, stem in zip(self.paths, self.stems, strict=True):
            yield SourceItem(str(path), stem, lambda p=path: str(p))


class ArraySource:
    """In-memory images (HWC, RGB/RGBA/gray, uint8 or uint16) or Pictures."""

    ordered = False

    def __init__(self, images: Sequence[np.ndarray | Picture], stems: Sequence[str] | None = None):
        self.images = list(images)
        self.stems = list(stems) if stems is not None else [f"image{i:05d}" for i in range(len(self.images))]

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[SourceItem]:
        for image, stem in zip(self.images, self.stems, strict=True):
            yield SourceItem("<array>", stem, lambda im=image: im)
