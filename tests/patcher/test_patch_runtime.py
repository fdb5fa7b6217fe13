"""The patched checkout imports and runs: each switch on and off, same output with every switch off.

Each checkout runs in its own subprocess (upstream's modules import each other by bare names, so a pristine and a
patched copy cannot share one interpreter). The generator part runs on the fixture and, when GPEN_UPSTREAM_DIR is
set, on a copy of the real upstream checkout with random weights; the whole pipeline runs on the fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

from gpen_tune.patcher import plan_apply

pytestmark = pytest.mark.slow   # every test runs the patched checkout in a child process

sys.path.insert(0, str(Path(__file__).parent))
from op_build import skip_unless_checkout_imports  # noqa: E402
from test_patch_engine import copy_checkout  # noqa: E402

PY = sys.executable

# Builds a tiny GPEN (64 px, narrow 0.125) with seeded random weights in the checkout's own FullGenerator, saves
# it as weights/tiny-gpen.pth and runs the checkout's FaceGAN on a real face crop under each switch setting.
GENERATOR_DRIVER = r"""
import json, os, sys
import numpy as np
root, out, configs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
device = sys.argv[4] if len(sys.argv) > 4 else 'cpu'
os.chdir(root); sys.path.insert(0, root)
import __init_paths
import cv2, torch
from skimage import data
from face_gan import FaceGAN
from gpen_model import FullGenerator
torch.manual_seed(0)
os.makedirs('weights', exist_ok=True)
torch.save(FullGenerator(64, 512, 8, 1, narrow=0.125).state_dict(), 'weights/tiny-gpen.pth')
face = cv2.resize(data.astronaut()[20:240, 140:320, ::-1], (64, 64), interpolation=cv2.INTER_AREA)
results = {}
for name, env in configs.items():
    for key in [k for k in os.environ if k.startswith('GPEN_TUNE_')]:
        del os.environ[key]
    os.environ.update(env)
    gan = FaceGAN('./', 64, None, 'tiny-gpen', 1, 0.125, None, device=device)
    results[name] = gan.process(face)
    results[name + '_again'] = gan.process(face)        # second call: replays the CUDA graph / compiled code
np.savez(out, **results)
"""

# Runs the fixture's FaceEnhancement on a real photo (astronaut on a wider canvas) under each switch setting and
# records how many detectors / parsers / SR models were built.
PIPELINE_DRIVER = r"""
import json, os, shutil, sys, types
import numpy as np
root, out, configs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.chdir(root); sys.path.insert(0, root)
import __init_paths
import cv2, torch
from skimage import data
from gpen_model import FullGenerator
torch.manual_seed(0)
os.makedirs('weights', exist_ok=True)
torch.save(FullGenerator(64, 512, 8, 1, narrow=0.125).state_dict(), 'weights/tiny-gpen.pth')
face = {'box': [181 / 1280, 62 / 720, 268 / 1280, 172 / 720], 'score': 0.99,
        'landmarks': [[x / 1280, y / 720] for x, y in ((205, 108), (246, 106), (226, 130), (210, 150), (242, 148))]}
json.dump({'faces': [face]}, open('weights/RetinaFace-R50.json', 'w'))
json.dump({'radius': 0.3}, open('weights/ParseNet-latest.json', 'w'))
canvas = np.full((720, 1280, 3), 90, np.uint8)
canvas[:512, :512] = data.astronaut()[:, :, ::-1]
from face_enhancement import FaceEnhancement
from face_detect.retinaface_detection import RetinaFaceDetection
from face_parse.face_parsing import FaceParse
args = types.SimpleNamespace(channel_multiplier=1, narrow=0.125, key=None, alpha=1.0, sr_model='realesrnet',
                             sr_scale=2, tile_size=0)
