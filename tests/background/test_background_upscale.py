"""Background upscaler: spandrel recognises a test-made RRDBNet in the official layout, x2 / x4 sizes, tiles
without seams, bf16 against fp32, the scaled inverse affine, and one-line errors for bad files."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from gpen_tune.background.upscale import BackgroundUpscaler, UpscaleError, load_descriptor, scale_inverse
from gpen_tune.face import samples

pytest.importorskip("spandrel")


def rrdbnet_state_dict(scale: int, num_feat: int = 16, num_block: int = 1, num_grow_ch: int = 32,
                       seed: int = 0) -> dict[str, torch.Tensor]:
    """An RRDBNet state dict with the official key names (conv_first, body.N.rdbK.convJ, conv_body, conv_up1,
    conv_up2, conv_hr, conv_last); x2 takes a pixel-unshuffled input (12 channels), as the released x2 files.
    Seeded random weights around a colour pass-through (centre taps carry RGB in the first three features), so
    the output is a picture that the random body perturbs, not a constant."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}

    def conv(name: str, cin: int, cout: int, carry: int = 1) -> None:
        w = torch.randn(cout, cin, 3, 3, generator=g) * (0.3 / (9 * cin) ** 0.5)
        for c in range(3):
            w[c, c * carry, 1, 1] += 1.0           # input channel c * carry (its first sub-pixel) -> feature c
        sd[f"{name}.weight"] = w
        sd[f"{name}.bias"] = torch.randn(cout, generator=g) * 0.01

    unshuffle = (4 // scale) ** 2                    # x4: none; x2: 2x2 pixels per input channel
    conv("conv_first", 3 * unshuffle, num_feat, carry=unshuffle)
    for b in range(num_block):
        for r in (1, 2, 3):
            for c in range(1, 6):
                cin, cout = num_feat + (c - 1) * num_grow_ch, num_grow_ch if c < 5 else num_feat
                sd[f"body.{b}.rdb{r}.conv{c}.weight"] = torch.randn(cout, cin, 3, 3, generator=g) / (9 * cin) ** 0.5
                sd[f"body.{b}.rdb{r}.conv{c}.bias"] = torch.zeros(cout)
    for name in ("conv_body", "conv_up1", "conv_up2", "conv_hr"):
        conv(name, num_feat, num_feat)
    conv("conv_last", num_feat, 3)
    return sd


@cache
def rrdbnet_file(scale: int, tmp: str) -> Path:
    path = Path(tmp) / f"rrdbnet_x{scale}.pth"
    torch.save({"params_ema": rrdbnet_state_dict(scale)}, path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("rrdbnet"))


@pytest.mark.parametrize("scale", [2, 4])
def test_spandrel_detects_the_official_layout_and_scale(folder, scale):
    desc = load_descriptor(rrdbnet_file(scale, folder))
    assert desc.architecture.id == "ESRGAN" and desc.scale == scale


@pytest.mark.parametrize("scale", [2, 4])
def test_output_size_on_a_real_photo(folder, scale):
    img = samples.grace_hopper()[:150, :131]                       # odd sizes: padded to the model's multiple
    up = BackgroundUpscaler("realesrnet", scale, rrdbnet_file(scale, folder))
    out = up.upscale(img)
    assert out.shape == (150 * scale, 131 * scale, 3) and out.dtype == np.uint8
    assert out.std() > 5                                           # a picture, not a constant


def test_tiles_meet_without_seams(folder):
    img = samples.astronaut()[100:292, 120:340]
    whole = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder)).upscale(img).astype(int)
    tiled = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder), tile=64).upscale(img).astype(int)
    assert np.abs(tiled - whole).max() <= 1
    no_context = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder), tile=64, tile_pad=0).upscale(img)
    assert np.abs(no_context.astype(int) - whole).max() > 4        # the test sees seams when there are some


def test_bf16_agrees_with_fp32(folder):
    img = samples.astronaut()[150:310, 150:330]
    fp32 = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder), precision="fp32").upscale(img)
    bf16 = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder), precision="bf16").upscale(img)
    mse = np.mean((fp32.astype(float) - bf16.astype(float)) ** 2)
    assert 10 * np.log10(255.0 ** 2 / max(mse, 1e-12)) >= 40.0


def test_sixteen_bit_frames_keep_their_depth(folder):
    img = samples.astronaut()[:64, :64].astype(np.uint16) * 257
    out = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder)).upscale(img)
    assert out.dtype == np.uint16 and out.shape == (128, 128, 3)


def test_scaled_inverse_maps_pixel_centres():
    inv = np.array([[0.5, 0.1, 30.0], [-0.1, 0.5, 12.0]])
    up = scale_inverse(inv, 2)
    p = np.array([17.0, 40.0, 1.0])
    assert np.allclose(up @ p, 2 * (inv @ p) + 0.5)


def test_wrong_scale_and_bad_files_fail_in_one_line(folder, tmp_path):
    with pytest.raises(UpscaleError, match="a x2 model"):
        BackgroundUpscaler("realesrnet", 4, rrdbnet_file(2, folder))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(UpscaleError, match="junk.pth") as e:
        BackgroundUpscaler("realesrgan", 2, junk)
    assert "\n" not in str(e.value)
    with pytest.raises(UpscaleError, match="not found"):
        BackgroundUpscaler("realesrnet", 2, tmp_path / "missing.pth")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_per_tile_shape_match_eager(folder):
    img = samples.astronaut()[:200, :230]
    eager = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder), device="cuda", tile=64,
                               precision="fp32", cuda_graphs=False)
    graphs = BackgroundUpscaler("realesrnet", 2, rrdbnet_file(2, folder), device="cuda", tile=64,
                                precision="fp32")
    a, b = eager.upscale(img), graphs.upscale(img)
    assert len(graphs._graphs) >= 2                                 # edge tiles have shapes of their own
    assert np.abs(a.astype(int) - b).max() <= 1
    assert np.array_equal(graphs.upscale(img), b)                   # replays give the same bits
