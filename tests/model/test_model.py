"""The clean-room generator: module tree = official state-dict layout, and fp32 parity with the upstream formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpen_reference import gpen_forward_ref, upfirdn2d_ref

from gpen_tune.load import load_model
from gpen_tune.model import MODELS, FullGenerator, GPENConfig
from gpen_tune.ops import upfirdn2d
from gpen_tune.weights.checkpoint import synthetic_state_dict

# (entries, parameters) from the facts doc, section 3.6
OFFICIAL_COUNTS = {
    "GPEN-BFR-256": (144, 18_879_010),
    "GPEN-BFR-512": (163, 71_005_223),
    "GPEN-BFR-1024": (182, 71_210_540),
    "GPEN-BFR-2048": (201, 71_294_769),
}

# a few literal (key, shape) pairs per model, from the per-level tables of the facts doc
OFFICIAL_SHAPES = {
    "GPEN-BFR-256": {
        "generator.conv1.conv.weight": (1, 256, 256, 3, 3),
        "generator.to_rgb1.conv.weight": (1, 3, 512, 1, 1),
        "generator.convs.6.conv.weight": (1, 128, 512, 3, 3),
        "generator.convs.10.conv.weight": (1, 32, 128, 3, 3),
        "generator.convs.11.activate.bias": (64,),
        "generator.to_rgbs.5.conv.modulation.weight": (64, 512),
        "ecd0.0.0.weight": (32, 3, 1, 1),
        "ecd1.0.1.weight": (64, 32, 3, 3),
        "ecd6.0.2.bias": (256,),
        "final_linear.0.weight": (512, 4096),
    },
    "GPEN-BFR-512": {
        "generator.input.input": (1, 512, 4, 4),
        "generator.convs.0.conv.blur.kernel": (4, 4),
        "generator.convs.8.conv.weight": (1, 256, 1024, 3, 3),
        "generator.convs.13.conv.weight": (1, 64, 128, 3, 3),
        "generator.to_rgbs.6.upsample.kernel": (4, 4),
        "ecd7.0.0.kernel": (4, 4),
        "ecd3.0.1.weight": (512, 256, 3, 3),
        "final_linear.0.weight": (512, 8192),
    },
    "GPEN-BFR-1024": {
        "generator.convs.15.conv.weight": (1, 32, 64, 3, 3),
        "generator.to_rgbs.7.conv.weight": (1, 3, 64, 1, 1),
        "ecd8.0.1.weight": (512, 512, 3, 3),
        "ecd0.0.0.weight": (32, 3, 1, 1),
    },
    "GPEN-BFR-2048": {
        "generator.convs.16.conv.weight": (1, 16, 64, 3, 3),
        "generator.convs.17.activate.bias": (32,),
        "ecd9.0.2.bias": (512,),
        "ecd0.0.0.weight": (16, 3, 1, 1),
    },
}


@pytest.mark.parametrize("name", list(OFFICIAL_COUNTS))
def test_module_tree_reproduces_official_layout(name):
    with torch.device("meta"):
        model = FullGenerator(MODELS[name].config)
    sd = model.state_dict()
    entries, params = OFFICIAL_COUNTS[name]
    assert len(sd) == entries
    assert sum(p.numel() for p in model.parameters()) == params
    for key, shape in OFFICIAL_SHAPES[name].items():
        assert tuple(sd[key].shape) == shape, key
    # the double index of the encoder and the FIR buffers of every up-sampling layer
    assert all(k.startswith("ecd") and ".0." in k for k in sd if k.startswith("ecd"))
    n_up = len(model.generator.to_rgbs)
    assert sum(k.endswith("conv.blur.kernel") for k in sd) == n_up
    assert sum(k.endswith("upsample.kernel") for k in sd) == n_up
    # the official state dict lists ToRGB's bias before its children and the blur before the modulation
    keys = list(sd)
    assert keys.index("generator.to_rgb1.bias") < keys.index("generator.to_rgb1.conv.weight")
    assert keys.index("generator.convs.0.conv.blur.kernel") < keys.index("generator.convs.0.conv.modulation.weight")


def test_fir_buffers_have_official_values():
    sd = synthetic_state_dict(MODELS["GPEN-BFR-256"].config)
    k = torch.tensor([1.0, 3, 3, 1])
    k2 = torch.outer(k, k)
    assert torch.allclose(sd["ecd1.0.0.kernel"], k2 / 64)
    assert torch.allclose(sd["generator.convs.0.conv.blur.kernel"], k2 / 16)
    assert torch.allclose(sd["generator.to_rgbs.0.upsample.kernel"], k2 / 16)


@pytest.mark.parametrize(
    "up,down,pad", [(1, 1, (1, 1)), (2, 1, (2, 1)), (1, 2, (2, 2)), (2, 1, (1, 1)), (1, 1, (0, 3))]
)
def test_upfirdn2d_matches_reference(up, down, pad):
    x = torch.randn(2, 3, 9, 11)
    k = torch.rand(4, 4)  # asymmetric on purpose: catches a missing kernel flip
    assert torch.allclose(upfirdn2d(x, k, up, down, pad), upfirdn2d_ref(x, k, up, down, pad), atol=1e-6)


def _face_batch(size: int, batch: int, seed: int) -> torch.Tensor:
    """Real photo content: the astronaut's face region, resized, flipped/shifted per sample, plus noise."""
    import cv2
    import skimage.data

    img = skimage.data.astronaut()[30:330, 100:400]
    g = np.random.default_rng(seed)
    out = []
    for i in range(batch):
        crop = cv2.resize(np.roll(img, 7 * i, axis=1), (size, size), interpolation=cv2.INTER_AREA)
        if i % 2:
            crop = crop[:, ::-1]
        crop = crop.astype(np.float32) / 127.5 - 1 + g.normal(0, 0.05, crop.shape).astype(np.float32)
        out.append(torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1))
    return torch.stack(out)


