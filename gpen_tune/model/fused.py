"""`fuse(model)`: GPEN's forward rebuilt for speed from a loaded FullGenerator (same weights, same function).

The --fused switch (gpen_tune.tune.fused) applies it; benchmarks/RESULTS.md has the floors and the
measurements behind each choice (alternatives measured slower were removed: NCHW layout, the encoder FIR as a
separate conv or folded into a 6x6 kernel, the up-conv as 4 polyphase convs, a one-pass encoder epilogue).
What changes against the plain model:
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
* Encoder: conv -> the feature (bias + lrelu + gain) and the next layer's blurred input (two Triton passes).
* channels-last end to end; encoder features are dropped right after their last use.
* Capture-safe: no host syncs, no data-dependent shapes, no tensors created from Python data in `forward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.model.gpen import FullGenerator
from gpen_tune.model.layers import Blur, EqualConv2d, FusedLeakyReLU
from gpen_tune.ops import modconv_epilogue as E
from gpen_tune.ops import modconv_epilogue_triton as T
from gpen_tune.ops.triton_support import compile_ahead

IMPLS = ("auto", "torch", "triton")


# ---------------------------------------------------------------------------------------------------------------


def _cl(t: torch.Tensor) -> torch.Tensor:
    """Channels-last (NHWC memory, cuDNN's tensor-core layout) for 4-D tensors, contiguous otherwise."""
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t.contiguous()


class _EncoderLayer(nn.Module):
    def __init__(self, layer: nn.Sequential, dtype: torch.dtype):
        super().__init__()
        conv = next(m for m in layer if isinstance(m, EqualConv2d))
        act = next(m for m in layer if isinstance(m, FusedLeakyReLU))
        w = conv.weight.detach().float() * conv.scale
        self.downsample = any(isinstance(m, Blur) for m in layer)
        self.padding = conv.padding
        self.register_buffer("weight", _cl(w.to(dtype)), persistent=False)
        self.register_buffer("bias", act.bias.detach().float().clone(), persistent=False)


class _StyledLayer(nn.Module):
    """One StyledConv: conv weight (dtype), demodulation sums (fp32), activation biases, noise scalar."""

    def __init__(self, sc: nn.Module, dtype: torch.dtype):
        super().__init__()
        conv = sc.conv
        w = conv.weight.detach()[0].float() * conv.scale                       # [cout, cin, k, k]
        self.upsample = conv.upsample
        self.cout, self.cin = w.shape[0], w.shape[1]
        self.padding = conv.padding
        cw = w.transpose(0, 1) if self.upsample else w                         # conv_transpose2d wants [cin, cout]
        self.register_buffer("weight", _cl(cw.to(dtype)), persistent=False)
        self.register_buffer("wsq", w.square().sum(dim=(2, 3)).t().contiguous(), persistent=False)  # [cin, cout]
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

    def __init__(self, model: FullGenerator, dtype: torch.dtype, impl: str = "auto"):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"impl={impl!r}; choose one of {IMPLS}")
        self.impl = impl
        self.dtype = dtype
        self.size = model.size
        g = model.generator
        # --- encoder and style path (fp32)
        self.encoder = nn.ModuleList(_EncoderLayer(ecd[0], dtype) for ecd in model.encoder)
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
        self.layers = nn.ModuleList(_StyledLayer(sc, dtype) for sc in styled)
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
        if self.impl == "torch":
            return False
        ok = T.available(device)
        if self.impl == "triton" and not ok:
            raise RuntimeError("impl='triton' needs Triton and a CUDA device of compute capability 8.0+")
        return ok

    def _encode(self, x: torch.Tensor, use_triton: bool) -> list[torch.Tensor]:
        feats: list[torch.Tensor] = []
        h = x
        n = len(self.encoder)
        for i, layer in enumerate(self.encoder):
            if layer.downsample:
                z = F.conv2d(h, layer.weight, stride=2)                  # h is already blurred and padded
            else:
                z = F.conv2d(h, layer.weight, padding=layer.padding)
            z = _cl(z)
            want_blur = i + 1 < n and self.encoder[i + 1].downsample
            if use_triton:
                f, fb = T.encoder_epilogue(z, layer.bias, self.enc_taps2d if want_blur else None)
            else:
                f, fb = E.encoder_epilogue(z, layer.bias, self.enc_taps2d if want_blur else None)
            del z
            feats.append(f)
            h = fb if want_blur else f
        return feats

    def extra_repr(self) -> str:
        return f"size={self.size}, dtype={self.dtype}, impl={self.impl}"

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
            gemv = self._use_triton and h * w * c2 < 2**31
            out = (T.to_rgb(a, wt) if gemv else _bmm_f32(a, wt)).view(bsz, h, w, 3).permute(0, 3, 1, 2)
        else:
            out = _bmm_f32(wt.transpose(1, 2), buf.reshape(bsz, c2, h * w)).view(bsz, 3, h, w)
        out = out + rgb.bias
        if skip is not None:
            # NCHW: on the channels-last skip the GEMV path writes, cuDNN's first call per shape cost ~1 s of every
            # process's first generator call (H100 profile; benchmarks/skip_upsample.py)
            out = out + F.conv_transpose2d(skip.contiguous(), rgb.up_weight, stride=2, padding=1, groups=3)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        use_triton = self._use_triton
        if use_triton is None:
            use_triton = self._use_triton = self._triton(x.device)
            if use_triton:
                # a dry pass first: its kernels compile side by side (a first-ever run compiled them one by one)
                with compile_ahead() as ahead:
                    if ahead:
                        self._run(x, use_triton)
        return self._run(x, use_triton)

    def _run(self, x: torch.Tensor, use_triton: bool) -> torch.Tensor:
        x = _cl(x.to(self.dtype))
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

        buf = _cl((self.const * s_conv[0][:, :, None, None]).to(dt))         # conv1's modulated input
        skip = None
        feat_idx = len(feats) - 1
        for k, layer in enumerate(self.layers):
            # layer k: conv1 (k=0) at 4 px, then pairs (up-conv, conv) per resolution
            f = feats[feat_idx]
            if layer.upsample:
                y = F.conv_transpose2d(buf, layer.weight, stride=2)
            else:
                y = F.conv2d(buf, layer.weight, padding=layer.padding)
            y = _cl(y)
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
                if layer.upsample:       # blurred here, so the transposed conv's output is freed before the pass
                    y = E.blur(y, layer.taps2d, pad=1)
                buf = E.styled_epilogue(y, f, d, layer.b_h, s_h, layer.b_f, s_f, layer.nw)
            del y, f
            if last_of_level:
                skip = self._to_rgb(buf, self.rgbs[rgb_idx], s_rgb[rgb_idx], s_next, skip)
                feats[feat_idx] = None                                        # last use: the allocator reuses it
                feat_idx -= 1
        return skip.contiguous()