results, counts = {}, {}
for name, env in configs.items():
    for key in [k for k in os.environ if k.startswith('GPEN_TUNE_')]:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith('GPEN_TUNE_')})
    RetinaFaceDetection.built = FaceParse.built = 0
    sr_weights = 'weights/realesrnet_x2.json'
    if env.get('NO_SR_WEIGHTS') and os.path.exists(sr_weights):
        os.rename(sr_weights, sr_weights + '.away')
    if not env.get('NO_SR_WEIGHTS') and os.path.exists(sr_weights + '.away'):
        os.rename(sr_weights + '.away', sr_weights)
    try:
        enh = FaceEnhancement(args, './', in_size=64, model='tiny-gpen', use_sr=False, device='cpu')
    except FileNotFoundError as exc:
        counts[name] = {'error': os.path.basename(str(exc))}
        continue
    built_at_init = [RetinaFaceDetection.built, FaceParse.built]
    out_img = enh.process(canvas.copy())[0]
    out_img2 = enh.process(canvas.copy())[0]
    results[name] = out_img
    assert (out_img == out_img2).all()
    loaded = getattr(enh.facedetector, 'loaded', None)
    counts[name] = {'init': built_at_init, 'after': [RetinaFaceDetection.built, FaceParse.built],
                    'detector_loaded_after': loaded}
