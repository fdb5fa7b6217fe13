"""The parse mask: both official checkpoint files load strictly (test-made, in their key layout), on by default only
when its weights are available (said once otherwise), required with --parse-mask, the device masks equal the host
ones, bf16 against fp32 on the bundled faces, registry pins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.face.parse import (
    UNAVAILABLE,
    FaceParser,
    ParseMaskError,
    load_parser,
    mask_area_iou,
    parse_weights_file,
)
from gpen_tune.face.paste import default_mask, feather_sigma

pytest.importorskip("facexlib")


def parsenet_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """ParseNet weights in the released files' layout (upstream's ParseNet-latest.pth and facexlib's
    parsing_parsenet.pth are both plain state dicts of this network: encoder.N..., body.N..., decoder.N...,
    out_img_conv, out_mask_conv); seeded random values."""
    from facexlib.parsing.parsenet import ParseNet

    torch.manual_seed(seed)
    net = ParseNet(in_size=512, out_size=512, min_feat_size=32, base_ch=64, parsing_ch=19, norm_type="bn",
                   relu_type="LeakyReLU", ch_range=[32, 256])
    return net.state_dict()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parsenet")
    sd = parsenet_state_dict()
    files = {}
    for name in ("ParseNet-latest.pth", "parsing_parsenet.pth"):
        files[name] = folder / name
        torch.save(sd, files[name])
    files["wrapped"] = folder / "dataparallel.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, files["wrapped"])
    files["wrong"] = folder / "wrong.pth"
    torch.save({k: v for k, v in sd.items() if not k.startswith("out_mask_conv")}, files["wrong"])
    return files


@pytest.fixture()
def offline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPEN_TUNE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GPEN_TUNE_OFFLINE", "1")
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def faces() -> np.ndarray:
    return samples.aligned_face_crops(256, 2)


def test_both_official_files_load_strictly(checkpoints):
    nets = [FaceParser("cpu", checkpoints[n]).net for n in ("ParseNet-latest.pth", "parsing_parsenet.pth",
                                                             "wrapped")]
    for net in nets[1:]:
        for (k, a), b in zip(nets[0].state_dict().items(), net.state_dict().values(), strict=True):
            assert torch.equal(a, b), k


def test_a_file_of_another_layout_fails_in_one_line(checkpoints):
    with pytest.raises(ParseMaskError, match="wrong.pth: not ParseNet weights") as e:
        FaceParser("cpu", checkpoints["wrong"])
    assert "\n" not in str(e.value)


def test_offline_without_weights_says_once_and_goes_on(offline_cache):
    said: list[str] = []
    assert load_parser(None, "cpu", notify=said.append) is None
    assert said == [UNAVAILABLE]
    assert load_parser(False, "cpu", notify=said.append) is None and len(said) == 1


def test_required_parse_mask_fails_in_one_line_naming_the_file(offline_cache):
    with pytest.raises(ParseMaskError) as e:
        load_parser(True, "cpu")
    msg = str(e.value)
    assert "\n" not in msg and "ParseNet-latest.pth" in msg and str(offline_cache) in msg
    with pytest.raises(ParseMaskError, match="missing.pth: parsing weights file not found"):
        load_parser(None, "cpu", weights=offline_cache / "missing.pth")


def test_cached_registry_file_is_found_and_pinned(offline_cache, checkpoints):
    from gpen_tune.weights import pins

    offline_cache.mkdir(parents=True)
    target = offline_cache / "parsing_parsenet.pth"
    target.write_bytes(checkpoints["parsing_parsenet.pth"].read_bytes())
    assert parse_weights_file() == target
    assert pins.get_pin("parsing_parsenet.pth") is not None
    with target.open("ab") as f:                       # the file changes after its pin
        f.write(b"\0")
    with pytest.raises(ValueError, match="differs from the pinned"):
        parse_weights_file()


@pytest.mark.slow
def test_device_masks_equal_host_masks_and_feather_widens_for_small_faces(checkpoints, faces):
    parser = FaceParser("cpu", checkpoints["ParseNet-latest.pth"])
    big = np.array([[1.5, 0.0, 10.0], [0.0, 1.5, 20.0]])              # a face ~ 2.7 times the crop's face
    small = np.array([[0.15, 0.0, 10.0], [0.0, 0.15, 20.0]])          # a ~35 px face from a 256 crop
    dev = parser.masks_device(torch.from_numpy(faces), [big, small])
    host = parser.masks(list(faces), [big, small])
    assert dev.shape == (2, 256, 256) and dev.dtype == torch.float32
    np.testing.assert_allclose(np.stack(host), dev.numpy(), atol=1e-6)
    assert feather_sigma(256, small) > feather_sigma(256, big)
    # a wider feather is a gentler ramp: compare the steepest steps of the two masks' square parts
    square_small, square_big = default_mask(256, small), default_mask(256, big)
    assert np.abs(np.diff(square_small)).max() < np.abs(np.diff(square_big)).max()


@pytest.mark.slow
def test_bf16_masks_agree_with_fp32_on_bundled_faces(checkpoints, faces):
    """The paste-mask criterion (IoU >= 0.99) and, since the test-made network's random logits all land in kept
    classes, also its class maps: they agree on nearly every pixel although random logits have tiny margins."""
    fp32 = FaceParser("cpu", checkpoints["ParseNet-latest.pth"], precision="fp32")
    bf16 = FaceParser("cpu", checkpoints["ParseNet-latest.pth"], precision="bf16")
    x = torch.from_numpy(faces)
    assert mask_area_iou(fp32.masks_device(x), bf16.masks_device(x)) >= 0.99
    with torch.inference_mode():
        t = x.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        a, b = fp32.net(t)[0].argmax(1), bf16.net(t.to(torch.bfloat16))[0].argmax(1)
    assert (a == b).float().mean().item() >= 0.95


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_masks_agree_with_fp32(checkpoints):
    x = torch.from_numpy(samples.aligned_face_crops(512)).cuda()
    fp32 = FaceParser("cuda", checkpoints["ParseNet-latest.pth"], precision="fp32").masks_device(x)
    auto = FaceParser("cuda", checkpoints["ParseNet-latest.pth"])
    assert auto.dtype == torch.bfloat16
    assert mask_area_iou(fp32, auto.masks_device(x)) >= 0.99
