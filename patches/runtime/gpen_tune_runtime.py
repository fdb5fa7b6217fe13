"""gpen-tune run-time switches for a patched upstream GPEN checkout (yangxy/GPEN, commit 2c73670).

`gpen-tune apply-patches` copies this file to `face_model/gpen_tune_runtime.py` and makes small structural edits
to upstream files that call into it. Every switch is read from a GPEN_TUNE_* environment variable (demo.py's new
flags only set those variables), so one patched checkout serves every combination without re-patching.
With every switch off each hook falls through to upstream's own code path, so the output is unchanged.

  GPEN_TUNE_LAZY_DETECTOR  0 | 1 | release  build detector, SR model and face parser on first use; `release`
                                            also frees the detector after each detection (re-built next image)
  GPEN_TUNE_COMPILE        0 | 1 | MODE     torch.compile the generator (MODE: default, reduce-overhead, ...)
  GPEN_TUNE_AMP            0 | bf16 | fp16  cast the generator to half, fp32 islands (styles, demod, RGB skip)
  GPEN_TUNE_OPS            auto | torch | cuda  op path; auto = upstream rule, but pure PyTorch with compile/amp
  GPEN_TUNE_FAST_MODCONV   0 | 1            batch-friendly modulated conv (on by itself with compile/amp)
  GPEN_TUNE_CHECKPOINT     0 | 1            inference-memory saver: keep only small encoder features alive
  GPEN_TUNE_FACE_CROP      0 | 1            detect on a downscaled copy, paste back inside each face's region
  GPEN_TUNE_DET_SIZE       N (1024)         long-side cap of the detection copy; 0 = native size
  GPEN_TUNE_CUDA_GRAPH     0 | 1            capture the generator in a CUDA graph per input shape, replay it
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

PREFIX = "GPEN_TUNE_"

# the patches installed in this checkout; `gpen-tune apply-patches` rewrites this tuple
INSTALLED = ("lazy-detector", "compile", "amp", "checkpoint", "face-crop", "cuda-graph", "native-ops")
_OFF = ("", "0", "off", "false", "no", "none")

# (patch that installs the switch, demo.py flag, env var suffix, argparse keywords)
FLAGS = [
    ("lazy-detector", "--lazy_detector", "LAZY_DETECTOR",
     dict(nargs="?", const="1", metavar="on|release",
          help="build detector, SR model and face parser on first use; 'release' frees the detector after "
               "each detection")),
    ("compile", "--compile", "COMPILE",
     dict(nargs="?", const="default", metavar="MODE", help="torch.compile the GPEN generator (mode: default, "
                                                           "reduce-overhead, max-autotune)")),
    ("amp", "--amp", "AMP", dict(choices=["bf16", "fp16", "off"], help="run the generator in bf16/fp16 with "
                                                                       "fp32 islands (styles, demodulation, skip)")),
    ("native-ops", "--ops", "OPS", dict(choices=["auto", "torch", "cuda"],
                                        help="op path: auto (upstream rule; pure PyTorch when --compile/--amp), "
                                             "torch (never builds the CUDA extension), cuda")),
    ("checkpoint", "--checkpoint", "CHECKPOINT",
     dict(action="store_const", const="1", help="inference-memory saver: free encoder features after last use, "
                                                "recompute the two largest")),
    ("face-crop", "--face_crop", "FACE_CROP",
     dict(action="store_const", const="1", help="detect on a downscaled copy, paste back only inside each face's "
                                                "region")),
    ("face-crop", "--det_size", "DET_SIZE", dict(type=int, metavar="N", help="long side of the detection copy "
                                                                            "for --face_crop (default 1024, 0 = "
                                                                            "native)")),
    ("cuda-graph", "--cuda_graph", "CUDA_GRAPH",
     dict(action="store_const", const="1", help="capture the generator in a CUDA graph per input size and replay")),
]

_noted: set[str] = set()


def _note(msg: str) -> None:
    if msg not in _noted:
        _noted.add(msg)
        print(f"gpen-tune: {msg}", file=sys.stderr)


_OWNER = {name: patch for patch, _flag, name, _kw in FLAGS}
_OWNER["FAST_MODCONV"] = "native-ops"


def env(name: str, default: str = "") -> str:
    """A switch's value; a switch whose patch is not installed here reads as off (its hooks are absent)."""
    owner = _OWNER.get(name)
    if owner is not None and owner not in INSTALLED and not (owner == "native-ops" and _native_ops_installed()):
        return default
    return os.environ.get(PREFIX + name, default).strip().lower()


