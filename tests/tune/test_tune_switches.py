"""Each switch changes what it claims, and stays within its tolerance of the fp32 eager generator (CPU)."""

from __future__ import annotations

import copy
import gc
import math
import warnings
import weakref

import numpy as np
import pytest
import torch
from model_configs import SMALLEST

from gpen_tune.face.detect import LazyDetector
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.model.layers import (
    EqualConv2d,
    EqualLinear,
    ModulatedConv2d,
    StyledConv,
    ToRGB,
)
from gpen_tune.restore.buckets import bucket_ceil
from gpen_tune.restore.restorer import Restorer, build_restorer, finite_per_face
from gpen_tune.tune import TuneConfig, act_checkpoint, amp, cuda_graph
from gpen_tune.tune.live_memory import generator_activation_peak
from gpen_tune.tune.torch_compile import CompiledForward

TINY = GPENConfig(64, narrow=0.25)

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.one_thread



def face_batch(size: int, n: int = 2) -> torch.Tensor:
    """Real faces: the astronaut's face and Grace Hopper's, resized to size x size, NCHW RGB in [-1, 1]."""
    import matplotlib.cbook
    from PIL import Image
    from skimage import data

    crops = [data.astronaut()[40:200, 160:300]]
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        crops.append(np.asarray(Image.open(f).convert("RGB"))[60:330, 110:380])
    imgs = [np.asarray(Image.fromarray(c).resize((size, size), Image.BICUBIC)) for c in crops]
    imgs = [imgs[i % len(imgs)] for i in range(n)]
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 127.5 - 1
    return x.contiguous()


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    a = (a.clamp(-1, 1) + 1) / 2
    b = (b.clamp(-1, 1) + 1) / 2
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1 / mse)


@pytest.fixture(scope="module")
def tiny_model():
    return load_model("synthetic", model=TINY)


@pytest.fixture(scope="module")
def tiny_ref(tiny_model):
    x = face_batch(64)
    with torch.no_grad():
        return x, tiny_model(x)


@pytest.fixture(scope="module")
def guard_model():
    """SMALLEST, for the fallback tests: what they check (which weights a re-run uses, when it happens) does not
    depend on size."""
    return load_model("synthetic", model=SMALLEST)


@pytest.fixture(scope="module")
def guard_ref(guard_model):
    x = face_batch(SMALLEST.size)
    with torch.no_grad():
        return x, guard_model(x)


# --- act_checkpoint ----------------------------------------------------------------------------------------------

def test_checkpoint_frees_features_scales_in_place_and_output_is_the_same(tiny_model, tiny_ref):
    x, ref = tiny_ref
    model = copy.deepcopy(tiny_model)
    restore = build_restorer(model, TuneConfig(act_checkpoint=True), device="cpu")
    assert restore.model.release_features is True
    styled = [m for m in restore.model.modules() if isinstance(m, StyledConv)]
    assert styled and all(m.low_memory for m in styled)
    assert not any(m.low_memory for m in tiny_model.modules() if isinstance(m, StyledConv))
    assert list(restore.model.state_dict()) == list(tiny_model.state_dict())  # same file format
    torch.testing.assert_close(restore(x), ref, rtol=0, atol=1e-5)
    assert not restore.fallbacks


def test_checkpoint_lowers_the_activation_peak():
    """Measured, not assumed: peak bytes of live activations of one forward (14.6 -> 12.1 MiB here; GPEN-512 at
    batch 1: 462 -> 385 MiB)."""
    cfg = GPENConfig(128, channel_multiplier=1, narrow=0.25)
    model = load_model("synthetic", model=cfg)
    x = face_batch(128, n=1)
    plain = generator_activation_peak(model, x)
    build_restorer(model, TuneConfig(act_checkpoint=True), device="cpu")
    saved = generator_activation_peak(model, x)
    assert saved < 0.85 * plain, (plain / 2**20, saved / 2**20)


def test_autograd_checkpointing_is_kept_for_grad_enabled_forwards(tiny_model, tiny_ref):
    x, ref = tiny_ref
    model = copy.deepcopy(tiny_model).requires_grad_(True)
    out = act_checkpoint.checkpointed_forward(model, x)
    assert torch.allclose(out, ref, atol=1e-6)
    out.mean().backward()
    assert model.ecd0[0][0].weight.grad is not None
    assert act_checkpoint.lower_peak(model) is not None  # refused: would break grads


