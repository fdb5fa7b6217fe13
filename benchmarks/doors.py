"""The speed users see, door by door: `gpen-tune enhance` timed as whole processes, each beside its door's own limit.

What it runs (every user figure is one `python -m gpen_tune enhance ...` process timed from start to exit, the same
code as the `gpen-tune` console script; synthetic weights: timing does not depend on weight values):
  one photo   the Solvay photo (28 faces), `--preset auto`, twice with fresh on-disk kernel caches (Triton,
              Inductor, CUDA's PTX cache in one new folder): the first run is a first-ever run, the second a run
              with those caches warm. `startup_s` is the same command on a photo with no face (imports, model and
              detector build, one detector call: the fixed cost of every command).
  folder      benchmarks/throughput.py's folder (1,024 photos on a GPU), `--preset speed`: faces per second of
              whole-process wall time; the generator's busy share from the run's --report (CUDA-event generator
              time over the span from its first batch to its last).
  video       benchmarks/video.py's clips (1080p, 240 frames, one face / a 9-face group), `--preset speed`:
              frames per second of whole-process wall, and with the start-up taken out; whether the run printed a
              CUDA-graph fallback line.
  big photo   the Solvay photo upscaled x3 (6.8 MP PNG), K copies, `--serial --preset speed`: the median seconds
              per image (the sum of its steps in the run's --report) over the copies after the serial path's first
              step of SERIAL_IMAGES_PER_STEP images (warm: that step's detector call shares its one-off set-up,
              cuDNN plans and graph captures, among its images; `big_photo_first_step_s` is its median).
The doors' own limits, measured in this process after the CLI runs (so it holds no GPU while they run):
  encoder     libx264 through PyAV on the video clip's frames at crf 18, each preset: fps, file size and PSNR
              against the source frames (the default, medium, is `encoder_alone_fps`).
  decoder     the clip decoded to RGB (PyAV, CPU) and the folder's JPEGs decoded by OpenCV (one thread).
  detector    the CLI's default detector on the folder's photos at batch 1 / 8 / 32: ms per image.
  generator   the preset's Restorer alone (`generator_alone_faces_per_s`), batch 64 (CUDA) or 1 (CPU).

    # GPU (one H200, ~5 minutes):
    python benchmarks/doors.py --out benchmarks/results
    # before/after in one call, as RESULTS.md's doors table was made (the baseline's tree beside this checkout;
    # its CLI runs from there, the limits are measured by this checkout's code):
    mkdir -p ../base && git archive 23cc6d4 gpen_tune benchmarks patches pyproject.toml | tar -x -C ../base
    python benchmarks/doors.py --no-limits --tag after --out benchmarks/results
    python benchmarks/doors.py --code ../base --tag base-23cc6d4 --out benchmarks/results
    # CPU (CI-size machines; GPEN-BFR-256, small folder/clip/photo, same keys; ~5 minutes on 2 cores):
    python benchmarks/doors.py --small --out benchmarks/results

Writes benchmarks/results/doors-<gpu name or cpu>-<date>.json with the top-level figures, each run's command,
wall time and report summary, and prints the top-level figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SOLVAY = next((p for p in (ROOT / "data" / "solvay_conference_1927.png",
                          ROOT.parent / "shared" / "data" / "solvay_conference_1927.png") if p.is_file()),
              ROOT.parent / "shared" / "data" / "solvay_conference_1927.png")
FALLBACK_MARK = "CUDA graph capture failed"
KEYS = ("one_photo_cold_s", "one_photo_warm_cache_s", "startup_s", "imports_s", "folder_faces_per_s",
        "folder_generator_busy", "video_one_face_fps", "video_group_fps", "big_photo_s", "encoder_alone_fps",
        "decoder_alone_fps", "detector_ms_per_image", "generator_alone_faces_per_s")


# ---------------------------------------------------------------------------------------------------- sizes


def sizes(small: bool) -> dict:
    """What each door gets: the GPU sizes of issue 37, or a CPU form with the same keys."""
    if small:
        return {"model": "GPEN-BFR-256", "preset_one": "auto", "preset": "auto", "folder_images": 8, "tiny": True,
                "video_size": (640, 360), "video_frames": 12, "big_scale": 1.0, "big_copies": 3,
                "det_batches": (1, 4), "gen_batch": 1, "gen_calls": 3, "timeout": 900}
    return {"model": "GPEN-BFR-512", "preset_one": "auto", "preset": "speed", "folder_images": 1024, "tiny": False,
            "video_size": (1920, 1080), "video_frames": 240, "big_scale": 3.0, "big_copies": 16,
            "det_batches": (1, 8, 32), "gen_batch": 64, "gen_calls": 30, "timeout": 300}


# ---------------------------------------------------------------------------------------------------- inputs


def make_inputs(work: Path, sz: dict, solvay: Path) -> dict:
    from clip_files import pan_frames, write_clip
    from throughput import build_folder

    from gpen_tune.face import samples

    inputs = {"work": work}
    one = work / "one" / "solvay.png"
    one.parent.mkdir(parents=True)
    shutil.copyfile(solvay, one)
    inputs["one"] = one
    noface = work / "noface" / "grey.png"
    noface.parent.mkdir(parents=True)
    cv2.imwrite(str(noface), np.full((256, 256, 3), 128, np.uint8))
    inputs["noface"] = noface
    inputs["folder_info"] = build_folder(work / "folder", sz["folder_images"], sz["tiny"])
    inputs["folder"] = work / "folder"
    clips = work / "clips"
    clips.mkdir()
    n, size = sz["video_frames"], sz["video_size"]
    inputs["clip_one"] = write_clip(clips / "one_face.mp4", pan_frames(samples.astronaut(), n, size))
    inputs["clip_group"] = write_clip(clips / "group.mp4", pan_frames(samples.mosaic(9, 4), n, size))
    big_dir = work / "big"
    big_dir.mkdir()
    src = cv2.imread(str(solvay))
    k = sz["big_scale"]
    big = src if k == 1 else cv2.resize(src, None, fx=k, fy=k, interpolation=cv2.INTER_CUBIC)
    for i in range(sz["big_copies"]):
        cv2.imwrite(str(big_dir / f"group{i:02d}.png"), big)
    inputs["big"] = big_dir
    inputs["big_mp"] = round(big.shape[0] * big.shape[1] / 1e6, 2)
    return inputs


# ---------------------------------------------------------------------------------------------------- CLI runs


def cli(args: list[str], env: dict, timeout: float, report: Path | None = None,
        profile: Path | None = None) -> dict:
    """One `gpen-tune enhance` process: its wall time, exit code, tail of stderr and the --report it wrote. It runs
    in the checkout on env's PYTHONPATH (`python -m` puts its working folder first on sys.path). `profile`: sample
    every thread with py-spy into this file (folded stacks, one root per thread; non-blocking: in its default
    mode, which stops the process for each sample, the runs took ~2x as long)."""
    cwd = env["PYTHONPATH"].split(os.pathsep)[0]
    cmd = [sys.executable, "-m", "gpen_tune", "enhance", *args]
    if profile is not None:
        from timing import py_spy

        cmd = [py_spy(), "record", "--threads", "--subprocesses", "--nonblocking", "-f", "raw", "-r", "200", "-o",
               str(profile), "--", *cmd]
    if report is not None:
        cmd += ["--report", str(report)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = 124, f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {timeout} s"
    wall = time.perf_counter() - t0
    out = {"command": "gpen-tune enhance " + shlex.join(args), "wall_s": round(wall, 3), "rc": rc,
           "graph_fallback": FALLBACK_MARK in text, "output_tail": text[-1500:]}
    if report is not None and report.is_file():
        data = json.loads(report.read_text())
        out["summary"] = {k: data["summary"].get(k) for k in ("images", "faces", "wall_s", "faces_per_s",
                                                              "detector_calls")}
        out["tune"] = {k: (data.get("tune") or {}).get(k) for k in ("describe", "effective_describe", "fallbacks",
                                                                   "warmup_s", "generator")}
        out["images"] = [{"input": Path(j["input"]).name, "n_faces": j["n_faces"], "timings_s": j["timings_s"],
                          "video": j.get("video"), "output_bytes": j.get("output_bytes")} for j in data["images"][:64]]
    if rc != 0:
        print(f"FAILED ({rc}): {out['command']}\n{text[-3000:]}", file=sys.stderr)
    return out


def common(sz: dict, preset: str, device: str) -> list[str]:
    return ["--weights", "synthetic", "--model", sz["model"], "--preset", preset, "--device", device, "--overwrite"]


def user_runs(inputs: dict, sz: dict, device: str, extra: list[str], code: Path,
              only: set[str] | None = None, profile_dir: Path | None = None) -> dict:
    """The CLI runs (`only`: these of them; one_photo_warm_cache is warm only after one_photo_cold; `profile_dir`:
    a py-spy profile of each run there, `<run>.folded`)."""
    work: Path = inputs["work"]
    caches = work / "kernel-caches"                 # fresh: the first run below is a first-ever run
    env = dict(os.environ, TRITON_CACHE_DIR=str(caches / "triton"), TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
               CUDA_CACHE_PATH=str(caches / "nv"), PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = sz["timeout"]
    t0 = time.perf_counter()                        # the imports alone: the floor under every command
    subprocess.run([sys.executable, "-c", "import torch, gpen_tune.pipeline.api, gpen_tune.cli.enhance"], env=env,
                   cwd=code, check=False, timeout=t)
    imports_s = round(time.perf_counter() - t0, 3)
    one = [str(inputs["one"]), "-o", str(work / "out_one"), *common(sz, sz["preset_one"], device), *extra]
    speed = [*common(sz, sz["preset"], device), *extra]
    plan = {                                        # name: (arguments, report file); in this order
        "one_photo_cold": (one, "r_one_cold.json"),
        "one_photo_warm_cache": (one, "r_one_warm.json"),
        "startup": ([str(inputs["noface"]), "-o", str(work / "out_noface"), *common(sz, sz["preset_one"], device),
                     *extra], None),
        "folder": ([str(inputs["folder"]), "-o", str(work / "out_folder"), *speed], "r_folder.json"),
        "clip_one": ([str(inputs["clip_one"]), "-o", str(work / "out_clip_one"), *speed], "r_clip_one.json"),
        "clip_group": ([str(inputs["clip_group"]), "-o", str(work / "out_clip_group"), *speed], "r_clip_group.json"),
        "big_photo": ([str(inputs["big"]), "-o", str(work / "out_big"), "--serial", *speed], "r_big.json"),
    }
    runs = {"imports": {"command": "python -c 'import torch, gpen_tune.pipeline.api, gpen_tune.cli.enhance'",
                        "wall_s": imports_s, "rc": 0}}
    for name, (args, report) in plan.items():
        if only is None or name in only:
            profile = profile_dir / f"{name}.folded" if profile_dir else None
            runs[name] = cli(args, env, t, work / report if report else None, profile)
    return runs


def busy_share(run: dict) -> float | None:
    gen = ((run.get("tune") or {}).get("generator") or {})
    span = gen.get("span_s")
    return round(gen["busy_s"] / span, 3) if span and gen.get("busy_s") is not None else None


def video_fps(run: dict | None, startup_s: float) -> tuple[float | None, float | None]:
    if run is None:
        return None, None
    frames = ((run.get("images") or [{}])[0].get("video") or {}).get("frames")
    if not frames or run["rc"] != 0:
        return None, None
    return round(frames / run["wall_s"], 2), round(frames / max(run["wall_s"] - startup_s, 1e-3), 2)


def big_photo_seconds(run: dict | None, first_step: bool = False) -> float | None:
    """Median seconds per image after the serial path's first step (or of that step); earlier forms of the run
    with one step only: the images after the first two."""
    if run is None:
        return None
    per = [sum(j["timings_s"].values()) for j in run.get("images") or []]
    from gpen_tune.pipeline.scheduler import SERIAL_IMAGES_PER_STEP as step
    if first_step:
        picked = per[:step]
    else:
        picked = per[step:] if len(per) > step else (per[2:] or per[1:] or per)
    return round(float(np.median(picked)), 3) if picked else None


def big_photo_bytes(run: dict | None) -> int | None:
    """The median size of the big photo's written PNGs (at the CLI's --png-level)."""
    sizes = [j.get("output_bytes") for j in (run or {}).get("images") or [] if j.get("output_bytes")]
    return int(np.median(sizes)) if sizes else None


# ---------------------------------------------------------------------------------------------------- limits


def encoder_limits(clip: Path, work: Path) -> dict:
    """libx264 alone on the clip's frames (RGB in, as the pipeline hands them), crf 18, each preset."""
    from clip_files import decoded, psnr, write_clip

    t0 = time.perf_counter()
    frames = decoded(clip)
    decode_fps = len(frames) / (time.perf_counter() - t0)
    out = {"frames": len(frames), "decoder_alone_fps": round(decode_fps, 1), "x264_crf18": {}}
    for preset in ("medium", "fast", "veryfast", "superfast", "ultrafast"):
        dst = work / f"enc_{preset}.mp4"
        t0 = time.perf_counter()
        write_clip(dst, frames, preset=preset)
        fps = len(frames) / (time.perf_counter() - t0)
        back = decoded(dst)
        out["x264_crf18"][preset] = {"fps": round(fps, 1), "bytes": dst.stat().st_size,
                                     "psnr_db": round(float(np.mean([psnr(a, b) for a, b in zip(frames, back,
                                                                                             strict=True)])), 2)}
    return out