PARITY_CONFIGS = [
    GPENConfig(32, channel_multiplier=1, narrow=0.25),
    GPENConfig(64, channel_multiplier=2, narrow=0.125),
    MODELS["GPEN-BFR-256"].config,
]


@pytest.mark.parametrize("cfg", PARITY_CONFIGS, ids=lambda c: f"{c.size}-cm{c.channel_multiplier}-n{c.narrow}")
def test_fp32_matches_upstream_formulation(cfg):
    model = load_model("synthetic", cfg)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    x = _face_batch(cfg.size, 3, seed=cfg.size)
    with torch.no_grad():
        ours = model(x)
        ref = gpen_forward_ref(sd, x)
    assert ours.shape == (3, 3, cfg.size, cfg.size) and ours.dtype == torch.float32
    assert ref.abs().max() > 0.1  # a live signal, not a collapsed output
    assert (ours - ref).abs().max().item() <= 1e-4


def test_batch_of_one_matches_upstream_formulation():
    """Batch 1 takes the weight-modulation route (style and demodulation folded into the weight)."""
    cfg = MODELS["GPEN-BFR-256"].config
    model = load_model("synthetic", cfg)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    x = _face_batch(cfg.size, 1, seed=5)
    with torch.no_grad():
        assert (model(x) - gpen_forward_ref(sd, x)).abs().max().item() <= 1e-4


def test_a_checkpoint_with_another_fir_kernel_is_honoured():
    cfg = GPENConfig(64, channel_multiplier=1, narrow=0.25)
    model = load_model("synthetic", cfg)
    sd = model.state_dict()
    key = next(k for k in sd if k.endswith("blur.kernel"))
    sd[key] = torch.full_like(sd[key], sd[key].sum().item() / 16)   # a box filter of the same gain
    model.load_state_dict(sd)
    x = _face_batch(64, 2, seed=3)
    with torch.no_grad():
        assert (model(x) - gpen_forward_ref(sd, x)).abs().max().item() <= 1e-4


def test_cached_demodulation_sums_follow_new_weights():
    cfg = GPENConfig(64, channel_multiplier=1, narrow=0.25)
    model = load_model("synthetic", cfg)
    x = _face_batch(64, 2, seed=4)
    with torch.no_grad():
        model(x)                                        # fills the caches
        sd = {k: v * 1.5 if k.endswith("conv.weight") else v for k, v in model.state_dict().items()}
        model.load_state_dict(sd)                       # copies in place: same tensors, new versions
        assert (model(x) - gpen_forward_ref(sd, x)).abs().max().item() <= 1e-4


def test_layer_styles_are_each_layers_affine_and_follow_new_weights():
    """Generator.layer_styles (one GEMM over the stacked affine weights, cached) gives every layer's own A(w), also
    after a modulation weight is changed in place, at batch 1 and 2."""
    cfg = GPENConfig(64, channel_multiplier=1, narrow=0.25)
    model = load_model("synthetic", cfg)
    g = model.generator
    x = _face_batch(64, 2, seed=5)
    with torch.no_grad():
        for w in (torch.randn(2, cfg.style_dim), torch.randn(1, cfg.style_dim)):
            got = g.layer_styles(w)
            want = [m(w) for m in g.modulations()]
            assert len(got) == len(want) == 2 + 3 * (cfg.log_size - 2)
            assert all(a.shape == b.shape and (a - b).abs().max() <= 1e-5 for a, b in zip(got, want, strict=True))
        g.to_rgbs[0].conv.modulation.weight.mul_(-2.0)      # in place: the stacked cache must notice
        g.convs[1].conv.modulation.bias.add_(0.5)
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        for batch in (x, x[:1]):
            assert (model(batch) - gpen_forward_ref(sd, batch)).abs().max().item() <= 1e-4


def test_input_matters_and_faces_are_batch_independent():
    cfg = GPENConfig(64, channel_multiplier=1, narrow=0.25)
    model = load_model("synthetic", cfg)
    x = _face_batch(64, 4, seed=1)
    with torch.no_grad():
        batched = model(x)
        single = torch.cat([model(x[i : i + 1]) for i in range(4)])
    assert (batched - single).abs().max().item() <= 1e-5
    assert (batched[0] - batched[1]).abs().mean().item() > 1e-2


def test_release_features_gives_identical_output():
    cfg = GPENConfig(64, channel_multiplier=1, narrow=0.25)
    model = load_model("synthetic", cfg)
    x = _face_batch(64, 2, seed=2)
    with torch.no_grad():
        kept = model(x)
        model.release_features = True
        released = model(x)
    assert torch.equal(kept, released)


def test_synthetic_weights_are_deterministic():
    cfg = GPENConfig(32, narrow=0.25)
    a, b = synthetic_state_dict(cfg), synthetic_state_dict(cfg)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert load_model("synthetic", cfg).weights_source == "synthetic"


def test_flop_count_matches_facts():
    # 138 GMAC = 276 GFLOP for BFR-512 (facts section 6, which also counts FIR taps: ~1.15 GMAC)
    assert abs(MODELS["GPEN-BFR-512"].config.flops_per_face() - 2 * (137.05 - 1.15) * 1e9) / 276e9 < 0.02