# torch builds with the fp32-output batched GEMM for half inputs (aten::bmm.dtype, CUDA only)
BMM_HAS_OUT_DTYPE = hasattr(torch.ops.aten.bmm, "dtype")


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 output; half inputs on CUDA use the fp32-output GEMM (no upcast copy of a)."""
    if BMM_HAS_OUT_DTYPE and a.dtype in (torch.float16, torch.bfloat16) and a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a, b).float()


def fuse(model: FullGenerator, dtype: torch.dtype | None = None, impl: str = "auto") -> FusedGenerator:
    """A fast module with FullGenerator's forward contract, built from a loaded FullGenerator (same weights).

    Args:
        model: a loaded FullGenerator (any device; fp32 weights preferred: bf16 weights lose precision already).
        dtype: compute dtype of convs and activations; None = the model's own (fp32 unless it was cast).
        impl: the fused passes as "triton" kernels (CUDA, compute capability 8.0+), their "torch" twins (any
            device; what the CPU runs), or "auto": Triton where it can run. A benchmark measures the twins by name.
    Returns:
        An eval-mode module on the model's device.
    """
    dtype = dtype or model.compute_dtype
    device = next(model.parameters()).device
    with torch.no_grad():
        fused = FusedGenerator(model, dtype, impl).to(device).eval()
    fused.requires_grad_(False)
    return fused