def decode_jpeg_limit(folder: Path, n: int = 64) -> float:
    files = sorted(folder.glob("*.jpg"))[:n]
    t0 = time.perf_counter()
    for f in files:
        cv2.imread(str(f))
    return round(len(files) / (time.perf_counter() - t0), 1)


def detector_limit(folder: Path, device, batches: tuple[int, ...]) -> dict:
    """ms per image of the CLI's default detector (auto) on the folder's photos, batch 1 / 8 / 32."""
    import torch

    from gpen_tune.face.detect import init_detector

    det = init_detector("auto", device=device)
    files = sorted(folder.glob("*.jpg"))
    imgs = [cv2.cvtColor(cv2.imread(str(f)), cv2.COLOR_BGR2RGB) for f in files[: max(batches) * 2]]
    out = {"detector": type(det).__name__}
    det.detect(imgs[:1])
    for b in batches:
        det.detect(imgs[:b])                              # first call of this batch shape
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        calls = max(1, 32 // b)
        for i in range(calls):
            det.detect(imgs[(i * b) % len(imgs):][:b] or imgs[:b])
        if device.type == "cuda":
            torch.cuda.synchronize()
        out[f"batch{b}_ms_per_image"] = round(1000 * (time.perf_counter() - t0) / (calls * b), 2)
    close = getattr(det, "close", None)
    if callable(close):
        close()
    return out


def generator_limit(sz: dict, device) -> dict:
    """The preset's Restorer alone on real face crops: faces per second at the door's batch."""
    import torch

    from gpen_tune.face import samples
    from gpen_tune.load import load_model
    from gpen_tune.restore.restorer import build_restorer
    from gpen_tune.tune.options import preset

    cfg = preset(sz["preset"], device)
    model = load_model("synthetic", model=sz["model"], device=device)
    b = sz["gen_batch"]
    restorer = build_restorer(model, cfg, device=device, max_batch=b, timed=False)
    face = cv2.resize(samples.astronaut(), (model.size, model.size), interpolation=cv2.INTER_AREA)
    crops = [face] * b
    for _ in range(3):
        restorer.restore_crops(crops)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(sz["gen_calls"]):
        restorer.restore_crops(crops)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"batch": b, "calls": sz["gen_calls"], "faces_per_s": round(b * sz["gen_calls"] / wall, 1),
            "effective": restorer.effective.describe(), "note": "uint8 crops in and out (upload, download included)"}


