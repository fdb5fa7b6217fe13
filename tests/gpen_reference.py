"""A direct, functional implementation of the upstream GPEN formulas (facts doc section 3), for parity tests only.

Deliberately written differently from `gpen_tune.model`: it reads the state dict by key, builds the per-sample
modulated weights and runs the grouped convolution (groups = batch) exactly as the upstream formulation does, and
implements upfirdn2d by explicit zero insertion and a flipped-kernel depthwise conv.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SQRT2 = math.sqrt(2.0)


def upfirdn2d_ref(x, k, up=1, down=1, pad=(0, 0)):
    n, c, h, w = x.shape
    z = x.new_zeros(n, c, h * up, w * up)
    z[:, :, ::up, ::up] = x
    z = F.pad(z, [pad[0], pad[1], pad[0], pad[1]])
    kk = torch.flip(k, [0, 1]).to(x)
    out = F.conv2d(z.reshape(n * c, 1, *z.shape[2:]), kk[None, None])
    out = out.reshape(n, c, *out.shape[2:])
    return out[:, :, ::down, ::down]


def lrelu_ref(x, b):
    return F.leaky_relu(x + b.view(1, -1, *([1] * (x.dim() - 2))), 0.2) * SQRT2


def equal_linear_ref(sd, p, x, lr_mul=1.0, act=False):
    wt, b = sd[p + ".weight"], sd[p + ".bias"]
    y = x @ (wt * lr_mul / math.sqrt(wt.shape[1])).t()
    return lrelu_ref(y, b * lr_mul) if act else y + b * lr_mul


def modconv_ref(sd, p, x, wlat, demod=True, up=False):
    weight = sd[p + ".weight"]                         # [1, cout, cin, k, k]
    _, cout, cin, k, _ = weight.shape
    b = x.shape[0]
    style = equal_linear_ref(sd, p + ".modulation", wlat)   # [B, cin]
    wmod = weight * (1 / math.sqrt(cin * k * k)) * style.view(b, 1, cin, 1, 1)
    if demod:
        wmod = wmod * torch.rsqrt(wmod.pow(2).sum([2, 3, 4]) + 1e-8).view(b, cout, 1, 1, 1)
    h, w = x.shape[2:]
    xin = x.reshape(1, b * cin, h, w)
    if up:
        wt = wmod.transpose(1, 2).reshape(b * cin, cout, k, k)
        out = F.conv_transpose2d(xin, wt, stride=2, padding=0, groups=b)
        out = out.reshape(b, cout, *out.shape[2:])
        return upfirdn2d_ref(out, sd[p + ".blur.kernel"], pad=(1, 1))
    out = F.conv2d(xin, wmod.reshape(b * cout, cin, k, k), padding=k // 2, groups=b)
    return out.reshape(b, cout, *out.shape[2:])


def styled_conv_ref(sd, p, x, wlat, noise, up=False):
    out = modconv_ref(sd, p + ".conv", x, wlat, up=up)
    out = torch.cat([out, sd[p + ".noise.weight"] * noise], 1)
    return lrelu_ref(out, sd[p + ".activate.bias"])


def to_rgb_ref(sd, p, x, wlat, skip=None):
    out = modconv_ref(sd, p + ".conv", x, wlat, demod=False) + sd[p + ".bias"]
    if skip is not None:
        out = out + upfirdn2d_ref(skip, sd[p + ".upsample.kernel"], up=2, pad=(2, 1))
    return out


def conv_layer_ref(sd, p, x, downsample):
    wt = sd[p + (".1.weight" if downsample else ".0.weight")]
    cout, cin, k, _ = wt.shape
    if downsample:
        x = upfirdn2d_ref(x, sd[p + ".0.kernel"], pad=(2, 2))
        x = F.conv2d(x, wt / math.sqrt(cin * k * k), stride=2)
        return lrelu_ref(x, sd[p + ".2.bias"])
    x = F.conv2d(x, wt / math.sqrt(cin * k * k), padding=k // 2)
    return lrelu_ref(x, sd[p + ".1.bias"])


def gpen_forward_ref(sd: dict[str, torch.Tensor], x: torch.Tensor, n_mlp: int = 8, lr_mlp: float = 0.01):
    """Upstream FullGenerator.forward(x)[0] from a state dict."""
    n_ecd = sum(1 for k in sd if k.startswith("ecd") and (k.endswith(".0.0.weight") or k.endswith(".0.1.weight")))
    feats = []
    h = x
    for i in range(n_ecd):
        h = conv_layer_ref(sd, f"ecd{i}.0", h, downsample=i > 0)
        feats.append(h)
    z = equal_linear_ref(sd, "final_linear.0", h.reshape(h.shape[0], -1), act=True)
    noise = [feats[-1]] + [f for f in reversed(feats[:-1]) for _ in range(2)]
    wl = z * torch.rsqrt(z.pow(2).mean(1, keepdim=True) + 1e-8)
    for i in range(1, n_mlp + 1):
        wl = equal_linear_ref(sd, f"generator.style.{i}", wl, lr_mul=lr_mlp, act=True)
    g = "generator."
    out = sd[g + "input.input"].repeat(x.shape[0], 1, 1, 1)
    out = styled_conv_ref(sd, g + "conv1", out, wl, noise[0])
    skip = to_rgb_ref(sd, g + "to_rgb1", out, wl)
    n_levels = len({k.split(".")[2] for k in sd if k.startswith(g + "to_rgbs.")})
    for lv in range(n_levels):
        out = styled_conv_ref(sd, f"{g}convs.{2 * lv}", out, wl, noise[1 + 2 * lv], up=True)
        out = styled_conv_ref(sd, f"{g}convs.{2 * lv + 1}", out, wl, noise[2 + 2 * lv])
        skip = to_rgb_ref(sd, f"{g}to_rgbs.{lv}", out, wl, skip)
    return skip
