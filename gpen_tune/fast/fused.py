"""`fuse(model)`: GPEN's forward rebuilt for speed from a loaded FullGenerator (same weights, same function).

What changes against `gpen_tune.model` (each lever is a `FastOptions` field, so a benchmark can attribute gains):
* Every style-independent weight transform is done once here: equalised-LR scales folded, conv weights in the
  compute dtype (transposed for the up-convs), per (cout, cin) sums of squares for demodulation in fp32, all
  modulation linears stacked into one matrix (one GEMM gives every layer's style), FIR taps as constants.
* Decoder: conv -> ONE fused pass (`epilogue.styled_epilogue`) that blurs the transposed-conv output, applies the
  demodulation, bias, leaky ReLU and gain, writes the encoder-feature half of the concatenation, and pre-scales
  both halves by the *next* conv's style. The next conv therefore reads its input exactly once and nothing
  activation-sized is materialised between convs. The up-conv stays a stride-2 transposed conv: folding the FIR
  into it (6x6 kernel = 4 polyphase 3x3 convs) would cost 4x its MACs.
* ToRGB: a per-sample [2C -> 3] matmul on the buffer with the RGB style folded into the weights (and the next
  conv's style divided out), accumulated in fp32; no scaled copy of the activation.
* Encoder: conv -> ONE pass writing the feature (bias + lrelu + gain) and the next layer's blurred input.
  `enc_blur="fold"` instead folds the blur into a 6x6 stride-2 kernel (4x the encoder's MACs: for measurement).
* channels-last end to end; encoder features are dropped right after their last use.
* Capture-safe: no host syncs, no data-dependent shapes, no tensors created from Python data in `forward`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.fast import epilogue as E
from gpen_tune.fast import triton_kernels as T
from gpen_tune.model.gpen import FullGenerator
from gpen_tune.model.layers import Blur, EqualConv2d, FusedLeakyReLU

EPILOGUES = ("auto", "torch", "triton")
BLUR_IMPLS = ("slices", "conv")
ENC_BLURS = ("fused", "conv", "fold")
UP_CONVS = ("transposed", "phases")
KERNELS = ("v2", "v1")


@dataclass(frozen=True)
class FastOptions:
    """The levers of the fast path; defaults are the predicted-fastest choice."""

    channels_last: bool = True     # NHWC activations and weights (cuDNN's native tensor-core layout)
    epilogue: str = "auto"         # "triton" (CUDA), "torch" (any device; Inductor-fusable), "auto": triton if it can
    up_blur: str = "slices"        # torch epilogue only: FIR after the transposed conv as slices or depthwise conv
    enc_blur: str = "fused"        # encoder FIR: "fused" into the epilogue, "conv" depthwise pass, "fold" 6x6 kernel
    up_conv: str = "transposed"    # "transposed": cuDNN's stride-2 transposed conv (dgrad kernels); "phases": its
    #                                4 polyphase convs (2x2, 2x1, 1x2, 1x1: same MACs, fprop kernels) interleaved
    kernels: str = "v2"            # Triton: "v2" encoder epilogue as elementwise + blur passes and ToRGB as a Triton
    #                                reduction; "v1" the first run's fused encoder pass and cuBLAS bmm ToRGB
    compile: bool = False          # torch.compile the forward (torch epilogue only; Inductor fuses the passes)
    release_features: bool = True  # drop each encoder feature after its last use (eager peak memory)

    def __post_init__(self) -> None:
        for name, allowed in (("epilogue", EPILOGUES), ("up_blur", BLUR_IMPLS), ("enc_blur", ENC_BLURS),
                              ("up_conv", UP_CONVS), ("kernels", KERNELS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"FastOptions.{name}={getattr(self, name)!r}; choose one of {allowed}")


# ---------------------------------------------------------------------------------------------------------------


def _cl(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t.contiguous()


def _fold_blur(weight: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """3x3 stride-2 conv after a 4x4 FIR (pad 2) == 6x6 stride-2 conv on the input padded by 2."""
    kf = kernel.double().flip(0, 1)
    w6 = weight.new_zeros(*weight.shape[:2], 6, 6, dtype=torch.float64)
    for u in range(3):
        for v in range(3):
            w6[:, :, u:u + 4, v:v + 4] += weight[:, :, u, v, None, None].double() * kf
    return w6.float()


class _EncoderLayer(nn.Module):
    def __init__(self, layer: nn.Sequential, dtype: torch.dtype, opts: FastOptions):
        super().__init__()
        conv = next(m for m in layer if isinstance(m, EqualConv2d))
        act = next(m for m in layer if isinstance(m, FusedLeakyReLU))
        blur = next((m for m in layer if isinstance(m, Blur)), None)
        w = conv.weight.detach().float() * conv.scale
        self.downsample = blur is not None
        self.fold = self.downsample and opts.enc_blur == "fold"
        if self.fold:
            w = _fold_blur(w, blur.kernel.detach().float())
        self.padding = conv.padding
        self.register_buffer("weight", _cl(w.to(dtype), opts.channels_last), persistent=False)
        self.register_buffer("bias", act.bias.detach().float().clone(), persistent=False)


class _StyledLayer(nn.Module):
    """One StyledConv: conv weight (dtype), demodulation sums (fp32), activation biases, noise scalar."""

    def __init__(self, sc: nn.Module, dtype: torch.dtype, opts: FastOptions):
        super().__init__()
        conv = sc.conv
        w = conv.weight.detach()[0].float() * conv.scale                       # [cout, cin, k, k]
        self.upsample = conv.upsample
        self.cout, self.cin = w.shape[0], w.shape[1]
        self.padding = conv.padding
        cw = w.transpose(0, 1) if self.upsample else w                         # conv_transpose2d wants [cin, cout]
        self.register_buffer("weight", _cl(cw.to(dtype), opts.channels_last), persistent=False)
        self.register_buffer("wsq", w.square().sum(dim=(2, 3)).t().contiguous(), persistent=False)  # [cin, cout]
        self.phases = self.upsample and opts.up_conv == "phases"
        if self.phases:
            # transposed conv, stride 2, k=3: out[2m] = x[m] w[0] + x[m-1] w[2], out[2m+1] = x[m] w[1] per axis,
            # i.e. correlation taps [w2, w0] (pad 1) for even outputs and [w1] for odd ones
            ev, od = [2, 0], [1]
            for name, rows, cols in (("w_ee", ev, ev), ("w_eo", ev, od), ("w_oe", od, ev), ("w_oo", od, od)):
                pw = w[:, :, rows][:, :, :, cols]
                self.register_buffer(name, _cl(pw.to(dtype), opts.channels_last), persistent=False)
        bias = sc.activate.bias.detach().float()
        self.register_buffer("b_h", bias[: self.cout].clone(), persistent=False)
        self.register_buffer("b_f", bias[self.cout:].clone(), persistent=False)
        self.nw = float(sc.noise.weight.detach().float().reshape(-1)[0])
        self.taps = E.separable_taps(conv.blur.kernel) if self.upsample else None
        if self.taps is not None:
            t2 = torch.tensor(self.taps[0], dtype=torch.float64)[:, None] * torch.tensor(self.taps[1],
                                                                                         dtype=torch.float64)
            self.register_buffer("taps2d", t2.float().contiguous(), persistent=False)


class _ToRGB(nn.Module):
    def __init__(self, trgb: nn.Module):
        super().__init__()
        self.register_buffer("weight", (trgb.conv.weight.detach()[0, :, :, 0, 0].float() * trgb.conv.scale).t()
                             .contiguous(), persistent=False)                   # [cin, 3]
        self.register_buffer("bias", trgb.bias.detach().float().reshape(1, 3, 1, 1).clone(), persistent=False)
        up = getattr(trgb, "upsample", None)
        # upfirdn2d(skip, K, up=2, pad=(2, 1)) == conv_transpose2d(skip, K, stride 2, padding 1, groups 3): 1 launch
        self.register_buffer("up_weight", None if up is None else
                             up.kernel.detach().float().expand(3, 1, 4, 4).contiguous(), persistent=False)


class FusedGenerator(nn.Module):
    """GPEN forward with fused passes; built by `fuse`. forward: [B,3,S,S] in [-1,1] -> [B,3,S,S] fp32."""

    def __init__(self, model: FullGenerator, dtype: torch.dtype, opts: FastOptions):
        super().__init__()
        self.opts = opts
        self.dtype = dtype
        self.size = model.size
        g = model.generator
        # --- encoder and style path (fp32)
        self.encoder = nn.ModuleList(_EncoderLayer(ecd[0], dtype, opts) for ecd in model.encoder)
        enc_kernel = next(m for m in model.encoder[1][0] if isinstance(m, Blur)).kernel
        self.enc_taps = E.separable_taps(enc_kernel)
        t2 = torch.tensor(self.enc_taps[0], dtype=torch.float64)[:, None] * torch.tensor(self.enc_taps[1],
                                                                                         dtype=torch.float64)
        self.register_buffer("enc_taps2d", t2.float().contiguous(), persistent=False)
        lin = model.final_linear[0]
        self.register_buffer("fl_w", (lin.weight.detach().float() * lin.scale).contiguous(), persistent=False)
        self.register_buffer("fl_b", (lin.bias.detach().float() * lin.lr_mul).contiguous(), persistent=False)
        maps = [m for m in g.style if hasattr(m, "weight")]
        self.register_buffer("map_w", torch.stack([m.weight.detach().float() * m.scale for m in maps]),
                             persistent=False)
        self.register_buffer("map_b", torch.stack([m.bias.detach().float() * m.lr_mul for m in maps]),
                             persistent=False)
        # --- decoder
        styled = [g.conv1, *g.convs]
        rgbs = [g.to_rgb1, *g.to_rgbs]
        self.layers = nn.ModuleList(_StyledLayer(sc, dtype, opts) for sc in styled)
        self.rgbs = nn.ModuleList(_ToRGB(t) for t in rgbs)
        mods = [sc.conv.modulation for sc in styled] + [t.conv.modulation for t in rgbs]
        self.register_buffer("mod_w", torch.cat([m.weight.detach().float() * m.scale for m in mods]).contiguous(),
                             persistent=False)
        self.register_buffer("mod_b", torch.cat([m.bias.detach().float() * m.lr_mul for m in mods]).contiguous(),
                             persistent=False)
        self.mod_sizes = [m.weight.shape[0] for m in mods]
        self.register_buffer("const", g.input.input.detach().float().clone(), persistent=False)
        self.register_buffer("demod_eps", torch.tensor(1e-8), persistent=False)
        self._use_triton = None  # decided on the first call (depends on the device)

    # -------------------------------------------------------------------------------------------------------

    def _triton(self, device: torch.device) -> bool:
        mode = self.opts.epilogue
        if mode == "torch":
            return False
        ok = T.available(device) and self.opts.channels_last
        if mode == "triton" and not ok:
            raise RuntimeError("epilogue='triton' needs Triton, a CUDA device and channels_last=True")
        return ok

    def _encode(self, x: torch.Tensor, use_triton: bool) -> list[torch.Tensor]:
        cl = self.opts.channels_last
        feats: list[torch.Tensor] = []
        h = x
        n = len(self.encoder)
        for i, layer in enumerate(self.encoder):
            if layer.fold:
                z = F.conv2d(F.pad(h, [2, 2, 2, 2]), layer.weight, stride=2)
            elif layer.downsample:
                z = F.conv2d(h, layer.weight, stride=2)                  # h is already blurred and padded
            else:
                z = F.conv2d(h, layer.weight, padding=layer.padding)
            z = _cl(z, cl)
            nxt = self.encoder[i + 1] if i + 1 < n else None
            want_blur = nxt is not None and nxt.downsample and not nxt.fold
            fused_blur = want_blur and self.opts.enc_blur == "fused"
            if use_triton:
                f, fb = T.encoder_epilogue(z, layer.bias, self.enc_taps2d if fused_blur else None,
                                           version=self.opts.kernels)
            else:
                f, fb = E.encoder_epilogue(z, layer.bias, self.enc_taps if fused_blur else None)
            del z
            if want_blur and fb is None:
                fb = _cl(E.blur(f, self.enc_taps, pad=2, impl="conv"), cl)
            feats.append(f)
            h = fb if want_blur else f
        return feats

    def extra_repr(self) -> str:
        return f"size={self.size}, dtype={self.dtype}, {self.opts}"

    def _apply(self, fn, *args, **kwargs):
        self._use_triton = None  # .to(device) may change which epilogue can run
        return super()._apply(fn, *args, **kwargs)

    def _styles(self, last: torch.Tensor) -> torch.Tensor:
        """Encoder code -> w (final_linear, pixel norm, 8-layer mapping) -> every layer's style, [B, sum of cin]."""
        z = E.lrelu_gain(last.flatten(1).float() @ self.fl_w.t() + self.fl_b)
        w = z * torch.rsqrt(z.square().mean(dim=1, keepdim=True) + 1e-8)
        for i in range(self.map_w.shape[0]):
            w = E.lrelu_gain(w @ self.map_w[i].t() + self.map_b[i])
        s = torch.addmm(self.mod_b, w, self.mod_w.t())                    # every layer's style in one GEMM
        return s

    def _demod(self, s_sq: torch.Tensor, layer: _StyledLayer) -> torch.Tensor:
        """d[b, o] = rsqrt(sum_i s[b,i]^2 * sum_k W[o,i,k]^2 + 1e-8), fp32 (a cin*9-term sum overflows fp16)."""
        return torch.rsqrt(torch.addmm(self.demod_eps, s_sq, layer.wsq))

    def _to_rgb(self, buf: torch.Tensor, rgb: _ToRGB, s_rgb: torch.Tensor, s_buf: torch.Tensor,
                skip: torch.Tensor | None) -> torch.Tensor:
        bsz, c2, h, w = buf.shape
        wt = rgb.weight[None] * (s_rgb / s_buf)[:, :, None]                    # [B, 2C, 3] fp32
        big = torch.finfo(buf.dtype).max                # a near-zero s_next must not overflow fp16 weights
        wt = wt.clamp(-big, big).to(buf.dtype)
        if buf.is_contiguous(memory_format=torch.channels_last):
            a = buf.permute(0, 2, 3, 1).reshape(bsz, h * w, c2)
            gemv = self._use_triton and self.opts.kernels == "v2" and h * w * c2 < 2**31
            out = (T.to_rgb(a, wt) if gemv else _bmm_f32(a, wt)).view(bsz, h, w, 3).permute(0, 3, 1, 2)
        else:
            out = _bmm_f32(wt.transpose(1, 2), buf.reshape(bsz, c2, h * w)).view(bsz, 3, h, w)
        out = out + rgb.bias
        if skip is not None:
            out = out + F.conv_transpose2d(skip, rgb.up_weight, stride=2, padding=1, groups=3)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        use_triton = self._use_triton
        if use_triton is None:
            use_triton = self._use_triton = self._triton(x.device)
        cl = self.opts.channels_last
        x = _cl(x.to(self.dtype), cl)
        feats = self._encode(x, use_triton)
        del x
        styles = self._styles(feats[-1])                                   # [B, sum of cin], fp32
        n_conv = len(self.layers)
        s_all = torch.split(styles, self.mod_sizes, dim=1)
        sq_all = torch.split(styles.square(), self.mod_sizes, dim=1)
        if self.dtype == torch.float16:                                     # per-layer relative floor (see safe_style)
            safe_all = tuple(E.safe_style(t, rel=2.0**-10) for t in s_all)
        else:
            safe_all = torch.split(E.safe_style(styles), self.mod_sizes, dim=1)
        s_conv, s_rgb = s_all[:n_conv], s_all[n_conv:]
        dt = self.dtype

        buf = _cl((self.const * s_conv[0][:, :, None, None]).to(dt), cl)     # conv1's modulated input
        skip = None
        feat_idx = len(feats) - 1
        for k, layer in enumerate(self.layers):
            # layer k: conv1 (k=0) at 4 px, then pairs (up-conv, conv) per resolution
            f = feats[feat_idx]
            if layer.phases:
                y = _phase_upconv(buf, layer, cl)
            elif layer.upsample:
                y = F.conv_transpose2d(buf, layer.weight, stride=2)
            else:
                y = F.conv2d(buf, layer.weight, padding=layer.padding)
            y = _cl(y, cl)
            del buf
            d = self._demod(sq_all[k], layer)                                # [B, cout] fp32 demodulation
            last_of_level = k == 0 or not layer.upsample
            rgb_idx = 0 if k == 0 else (k - 1) // 2 + 1
            s_next = safe_all[k + 1] if k + 1 < n_conv else safe_all[n_conv + rgb_idx]
            c = layer.cout
            s_h, s_f = s_next[:, :c], s_next[:, c:]
            if use_triton:
                buf = T.styled_epilogue(y, f, d, layer.b_h, s_h, layer.b_f, s_f, layer.nw,
                                        layer.taps2d if layer.upsample else None)
            else:
                buf = E.styled_epilogue(y, f, d, layer.b_h, s_h, layer.b_f, s_f, layer.nw,
                                        layer.taps, blur_impl=self.opts.up_blur)
            del y, f
            if last_of_level:
                skip = self._to_rgb(buf, self.rgbs[rgb_idx], s_rgb[rgb_idx], s_next, skip)
                if self.opts.release_features:
                    feats[feat_idx] = None                                    # last use: the allocator reuses it
                feat_idx -= 1
        return skip.contiguous()