def _native_ops_installed() -> bool:
    return "compile" in INSTALLED or "amp" in INSTALLED


def on(name: str) -> bool:
    return env(name) not in _OFF


# ---------------------------------------------------------------- switches


def lazy_mode() -> str:
    value = env("LAZY_DETECTOR")
    return "release" if value == "release" else ("on" if on("LAZY_DETECTOR") else "off")


def compile_mode() -> str | None:
    value = env("COMPILE")
    if value in _OFF:
        return None
    return "default" if value in ("1", "on", "true", "yes", "default") else value


def amp_dtype():
    value = env("AMP")
    if value in _OFF:
        return None
    import torch

    if value in ("1", "on", "bf16", "bfloat16"):
        return torch.bfloat16
    if value in ("fp16", "half", "float16"):
        return torch.float16
    raise ValueError(f"{PREFIX}AMP={value!r}: use bf16, fp16 or 0")


def checkpoint_on() -> bool:
    return on("CHECKPOINT")


def face_crop_on() -> bool:
    return on("FACE_CROP")


def det_size() -> int:
    value = env("DET_SIZE", "1024") or "1024"
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(f"{PREFIX}DET_SIZE={value!r}: use a whole number of pixels (0 = native)") from None


def cuda_graph_on() -> bool:
    return on("CUDA_GRAPH")


def use_cuda_ext() -> bool:
    """May the compiled CUDA ops be built? Upstream's own platform/CUDA test still applies on top."""
    choice = env("OPS", "auto") or "auto"
    if choice == "torch":
        return False
    if choice == "cuda":
        return True
    # the compiled ops raise under half precision and cannot be traced by torch.compile (upstream, measured)
    return not (compile_mode() or amp_dtype())


def fast_modconv() -> bool:
    return bool(compile_mode() or amp_dtype()) or on("FAST_MODCONV")


def active() -> dict[str, str]:
    return {name: os.environ[PREFIX + name] for _p, _f, name, _k in FLAGS + [(None, None, "FAST_MODCONV", None)]
            if env(name) not in _OFF and name != "DET_SIZE"}


# ---------------------------------------------------------------- demo.py flags


def add_arguments(parser: argparse.ArgumentParser, patches=None) -> None:
    """Add the flags of the installed patches; each only sets its GPEN_TUNE_* variable."""
    patches = INSTALLED if patches is None else patches
    group = parser.add_argument_group("gpen-tune switches (each also readable from its GPEN_TUNE_* variable)")
    for patch, flag, name, kwargs in FLAGS:
        if patch in patches or (patch == "native-ops" and ("compile" in patches or "amp" in patches)):
            kw = dict(kwargs)
            kw["help"] = f"{kw['help']} [env {PREFIX}{name}]"
            group.add_argument(flag, dest="gpen_tune_" + name.lower(), default=None, **kw)


def apply_args(args) -> None:
    for _patch, _flag, name, _kw in FLAGS:
        value = getattr(args, "gpen_tune_" + name.lower(), None)
        if value is not None:
            os.environ[PREFIX + name] = str(value)
    if active():
        _note("switches on: " + ", ".join(f"{k.lower()}={v}" for k, v in active().items()))


