"""Reading and checking GPEN checkpoint files.

Always `torch.load(..., weights_only=True)`: a checkpoint is data, and a pickle that tries to run code is refused
before anything executes. A pinned cache file is hashed against its pin first (`gpen_tune.weights.integrity`), a
tensor holding NaN or inf is refused (it would restore every face as a black square), and every key and shape is
checked against the model config before `load_state_dict`.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import torch

from gpen_tune.model.configs import MODELS, GPENConfig, ModelInfo
from gpen_tune.model.gpen import FullGenerator
from gpen_tune.ops.fir import make_kernel
from gpen_tune.weights.integrity import check_pinned


class CheckpointError(ValueError):
    """A weights file that cannot be used; the message names the file and what to do."""


@lru_cache(maxsize=16)
def expected_shapes(cfg: GPENConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the official state dict for `cfg`, derived from our module tree (built on 'meta'; cached,
    since building the tree is not free). Callers must not modify the returned dict."""
    with torch.device("meta"):
        model = FullGenerator(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def read_state_dict(path: str | Path, key: str | None = None, *, check_pin: bool = True) -> dict[str, torch.Tensor]:
    """Load a plain tensor dict from `path` safely; `key` picks a sub-dict (e.g. 'g_ema' of a training file).

    Raises CheckpointError (unusable file, non-finite values) or WeightsMismatchError (a pinned cache file whose
    sha256 changed; `check_pin=False` is for callers that check a requested hash themselves).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, expected a .pth checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file, expected a .pth checkpoint file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes); delete it and download again")
    if check_pin:
        check_pinned(path)
    kind = _sniff(path)
    if kind is not None:
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (looks like {kind}); expected a GPEN .pth file")
    _refuse_oversized_records(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except zipfile.BadZipFile as e:
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({e}); delete it and download again") from None
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        if "zip" in msg.lower() or "central directory" in msg.lower() or "failed finding" in msg.lower():
            raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({msg}); delete it and download again") \
                from None
        raise CheckpointError(f"{path}: not a loadable PyTorch checkpoint ({msg})") from None
    except Exception as e:  # pickle.UnpicklingError for unsafe globals and non-checkpoint bytes, EOFError, ...
        text = str(e)
        detail = _detail_line(text) or type(e).__name__
        if "GLOBAL" in text or "Unsupported global" in text:
            raise CheckpointError(
                f"{path}: refused, the file wants to run code or build objects on load ({detail[:160]}); "
                "nothing was executed; only plain tensor checkpoints are accepted"
            ) from None
        if isinstance(e, EOFError):
            raise CheckpointError(f"{path}: truncated checkpoint (ends early); delete it and download again") \
                from None
        raise CheckpointError(f"{path}: not a loadable PyTorch checkpoint ({detail[:160]})") from None
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            raise CheckpointError(f"{path}: has no entry {key!r}")
        obj = obj[key]
    if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        hint = ""
        if isinstance(obj, Mapping) and "g_ema" in obj:
            hint = " (a training checkpoint: pass key='g_ema' / --key g_ema)"
        raise CheckpointError(f"{path}: not a state dict of tensors{hint}")
    sd = {str(k): v for k, v in obj.items()}
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    _refuse_non_finite(sd, path)
    return sd


@lru_cache(maxsize=1)
def largest_record_bytes() -> int:
    """The most bytes one storage of a GPEN checkpoint can need: the largest official generator whole, in fp64
    (a state dict whose tensors all share one storage, at the widest float type)."""
    return max(sum(math.prod(s) for s in expected_shapes(m.config).values()) for m in MODELS.values()) * 8


def _refuse_oversized_records(path: Path) -> None:
    """Refuse, before torch allocates anything, a zip checkpoint with a storage larger than any GPEN tensor can be:
    torch allocates each storage at the size its zip entry states, and a small deflated file can state gigabytes."""
    try:
        with zipfile.ZipFile(path) as z:
            entries = z.infolist()
    except (zipfile.BadZipFile, OSError):
        return                                       # not a zip (legacy format) or damaged: torch.load says which
    cap = largest_record_bytes()
    for e in entries:
        if e.file_size > cap:
            raise CheckpointError(f"{path}: refused before loading: its entry {e.filename} would take "
                                  f"{e.file_size / 1e9:.1f} GB, more than any GPEN tensor ({cap / 1e6:.0f} MB at "
                                  "most); a damaged or foreign file: download it again or use another file")


def find_non_finite(sd: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Key -> number of NaN/inf values, for every floating-point tensor that has any.

    The test is min and max in one pass (NaN and inf both show there), about 25x faster on the CPU than
    `isfinite(t).all()`, which writes a mask as large as the tensor; only a bad tensor is counted in full."""
    bad = {}
    for k, v in sd.items():
        if not (v.is_floating_point() or v.is_complex()) or v.numel() == 0:
            continue
        if v.is_complex():
            ok = bool(torch.isfinite(v).all())
        else:
            lo, hi = torch.aminmax(v)
            ok = bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))
        if not ok:
            bad[k] = int((~torch.isfinite(v)).sum())
    return bad