def door_limits(result: dict, inputs: dict, sz: dict, device) -> None:
    """Each door's own limit into `result`; a door whose measurement fails records its error, the rest still run."""
    def attempt(name: str, fn) -> None:
        try:
            fn()
        except Exception as e:                            # noqa: BLE001 (recorded in the JSON, the run goes on)
            result.setdefault("limit_errors", {})[name] = f"{type(e).__name__}: {e}"[:500]
            print(f"limit {name} failed: {e}", file=sys.stderr)

    def encoder() -> None:
        enc = result["encoder"] = encoder_limits(inputs["clip_one"], inputs["work"])
        result["encoder_alone_fps"] = enc["x264_crf18"]["medium"]["fps"]
        result["decoder_alone_fps"] = enc["decoder_alone_fps"]

    def detector() -> None:
        result["jpeg_decode_alone_per_s"] = decode_jpeg_limit(inputs["folder"])
        det = result["detector"] = detector_limit(inputs["folder"], device, sz["det_batches"])
        result["detector_ms_per_image"] = det[f"batch{sz['det_batches'][-1]}_ms_per_image"]

    def generator() -> None:
        gen = result["generator"] = generator_limit(sz, device)
        result["generator_alone_faces_per_s"] = gen["faces_per_s"]

    for name, fn in (("encoder", encoder), ("detector", detector), ("generator", generator)):
        attempt(name, fn)


