"""Checkpoints in the official layout for all four released sizes: key names and shapes against the facts doc
(section 3.6, written out literally here), strict loading, and clear refusals of bad files."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from conftest_weights import checkpoint_file, jpeg_file

from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.weights.checkpoint import CheckpointError, read_state_dict
from gpen_tune.weights.registry import infer_model, verify_file

# Upstream GPEN's checkpoints: entries, learned parameters, module counts, and a few
# literal shapes per level (first/last synthesis level, channel-table breakpoints, encoder ends, final_linear).
FACTS = {
    "GPEN-BFR-256": dict(entries=144, params=18_879_010, convs=12, to_rgbs=6, ecd=7, shapes={
        "generator.input.input": (1, 256, 4, 4),
        "generator.conv1.conv.weight": (1, 256, 256, 3, 3),
        "generator.conv1.activate.bias": (512,),
        "generator.to_rgb1.conv.weight": (1, 3, 512, 1, 1),
        "generator.convs.0.conv.weight": (1, 256, 512, 3, 3),
        "generator.convs.6.conv.weight": (1, 128, 512, 3, 3),
        "generator.convs.7.conv.weight": (1, 128, 256, 3, 3),
        "generator.convs.10.conv.weight": (1, 32, 128, 3, 3),
        "generator.convs.10.conv.blur.kernel": (4, 4),
        "generator.convs.11.conv.weight": (1, 32, 64, 3, 3),
        "generator.convs.11.conv.modulation.weight": (64, 512),
        "generator.convs.11.activate.bias": (64,),
        "generator.to_rgbs.5.conv.weight": (1, 3, 64, 1, 1),
        "generator.to_rgbs.5.upsample.kernel": (4, 4),
        "ecd0.0.0.weight": (32, 3, 1, 1),
        "ecd0.0.1.bias": (32,),
        "ecd1.0.0.kernel": (4, 4),
        "ecd1.0.1.weight": (64, 32, 3, 3),
        "ecd3.0.1.weight": (256, 128, 3, 3),
        "ecd6.0.1.weight": (256, 256, 3, 3),
        "final_linear.0.weight": (512, 4096),
    }),
    "GPEN-BFR-512": dict(entries=163, params=71_005_223, convs=14, to_rgbs=7, ecd=8, shapes={
        "generator.style.1.weight": (512, 512),
        "generator.style.8.bias": (512,),
        "generator.input.input": (1, 512, 4, 4),
        "generator.conv1.conv.weight": (1, 512, 512, 3, 3),
        "generator.conv1.noise.weight": (1,),
        "generator.to_rgb1.conv.weight": (1, 3, 1024, 1, 1),
        "generator.to_rgb1.bias": (1, 3, 1, 1),
        "generator.convs.6.conv.weight": (1, 512, 1024, 3, 3),
        "generator.convs.8.conv.weight": (1, 256, 1024, 3, 3),
        "generator.convs.9.conv.weight": (1, 256, 512, 3, 3),
        "generator.convs.12.conv.weight": (1, 64, 256, 3, 3),
        "generator.convs.13.conv.weight": (1, 64, 128, 3, 3),
        "generator.convs.13.activate.bias": (128,),
        "generator.to_rgbs.6.conv.weight": (1, 3, 128, 1, 1),
        "generator.to_rgbs.6.conv.modulation.weight": (128, 512),
        "ecd0.0.0.weight": (64, 3, 1, 1),
        "ecd1.0.1.weight": (128, 64, 3, 3),
        "ecd3.0.1.weight": (512, 256, 3, 3),
        "ecd7.0.0.kernel": (4, 4),
        "ecd7.0.1.weight": (512, 512, 3, 3),
        "ecd7.0.2.bias": (512,),
        "final_linear.0.weight": (512, 8192),
        "final_linear.0.bias": (512,),
    }),
    "GPEN-BFR-1024": dict(entries=182, params=71_210_540, convs=16, to_rgbs=8, ecd=9, shapes={
        "generator.input.input": (1, 512, 4, 4),
        "generator.convs.6.conv.weight": (1, 512, 1024, 3, 3),
        "generator.convs.8.conv.weight": (1, 256, 1024, 3, 3),
        "generator.convs.14.conv.weight": (1, 32, 128, 3, 3),
        "generator.convs.15.conv.weight": (1, 32, 64, 3, 3),
        "generator.convs.15.activate.bias": (64,),
        "generator.to_rgbs.7.conv.weight": (1, 3, 64, 1, 1),
        "ecd0.0.0.weight": (32, 3, 1, 1),
        "ecd1.0.1.weight": (64, 32, 3, 3),
        "ecd4.0.1.weight": (512, 256, 3, 3),
        "ecd8.0.1.weight": (512, 512, 3, 3),
        "final_linear.0.weight": (512, 8192),
    }),
    "GPEN-BFR-2048": dict(entries=201, params=71_294_769, convs=18, to_rgbs=9, ecd=10, shapes={
        "generator.input.input": (1, 512, 4, 4),
        "generator.convs.8.conv.weight": (1, 256, 1024, 3, 3),
        "generator.convs.16.conv.weight": (1, 16, 64, 3, 3),
        "generator.convs.16.conv.blur.kernel": (4, 4),
        "generator.convs.17.conv.weight": (1, 16, 32, 3, 3),
        "generator.convs.17.activate.bias": (32,),
        "generator.to_rgbs.8.conv.weight": (1, 3, 32, 1, 1),
        "generator.to_rgbs.8.conv.modulation.bias": (32,),
        "ecd0.0.0.weight": (16, 3, 1, 1),
        "ecd1.0.1.weight": (32, 16, 3, 3),
        "ecd5.0.1.weight": (512, 256, 3, 3),
        "ecd9.0.1.weight": (512, 512, 3, 3),
        "final_linear.0.weight": (512, 8192),
    }),
}
SIZES = list(FACTS)


def _indices(keys, prefix):
    return {int(k[len(prefix):].split(".")[0]) for k in keys if k.startswith(prefix)}


@pytest.mark.parametrize("name", SIZES)
def test_official_layout_matches_the_facts(name):
    facts = FACTS[name]
    sd = read_state_dict(checkpoint_file(name))  # weights_only=True, as every load
    assert len(sd) == facts["entries"]
    assert sum(v.numel() for k, v in sd.items() if not k.endswith(".kernel")) == facts["params"]
    assert _indices(sd, "generator.convs.") == set(range(facts["convs"]))
    assert _indices(sd, "generator.to_rgbs.") == set(range(facts["to_rgbs"]))
    assert {int(k[3:].split(".")[0]) for k in sd if k.startswith("ecd")} == set(range(facts["ecd"]))
    for key, shape in facts["shapes"].items():
        assert tuple(sd[key].shape) == shape, key
    # every ecdN (N >= 1) has the double index `ecdN.0.k` and a 4x4 blur kernel summing to 1
    for n in range(1, facts["ecd"]):
        assert {f"ecd{n}.0.0.kernel", f"ecd{n}.0.1.weight", f"ecd{n}.0.2.bias"} <= set(sd)
        assert torch.isclose(sd[f"ecd{n}.0.0.kernel"].sum(), torch.tensor(1.0))
    # the up-sampling FIRs are K x 4 (sum 4); odd convs and conv1/to_rgb1 carry no kernel
    assert torch.isclose(sd["generator.convs.0.conv.blur.kernel"].sum(), torch.tensor(4.0))
    assert "generator.convs.1.conv.blur.kernel" not in sd and "generator.to_rgb1.upsample.kernel" not in sd
    assert sum(k.endswith(".kernel") for k in sd) == facts["convs"] // 2 + facts["to_rgbs"] + facts["ecd"] - 1


@pytest.mark.parametrize("name", SIZES)
def test_strict_load_and_model_inference(name):
    path = checkpoint_file(name)
    net = load_model(path, model=name)
    sd = read_state_dict(path)
    got = net.state_dict()
    assert set(got) == set(sd)
    for key in ("ecd0.0.0.weight", "generator.style.3.weight", "final_linear.0.weight"):
        assert torch.equal(got[key], sd[key])
    assert not net.training and net.weights_source == str(path)

    v = verify_file(path)  # no --model: inferred from the keys and shapes
    assert v.model == name and v.entries == FACTS[name]["entries"] and v.params == FACTS[name]["params"]


def test_custom_config_is_inferred():
    cfg = GPENConfig(64, channel_multiplier=2, narrow=0.25)
    sd = read_state_dict(checkpoint_file(cfg))
    name, got = infer_model(sd)
    assert got == cfg and name.startswith("custom GPEN (size 64")


def test_wrong_size_lists_missing_keys():
    with pytest.raises(CheckpointError) as e:
        load_model(checkpoint_file("GPEN-BFR-256"), model="GPEN-BFR-512")
    msg = str(e.value)
    assert "19 missing keys" in msg and "wrong shapes" in msg and "\n" not in msg
    for module in ("generator.convs.12.*", "generator.convs.13.*", "generator.to_rgbs.6.*", "ecd7.*"):
        assert module in msg
    assert "looks like GPEN-BFR-256: pass --model GPEN-BFR-256" in msg


def test_wrong_size_lists_unexpected_keys():
    with pytest.raises(CheckpointError) as e:
        load_model(checkpoint_file("GPEN-BFR-512"), model="GPEN-BFR-256")
    msg = str(e.value)
    assert "19 unexpected keys" in msg and "ecd7.*" in msg and "generator.convs.13.*" in msg and "size 256" in msg
    assert "looks like GPEN-BFR-512" in msg


def test_truncated_file(tmp_path):
    data = checkpoint_file("GPEN-BFR-256").read_bytes()
    bad = tmp_path / "truncated.pth"
    bad.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match="truncated or corrupt.*download again") as e:
        load_model(bad, model="GPEN-BFR-256")
    assert str(bad) in str(e.value)


def test_zero_byte_file(tmp_path):
    bad = tmp_path / "empty.pth"
    bad.touch()
    with pytest.raises(CheckpointError, match="empty file"):
        load_model(bad, model="GPEN-BFR-256")


def test_jpeg_is_not_a_checkpoint():
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint \\(looks like a JPEG image\\)") as e:
        verify_file(jpeg_file())
    assert "grace_hopper.jpg" in str(e.value)


class _Payload:
    """Unpickling this would create the marker file: a checkpoint that tries to run code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.mark.parametrize("fmt", ["torch.save", "raw pickle"])
def test_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, fmt):
    marker = tmp_path / "PWNED"
    bad = tmp_path / "evil.pth"
    sd = {"ecd0.0.0.weight": torch.zeros(1), "evil": _Payload(marker)}
    if fmt == "torch.save":
        torch.save(sd, bad)
    else:
        with open(bad, "wb") as f:  # protocol 2, like torch.save, so the unpickler reaches the GLOBAL opcode
            pickle.dump({"evil": _Payload(marker)}, f, protocol=2)
    with pytest.raises(CheckpointError) as e:
        load_model(bad, model="GPEN-BFR-256")
    assert not marker.exists()
    msg = str(e.value)
    assert str(bad) in msg and "refused" in msg and "run code" in msg and "os.makedirs" in msg
    with pytest.raises(CheckpointError):
        verify_file(bad)
    assert not marker.exists()


def test_unknown_layout_names_the_closest_model(tmp_path):
    sd = read_state_dict(checkpoint_file("GPEN-BFR-512"))
    del sd["final_linear.0.bias"]
    bad = tmp_path / "edited.pth"
    torch.save(sd, bad)
    with pytest.raises(CheckpointError, match="matches no known GPEN model.*closest is GPEN-BFR-512 with 1 missing"):
        verify_file(bad)