def _refuse_non_finite(sd: Mapping[str, torch.Tensor], path: Path) -> None:
    bad = find_non_finite(sd)
    if bad:
        names = ", ".join(list(bad)[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
        raise CheckpointError(f"{path}: {sum(bad.values()):,} non-finite values (NaN/inf) in {len(bad)} tensors "
                              f"({names}); a damaged or diverged checkpoint, refused: download it again or use "
                              f"another file")


_MAGIC = {
    b"\xff\xd8\xff": "a JPEG image", b"\x89PNG": "a PNG image", b"GIF8": "a GIF image", b"%PDF": "a PDF",
    b"\x1f\x8b": "a gzip archive", b"<": "an HTML/XML page (an error page from the server?)",
}


def _sniff(path: Path) -> str | None:
    """Name the format of a file that is clearly no torch checkpoint (zip 'PK' or pickle 0x80), else None."""
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"PK") or head.startswith(b"\x80"):
        return None
    stripped = head.lstrip()
    for magic, kind in _MAGIC.items():
        if stripped.startswith(magic):
            return kind
    if len(head) >= 9 and head[8:9] == b"{":
        return "a safetensors file (not supported: use the official .pth)"
    return None


def _detail_line(text: str) -> str:
    """The informative line of torch's long weights_only error (the unsupported global / operand)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "GLOBAL" in ln or "Unsupported" in ln:
            return ln
    return lines[0] if lines else ""


def check_state_dict(sd: Mapping[str, torch.Tensor], cfg: GPENConfig, source: str = "checkpoint") -> None:
    """Raise CheckpointError listing missing, unexpected and wrongly shaped keys for `cfg`.

    Missing/unexpected keys are listed per module (`generator.convs.12.*`, `ecd7.*`) so that a wrong-size file
    is recognisable at a glance; the message also names the registry model the file does match, if any.
    """
    want = expected_shapes(cfg)
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    wrong = [f"{k} {tuple(sd[k].shape)}!={want[k]}" for k in want if k in sd and tuple(sd[k].shape) != want[k]]
    wrong += [f"{k} is {str(sd[k].dtype).replace('torch.', '')}, not floating point" for k in want
              if k in sd and not sd[k].is_floating_point()]
    if missing or unexpected or wrong:
        def show(items: list[str], limit: int = 6) -> str:
            return ", ".join(items[:limit]) + (f" (+{len(items) - limit} more)" if len(items) > limit else "")

        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys: {show(_group_keys(missing), 8)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys: {show(_group_keys(unexpected), 8)}")
        if wrong:
            parts.append(f"{len(wrong)} wrong shapes or types: {show(wrong, 3)}")
        raise CheckpointError(
            f"{source}: does not match GPEN size {cfg.size} (channel_multiplier {cfg.channel_multiplier}, "
            f"narrow {cfg.narrow:g}): " + "; ".join(parts) + ". " + _which_model_hint(sd)
        )


def _group_keys(keys: list[str]) -> list[str]:
    """Collapse keys to their module: 'generator.convs.12.*', 'ecd7.*'; a lone key stays as it is."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        parts = k.split(".")
        if parts[0] == "generator" and len(parts) > 3 and parts[1] in ("convs", "to_rgbs", "style"):
            g = ".".join(parts[:3])
        elif parts[0].startswith("ecd") or len(parts) < 3:
            g = parts[0]
        else:
            g = ".".join(parts[:2])
        groups.setdefault(g, []).append(k)
    return [members[0] if len(members) == 1 else f"{g}.*" for g, members in groups.items()]


def _which_model_hint(sd: Mapping[str, torch.Tensor]) -> str:
    found = match_model(dict(sd))
    if found is None:
        return "Is it the right model (--model)?"
    name = found[0]
    return f"It looks like {name}: pass --model {name}." if not name.startswith("custom") else \
        f"It looks like a {name}: pass that GPENConfig."


def describe_config(cfg: GPENConfig) -> str:
    return f"size {cfg.size}, channel_multiplier {cfg.channel_multiplier}, narrow {cfg.narrow:g}"


def match_model(sd: Mapping[str, torch.Tensor]) -> tuple[str, GPENConfig] | None:
    """Registry name (or a description of a custom config) whose keys and shapes all match `sd`, else None."""
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    for info in MODELS.values():
        if expected_shapes(info.config) == shapes:
            return info.name, info.config
    cfg = _derive_config(shapes)
    if cfg is not None and expected_shapes(cfg) == shapes:
        return f"custom GPEN ({describe_config(cfg)})", cfg
    return None


def infer_model(sd: Mapping[str, torch.Tensor], source: str = "checkpoint") -> tuple[str, GPENConfig]:
    """Like `match_model`, but a file that matches nothing raises CheckpointError naming the closest model."""
    found = match_model(sd)
    if found is not None:
        return found
    shapes = {k: tuple(v.shape) for k, v in sd.items()}

    def distance(info: ModelInfo) -> int:
        return len(set(expected_shapes(info.config).items()) ^ set(shapes.items()))

    best = min(MODELS.values(), key=distance)
    want = expected_shapes(best.config)
    missing = sum(k not in shapes for k in want)
    unexpected = sum(k not in want for k in shapes)
    wrong = sum(k in shapes and shapes[k] != v for k, v in want.items())
    raise CheckpointError(
        f"{source}: matches no known GPEN model ({len(shapes)} entries; closest is {best.name} with {missing} "
        f"missing keys, {unexpected} unexpected keys, {wrong} wrong shapes); is it a GPEN generator checkpoint?"
    )


def _derive_config(shapes: dict[str, tuple[int, ...]]) -> GPENConfig | None:
    """Guess (size, channel_multiplier, narrow) of a non-registry GPEN from a few telltale shapes."""
    try:
        n_ecd = 1 + max(int(k[3:].split(".")[0]) for k in shapes if k.startswith("ecd"))
        size = 2 ** (n_ecd + 1)
        if size > 8192:
            return None
        narrow = shapes["generator.input.input"][1] / 512
        c_size = shapes["ecd0.0.0.weight"][0]
    except (KeyError, ValueError, IndexError):
        return None
    for cm in (1, 2, 4):
        try:
            cfg = GPENConfig(size, channel_multiplier=cm, narrow=narrow)
        except ValueError:
            return None
        if cfg.channels.get(size) == c_size:
            return cfg
    return None


def synthetic_state_dict(cfg: GPENConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random weights in the official layout, for benchmarks and tests (not a face restorer).

    The encoder-feature scalars (`noise.weight`, zero at init upstream) are set to 0.5 so that the output depends
    on the input face as it does with trained weights.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = FullGenerator(cfg)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("kernel"):
            continue  # fixed FIR buffers: take the real values below
        if k.endswith("noise.weight"):
            sd[k] = torch.full(tuple(v.shape), 0.5)
        elif k.endswith("modulation.bias"):
            sd[k] = torch.ones(tuple(v.shape))
        elif k.endswith("bias"):
            sd[k] = torch.zeros(tuple(v.shape))
        else:
            t = torch.randn(tuple(v.shape), generator=gen)
            if k.startswith("generator.style."):
                t = t / cfg.lr_mlp
            sd[k] = t
    sd.update(fir_buffers(cfg))
    return {k: sd[k] for k in model.state_dict()}


def fir_buffers(cfg: GPENConfig) -> dict[str, torch.Tensor]:
    """The fixed 4x4 FIR buffers saved in the checkpoints: K for the encoder blurs, 4K for the 2x upsamplers."""
    k = make_kernel(cfg.blur_kernel)
    return {name: (k.clone() if name.startswith("ecd") else k * 4)
            for name in expected_shapes(cfg) if name.endswith("kernel")}