# ---------------------------------------------------------------------------------------------------- main


def environment() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
           "machine": platform.machine()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="CPU form: GPEN-BFR-256, small folder/clips/photo")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--image", type=Path, default=SOLVAY, help="the group photo (default: the Solvay photo)")
    ap.add_argument("--tag", default="", help="added to the JSON name (e.g. the code's commit)")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose gpen_tune the CLI runs (default: "
                    "this one; e.g. an older commit's tree for a before/after)")
    ap.add_argument("--extra", default="", help="extra enhance options for every CLI run (quoted)")
    ap.add_argument("--no-limits", dest="limits", action="store_false", help="the CLI runs only")
    ap.add_argument("--only", default=None, help="comma list of CLI runs: one_photo_cold, one_photo_warm_cache, "
                    "startup, folder, clip_one, clip_group, big_photo (default: all)")
    ap.add_argument("--py-spy", dest="profile_dir", type=Path, default=None,
                    help="sample each CLI run with py-spy (every thread) into DIR/<run>.folded")
    ap.add_argument("--video-frames", type=int, default=None,
                    help="frames of each test clip (default: issue 37's 240; the CPU form 12); a longer clip shows "
                         "the rate once start-up and warm-up are spread over it")
    ap.add_argument("--video-size", default=None, metavar="WxH", help="the test clips' size (default: 1920x1080; "
                    "the CPU form 640x360)")
    ap.add_argument("--folder-images", type=int, default=None,
                    help="photos in the folder (default: issue 37's 1,024; the CPU form 8)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if not args.image.is_file():
        ap.error(f"{args.image}: not found (pass --image)")
    from timing import bench_device

    device = bench_device(args.device)
    sz = sizes(args.small)
    sz["video_frames"] = args.video_frames or sz["video_frames"]
    sz["video_size"] = tuple(map(int, args.video_size.split("x"))) if args.video_size else sz["video_size"]
    sz["folder_images"] = args.folder_images or sz["folder_images"]
    work = Path(tempfile.mkdtemp(prefix="gpen-doors-"))
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    t_all = time.perf_counter()
    inputs = make_inputs(work, sz, args.image)
    only = set(args.only.split(",")) if args.only else None
    if args.profile_dir:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    runs = user_runs(inputs, sz, device.type, shlex.split(args.extra), args.code.resolve(), only, args.profile_dir)
    startup = runs["startup"]["wall_s"] if "startup" in runs else 0.0
    one_fps, one_fps_steady = video_fps(runs.get("clip_one"), startup)
    grp_fps, grp_fps_steady = video_fps(runs.get("clip_group"), startup)
    folder = runs.get("folder") or {"wall_s": 0.0}
    faces = (folder.get("summary") or {}).get("faces") or 0
    result = {
        "benchmark": "doors", "command": command, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment(), "device": device.type, "small": args.small,
        "code": str(args.code.resolve()), "extra": args.extra, "sizes": sz, "model": sz["model"],
        "one_photo_cold_s": runs.get("one_photo_cold", {}).get("wall_s"),
        "one_photo_warm_cache_s": runs.get("one_photo_warm_cache", {}).get("wall_s"),
        "startup_s": runs.get("startup", {}).get("wall_s"), "imports_s": runs["imports"]["wall_s"],
        "folder_faces_per_s": round(faces / folder["wall_s"], 1) if faces else None,
        "folder_generator_busy": busy_share(folder),
        "video_one_face_fps": one_fps, "video_group_fps": grp_fps,
        "video_one_face_fps_after_startup": one_fps_steady, "video_group_fps_after_startup": grp_fps_steady,
        "video_graph_fallback": any(runs.get(k, {}).get("graph_fallback") for k in ("clip_one", "clip_group")),
        "big_photo_s": big_photo_seconds(runs.get("big_photo")),
        "big_photo_first_step_s": big_photo_seconds(runs.get("big_photo"), first_step=True),
        "big_photo_megapixels": inputs["big_mp"],
        "big_photo_output_bytes": big_photo_bytes(runs.get("big_photo")),
        "failed_runs": [k for k, r in runs.items() if r["rc"] != 0],
        "folder": inputs["folder_info"] | {"faces": faces},
        "runs": runs,
    }
    if args.limits:
        door_limits(result, inputs, sz, device)
    result["total_s"] = round(time.perf_counter() - t_all, 1)
    shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = result["environment"].get("gpu") if device.type == "cuda" else None
    name = (gpu or "cpu").replace(" ", "-")
    tag = f"-{args.tag}" if args.tag else ""
    path = args.out / f"doors-{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}{tag}.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result.get(k) for k in (*KEYS, "video_graph_fallback", "failed_runs", "total_s")},
                     indent=1))
    print(f"wrote {path}")
    return 1 if result["failed_runs"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