def switches_from_argv(patches=None, argv=None) -> None:
    """Read our flags before upstream imports its ops (the CUDA extension is built at import time)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_arguments(parser, patches)
    args, _rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    for _patch, _flag, name, _kw in FLAGS:
        value = getattr(args, "gpen_tune_" + name.lower(), None)
        if value is not None:
            os.environ[PREFIX + name] = str(value)


# ---------------------------------------------------------------- lazy-detector


class LazyModel:
    """Stands in for an upstream model wrapper: builds it on first attribute access; `release()` drops it."""

    def __init__(self, name: str, factory) -> None:
        self.__dict__["_name"] = name
        self.__dict__["_factory"] = factory
        self.__dict__["_obj"] = None

    @property
    def loaded(self) -> bool:
        return self.__dict__["_obj"] is not None

    def get(self):
        if self.__dict__["_obj"] is None:
            self.__dict__["_obj"] = self.__dict__["_factory"]()
        return self.__dict__["_obj"]

    def release(self) -> None:
        if self.__dict__["_obj"] is None:
            return
        self.__dict__["_obj"] = None
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __getattr__(self, attr):
        return getattr(self.get(), attr)

    def __setattr__(self, attr, value):
        setattr(self.get(), attr, value)

    def __repr__(self) -> str:
        return f"LazyModel({self._name}, loaded={self.loaded})"


def lazy(name: str, factory):
    """Upstream builds every model in FaceEnhancement.__init__; with the switch on, build each on first use."""
    if lazy_mode() == "off":
        return factory()
    import torch

    # upstream's detector constructor turns autograd off for the whole process and FaceParse relies on it
    torch.set_grad_enabled(False)
    return LazyModel(name, factory)


def release(model) -> None:
    if isinstance(model, LazyModel):
        model.release()


def after_detect(enhancer) -> None:
    if lazy_mode() == "release":
        release(enhancer.facedetector)


# ---------------------------------------------------------------- face-crop


def detect_downscaled(detector, img, cap: int):
    """Run upstream's detector on a copy whose long side is at most `cap`; boxes/landmarks in full-image pixels."""
    import cv2
    import numpy as np

    height, width = img.shape[:2]
    if not cap or max(height, width) <= cap:
        return detector.detect(img)
    scale = cap / float(max(height, width))
    small_w, small_h = max(1, round(width * scale)), max(1, round(height * scale))
    small = cv2.resize(img, (small_w, small_h), interpolation=cv2.INTER_AREA)
    boxes, landmarks = detector.detect(small)
    sx, sy = width / float(small_w), height / float(small_h)
    boxes = np.array(boxes, dtype=np.float64, copy=True).reshape(-1, 5)
    boxes[:, [0, 2]] *= sx
    boxes[:, [1, 3]] *= sy
    landmarks = np.array(landmarks, dtype=np.float64, copy=True).reshape(-1, 10)
    landmarks[:, :5] *= sx      # upstream's layout: x1..x5, y1..y5
    landmarks[:, 5:] *= sy
    return boxes, landmarks


def _region(tfm_inv, size: int, width: int, height: int):
    """Bounding box (x0, y0, x1, y1) of the full image that the inverse warp of a size x size crop can touch."""
    import numpy as np

    corners = np.array([[-1, -1, 1], [size, -1, 1], [-1, size, 1], [size, size, 1]], dtype=np.float64)
    pts = corners @ np.asarray(tfm_inv, dtype=np.float64).T
    x0 = max(0, int(np.floor(pts[:, 0].min())) - 1)
    y0 = max(0, int(np.floor(pts[:, 1].min())) - 1)
    x1 = min(width, int(np.ceil(pts[:, 0].max())) + 2)
    y1 = min(height, int(np.ceil(pts[:, 1].max())) + 2)
    return x0, y0, x1, y1