np.savez(out, **results)
json.dump(counts, open(out + '.json', 'w'))
"""


def run_drivers(driver: str, jobs: list[tuple[Path, Path, dict]], extra_weights: tuple[str, ...] = ()) -> list[dict]:
    """Run one driver process per (checkout, output, configs), concurrently; return each one's arrays."""
    procs = []
    for root, out, configs in jobs:
        for rel in extra_weights:
            (root / "weights").mkdir(exist_ok=True)
            (root / "weights" / rel).write_text("{}")
        procs.append(subprocess.Popen([PY, "-c", driver, str(root), str(out), json.dumps(configs)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc, (_root, out, _configs) in zip(procs, jobs, strict=True):
        _stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        with np.load(out) as npz:
            results.append({k: npz[k] for k in npz.files})
    return results


def run_driver(driver: str, root: Path, out: Path, configs: dict, extra_weights: tuple[str, ...] = ()) -> dict:
    return run_drivers(driver, [(root, out, configs)], extra_weights)[0]


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


GEN_CONFIGS = {
    "off": {},
    "checkpoint": {"GPEN_TUNE_CHECKPOINT": "1"},
    "fast_modconv": {"GPEN_TUNE_FAST_MODCONV": "1"},
    "amp_bf16": {"GPEN_TUNE_AMP": "bf16"},
    "amp_fp16": {"GPEN_TUNE_AMP": "fp16"},
    "cuda_graph_on_cpu": {"GPEN_TUNE_CUDA_GRAPH": "1"},
    "ops_torch": {"GPEN_TUNE_OPS": "torch"},
    "everything": {"GPEN_TUNE_CHECKPOINT": "1", "GPEN_TUNE_AMP": "bf16", "GPEN_TUNE_CUDA_GRAPH": "1",
                   "GPEN_TUNE_LAZY_DETECTOR": "release", "GPEN_TUNE_FACE_CROP": "1"},
}


@pytest.mark.parametrize("kind", ["fixture", "upstream"])
def test_patched_generator_runs_with_each_switch_and_matches_upstream_with_switches_off(kind, tmp_path):
    if kind == "fixture":
        skip_unless_checkout_imports()
    pristine = copy_checkout(kind, tmp_path / "pristine")
    patched = copy_checkout(kind, tmp_path / "patched")
    plan_apply(patched).commit()
    ref, got = run_drivers(GENERATOR_DRIVER, [(pristine, tmp_path / "ref.npz", {"off": {}}),
                                              (patched, tmp_path / "got.npz", GEN_CONFIGS)])
    reference = ref["off"]
    assert reference.std() > 10                            # a real image, not a blank
    for exact in ("off", "checkpoint", "cuda_graph_on_cpu", "ops_torch"):
        assert np.array_equal(got[exact], reference), exact
    assert np.abs(got["fast_modconv"].astype(int) - reference).max() <= 1
    for half in ("amp_bf16", "amp_fp16", "everything"):
        assert mean_abs(got[half], reference) < 2.0, half    # uint8 levels; fp32 islands keep it close
        assert not np.array_equal(got[half], reference) or half == "amp_fp16"


GPU_CONFIGS = {
    "fp32": {"GPEN_TUNE_OPS": "torch"},
    "fast_modconv": {"GPEN_TUNE_OPS": "torch", "GPEN_TUNE_FAST_MODCONV": "1"},
    "cuda_graph": {"GPEN_TUNE_OPS": "torch", "GPEN_TUNE_CUDA_GRAPH": "1"},
    "amp_bf16": {"GPEN_TUNE_AMP": "bf16"},
    "amp_fp16_graph": {"GPEN_TUNE_AMP": "fp16", "GPEN_TUNE_CUDA_GRAPH": "1"},
    "compile": {"GPEN_TUNE_COMPILE": "1"},
    "compile_bf16_checkpoint_graph": {"GPEN_TUNE_COMPILE": "1", "GPEN_TUNE_AMP": "bf16", "GPEN_TUNE_CHECKPOINT": "1",
                                      "GPEN_TUNE_CUDA_GRAPH": "1"},
}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["fixture", "upstream"])
def test_patched_generator_switches_on_a_gpu(kind, tmp_path):
    """On CUDA: pure-PyTorch fp32 as the reference (no extension build), every GPU switch close to it."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    patched = copy_checkout(kind, tmp_path / "patched")
    plan_apply(patched).commit()
    # the ops modules decide at import whether to JIT-build the CUDA extension: ask for the pure-PyTorch path
    # (the fixture ships no C++ sources, and building upstream's takes minutes and a matching host compiler)
    env = {**os.environ, "GPEN_TUNE_OPS": "torch"}
    proc = subprocess.run([PY, "-c", GENERATOR_DRIVER, str(patched), str(tmp_path / "gpu.npz"),
                           json.dumps(GPU_CONFIGS), "cuda"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running without it" not in proc.stderr               # the CUDA graph was captured, not skipped
    with np.load(tmp_path / "gpu.npz") as got:
        reference = got["fp32"]
        for name in GPU_CONFIGS:
            for key in (name, name + "_again"):
                limit = 2.0 if ("amp" in name or "bf16" in name) else 0.05
                assert mean_abs(got[key], reference) < limit, key


@pytest.mark.slow
def test_patched_generator_compiles(tmp_path):
    skip_unless_checkout_imports()
    pristine = copy_checkout("fixture", tmp_path / "pristine")
    patched = copy_checkout("fixture", tmp_path / "patched")
    plan_apply(patched, ["compile"]).commit()
    reference = run_driver(GENERATOR_DRIVER, pristine, tmp_path / "ref.npz", {"off": {}})["off"]
    got = run_driver(GENERATOR_DRIVER, patched, tmp_path / "got.npz", {"compile": {"GPEN_TUNE_COMPILE": "1"}})
    assert np.abs(got["compile"].astype(int) - reference).max() <= 1


PIPE_CONFIGS = {
    "off": {},
    "lazy": {"GPEN_TUNE_LAZY_DETECTOR": "1"},
    "release": {"GPEN_TUNE_LAZY_DETECTOR": "release"},
    "face_crop_native": {"GPEN_TUNE_FACE_CROP": "1", "GPEN_TUNE_DET_SIZE": "0"},
    "face_crop": {"GPEN_TUNE_FACE_CROP": "1", "GPEN_TUNE_DET_SIZE": "640"},
    "everything": {"GPEN_TUNE_FACE_CROP": "1", "GPEN_TUNE_DET_SIZE": "640", "GPEN_TUNE_LAZY_DETECTOR": "release",
                   "GPEN_TUNE_CHECKPOINT": "1", "GPEN_TUNE_AMP": "bf16"},
    "off_no_sr_weights": {"NO_SR_WEIGHTS": "1"},
    "lazy_no_sr_weights": {"NO_SR_WEIGHTS": "1", "GPEN_TUNE_LAZY_DETECTOR": "1"},
}


def test_patched_pipeline_and_demo_with_lazy_detector_and_face_crop(tmp_path):
    skip_unless_checkout_imports()
    pristine = copy_checkout("fixture", tmp_path / "pristine")
    patched = copy_checkout("fixture", tmp_path / "patched")
    plan_apply(patched).commit()
    sr = ("realesrnet_x2.json",)
    ref, got = run_drivers(PIPELINE_DRIVER, [(pristine, tmp_path / "ref.npz", {"off": {}}),
                                             (patched, tmp_path / "got.npz", PIPE_CONFIGS)], sr)
    ref = ref["off"]
    counts = json.loads((tmp_path / "got.npz.json").read_text())

    assert np.array_equal(got["off"], ref) and np.array_equal(got["lazy"], ref) and np.array_equal(got["release"], ref)
    assert counts["off"]["init"] == [1, 1]                              # upstream: built in __init__
    assert counts["lazy"]["init"] == [0, 0] and counts["lazy"]["after"] == [1, 1]
    assert counts["release"]["after"] == [2, 1] and counts["release"]["detector_loaded_after"] is False
    # upstream needs the SR weights even without --use_sr; with the lazy switch they are not touched
    assert counts["off_no_sr_weights"] == {"error": "realesrnet_x2.json"}
    assert np.array_equal(got["lazy_no_sr_weights"], ref)

    canvas_changed = np.abs(ref.astype(int) - 90).sum(axis=2) > 0
    assert canvas_changed[:512, :512].any()
    for name in ("face_crop_native", "face_crop", "everything"):
        assert mean_abs(got[name], ref) < 0.5, name
    # region-limited paste-back: outside the face's region the photo is returned untouched
    assert np.array_equal(got["face_crop"][:, 600:], ref[:, 600:])
    assert np.abs(got["face_crop_native"].astype(int) - ref).max() <= 2

    # demo.py documents the switches and runs with them (the weights are the ones the driver wrote)
    help_text = subprocess.run([PY, "demo.py", "--help"], cwd=patched, capture_output=True, text=True).stdout
    for flag in ("--lazy_detector", "--compile", "--amp", "--ops", "--checkpoint", "--face_crop", "--det_size",
                 "--cuda_graph", "GPEN_TUNE_FACE_CROP"):
        assert flag in help_text, flag
    (patched / "inputs").mkdir()
    cv2.imwrite(str(patched / "inputs" / "astronaut.png"), np.ascontiguousarray(data.astronaut()[:, :, ::-1]))
    proc = subprocess.run([PY, "demo.py", "--face_crop", "--det_size", "256", "--lazy_detector", "release",
                           "--checkpoint", "--amp", "bf16", "--ops", "torch"], cwd=patched, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "switches on:" in proc.stderr and "face_crop=1" in proc.stderr
    assert (patched / "outputs" / "astronaut_GPEN.png").exists()


UPSTREAM_LAZY = r"""
import os, sys, types
root = sys.argv[1]
os.chdir(root); sys.path.insert(0, root)
import __init_paths
import torch
from gpen_model import FullGenerator
os.makedirs('weights', exist_ok=True)
torch.save(FullGenerator(64, 512, 8, 1, narrow=0.125).state_dict(), 'weights/tiny-gpen.pth')
from face_enhancement import FaceEnhancement
args = types.SimpleNamespace(channel_multiplier=1, narrow=0.125, key=None, alpha=1.0, sr_model='realesrnet',
                             sr_scale=2, tile_size=0)
enh = FaceEnhancement(args, './', in_size=64, model='tiny-gpen', use_sr=False, device='cpu')
print('built', type(enh.facedetector).__name__, enh.facedetector.loaded, enh.srmodel.loaded, enh.faceparser.loaded)
enh.release_detector()
"""


def test_upstream_lazy_detector_builds_without_detector_parser_sr_weights(tmp_path):
    patched = copy_checkout("upstream", tmp_path / "patched")
    plan_apply(patched, ["lazy-detector"]).commit()
    env = {**os.environ, "GPEN_TUNE_LAZY_DETECTOR": "1"}
    proc = subprocess.run([PY, "-c", UPSTREAM_LAZY, str(patched)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "built LazyModel False False False" in proc.stdout
    env["GPEN_TUNE_LAZY_DETECTOR"] = "0"
    proc = subprocess.run([PY, "-c", UPSTREAM_LAZY, str(patched)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode != 0 and "RetinaFace-R50.pth" in proc.stderr
