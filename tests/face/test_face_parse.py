"""The parse mask: both official checkpoint files load strictly (test-made, in their key layout), on by default only
when its weights are available (said once otherwise), required with --parse-mask, synthetic weights (said loudly),
the dtype rule, the device masks and the batched device feather equal the host ones, a face's mask in a batch
equals its mask alone, bf16 against fp32 on the bundled faces, registry pins; on CUDA: bf16 / fp16 against fp32,
no host sync, the device paste through the mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.face.parse import (
    SYNTHETIC,
    SYNTHETIC_NOTICE,
    UNAVAILABLE,
    FaceParser,
    ParseMaskError,
    feather_device,
    load_parser,
    mask_area_iou,
    parse_dtype,
    parse_weights_file,
    synthetic_parse_state_dict,
    timing_parse_weights,
)
from gpen_tune.face.paste import default_mask, feather, feather_params, feather_sigma

SMALL = np.array([[0.15, 0.0, 10.0], [0.0, 0.15, 20.0]])        # crop -> image of a ~35 px face from a 256 crop
BIG = np.array([[1.5, 0.0, 10.0], [0.0, 1.5, 20.0]])            # a face ~ 2.7 times the crop's face

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


def test_synthetic_weights_are_a_seeded_parsenet_in_the_official_layout_and_said_loudly():
    said: list[str] = []
    parser = load_parser(True, "cpu", SYNTHETIC, notify=said.append)
    assert said == [SYNTHETIC_NOTICE] and parser.weights == SYNTHETIC
    official = parsenet_state_dict(seed=3)
    state = parser.net.state_dict()
    assert list(state) == list(official) and all(state[k].shape == v.shape for k, v in official.items())
    rng = torch.get_rng_state()
    again = synthetic_parse_state_dict()
    assert torch.equal(torch.get_rng_state(), rng)                    # the caller's random state is untouched
    assert all(torch.equal(state[k], again[k]) for k in state)        # seeded: the same network every time


def test_timing_weights_are_the_cached_file_else_synthetic(offline_cache, checkpoints):
    assert timing_parse_weights() == SYNTHETIC
    offline_cache.mkdir(parents=True)
    target = offline_cache / "ParseNet-latest.pth"
    target.write_bytes(checkpoints["ParseNet-latest.pth"].read_bytes())
    assert timing_parse_weights() == target


def test_dtype_rule_bf16_on_cuda_fp32_on_the_cpu():
    assert parse_dtype(torch.device("cpu")) == torch.float32
    assert parse_dtype(torch.device("cuda", 0)) == torch.bfloat16
    assert parse_dtype(torch.device("cpu"), "fp16") == torch.float16
    with pytest.raises(ValueError, match="parse precision must be one of"):
        parse_dtype(torch.device("cpu"), "int8")


def test_device_feather_of_a_batch_equals_the_host_feather_of_each_face():
    """Faces of different feathers (default, widened for small faces, so different kernel sizes and borders) in one
    batch: each face's mask equals `feather` of it alone (OpenCV)."""
    rng = np.random.default_rng(0)
    masks = (rng.random((4, 256, 256)) > 0.4).astype(np.float32)
    masks[:, 64:192, 64:192] = 1.0
    sigmas = [None, feather_sigma(256, SMALL), feather_sigma(256, BIG), feather_sigma(256, SMALL * 2)]
    params = {feather_params(256, s) for s in sigmas}
    assert len(params) == 3 and len({ksize for *_, ksize in params}) == 2     # borders and kernel sizes differ
    got = feather_device(torch.from_numpy(masks), sigmas).numpy()
    for m, s, g in zip(masks, sigmas, got, strict=True):
        np.testing.assert_allclose(g, feather(m, s), atol=1e-6)


@pytest.mark.slow
def test_masks_of_a_batch_equal_each_face_parsed_alone_on_the_cpu(checkpoints, faces):
    """What parsing per generator batch relies on: a face's mask does not depend on the batch around it (faces of
    different feathers in one batch, through `start` with its host copy, against each face alone through the
    host API); the device masks and their host copy agree."""
    parser = FaceParser("cpu", checkpoints["ParseNet-latest.pth"])
    inverses = [SMALL, BIG]
    device, host, seconds = parser.start(torch.from_numpy(faces), inverses, download=True).result()
    assert device.shape == (2, 256, 256) and device.dtype == torch.float32 and len(host) == 2 and seconds > 0
    np.testing.assert_allclose(np.stack(host), device.numpy(), atol=1e-6)
    for face, inverse, batched in zip(faces, inverses, host, strict=True):
        (alone,) = parser.masks([face], [inverse])
        np.testing.assert_allclose(batched, alone, atol=1e-6)
    assert parser.start(torch.from_numpy(faces[:1]), inverses[:1], download=False).result()[1] is None