def face_crop_process(enh, img):
    """FaceEnhancement.process (non-aligned) with a downscaled detection copy and per-face region paste-back.

    Same per-face steps as upstream (align, GAN, parse mask, small-face smoothing, alpha blend, larger-mask-wins
    compositing, final blend); only the warps, the compositing and the final blend are limited to each face's
    region, where upstream works on full-frame canvases for every face.
    """
    import cv2
    import numpy as np

    warp_and_crop_face = sys.modules[type(enh).__module__].warp_and_crop_face
    orig_faces, enhanced_faces = [], []
    img_sr = None
    if enh.use_sr:
        img_sr = enh.srmodel.process(img)
        if img_sr is not None:
            img = cv2.resize(img, img_sr.shape[:2][::-1])

    facebs, landms = detect_downscaled(enh.facedetector, img, det_size())
    after_detect(enh)

    height, width = img.shape[:2]
    full_mask = np.zeros((height, width), dtype=np.float32)
    full_img = np.zeros(img.shape, dtype=np.uint8)
    touched = None
    for faceb, points in zip(facebs, landms):  # noqa: B905 (runs on old Pythons too)
        if faceb[4] < enh.threshold:
            continue
        face_h, face_w = faceb[3] - faceb[1], faceb[2] - faceb[0]
        points = np.reshape(points, (2, 5))
        of, tfm_inv = warp_and_crop_face(img, points, reference_pts=enh.reference_5pts,
                                         crop_size=(enh.in_size, enh.in_size))
        ef = enh.facegan.process(of)
        orig_faces.append(of)
        enhanced_faces.append(ef)

        mask = enh.mask_postprocess(enh.faceparser.process(ef)[0] / 255.)
        mask = cv2.resize(mask, (enh.in_size, enh.in_size))
        x0, y0, x1, y1 = _region(tfm_inv, enh.in_size, width, height)
        if x1 <= x0 or y1 <= y0:
            continue
        shifted = np.array(tfm_inv, dtype=np.float64, copy=True)
        shifted[0, 2] -= x0
        shifted[1, 2] -= y0
        mask = cv2.warpAffine(mask, shifted, (x1 - x0, y1 - y0), flags=3)

        if min(face_h, face_w) < 100:
            ef = cv2.filter2D(ef, -1, enh.kernel)
        ef = cv2.addWeighted(ef, enh.alpha, of, 1. - enh.alpha, 0.0)
        if enh.in_size != enh.out_size:
            ef = cv2.resize(ef, (enh.in_size, enh.in_size))
        face = cv2.warpAffine(ef, shifted, (x1 - x0, y1 - y0), flags=3)

        region_mask = full_mask[y0:y1, x0:x1]
        region_img = full_img[y0:y1, x0:x1]
        take = (mask - region_mask) > 0
        region_mask[take] = mask[take]
        region_img[take] = face[take]
        touched = (x0, y0, x1, y1) if touched is None else (
            min(touched[0], x0), min(touched[1], y0), max(touched[2], x1), max(touched[3], y1))

    background = img_sr if (enh.use_sr and img_sr is not None) else img
    out = np.ascontiguousarray(background).copy()
    if touched is not None:
        x0, y0, x1, y1 = touched
        m = full_mask[y0:y1, x0:x1, np.newaxis]
        out[y0:y1, x0:x1] = cv2.convertScaleAbs(background[y0:y1, x0:x1] * (1 - m) + full_img[y0:y1, x0:x1] * m)
    return out, orig_faces, enhanced_faces


# ---------------------------------------------------------------- compile / amp / cuda-graph (FaceGAN hooks)


def modulated_conv2d_fast(conv, x, style):
    """ModulatedConv2d without the per-sample grouped conv: scale activations by the style, one shared-weight
    conv, then scale by the demodulation coefficients. Same maths; styles and demodulation stay in fp32."""
    import torch
    import torch.nn.functional as F

    batch = x.shape[0]
    s = conv.modulation(style.to(conv.modulation.weight.dtype)).float()          # [B, cin]
    weight = conv.weight[0] * conv.scale                                           # [cout, cin, k, k]
    x = x * s.to(x.dtype).view(batch, -1, 1, 1)
    demod = None
    if conv.demodulate:
        w2 = (conv.weight[0].float() * conv.scale).pow(2).sum([2, 3])            # [cout, cin]
        demod = torch.rsqrt(s.pow(2) @ w2.t() + 1e-8).to(x.dtype).view(batch, -1, 1, 1)
    if conv.upsample:
        out = F.conv_transpose2d(x, weight.transpose(0, 1), padding=0, stride=2)
        if demod is not None:
            out = out * demod
        return conv.blur(out)
    if conv.downsample:
        out = F.conv2d(conv.blur(x), weight, padding=0, stride=2)
    else:
        out = F.conv2d(x, weight, padding=conv.padding)
    if demod is not None:
        return out * demod
    return out.float()            # demodulate=False is ToRGB: the RGB skip sum stays fp32


def _to_fp32_inputs(_module, args):
    import torch

    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def cast_with_islands(model, dtype) -> None:
    """Half weights and activations; EqualLinear (mapping, final_linear, modulation), the RGB skip upsampling and
    ToRGB biases stay fp32, with their inputs converted on entry."""
    model.to(dtype)
    for module in model.modules():
        kind = type(module).__name__
        if kind in ("EqualLinear", "Upsample"):
            module.float()
            module.register_forward_pre_hook(_to_fp32_inputs)
        elif kind == "ToRGB" and getattr(module, "bias", None) is not None:
            module.bias.data = module.bias.data.float()


class GeneratorRunner:
    """What FaceGAN calls instead of `self.model(img_t)` when a generator switch is on."""

    def __init__(self, fn, dtype) -> None:
        self.fn = fn
        self.dtype = dtype

    def __call__(self, img_t):
        if self.dtype is not None:
            img_t = img_t.to(self.dtype)
        out = self.fn(img_t)
        return (out[0].float(),) + tuple(out[1:])


