"""Is DIR an upstream GPEN checkout we can patch? Checked by files and structure (classes, methods, functions).

The patch set is written against yangxy/GPEN 2c73670. A file that differs from that commit only in ways the
edits do not depend on (whitespace, comments, other code) is still patchable; a missing file, class or method
is refused with a message naming the file and what was expected.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.upstream import UPSTREAM_COMMIT, UPSTREAM_REPO

# file -> names it must define ("Class", "Class.method" or "function"), at upstream 2c73670
REQUIRED: dict[str, tuple[str, ...]] = {
    "demo.py": (),
    "__init_paths.py": (),
    "align_faces.py": ("warp_and_crop_face", "get_reference_facial_points"),
    "face_enhancement.py": ("FaceEnhancement.__init__", "FaceEnhancement.process", "FaceEnhancement.mask_postprocess"),
    "face_model/face_gan.py": ("FaceGAN.__init__", "FaceGAN.load_model", "FaceGAN.process"),
    "face_model/gpen_model.py": ("ModulatedConv2d.forward", "StyledConv", "ToRGB", "Generator.forward",
                                 "FullGenerator.__init__", "FullGenerator.forward"),
    "face_model/op/fused_act.py": ("FusedLeakyReLU", "fused_leaky_relu"),
    "face_model/op/upfirdn2d.py": ("upfirdn2d", "upfirdn2d_native"),
    "face_detect/retinaface_detection.py": ("RetinaFaceDetection.detect",),
    "face_parse/face_parsing.py": ("FaceParse.process",),
    "sr_model/real_esrnet.py": ("RealESRNet.process",),
}

# sha256 of these files at upstream 2c73670: an exact match is reported, a difference is only a notice
KNOWN_SHA256 = {
    "demo.py": "d158b5c566ac4a0b56c311f5bb9a87b3ca8f7a4e32f006ad96003d45fbbd224e",
    "__init_paths.py": "f7eaf90d4571f9f986ee80cc766991abec24bf852e7d9139f1fcbef455bd0b6b",
    "align_faces.py": "f3c9d3e87ffd2dd549dc3aaa432ea1eb2275bf5f49c5644e764aeab06da41610",
    "face_enhancement.py": "2954051efb73d38ff1800153488a445a9f3c5ec82a3eeb17b86a2ee8517ca9b8",
    "face_model/face_gan.py": "5518c3f401baf676634115a471b47727cc270969d21d87274cada14038a02fc0",
    "face_model/gpen_model.py": "60e3cad566bb0353b58af5759a8192857a0e58aa831d43e6f0fe9f8989206bcf",
    "face_model/op/fused_act.py": "393edefb610b59c441972cd7e5c65e9c7b8e04353e1bd0b254d18954ce6c55cd",
    "face_model/op/upfirdn2d.py": "cdb50bf3a9afe0ef462360a3f006e31d27d43cedd81083874a16c8c15232460f",
    "face_detect/retinaface_detection.py": "cd6886be4157d3c210fa6d3cf893211ad56ef62f3f25a19a5983695a432a945f",
    "face_parse/face_parsing.py": "bb920fe6bb14df1c3c6288e81141aee934c5eafeb7417c348f807a8dfe82312f",
    "sr_model/real_esrnet.py": "d9474d8f296ccf96b546ed63547dce4171c7764217aba0731fa5c7d457359b45",
}


@dataclass(frozen=True)
class Recognition:
    exact: bool                      # every known file is byte-identical to upstream 2c73670
    differing: tuple[str, ...]       # files that differ from 2c73670 (still structurally compatible)

    def describe(self) -> str:
        if self.exact:
            return f"upstream {UPSTREAM_REPO} {UPSTREAM_COMMIT} (files identical)"
        return (f"structurally compatible with {UPSTREAM_REPO} {UPSTREAM_COMMIT} "
                f"(differs in: {', '.join(self.differing)})")


def defined_names(module: cst.Module) -> set[str]:
    """Top-level functions and classes, and 'Class.method' for methods."""
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.ClassDef):
            names.add(stmt.name.value)
            for inner in stmt.body.body:
                if isinstance(inner, cst.FunctionDef):
                    names.add(f"{stmt.name.value}.{inner.name.value}")
    return names


def parse(rel: str, data: bytes) -> cst.Module:
    """Parse once per content (libcst trees are immutable, and parsing is the slow part of every command)."""
    return _parse_cached(rel, data)


@functools.lru_cache(maxsize=128)
def _parse_cached(rel: str, data: bytes) -> cst.Module:
    try:
        return cst.parse_module(data)
    except cst.ParserSyntaxError as exc:
        raise PatchError(f"{rel}: cannot parse it as Python ({str(exc).splitlines()[0]}); restore the upstream "
                         f"file") from None
    except UnicodeDecodeError as exc:
        raise PatchError(f"{rel}: not valid {exc.encoding} text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8 or restore the upstream file, nothing was changed") from None
    except SyntaxError as exc:  # an unknown `# coding:` declaration
        raise PatchError(f"{rel}: cannot read it as Python source ({exc.msg}); restore the upstream file, nothing "
                         f"was changed") from None


def recognise(root: Path, sources: dict[str, bytes], sha256: dict[str, str]) -> Recognition:
    """sources: rel path -> the (pristine) bytes to check; raises PatchError naming the first problem."""
    if not root.is_dir():
        raise PatchError(f"{root}: not a directory; give the path of your GPEN checkout")
    missing = [rel for rel in REQUIRED if rel not in sources]
    if len(missing) == len(REQUIRED):
        raise PatchError(f"{root}: not an upstream GPEN checkout (no demo.py, face_enhancement.py, face_model/...); "
                         f"give the directory that holds {UPSTREAM_REPO}'s demo.py")
    if missing:
        raise PatchError(f"{root / missing[0]}: missing; expected the upstream {UPSTREAM_REPO} {UPSTREAM_COMMIT} "
                         f"layout ({', '.join(missing)} not found)")
    for rel, wanted in REQUIRED.items():
        if not wanted:
            continue
        have = defined_names(parse(rel, sources[rel]))
        for name in wanted:
            if name not in have:
                kind = "method" if "." in name else "class or function"
                raise PatchError(f"{rel}: expected {kind} `{name}` (upstream {UPSTREAM_REPO} {UPSTREAM_COMMIT}); "
                                 f"unknown GPEN version, not patched")
    differing = tuple(rel for rel, digest in KNOWN_SHA256.items() if sha256.get(rel) != digest)
    return Recognition(exact=not differing, differing=differing)