def _phase_upconv(x: torch.Tensor, layer: _StyledLayer, channels_last: bool) -> torch.Tensor:
    """conv_transpose2d(x, W, stride=2) as 4 stride-1 convs written into the even/odd rows/cols of the output."""
    bsz, _, h, w = x.shape
    y = torch.empty((bsz, layer.cout, 2 * h + 1, 2 * w + 1), device=x.device, dtype=x.dtype,
                    memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    y[:, :, 0::2, 0::2] = F.conv2d(x, layer.w_ee, padding=1)
    y[:, :, 0::2, 1::2] = F.conv2d(x, layer.w_eo, padding=(1, 0))
    y[:, :, 1::2, 0::2] = F.conv2d(x, layer.w_oe, padding=(0, 1))
    y[:, :, 1::2, 1::2] = F.conv2d(x, layer.w_oo)
    return y


_BMM_OUT_DTYPE = [True]  # cleared once if this torch has no fp32-output bmm for half inputs


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 output; half inputs on CUDA use the fp32-output GEMM (no upcast copy of a)."""
    if _BMM_OUT_DTYPE[0] and a.dtype in (torch.float16, torch.bfloat16) and a.is_cuda:
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            _BMM_OUT_DTYPE[0] = False
    return torch.bmm(a, b).float()


def fuse(model: FullGenerator, dtype: torch.dtype | None = None, options: FastOptions | None = None,
         **variant_flags) -> nn.Module:
    """A fast module with FullGenerator's forward contract, built from a loaded FullGenerator (same weights).

    Args:
        model: a loaded FullGenerator (any device; fp32 weights preferred: bf16 weights lose precision already).
        dtype: compute dtype of convs and activations; None = the model's own (fp32 unless it was cast).
        options / variant_flags: FastOptions, or its fields as keywords (e.g. `epilogue="torch", compile=True`).
    Returns:
        An eval-mode module on the model's device; `.opts` holds the options. With compile=True the returned
        object is the torch.compile wrapper of that module.
    """
    opts = replace(options or FastOptions(), **variant_flags)
    dtype = dtype or model.compute_dtype
    if opts.compile and opts.epilogue == "triton":
        raise ValueError("compile=True uses the torch epilogue (Inductor generates its kernels); "
                         "set epilogue='torch' or 'auto'")
    if opts.compile:
        opts = replace(opts, epilogue="torch")
    device = next(model.parameters()).device
    with torch.no_grad():
        fused = FusedGenerator(model, dtype, opts).to(device).eval()
    fused.requires_grad_(False)
    if opts.compile:
        return torch.compile(fused)
    return fused