class CudaGraphRunner:
    """Static input buffer + one captured CUDA graph per (shape, dtype); replays it for every later call."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.graphs = {}
        self.failed = False

    def _capture(self, x):
        import torch

        static_in = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):                      # warm-up: cuDNN algorithm choice, allocator, compile
                self.fn(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self.fn(static_in)
        return graph, static_in, static_out

    def __call__(self, x):
        import torch

        if self.failed or x.device.type != "cuda":
            return self.fn(x)
        key = (tuple(x.shape), x.dtype, str(x.device))
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self.graphs[key] = self._capture(x)
            except RuntimeError as exc:
                self.failed = True
                _note(f"cuda-graph capture failed ({str(exc).splitlines()[0]}); running without it")
                return self.fn(x)
        graph, static_in, static_out = entry
        static_in.copy_(x)
        graph.replay()
        return tuple(t.clone() if torch.is_tensor(t) else t for t in static_out)


def prepare_facegan(gan) -> None:
    """Called at the end of FaceGAN.load_model: decide once which generator runner this FaceGAN uses."""
    import torch

    gan.gpen_tune_runner = None
    model = gan.model
    dtype, mode, graph = amp_dtype(), compile_mode(), cuda_graph_on()
    fast = fast_modconv()
    for module in model.modules():
        if type(module).__name__ == "ModulatedConv2d":
            module.gpen_tune_fast = fast
    if not (dtype or mode or graph):
        return
    if dtype is not None:
        cast_with_islands(model, dtype)
    fn = model
    if mode:
        fn = torch.compile(model) if mode == "default" else torch.compile(model, mode=mode)
    if graph:
        if str(gan.device).startswith("cuda") and torch.cuda.is_available():
            fn = CudaGraphRunner(fn)
        else:
            _note(f"cuda-graph needs a CUDA device (FaceGAN runs on {gan.device!r}); running without it")
    gan.gpen_tune_runner = GeneratorRunner(fn, dtype)


def run_generator(gan, img_t):
    runner = getattr(gan, "gpen_tune_runner", None)
    return gan.model(img_t) if runner is None else runner(img_t)


# ---------------------------------------------------------------- checkpoint (inference-memory saver)


def lowmem_applies(generator, return_latents=False, inject_index=None, truncation=1, truncation_latent=None,
                   input_is_latent=False) -> bool:
    """The saver covers FaceGAN's call (defaults only); any other use runs upstream's forward."""
    return (bool(getattr(generator, "gpen_tune_lowmem", False)) and not return_latents and inject_index is None
            and truncation == 1 and not input_is_latent)


def full_generator_forward_lowmem(fg, inputs):
    """FullGenerator.forward with the same output, for less peak memory under no_grad.

    torch.utils.checkpoint saves nothing at inference (nothing is kept for backward). What is kept is every
    encoder feature until the decoder level that injects it. Here the two largest features are dropped after
    the encoder and recomputed from the input when their level comes; every feature is freed after last use.
    """
    encoder = [getattr(fg, name) for name in fg.names]
    n_recompute = min(2, len(encoder) - 1)
    kept = []
    h = inputs
    for i, ecd in enumerate(encoder):
        h = ecd(h)
        kept.append(None if i < n_recompute else h)
    z = fg.final_linear(h.view(h.shape[0], -1))
    del h

    def feature(i):
        f = kept[i]
        if f is None:
            f = inputs
            for ecd in encoder[: i + 1]:
                f = ecd(f)
        return f

    g = fg.generator
    w = g.style(z)                       # one style for every layer (upstream repeats it n_latent times)
    top = len(encoder) - 1
    out = g.input(w)
    out = g.conv1(out, w, noise=feature(top))
    kept[top] = None
    skip = g.to_rgb1(out, w)
    for level, to_rgb in enumerate(g.to_rgbs):
        idx = top - 1 - level
        f = feature(idx)
        out = g.convs[2 * level](out, w, noise=f)
        out = g.convs[2 * level + 1](out, w, noise=f)
        del f
        kept[idx] = None                 # last use: the allocator may reuse it for the next level
        skip = to_rgb(out, w, skip)
    return skip, None