# --- amp ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("amp", [pytest.param("bf16", marks=pytest.mark.cpu_bf16), "fp16"])
def test_amp_casts_convs_keeps_fp32_islands_and_stays_within_tolerance(tiny_model, tiny_ref, guard_model, guard_ref,
                                                                      amp):
    # fp16 (a GPU format; emulated, slowly, on CPUs) on the smallest generator, bf16 on the 64 px one
    model, (x, ref) = (guard_model, guard_ref) if amp == "fp16" else (tiny_model, tiny_ref)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    restore = build_restorer(copy.deepcopy(model), TuneConfig(amp=amp), device="cpu")
    m = restore.model
    assert m.ecd0[0][0].weight.dtype == dtype
    for mod in m.modules():
        if isinstance(mod, (EqualConv2d, ModulatedConv2d)):
            assert mod.weight.dtype == dtype
        if isinstance(mod, EqualLinear):  # mapping network, modulation: the style path stays fp32
            assert mod.weight.dtype == torch.float32
        if isinstance(mod, ToRGB):
            assert mod.bias.dtype == torch.float32
    out = restore(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert psnr(out, ref) >= 40.0, psnr(out, ref)
    assert restore.effective.amp == amp and not restore.fallbacks


def test_amp_reruns_a_non_finite_batch_in_fp32_with_the_original_weights(guard_model, guard_ref):
    x, ref = guard_ref
    restore = build_restorer(copy.deepcopy(guard_model), TuneConfig(amp="fp16"), device="cpu")
    with torch.no_grad():  # an overflow in the half model only: its first conv weight becomes inf
        restore.model.ecd0[0][0].weight.mul_(float("inf"))
    out = restore(x)
    assert torch.isfinite(out).all()
    assert torch.equal(out, ref)  # the fp32 re-run uses the weights kept before casting
    assert restore.fp32_reruns == 1
    assert any("re-ran it in fp32" in f and "original fp32 weights" in f for f in restore.fallbacks)


def test_crop_level_guard_reruns_a_broken_half_batch_in_fp32(guard_model):
    """The pipeline's form of the NaN guard (submit / restore_crops): the per-face flags travel with the batch and
    a non-finite face sends the batch to the fp32 re-run; the crops equal the fp32 model's, nothing is counted
    as non-finite; a healthy half batch runs once."""
    from gpen_tune.model.io import to_model_input, to_uint8_nhwc

    faces = ((face_batch(SMALLEST.size, n=3) + 1) * 127.5).round().clamp(0, 255).byte().permute(0, 2, 3, 1)
    crops = [c.numpy() for c in faces]
    with torch.no_grad():
        want = to_uint8_nhwc(guard_model(to_model_input(torch.from_numpy(np.stack(crops))))).numpy()
    healthy = build_restorer(copy.deepcopy(guard_model), TuneConfig(amp="fp16"), device="cpu")
    healthy.restore_crops(crops)
    assert healthy.fp32_reruns == 0 and healthy.nonfinite_faces == 0
    broken = build_restorer(copy.deepcopy(guard_model), TuneConfig(amp="fp16"), device="cpu")
    with torch.no_grad():
        broken.model.ecd0[0][0].weight.mul_(float("inf"))
    got = broken.restore_crops(crops)
    assert broken.fp32_reruns == 1 and broken.nonfinite_faces == 0
    assert np.array_equal(got, want)


def test_fp32_rerun_first_needed_inside_inference_mode(guard_model, guard_ref):
    """The folder runner restores under torch.inference_mode; the fp32 model built there for the first re-run must
    still run (its weights must not be inference tensors, whose version the demodulation cache reads)."""
    x, ref = guard_ref
    restore = build_restorer(copy.deepcopy(guard_model), TuneConfig(amp="fp16"), device="cpu")
    with torch.no_grad():
        restore.model.ecd0[0][0].weight.mul_(float("inf"))
    with torch.inference_mode():
        out = restore(x)
    assert torch.equal(out, ref) and restore.fp32_reruns == 1


def test_fp16_overflow_is_caught_and_rerun(guard_model):
    x = face_batch(SMALLEST.size, n=1)
    big = copy.deepcopy(guard_model)
    with torch.no_grad():  # encoder activations ~1e6: fine in fp32, inf in fp16 (max 65504)
        big.ecd0[0][0].weight.mul_(1e6)
        ref = big(x)
    assert torch.isfinite(ref).all()
    restore = build_restorer(copy.deepcopy(big), TuneConfig(amp="fp16"), device="cpu")
    with torch.no_grad():
        assert not torch.isfinite(restore.model(x)).all()  # the half model really overflows
    out = restore(x)
    assert torch.equal(out, ref)
    assert restore.fp32_reruns == 1


# --- compile -----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_compile_traces_the_generator_as_one_graph_and_the_compiled_module_is_used():
    """fullgraph=True (a graph break raises and would fall back): the Dynamo trace, run eagerly. On SMALLEST,
    which has every layer kind of GPEN-BFR-256 (encoder, mapping, styled convs with upsampling, ToRGB skips)."""
    model = load_model("synthetic", model=SMALLEST)
    x = face_batch(SMALLEST.size, n=1)
    with torch.no_grad():
        ref = model(x)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    restore = build_restorer(model, TuneConfig(compile="default"), device="cpu", compile_backend=counting_backend)
    assert isinstance(restore.forward, CompiledForward)
    out = restore(x)
    assert restore.forward.active and not restore.fallbacks
    assert len(graphs) == 1  # one whole graph
    assert (out - ref).abs().max() <= 1e-4
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_failure_warns_and_runs_eager(tiny_model, tiny_ref):
    x, ref = tiny_ref

    def broken_backend(gm, example_inputs):
        raise RuntimeError("backend exploded (test)")

    torch._dynamo.reset()
    restore = build_restorer(copy.deepcopy(tiny_model), TuneConfig(compile="max-autotune"), device="cpu",
                             compile_backend=broken_backend)
    with pytest.warns(RuntimeWarning, match="running eager"):
        out = restore(x)
    assert torch.equal(out, ref)
    assert not restore.forward.active
    assert any("compile (max-autotune) failed" in f for f in restore.fallbacks)
    torch._dynamo.reset()


@pytest.mark.slow
def test_inductor_compiles_the_generator_fullgraph_on_cpu():
    """The real thing: Inductor code generation for the whole generator, on SMALLEST (every layer kind; the
    code generation time grows with the layer count: GPEN-BFR-256 took 2.3-3.5 min cold on 2 busy cores)."""
    model = load_model("synthetic", model=SMALLEST)
    x = face_batch(SMALLEST.size, n=1)
    with torch.no_grad():
        ref = model(x)
    torch._dynamo.reset()
    restore = build_restorer(model, TuneConfig(compile="default"), device="cpu")
    out = restore(x)
    assert restore.forward.active and not restore.fallbacks
    assert (out - ref).abs().max() <= 1e-3
    torch._dynamo.reset()


# --- cuda graph --------------------------------------------------------------------------------------------------

def test_cuda_graph_is_skipped_on_cpu_with_a_clear_reason(tiny_model, tiny_ref):
    x, ref = tiny_ref
    restore = build_restorer(copy.deepcopy(tiny_model), TuneConfig(cuda_graph=True), device="cpu")
    assert restore.skipped["cuda_graph"] == "CUDA Graphs need a CUDA device; running on cpu without graph capture"
    assert "cuda_graph skipped: CUDA Graphs need a CUDA device" in restore.fallbacks[0]
    assert not isinstance(restore.forward, cuda_graph.GraphedForward)
    assert restore.effective.cuda_graph is False
    assert torch.equal(restore(x), ref)


def test_cuda_graph_buckets():
    assert [bucket_ceil(b) for b in (1, 2, 3, 5, 16, 17, 64)] == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError):
        bucket_ceil(65)
    assert cuda_graph.compile_already_graphs(TuneConfig(compile="reduce-overhead"))
    assert cuda_graph.compile_already_graphs(TuneConfig(compile="max-autotune"))
    assert not cuda_graph.compile_already_graphs(TuneConfig(compile="default"))


