"""The CPU path and the device rules: capability reading, preset auto on CPU / MPS / small GPUs, the amp rules,
device selection, batch limits and the threads a CPU run uses."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from model_configs import SMALLEST

from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.model.io import psnr
from gpen_tune.pipeline import EnhanceSettings, Pipeline
from gpen_tune.pipeline.scheduler import SchedulerConfig
from gpen_tune.pipeline.settings import resolve_device
from gpen_tune.pipeline.sinks import MemorySink
from gpen_tune.pipeline.sources import ArraySource
from gpen_tune.restore import build_restorer, default_batch_size
from gpen_tune.tune import amp
from gpen_tune.tune.hardware import CpuCapabilities, cpu_capabilities, cpu_flags
from gpen_tune.tune.options import PRESETS, GiB, TuneConfig, choose_cpu_preset, choose_preset, cli_flags, resolve_preset

TINY = GPENConfig(64, narrow=0.25)
ZEN4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 "
        "avx512vl\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 avx512vl\n")
ZEN3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd asimdhp bf16 sve\n"


def caps(cpuinfo: str, cores: int = 2) -> CpuCapabilities:
    return cpu_capabilities(cpuinfo, cores=cores)


def test_cpu_flags_read_x86_and_arm_cpuinfo():
    assert "avx512_bf16" in cpu_flags(ZEN4) and "avx2" in cpu_flags(ZEN3)
    assert {"asimdhp", "bf16"} <= cpu_flags(GRAVITON3)
    assert cpu_flags("") == frozenset()


@pytest.mark.parametrize(("cpuinfo", "bf16", "fp16"), [(ZEN4, True, False), (ZEN3, False, False),
                                                      (SAPPHIRE, True, True), (GRAVITON3, True, True)])
def test_native_half_precision_from_the_flags(cpuinfo, bf16, fp16):
    c = caps(cpuinfo, cores=4)
    assert (c.bf16_dot, c.fp16_dot, c.cores) == (bf16, fp16, 4)
    assert ("native" in c.describe()) and ("fp32 only" in c.describe()) == (not bf16 and not fp16)


def test_auto_on_the_cpu_takes_the_cpu_preset_bf16_only_with_native_bf16():
    name, cfg, why = choose_cpu_preset(caps(ZEN4))
    assert name == "cpu" and cfg == PRESETS["cpu"] and cfg.amp == "bf16" and cfg.fused and cfg.onednn and "bf16" in why
    name, cfg, why = choose_cpu_preset(caps(ZEN3))
    assert name == "cpu" and cfg.amp == "off" and cfg.fused and not cfg.onednn and "no native bf16" in why
    # no GPU-only switch on the CPU preset
    assert not (cfg.cuda_graph or cfg.lazy_detector or cfg.compile)
    # choose_preset without CUDA memory = the CPU preset for the given CPU
    assert choose_preset(None, None, cpu=caps(ZEN3))[1].amp == "off"
    assert choose_preset(None, None, cpu=caps(ZEN4))[1].amp == "bf16"
    assert resolve_preset("auto", "cpu")[0] == "cpu"
    assert resolve_preset("auto", "mps")[:2] == ("mps", PRESETS["mps"]) and PRESETS["mps"].amp == "fp16"


@pytest.mark.parametrize(("free_gib", "total_gib", "want"), [(3.2, 4, "low-memory"), (5.9, 8, "low-memory"),
                                                             (7, 8, "balanced"), (70, 80, "speed")])
def test_auto_on_a_gpu_from_free_memory(free_gib, total_gib, want):
    name, cfg, why = choose_preset(int(free_gib * GiB), int(total_gib * GiB))
    assert name == want and cfg == PRESETS[want] and f"of {total_gib:.1f} GiB" in why


def test_what_low_memory_turns_on_and_its_batch_limit():
    cfg = PRESETS["low-memory"]
    assert cfg.act_checkpoint and cfg.lazy_detector and cfg.amp == "bf16"
    assert not cfg.cuda_graph and not cfg.compile      # no graph pools, no compile workspaces
    assert default_batch_size("cuda", low_memory=cfg.act_checkpoint) == 1 < default_batch_size("cuda") == 32
    assert default_batch_size("cpu") == default_batch_size("cpu", low_memory=True) == 1
    assert default_batch_size("mps") == 8


def test_amp_pays_off_only_with_native_dot_products():
    assert amp.pays_off("cpu", TuneConfig(amp="bf16"), caps(ZEN4)) is None
    assert "no native fp16" in amp.pays_off("cpu", TuneConfig(amp="fp16"), caps(ZEN4))
    assert "no native bf16" in amp.pays_off("cpu", TuneConfig(amp="bf16"), caps(ZEN3))
    assert amp.pays_off("cpu", TuneConfig(amp="fp16"), caps(SAPPHIRE)) is None
    assert amp.pays_off("cpu", TuneConfig(), caps(ZEN3)) is None
    assert amp.pays_off("cuda", TuneConfig(amp="fp16"), caps(ZEN3)) is None   # a GPU's own rules: is_supported


def test_cli_flags_name_the_switches_as_the_cli_spells_them():
    assert cli_flags(TuneConfig(amp="bf16", act_checkpoint=True)) == "--act-checkpoint --amp bf16"
    assert cli_flags(TuneConfig()) == "fp32, all off"
    assert cli_flags(PRESETS["cpu"]) == "--amp bf16 --fused --onednn"
    assert cli_flags(TuneConfig(face_crop=False)) == "--no-face-crop"


@pytest.mark.parametrize(("cuda", "mps", "want"), [(True, True, "cuda"), (False, True, "mps"),
                                                   (False, False, "cpu")])
def test_auto_device_prefers_cuda_then_mps_then_cpu(cuda, mps, want):
    notes: list[str] = []
    assert resolve_device("auto", notes.append, cuda=cuda, mps=mps).type == want
    assert bool(notes) == (want != "cuda")
    assert want != "cpu" or "NO GPU FOUND" in notes[0]


def test_explicit_devices_are_checked():
    assert resolve_device("mps", cuda=False, mps=True).type == "mps"
    with pytest.raises(ValueError, match="Apple MPS is not available"):
        resolve_device("mps", cuda=True, mps=False)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda:1", cuda=False, mps=True)
    assert resolve_device("cpu", cuda=True, mps=True).type == "cpu"


def test_cpu_preset_restorer_keeps_40_db_and_runs_fused():
    model = load_model("synthetic", model=TINY)
    x = torch.from_numpy(samples.aligned_face_crops(64, n=2)).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        ref = model(x)
    for cpu in (caps(ZEN4), caps(ZEN3)):
        _, cfg, _ = choose_cpu_preset(cpu)
        restorer = build_restorer(copy.deepcopy(model), cfg, device="cpu", max_batch=1)
        assert restorer.effective.fused and restorer.effective.amp == cfg.amp and not restorer.skipped
        out = restorer(x)
        assert psnr(out, ref) >= 40.0


def test_threads_of_a_cpu_run_never_exceed_the_cores():
    assert SchedulerConfig().cpu_threads(cores=2) == 1
    assert SchedulerConfig().cpu_threads(cores=16) == 8
    assert SchedulerConfig().cpu_threads(cores=1) == 1
    assert SchedulerConfig(torch_threads=3).cpu_threads(cores=2) == 3      # the user's explicit choice


def test_threaded_cpu_run_splits_the_cores_and_restores_torch_threads():
    """A real threaded run (tiny synthetic generator, bundled photos): while faces are restored torch uses the
    scheduler's CPU thread count; afterwards the caller's setting is back."""
    before = torch.get_num_threads()
    seen: list[int] = []
    settings = EnhanceSettings(model="GPEN-BFR-256", weights="synthetic", device="cpu", detector="mtcnn")
    model = load_model("synthetic", model=TINY)
    restorer = build_restorer(model, TuneConfig(face_crop=True), device="cpu", max_batch=1)
    config = SchedulerConfig(workers=1, torch_threads=1)
    with Pipeline(settings, TuneConfig(face_crop=True), restorer=restorer) as pipe:
        images = [samples.astronaut(), samples.grace_hopper()]
        sink = MemorySink()
        summary = pipe.run(ArraySource(images), sink, config=config,
                           on_faces=lambda n: seen.append(torch.get_num_threads()))
    assert summary.ok == 2 and seen and set(seen) == {1}
    assert torch.get_num_threads() == before
    assert sorted(sink.results) == [0, 1] and all(isinstance(a, np.ndarray) for a in sink.results.values())


def test_bf16_on_the_cpu_keeps_no_second_copy_of_the_weights():
    """bf16 cannot overflow (fp32's exponent range): on the CPU its NaN fallback up-casts the half weights instead of
    keeping the fp32 originals resident; fp16 (which overflows) and GPUs keep them."""
    assert not amp.keeps_fp32_originals("cpu", TuneConfig(amp="bf16"))
    assert amp.keeps_fp32_originals("cpu", TuneConfig(amp="fp16"))
    assert amp.keeps_fp32_originals("cuda", TuneConfig(amp="bf16"))
    model = load_model("synthetic", model=SMALLEST)
    restorer = build_restorer(copy.deepcopy(model), TuneConfig(amp="bf16"), device="cpu")
    assert restorer.reserve is not None and not restorer.reserve.exact and restorer.reserve.saved == {}
    fused = build_restorer(copy.deepcopy(model), TuneConfig(amp="bf16", fused=True), device="cpu")
    assert fused.reserve is None and fused.dtype == torch.bfloat16      # the fused module: the only weights
    assert all(p.device.type == "meta" for p in fused.model.parameters())
    assert np.array_equal(fused.restore_crops(list(samples.aligned_face_crops(16, n=1))).shape, (1, 16, 16, 3))
    crops = samples.aligned_face_crops(16, n=2)
    restorer_plain = build_restorer(copy.deepcopy(model), TuneConfig(amp="bf16"), device="cpu")
    with torch.no_grad():                    # a broken half model: the up-cast re-run runs, the input is kept
        restorer_plain.model.ecd0[0][0].weight.mul_(float("inf"))
    out = restorer_plain.restore_crops(list(crops))
    assert restorer_plain.fp32_reruns == 1 and restorer_plain.nonfinite_faces == 2
    assert np.array_equal(out, crops)