def test_feather_widens_for_small_faces():
    assert feather_sigma(256, SMALL) > feather_sigma(256, BIG)
    # a wider feather is a gentler ramp: compare the steepest steps of the two masks' square parts
    square_small, square_big = default_mask(256, SMALL), default_mask(256, BIG)
    assert np.abs(np.diff(square_small)).max() < np.abs(np.diff(square_big)).max()


@pytest.mark.slow
def test_bf16_masks_agree_with_fp32_on_bundled_faces(checkpoints, faces):
    """The paste-mask criterion (IoU >= 0.99) and, since the test-made network's random logits all land in kept
    classes, also its class maps: they agree on nearly every pixel although random logits have tiny margins. One
    face: bf16 runs emulated, slowly, on CPUs without bf16 instructions."""
    fp32 = FaceParser("cpu", checkpoints["ParseNet-latest.pth"], precision="fp32")
    bf16 = FaceParser("cpu", checkpoints["ParseNet-latest.pth"], precision="bf16")
    x = torch.from_numpy(faces[:1])
    assert mask_area_iou(fp32.masks_device(x), bf16.masks_device(x)) >= 0.99
    with torch.inference_mode():
        t = x.permute(0, 3, 1, 2).float() / 127.5 - 1.0
        a, b = fp32.net(t)[0].argmax(1), bf16.net(t.to(torch.bfloat16))[0].argmax(1)
    assert (a == b).float().mean().item() >= 0.95


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["auto", "fp16"])
def test_cuda_half_masks_agree_with_fp32(checkpoints, precision):
    """The pipeline's choice on CUDA ("auto": bf16) and fp16: masks within IoU 0.99 of fp32's."""
    x = torch.from_numpy(samples.aligned_face_crops(512)).cuda()
    fp32 = FaceParser("cuda", checkpoints["ParseNet-latest.pth"], precision="fp32").masks_device(x)
    half = FaceParser("cuda", checkpoints["ParseNet-latest.pth"], precision=precision)
    assert half.dtype == (torch.bfloat16 if precision == "auto" else torch.float16)
    assert mask_area_iou(fp32, half.masks_device(x)) >= 0.99


@pytest.mark.gpu
def test_cuda_masks_make_no_host_sync(faces):
    """A batch of faces with different feathers: no host sync (an error in sync debug mode), the same masks as
    the host feather of the same class masks."""
    parser = FaceParser("cuda", SYNTHETIC)
    x = torch.from_numpy(faces).cuda()
    parser.masks_device(x, [SMALL, BIG])                 # warm-up: cuDNN's algorithm search, the pinned pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        masks = parser.masks_device(x, [SMALL, BIG])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host = parser.masks(list(faces), [SMALL, BIG])
    np.testing.assert_allclose(masks.cpu().numpy(), np.stack(host), atol=1e-6)


@pytest.mark.gpu
def test_cuda_device_paste_through_the_parse_mask_matches_the_host_paste(tmp_path):
    """The parse mask and the paste on the device (--paste gpu) against the host paste (--paste cpu) with the same
    parser, both threaded (only the threaded path keeps crops on the device) with one face per generator batch
    (the same batches whatever the timing), <= 2 grey levels; both record the parse step's time."""
    import cv2

    from gpen_tune.load import load_model
    from gpen_tune.model.configs import GPENConfig
    from gpen_tune.pipeline import EnhanceSettings, Pipeline, enhance

    folder = tmp_path / "in"
    folder.mkdir()
    for i, img in enumerate([cv2.resize(samples.mosaic(6, 2), None, fx=2.0, fy=2.0), samples.astronaut()]):
        cv2.imwrite(str(folder / f"{i}.png"), np.ascontiguousarray(img[..., ::-1]))
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    common = dict(device="cuda", detector="mtcnn", batch_size=1, parse_mask=True, parse_weights=SYNTHETIC)
    host = Pipeline(EnhanceSettings(**common, paste="cpu"), model=model)
    device = Pipeline(EnhanceSettings(**common, paste="gpu"), model=model)
    on_host = enhance(folder, tmp_path / "s", pipeline=host, serial=False, ext="png").summary
    on_device = enhance(folder, tmp_path / "p", pipeline=device, serial=False, ext="png").summary
    assert on_device.faces == on_host.faces >= 7
    assert not host.steps(service="thread").device_paste_possible
    assert device.steps(service="thread").device_paste_possible
    for a, b in zip(on_host.results, on_device.results, strict=True):
        x, y = cv2.imread(str(a.output)).astype(int), cv2.imread(str(b.output)).astype(int)
        assert np.abs(x - y).max() <= 2, a.output
        assert a.timings["parse"] > 0 and b.timings["parse"] > 0
    host.close()
    device.close()