# --- OOM splitting -----------------------------------------------------------------------------------------------

def test_out_of_memory_splits_the_batch_and_remembers_the_limit(tiny_model):
    x = face_batch(64, n=5)
    with torch.no_grad():
        ref = torch.cat([tiny_model(x[i:i + 1]) for i in range(5)])
    seen = []

    def runs_at_most_two(batch):
        seen.append(batch.shape[0])
        if batch.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return tiny_model(batch)

    restore = Restorer(runs_at_most_two, model=tiny_model)
    out = restore(x)
    assert (out - ref).abs().max() <= 1e-5
    assert restore.limit == restore.max_batch == 2
    assert seen == [5, 2, 2, 1]
    assert any("out of memory at batch 5" in f for f in restore.fallbacks)
    seen.clear()
    restore(x[:4])
    assert seen == [2, 2]  # the limit is remembered: no new failures


def test_out_of_memory_at_batch_one_is_raised(tiny_model):
    def always_oom(batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    with pytest.raises(torch.cuda.OutOfMemoryError):
        Restorer(always_oom, model=tiny_model)(face_batch(64, n=1))


# --- lazy detector -----------------------------------------------------------------------------------------------

class SmallDetector:
    """A detector-shaped object holding real weights (the pipeline's init_detector is not in this branch)."""

    name = "small"
    device = torch.device("cpu")

    def __init__(self):
        self.net = torch.nn.Conv2d(3, 8, 3)
        self.closed = False

    def detect(self, images):
        with torch.no_grad():
            return [[float(self.net(torch.from_numpy(im).permute(2, 0, 1)[None].float()).mean())] for im in images]

    def close(self):
        self.net = None
        self.closed = True


def test_lazy_detector_builds_on_first_use_releases_and_rebuilds():
    from skimage import data

    img = data.astronaut()[:64, :64]
    lazy = LazyDetector(SmallDetector, policy="always")
    assert not lazy.loaded and lazy.builds == 0  # nothing built until needed
    first = lazy.detect([img])
    assert lazy.loaded and lazy.builds == 1
    ref = weakref.ref(lazy.detector)
    assert lazy.before_restore() is True
    gc.collect()
    assert not lazy.loaded and ref() is None  # the object is gone
    assert lazy.releases == 1
    lazy.detect([img])
    assert lazy.loaded and lazy.builds == 2  # recreated on demand
    lazy.close()
    assert not lazy.loaded
    assert first  # detections came back


def test_lazy_detector_tight_policy_reads_free_memory():
    free = {"bytes": 10 * 1024**3}
    lazy = LazyDetector(SmallDetector, policy="tight", min_free_bytes=4 * 1024**3,
                         device="cuda:0", free_memory=lambda device: free["bytes"])
    lazy.detector  # noqa: B018 - build it
    assert lazy.before_restore() is False and lazy.loaded  # plenty free: kept
    free["bytes"] = 1024**3
    assert lazy.before_restore() is True and not lazy.loaded  # tight: released
    assert lazy.before_restore() is False  # nothing left to release


# --- build order -------------------------------------------------------------------------------------------------

def test_all_cpu_switches_together_stay_within_tolerance(guard_model, guard_ref):
    x, ref = guard_ref
    cfg = TuneConfig(lazy_detector=True, amp="bf16", act_checkpoint=True, face_crop=True, cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore = build_restorer(copy.deepcopy(guard_model), cfg, device="cpu")
    assert set(restore.skipped) == {"lazy_detector", "cuda_graph"}
    assert restore.model.release_features and restore.model.ecd0[0][0].weight.dtype == torch.bfloat16
    assert psnr(restore(x), ref) >= 40.0


# --- GPU (skipped here) ------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_graph_replays_the_right_outputs_for_changing_inputs(no_tf32):
    model = load_model("synthetic", model="GPEN-BFR-256", device="cuda")
    x = face_batch(256, n=3).cuda()
    with torch.no_grad():
        ref = model(x)
    restore = build_restorer(copy.deepcopy(model), TuneConfig(cuda_graph=True), device="cuda")
    assert isinstance(restore.forward, cuda_graph.GraphedForward)
    a = restore(x[:1])  # the bucket's first use runs eager
    b = restore(x[1:2])  # same bucket, different face: captured, replayed
    a2 = restore(x[:1])  # replayed
    restore(x)  # batch 3, bucket 4: eager
    c = restore(x)  # batch 3 padded to bucket 4: captured
    assert (a - ref[:1]).abs().max() < 1e-3 and (b - ref[1:2]).abs().max() < 1e-3
    assert (a2 - ref[:1]).abs().max() < 1e-3 and (c - ref).abs().max() < 1e-3
    assert (a2 - b).abs().max() > 1e-1  # different faces through one graph: different outputs (a stale replay fails)
    assert len(restore.forward.graphs) == 2


@pytest.mark.gpu
def test_bf16_on_gpu_within_tolerance():
    model = load_model("synthetic", model="GPEN-BFR-256", device="cuda")
    x = face_batch(256, n=2).cuda()
    with torch.no_grad():
        ref = model(x)
    restore = build_restorer(copy.deepcopy(model), TuneConfig(amp="bf16", cuda_graph=True), device="cuda")
    assert psnr(restore(x), ref) >= 40.0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_graph_composes_with_compile_without_capturing_twice(mode):
    model = load_model("synthetic", model="GPEN-BFR-256", device="cuda")
    x = face_batch(256, n=2).cuda()
    with torch.no_grad():
        ref = model(x)
    torch._dynamo.reset()
    restore = build_restorer(copy.deepcopy(model), TuneConfig(compile=mode, cuda_graph=True), device="cuda")
    if mode == "default":  # the compiled module is what gets captured
        assert isinstance(restore.forward, cuda_graph.GraphedForward)
        assert isinstance(restore.forward.module, CompiledForward)
    else:  # Inductor replays its own graphs: no manual capture
        assert isinstance(restore.forward, CompiledForward)
        assert "already replays CUDA graphs" in restore.notes[0]
    for _ in range(3):
        out = restore(x)
    assert (out - ref).abs().max() < 1e-2 and not restore.fallbacks
    torch._dynamo.reset()


@pytest.mark.gpu
def test_cudnn_search_pool_is_released_after_warmup(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # restored after the test (others need defaults)
    model = load_model("synthetic", model="GPEN-BFR-256", device="cuda")
    restore = build_restorer(model, TuneConfig(), device="cuda")
    restore(face_batch(256, n=4).cuda())
    torch.cuda.synchronize()
    # whatever the algorithm search reserved is handed back; what stays is what the generator holds
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < 512 * 1024**2


def test_fused_switch_uses_the_fast_module_built_from_fp32_weights(tiny_model, tiny_ref):
    x, ref = tiny_ref
    exact = build_restorer(copy.deepcopy(tiny_model), TuneConfig(fused=True), device="cpu")
    assert exact.forward is not exact.model and not exact.fallbacks
    assert (exact(x) - ref).abs().max() <= 1e-3
    half = build_restorer(copy.deepcopy(tiny_model), TuneConfig(fused=True, amp="bf16"), device="cpu")
    assert half.model.ecd0[0][0].weight.dtype == torch.bfloat16  # the fallback template is cast after fusing
    assert half.reserve is None          # on the CPU no fp32 copy is kept (memory): a bad face keeps its input
    assert psnr(half(x), ref) >= 40.0


def test_non_finite_check_is_one_reduction_per_face_and_never_misses():
    x = torch.rand(3, 3, 16, 16) * 2 - 1
    assert finite_per_face(x).tolist() == [True] * 3 and finite_per_face(x.bfloat16()).all()
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[1, 2, 7, 3] = bad
        assert finite_per_face(y).tolist() == [True, False, True]
        assert finite_per_face(y.bfloat16()).tolist() == [True, False, True]
    y = x.clone()
    y[2, 0, 0, 0], y[2, 1, 1, 1] = float("inf"), -float("inf")  # inf - inf = nan in the sum: still caught
    assert finite_per_face(y).tolist() == [True, True, False]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        finite_per_face(x)
    sums = [e for e in prof.key_averages() if e.key == "aten::sum"]
    assert len(sums) == 1 and sums[0].count == 1       # one reduction for the whole batch


def test_amp_casts_the_blur_kernels_once_not_per_call(guard_model, guard_ref):
    from gpen_tune.model.layers import Blur, Upsample

    x, _ = guard_ref
    restore = build_restorer(copy.deepcopy(guard_model), TuneConfig(amp="bf16"), device="cpu")
    kinds = {(type(m).__name__, m.kernel.dtype) for m in restore.model.modules() if isinstance(m, Blur | Upsample)}
    assert kinds == {("Blur", torch.bfloat16), ("Upsample", torch.float32)}  # Upsample filters the fp32 RGB skip
    per_call = copy.deepcopy(guard_model)         # what ran before: half weights, fp32 kernels cast on every call
    keep = amp.fp32_islands(per_call)
    for p in per_call.parameters():
        if id(p) not in keep:
            p.data = p.data.bfloat16()
    with torch.no_grad():
        assert torch.equal(restore(x), per_call(x).float())
