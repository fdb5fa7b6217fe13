#!/usr/bin/env bash
# The H200 runs behind benchmarks/results/ and benchmarks/RESULTS.md: every GPU figure there comes from one
# of these commands. Run from the repository root on the GPU machine; results go to $OUT (or benchmarks/results),
# the log to $OUT/YYYYMMDD-HHMM-h200-NAME.log. PYTHON=echo prints the commands without running them.
#   bash benchmarks/h200_runs.sh NAME
# NAME (oldest first; when it ran; what it measures). Parts marked "flag since removed" measured
# experiments that were not kept: their flags are gone from throughput.py, so they no longer run as written.
#   tests-generator-bench                 run 2026-11-30 18:30 UTC: GPU tests, generator limit (quick), bench GPEN-BFR-512 and -256 (~9 min)
#   folder-balanced                       run 2026-11-30 18:39 UTC: folder throughput, serial vs pipeline in one run, preset balanced (~4 min)
#   bench-switches-presets                run 2026-11-30 18:42 UTC: bench GPEN-BFR-512: default vs amp / cuda-graph / compile / presets (~2 min)
#   folder-plain-bs1-tests                run 2026-11-30 19:49 UTC: folder throughput (batched detector), plain bs1 before/after the model change, GPU tests (~5 min)
#   bench-detector-speed                  run 2026-11-30 19:52 UTC: bench GPEN-BFR-512 and -256 on the changed model, detector speed (~9 min)
#   tests-folder-gpu-paste                run 2026-11-30 20:02 UTC: GPU tests, folder throughput incl. the GPU paste for every image (~4 min)
#   tests-folder-float32-detector         run 2026-11-30 20:07 UTC: detector/runner GPU tests, folder throughput with the float32 detector (~3 min)
#   ab-caller-shrink                      no log kept: A/B of the shrink to det_size in the callers' threads (~2 min)
#   fir-triton-tests-bench                no log kept: Triton FIR A/B at bs1, GPU tests, bench GPEN-BFR-512 (~10 min)
#   fir-triton-caller-shrink-gil          run 2026-11-30 22:05 UTC: Triton FIR A/B, GPU tests, caller-shrink A/B, GIL profile, GPU JPEG probe (~8 min)
#   fir-dispatch-folder-gil               run 2026-11-30 22:20 UTC: FIR dispatch A/B, GPU tests, folder throughput (OpenCV decode, deferred NaN guard), GIL profile (~5 min)
#   bench-512-256-short                   run 2026-11-30 22:26 UTC: bench GPEN-BFR-512 and -256 on the merged model (~9 min)
#   tests-detector-speed-prepare-threads  run 2026-11-30 22:41 UTC: GPU tests, detector speed, folder throughput (one-sync P-Net), 12/48 prepare threads (~6 min)
#   folder-48-prepare-threads             run 2026-11-30 22:46 UTC: folder throughput with 48 prepare threads twice, GPU tests (~5 min)
#   ab-detector-priority                  run 2026-11-30 23:06 UTC: A/B/A of the detector stream's priority, pipeline only (~1.5 min; run with high priority as the default, "pipeline" rows = high)
#   plain-bs1-layouts                     run 2026-12-01 02:23 UTC: plain bs1: FIR variants, channels-last modulated weights, whole model NHWC (~1 min)
#   ab-detector-process-256               run 2026-12-01 02:24 UTC: pipeline with the detector thread vs the detector process, one run (~2 min)
#   detector-load-switch-500us            run 2026-12-01 02:29 UTC: detector under GPU/CPU/GIL load; pipeline with a 0.5 ms GIL switch interval (~3 min)
#   plain-bs1-styles-gemm                 run 2026-12-01 02:42 UTC: plain bs1 before/after (benchmarks/_before held layers.py/gpen.py/fir.py of 4178025: styles GEMM, lrelu in the conv's last pass, cached sums read in capture); detector contention; GPU tests (~6 min)
#   ab-pnet-host-plan                     run 2026-12-01 02:51 UTC: at d911227 (its benchmarks/_before/mtcnn_batched.py = f119d48's): detector driver A/B alone and under load; throughput A/B/A; GPU tests (~8 min); the driver change it measured was reverted (f720bad)
#   bench-512-256                         run 2026-12-01 02:55 UTC: bench GPEN-BFR-512 and -256 (~6 min)
#   folder-cpu-paste-prepare16            run 2026-12-01 03:04 UTC: pipeline with default settings / CPU paste / 16 prepare threads x 3 images / default (~3 min)
#   ab-switch-20ms                        run 2026-12-01 03:17 UTC: pipeline A/B/A with a 20 ms GIL switch interval (~2 min)
#   detector-gil-split                    run 2026-12-01 04:10 UTC: is the detector's in-run slowdown the GIL or the CPU (--gil-split), and how much of a call is GPU time (--profile)? (~2 min)
#   ab-pnet-graphs                        run 2026-12-01 04:24 UTC: GPU tests, detector speed / under load / folder throughput with the P-Net from CUDA graphs vs eager (~9 min)
#   ab-paste-triton                       run 2026-12-01 04:34 UTC: GPU tests (detector, paste, throughput), A/B/A of the one-kernel Triton paste vs PyTorch calls (~5 min)
#   gil-profile-prepare24-finish12        run 2026-12-01 04:36 UTC: GIL profile of a pipeline run; pipeline with 24 prepare / 12 finish threads (~4 min)
#   ab-gpu-paste-detector-priority        run 2026-12-01 04:39 UTC: pipeline A/B/A: GPU paste at every size; detector stream priority (~3 min)
#   ab-area-triton                        run 2026-12-01 04:45 UTC: GPU tests, detector alone and folder A/B/A: Triton area resize vs PyTorch calls (~6 min)
#   ab-switch-50us-detector-load          run 2026-12-01 04:48 UTC: pipeline A/B/A with a 0.05 ms GIL switch interval; detector under every load (~4 min)
#   ab-detector-batch64-folder1024        run 2026-12-01 04:50 UTC: pipeline A/B/A with 64-image detector calls; 1,024-photo folder (~4 min)
#   ab-detector-process-tests             run 2026-12-01 04:53 UTC: pipeline vs detector process; all GPU tests (~5 min)
#   ab-rnet-onet-graphs                   run 2026-12-01 05:03 UTC: at 097a0b2 (its R-Net / O-Net graphs were reverted after this run: 455 vs 426 / 458 faces/s): detector GPU tests; pipeline A/B/A (~3 min)
#   ab-device-results-stage-crops         run 2026-12-01 05:56 UTC: flags since removed: GPU tests; pipeline A/B/A with device-only results and with crops staged by the prepare workers (~5 min)
#   ab-yield-to-detector                  run 2026-12-01 05:58 UTC: flag since removed: pipeline A/B/A with the generator yielding to the detector, 256 and 1,024 photos (~5 min)
#   cpu-by-thread-detector-kernels        run 2026-12-01 06:02 UTC: CPU seconds per thread kind in a 1,024-photo run; the detector's kernels by name (~3 min)
#   ab-nms-triton                         run 2026-12-01 06:10 UTC: detector GPU tests; NMS per group (Triton) vs torchvision's: detector alone, pipeline A/B/A (~5 min)
#   ab-batch-copies-switch-1ms            run 2026-12-01 06:15 UTC: runner GPU tests; A/B/A of the GPU stage's per-batch host copies and of a 1 ms GIL switch interval (~5 min)
#   thread-profile-switch-1ms             run 2026-12-01 06:19 UTC: py-spy --idle of a 1,024-photo run (where each thread waits); switch interval 1 ms A/B/A again (~4 min)
#   ab-pinned-direct-copies               run 2026-12-01 06:26 UTC: flags since removed: A/B/A of direct copies from page-locked memory
#   tests-folder-256-1024-aaa             run 2026-12-01 06:33 UTC: all GPU tests; serial + pipeline (256), pipeline (1,024), A/A/A calibration (~8 min)
#   ab-soften-together                    run 2026-12-01 06:40 UTC: flag since removed: runner GPU tests; A/B/A of the small faces softened together
#   ab-cut-on-gpu                         run 2026-12-01 07:33 UTC: all GPU tests; pipeline A/B/A of faces cut on the CPU vs the GPU (~4 min)
#   ab-detector-priority-batch64          run 2026-12-01 07:41 UTC: pipeline A/B/As: detector stream priority, 64-image detector calls (~3 min)
#   ab-detector-threads-first-try         run 2026-12-01 07:47 UTC: flag not yet in throughput.py, its A/Bs failed (they ran as ab-detector-threads)
#   ab-detector-threads                   run 2026-12-01 07:48 UTC: flag since removed: pipeline A/B/A with 2 and 3 detector threads (~2 min)
#   detector-phases                       run 2026-12-01 07:51 UTC: where a detector call goes (phases timed); detector alone and under decode threads (~2 min)
#   ab-pinned-uploads                     run 2026-12-01 07:54 UTC: flag since removed: image uploads through page-locked staging (~1 min)
#   ab-canvas-one-call                    run 2026-12-01 07:58 UTC: flag since removed: detector canvas filled in one call vs one copy per image (~2 min)
#   detector-process-1024-folder-256      run 2026-12-01 08:00 UTC: detector thread vs process (1,024 photos); serial + pipeline (256) (~2 min)
#   abab-detector-process                 run 2026-12-01 08:03 UTC: A/B/A/B detector thread / process, 1,024 photos (~2 min)
#   detector-process-4096                 run 2026-12-01 08:08 UTC: detector thread vs process, 4,096 photos (~2 min)
#   targets-4096-tests                    run 2026-12-01 08:13 UTC: 4,096 photos with --detector-process, serial on the first 256 and pipeline in one run; all GPU tests (~4 min)
#   redesign-measurements                 run 2026-12-01 23:14 UTC: GPU tests; folder A/B/A before/after the redesign (1,024 photos); 1080p video; 6.8 MP group photo; 4 GB mode (~9 min)
#   tests-low-memory                      run 2026-12-02 00:48 UTC: all GPU tests with tracebacks and JUnit XML; 4 GB mode on 64 photos (~3 min)
#   low-memory-where                      run 2026-12-02 00:54 UTC: the fixed GPU-cut test; 4 GB mode on 24 photos: where the peak goes (memory history), batch 1, CPU paste, expandable segments (~2 min)
#   low-memory-after                      run 2026-12-02 01:00 UTC: 4 GB mode after the detector's memory-sized calls and batch 1: tests; 64 photos low-memory (memory history), expandable segments, auto (~2 min)
#   parse-cost-tests                      run 2026-12-02 01:29 UTC: the parse mask's cost: bench GPEN-BFR-512 with --parse-mask; the 6.8 MP group photo with and without it; all GPU tests (~7 min)
#   low-memory-paste-tests                run 2026-12-02 01:05 UTC: 4 GB mode with the CPU paste and cuDNN's workspace sized on small GPUs: 64 photos (memory history), auto, 256 photos; all GPU tests (~5 min)
#   tests-own-mtcnn-nets                  2026-12-02: MTCNN's networks our own (mtcnn_nets.py): all GPU tests (JUnit XML), detector speed, 4 GB mode on 64 photos, folder pipeline (~8 min)
#   gpu-tests-mirrored-layout             2026-12-03: all GPU tests after tests/ was laid out as the package (JUnit XML) (~4 min)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-benchmarks/results}
PART=${1:-tests-generator-bench}
LOG="$DEST/$(date -u +%Y%m%d-%H%M)-h200-$PART.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
step() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }
# folder512 SECONDS LINES ARGS...: benchmarks/throughput.py on GPEN-BFR-512, --preset speed, batch 32, with ARGS;
# the last LINES lines of its output go to the log (the parts from ab-cut-on-gpu on)
folder512() {
  local limit=$1 lines=$2; shift 2
  timeout "$limit" "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --batch 32 "$@" \
    --out "$DEST" 2>&1 | tail -"$lines" >> "$LOG"
}

case "$PART" in
  tests-generator-bench)
    step "GPU tests"
    timeout 80 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -15 >> "$LOG"
    step "generator limit (quick)"
    timeout 160 "$PY" benchmarks/generator_limit.py --quick --budget-s 125 --profile fused_bf16_triton --out "$DEST" 2>&1 | tail -25 >> "$LOG"
    step "bench GPEN-BFR-512"
    timeout 170 "$PY" -m gpen_tune.bench --model GPEN-BFR-512 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 2.6 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    step "bench GPEN-BFR-256"
    timeout 100 "$PY" -m gpen_tune.bench --model GPEN-BFR-256 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 1.4 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    ;;
  folder-balanced)
    step "throughput GPEN-BFR-512, preset balanced"
    timeout 230 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset balanced --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -40 >> "$LOG"
    ;;
  bench-switches-presets)
    step "bench GPEN-BFR-512, single switches and presets"
    timeout 230 "$PY" -m gpen_tune.bench --model GPEN-BFR-512 --device cuda \
      --rows default,amp,cuda_graph,preset:balanced,compile,preset:speed --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 3.0 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    ;;
  folder-plain-bs1-tests)
    step "throughput GPEN-BFR-512, preset speed, serial and pipeline"
    timeout 240 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "throughput GPEN-BFR-512, preset balanced, pipeline only"
    timeout 110 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset balanced --images 256 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "plain model at batch 1: eager vs graph, before/after the model change (bl_model = previous layers)"
    if [ -d bl_model ]; then BEFORE="--before bl_model"; else BEFORE=""; fi
    timeout 120 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 $BEFORE --out "$DEST" 2>&1 | tail -40 >> "$LOG"
    step "GPU tests"
    timeout 90 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -15 >> "$LOG"
    ;;
  bench-detector-speed)
    step "bench GPEN-BFR-512 (all rows)"
    timeout 400 "$PY" -m gpen_tune.bench --model GPEN-BFR-512 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 5.6 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    step "detector speed"
    timeout 60 "$PY" benchmarks/detector_speed.py --device cuda --out "$DEST" 2>&1 | tail -20 >> "$LOG"
    step "bench GPEN-BFR-256"
    timeout 110 "$PY" -m gpen_tune.bench --model GPEN-BFR-256 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 1.3 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    ;;
  tests-folder-gpu-paste)
    step "GPU tests"
    timeout 100 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short 2>&1 | tail -45 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, serial and pipeline"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "throughput GPEN-BFR-512, preset balanced, pipeline only"
    timeout 90 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset balanced --images 256 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, pipeline only, GPU paste for every image"
    timeout 90 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --paste gpu --skip-serial --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    ;;
  tests-folder-float32-detector)
    step "GPU tests of the detector and the folder runner, with tracebacks"
    timeout 60 "$PY" -m pytest -q -m gpu tests/test_mtcnn_batched.py tests/test_throughput.py -p no:cacheprovider \
      --tb=short 2>&1 | tail -60 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, serial and pipeline (float32 detector, 24 prepare threads)"
    timeout 110 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    ;;
  ab-caller-shrink)
    step "throughput GPEN-BFR-512, preset speed: serial, pipeline (shrink in callers), pipeline (shrink in detector)"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-caller-shrink --out "$DEST" 2>&1 | tail -16 >> "$LOG"
    ;;
  fir-triton-tests-bench)
    step "plain model at batch 1: PyTorch's depthwise FIR vs the Triton FIR, eager and graph, one run"
    timeout 120 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 --out "$DEST" 2>&1 | tail -40 >> "$LOG"
    step "GPU tests"
    timeout 100 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short 2>&1 | tail -30 >> "$LOG"
    step "bench GPEN-BFR-512 (all rows, Triton FIR)"
    timeout 400 "$PY" -m gpen_tune.bench --model GPEN-BFR-512 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 5.6 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    ;;
  fir-triton-caller-shrink-gil)
    step "plain model at batch 1: PyTorch's depthwise FIR vs the Triton FIR, eager and graph, one run"
    timeout 120 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 --out "$DEST" 2>&1 | tail -40 >> "$LOG"
    step "GPU tests"
    timeout 110 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short 2>&1 | tail -30 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed: serial, pipeline (shrink in callers), pipeline (shrink in detector)"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-caller-shrink --out "$DEST" 2>&1 | tail -16 >> "$LOG"
    step "where the GIL goes in a pipeline run (py-spy --gil, raw stacks)"
    if command -v py-spy >/dev/null; then
      timeout 100 py-spy record --gil --threads --rate 250 --format raw -o "$DEST/pyspy_gil_pipeline.txt" -- \
        "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 --skip-serial \
        --out "$DEST/pyspy_run" 2>&1 | tail -8 >> "$LOG"
    else echo "py-spy not installed" >> "$LOG"; fi
    step "GPU JPEG decode probe (torchvision.io on CUDA vs cv2)"
    timeout 60 "$PY" benchmarks/jpeg_probe.py --out "$DEST" 2>&1 | tail -20 >> "$LOG"
    ;;
  fir-dispatch-folder-gil)
    step "plain model at batch 1: FIR on PyTorch's conv / always Triton / default dispatch, eager and graph, one run"
    timeout 120 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 --out "$DEST" 2>&1 | tail -60 >> "$LOG"
    step "GPU tests"
    timeout 120 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short 2>&1 | tail -30 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, serial and pipeline"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "where the GIL goes in a pipeline run (py-spy --gil, raw stacks)"
    if command -v py-spy >/dev/null; then
      timeout 90 py-spy record --gil --threads --rate 100 --format raw -o "$DEST/pyspy_gil_pipeline.txt" -- \
        "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 --skip-serial \
        --out "$DEST/pyspy_run" 2>&1 | tail -4 >> "$LOG"
    else echo "py-spy not installed" >> "$LOG"; fi
    ;;
  bench-512-256-short)
    step "bench GPEN-BFR-512 (all rows)"
    timeout 400 "$PY" -m gpen_tune.bench --model GPEN-BFR-512 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 5.6 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    step "bench GPEN-BFR-256"
    timeout 110 "$PY" -m gpen_tune.bench --model GPEN-BFR-256 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 1.3 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    ;;
  tests-detector-speed-prepare-threads)
    step "GPU tests"
    timeout 130 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short 2>&1 | tail -30 >> "$LOG"
    step "detector speed (P-Net stage with one nonzero and two NMS for the pyramid)"
    timeout 60 "$PY" benchmarks/detector_speed.py --device cuda --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, serial and pipeline"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    for n in 12 48; do
      step "throughput GPEN-BFR-512, preset speed, pipeline only, $n prepare threads"
      timeout 70 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
        --skip-serial --prepare-workers $n --out "$DEST" 2>&1 | tail -8 >> "$LOG"
    done
    ;;
  folder-48-prepare-threads)
    step "throughput GPEN-BFR-512, preset speed, serial and pipeline (default threads: 8 finish, 48 prepare)"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, pipeline only, repeat"
    timeout 70 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -8 >> "$LOG"
    step "GPU tests"
    timeout 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short -rA 2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|^E " | tail -40 >> "$LOG"
    ;;
  ab-detector-priority)
    step "throughput GPEN-BFR-512, preset speed, pipeline: detector stream high priority / default / high"
    timeout 100 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  plain-bs1-layouts)
    step "plain model at batch 1: FIR variants, channels-last modulated weights, whole model NHWC, eager and graph, one run"
    timeout 150 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 --out "$DEST" 2>&1 | tail -80 >> "$LOG"
    ;;
  ab-detector-process-256)
    step "throughput GPEN-BFR-512, preset speed: serial, pipeline (detector thread), pipeline (detector process)"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-detector-process --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    ;;
  detector-load-switch-500us)
    step "detector call time alone and under GPU / CPU / GIL load (one process)"
    timeout 150 "$PY" benchmarks/detector_contention.py --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed, pipeline: GIL switch interval 5 ms / 0.5 ms / 5 ms"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-switch-interval 0.0005 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  plain-bs1-styles-gemm)
    step "plain bs1: before (benchmarks/_before: the previous layers.py/gpen.py/fir.py) vs after, eager and graph"
    if [ -d benchmarks/_before ]; then BEFORE="--before benchmarks/_before"; else BEFORE=""; fi
    timeout 150 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 $BEFORE --out "$DEST" 2>&1 | grep -v "^  " | tail -20 >> "$LOG"
    step "detector under GPU / CPU load, stream priority (one process)"
    timeout 200 "$PY" benchmarks/detector_contention.py --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    step "GPU tests: FIR, model, switches"
    timeout 200 "$PY" -m pytest -q -m gpu tests/test_fir_triton.py tests/test_tune_switches.py tests/test_fast.py \
      -p no:cacheprovider --tb=short -rA 2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|^E " | tail -30 >> "$LOG"
    ;;
  ab-pnet-host-plan)
    step "detector driver before (benchmarks/_before/mtcnn_batched.py) / after, alone and under CPU / GPU load"
    timeout 150 "$PY" benchmarks/detector_contention.py --before benchmarks/_before/mtcnn_batched.py \
      --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "throughput GPEN-BFR-512, preset speed: serial, pipeline, pipeline with the previous driver, pipeline"
    timeout 220 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-mtcnn-before benchmarks/_before/mtcnn_batched.py --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    step "GPU tests"
    timeout 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider --tb=short -rA 2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|^E " | tail -40 >> "$LOG"
    ;;
  bench-512-256)
    step "bench GPEN-BFR-512 (all rows)"
    timeout 400 "$PY" -m gpen_tune.bench --model GPEN-BFR-512 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 5.6 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    step "bench GPEN-BFR-256"
    # (on 2026-12-01 this 1.3-minute run was cut off by the timeout; the committed -256 table comes from a run of its
    # own right after, with --max-minutes 3.6 and timeout 290, which finished in 142 s: that is what runs here now)
    timeout 290 "$PY" -m gpen_tune.bench --model GPEN-BFR-256 --device cuda --batch-sizes 1,4,16 --repeats 6 \
      --warmup 2 --max-minutes 3.6 -o "$DEST" 2>&1 | tail -30 >> "$LOG"
    ;;
  folder-cpu-paste-prepare16)
    for opts in "" "--paste cpu" "--prepare-workers 16 --detect-batch 3" ""; do
      step "throughput GPEN-BFR-512, preset speed, pipeline only: default settings $opts"
      timeout 80 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
        --skip-serial $opts --out "$DEST" 2>&1 | tail -7 >> "$LOG"
    done
    ;;
  ab-switch-20ms)
    step "throughput GPEN-BFR-512, preset speed, pipeline: GIL switch interval 5 ms / 20 ms / 5 ms"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-switch-interval 0.02 --out "$DEST" 2>&1 | tail -9 >> "$LOG"
    ;;
  detector-gil-split)
    step "detector under decode load: 8 / 16 / 48 threads of this process vs 48 processes (GIL or CPU?)"
    timeout 200 "$PY" benchmarks/detector_contention.py --gil-split --profile --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    ;;
  ab-pnet-graphs)
    step "GPU tests"
    timeout 150 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -15 >> "$LOG"
    step "detector speed: eager driver vs P-Net from CUDA graphs, alone"
    timeout 90 "$PY" benchmarks/detector_speed.py --device cuda --batch 1,8,21,32 --repeats 5 --kinds mixed \
      --skip-facenet --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    step "throughput: serial, pipeline, A/B/A with the P-Net eager"
    timeout 240 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-pnet-graphs --out "$DEST" 2>&1 | tail -16 >> "$LOG"
    step "detector under load, P-Net graphs vs eager"
    timeout 150 "$PY" benchmarks/detector_contention.py --ab-pnet-graphs --profile --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    ;;
  ab-paste-triton)
    step "GPU tests: detector, paste, throughput"
    timeout 150 "$PY" -m pytest -q -m gpu tests/test_mtcnn_batched.py tests/test_throughput.py -p no:cacheprovider 2>&1 | tail -8 >> "$LOG"
    step "throughput: serial, pipeline, A/B/A with the GPU paste in PyTorch calls"
    timeout 240 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-paste-torch --out "$DEST" 2>&1 | tail -16 >> "$LOG"
    ;;
  gil-profile-prepare24-finish12)
    step "where the GIL goes in a pipeline run now (py-spy --gil, raw stacks; P-Net graphs, Triton paste)"
    if command -v py-spy >/dev/null; then
      CMD="py-spy record --gil --threads --rate 250 --format raw -o pyspy_gil_pipeline.txt -- python3 benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 --skip-serial"
      timeout 120 py-spy record --gil --threads --rate 250 --format raw -o "$DEST/pyspy_gil_pipeline.txt" -- \
        "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 --skip-serial \
        --out "$DEST/pyspy_run" 2>&1 | tail -8 >> "$LOG"
      "$PY" benchmarks/gil_summary.py "$DEST/pyspy_gil_pipeline.txt" --command "$CMD (benchmarks/h200_runs.sh gil-profile-prepare24-finish12)" \
        --rate 250 --note "P-Net CUDA graphs, one-kernel paste" -o "$DEST/$(date -u +%Y%m%d-%H%M)_gil_profile.json" >> "$LOG" 2>&1
      rm -f "$DEST/pyspy_gil_pipeline.txt"
    else echo "py-spy not installed" >> "$LOG"; fi
    step "pipeline with 24 prepare threads"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --prepare-workers 24 --out "$DEST" 2>&1 | tail -9 >> "$LOG"
    step "pipeline with 12 finish threads"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --workers 12 --out "$DEST" 2>&1 | tail -9 >> "$LOG"
    ;;
  ab-gpu-paste-detector-priority)
    step "pipeline A/B/A: GPU paste for every image size (--paste gpu) vs auto (GPU from 2 MP)"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-paste gpu --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "pipeline A/B/A: detector stream at high priority (P-Net graphs now)"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-area-triton)
    step "GPU tests: detector, paste, throughput"
    timeout 150 "$PY" -m pytest -q -m gpu tests/test_mtcnn_batched.py tests/test_throughput.py -p no:cacheprovider 2>&1 | tail -8 >> "$LOG"
    step "detector speed alone: area resize as one Triton kernel (default) / in PyTorch calls (--area torch)"
    timeout 60 "$PY" benchmarks/detector_speed.py --device cuda --batch 8,21,32 --repeats 5 --kinds mixed \
      --skip-facenet --out "$DEST" 2>&1 | tail -7 >> "$LOG"
    timeout 60 "$PY" benchmarks/detector_speed.py --device cuda --batch 8,21,32 --repeats 5 \
      --kinds mixed --skip-facenet --area torch --out "$DEST" 2>&1 | tail -7 >> "$LOG"
    step "throughput: serial, pipeline (GPU paste at every size now), A/B/A with the area resize in PyTorch calls"
    timeout 240 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --ab-area-torch --out "$DEST" 2>&1 | tail -16 >> "$LOG"
    ;;
  ab-switch-50us-detector-load)
    step "pipeline A/B/A: GIL switch interval 0.05 ms (default 0.2)"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-switch-interval 0.00005 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "detector under load (graphs, Triton area resize), all conditions"
    timeout 150 "$PY" benchmarks/detector_contention.py --full --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    ;;
  ab-detector-batch64-folder1024)
    step "pipeline A/B/A: 64 images per detector call and 64 prepare threads (default 32 / 48)"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-detector-batch 64 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "steady state: a folder of 1,024 photos, pipeline only"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-detector-process-tests)
    step "pipeline vs the detector in its own process (own GIL; P-Net graphs captured at its start)"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-detector-process --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "GPU tests (all)"
    timeout 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tail -8 >> "$LOG"
    ;;
  ab-rnet-onet-graphs)
    step "GPU tests: detector"
    timeout 100 "$PY" -m pytest -q -m gpu tests/test_mtcnn_batched.py -p no:cacheprovider 2>&1 | tail -5 >> "$LOG"
    step "pipeline A/B/A: the detector's R-Net / O-Net stages from CUDA graphs too"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-crop-graphs --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-device-results-stage-crops)   # run 2026-12-01; --ab-device-results / --ab-stage-crops since removed (last in 77e1b11)
    step "GPU tests: throughput (device-only results are new)"
    timeout 150 "$PY" -m pytest -q -m gpu tests/test_throughput.py -p no:cacheprovider 2>&1 | tail -5 >> "$LOG"
    step "pipeline A/B/A: restored crops kept on the device (no per-batch download)"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-device-results --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "pipeline A/B/A: crops uploaded by the prepare workers (GPU stage gathers on the device)"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-stage-crops --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-yield-to-detector)   # run 2026-12-01; --ab-yield-to-detector since removed (last in 77e1b11)
    step "pipeline A/B/A: generator held back (at most 30 ms) while the detector is inside a call"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --skip-serial --ab-yield-to-detector 30 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "the same on 1,024 photos"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-yield-to-detector 30 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  cpu-by-thread-detector-kernels)
    step "pipeline on 1,024 photos with CPU seconds per kind of thread (which stage is CPU-bound?)"
    timeout 150 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -8 >> "$LOG"
    step "detector alone under the profiler, P-Net graphs and eager: where its GPU time goes"
    timeout 150 "$PY" benchmarks/detector_contention.py --profile --ab-pnet-graphs --calls 6 --out "$DEST" 2>&1 \
      | grep -v -i warn | tail -12 >> "$LOG"
    ;;
  ab-nms-triton)
    step "GPU tests: detector (the per-group NMS kernel is new) and runner (three experiments removed)"
    timeout 200 "$PY" -m pytest -q -m gpu tests/test_mtcnn_batched.py tests/test_throughput.py -p no:cacheprovider \
      2>&1 | grep -v -i warn | tail -25 >> "$LOG"
    step "detector alone, profiled and timed: NMS per group (Triton) vs torchvision's, same run"
    timeout 150 "$PY" benchmarks/detector_contention.py --profile --ab-nms-torchvision --calls 6 --out "$DEST" 2>&1 \
      | grep -v -i warn | tail -12 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: NMS per group vs torchvision's"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-nms-torchvision --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-batch-copies-switch-1ms)
    step "GPU tests: runner (one host copy per batch each way in the GPU stage)"
    timeout 150 "$PY" -m pytest -q -m gpu tests/test_throughput.py -p no:cacheprovider 2>&1 | grep -v -i warn \
      | tail -15 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: GPU stage host copies per crop vs one per batch"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-per-crop-copies --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: GIL switch interval 1 ms vs 5 ms"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-switch-interval 0.001 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  thread-profile-switch-1ms)
    step "where each thread is (py-spy --idle, innermost frame and line) in a 1,024-photo pipeline run"
    if command -v py-spy >/dev/null; then
      CMD="py-spy record --idle --threads --rate 100 --format raw -o pyspy_idle.txt -- python3 benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 --skip-serial"
      timeout 200 py-spy record --idle --threads --rate 100 --format raw -o "$DEST/pyspy_idle.txt" -- \
        "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 --skip-serial \
        --out "$DEST/pyspy_run" 2>&1 | tail -6 >> "$LOG"
      "$PY" benchmarks/gil_summary.py "$DEST/pyspy_idle.txt" --command "$CMD (benchmarks/h200_runs.sh thread-profile-switch-1ms)" \
        --rate 100 --leaves gpen-gpu,gpen-detect,gpen-finN,gpen-prepN --note "where the GPU-stage and \
detector threads wait (NMS kernel landed)" -o "$DEST/$(date -u +%Y%m%d-%H%M)_thread_profile.json" | head -12 >> "$LOG" 2>&1
      gzip -f "$DEST/pyspy_idle.txt"
    else echo "py-spy not installed" >> "$LOG"; fi
    step "pipeline A/B/A on 1,024 photos: GIL switch interval 1 ms vs 5 ms (again)"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-switch-interval 0.001 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-pinned-direct-copies)   # run 2026-12-01 06:27; --ab-staging-copies and --ab-detector-host-canvas since removed (last in 29716b9)
    step "GPU tests: runner and detector (direct copies from page-locked memory)"
    timeout 200 "$PY" -m pytest -q -m gpu tests/test_throughput.py tests/test_mtcnn_batched.py -p no:cacheprovider \
      2>&1 | grep -v -i warn | tail -15 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: GPU stage staging buffers vs direct copies"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-staging-copies --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: detector host canvas vs direct uploads"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-detector-host-canvas --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  tests-folder-256-1024-aaa)
    step "GPU tests (all)"
    timeout 260 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | grep -v -i warn | tail -8 >> "$LOG"
    step "throughput: serial and pipeline, 256 photos (the headline run)"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 256 --batch 32 \
      --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    step "pipeline on 1,024 photos"
    timeout 120 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --out "$DEST" 2>&1 | tail -8 >> "$LOG"
    step "A/A/A calibration on 1,024 photos after an untimed warm run (B = the default 0.2 ms switch interval)"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-switch-interval 0.0002 --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-soften-together)   # run 2026-12-01 06:40; --ab-soften-per-face since removed (the per-face path with it, last in 7196d4c)
    step "GPU tests: paste (small faces softened together)"
    timeout 120 "$PY" -m pytest -q -m gpu tests/test_throughput.py -p no:cacheprovider 2>&1 | grep -v -i warn \
      | tail -6 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: small faces softened one at a time vs together"
    timeout 200 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 1024 --batch 32 \
      --skip-serial --ab-soften-per-face --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    ;;
  ab-cut-on-gpu)
    step "GPU tests (all): faces cut on the GPU, 852b2df's tidy"
    timeout 280 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | grep -v -i warn | tail -12 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: faces cut on the CPU vs on the GPU"
    folder512 220 10 --images 1024 --skip-serial --ab-cut-on-cpu
    ;;
  ab-detector-priority-batch64)
    step "pipeline A/B/A on 1,024 photos: detector stream at high priority (the detector now limits)"
    folder512 200 10 --images 1024 --skip-serial
    step "pipeline A/B/A on 1,024 photos: up to 64 images per detector call, 64 prepare threads"
    folder512 240 10 --images 1024 --skip-serial --ab-detector-batch 64
    ;;
  ab-detector-threads-first-try)   # --ab-detector-servers was not in throughput.py yet: its two A/Bs failed; they ran as ab-detector-threads
    step "GPU tests: detector plans and servers, faces cut on the GPU (run: 7 passed)"
    timeout 150 "$PY" -m pytest -q -m gpu tests/test_throughput.py tests/test_face_align.py -p no:cacheprovider 2>&1 \
      | grep -v -i warn | tail -8 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: 2 detector threads"
    folder512 200 10 --images 1024 --skip-serial --ab-detector-servers 2
    step "pipeline A/B/A on 1,024 photos: 3 detector threads"
    folder512 200 10 --images 1024 --skip-serial --ab-detector-servers 3
    ;;
  ab-detector-threads)   # run 2026-12-01 07:48; detector servers (BatchingDetector(servers=N), MTCNN plan pool) since
            # removed: 599.2 (2 threads) vs 675.8 / 630.7, 628.1 (3 threads) vs 665.2 / 687.8 faces/s
    step "pipeline A/B/A on 1,024 photos: 2 detector threads"
    folder512 200 10 --images 1024 --skip-serial --ab-detector-servers 2
    step "pipeline A/B/A on 1,024 photos: 3 detector threads"
    folder512 200 10 --images 1024 --skip-serial --ab-detector-servers 3
    ;;
  detector-phases)
    step "pipeline on 1,024 photos with the detector's phases timed (diagnostics: where a detector call goes)"
    folder512 150 8 --images 1024 --skip-serial --detector-phases
    step "detector alone and under 48 decode threads (kernels by name)"
    timeout 150 "$PY" benchmarks/detector_contention.py --out "$DEST" 2>&1 | tail -12 >> "$LOG"
    ;;
  ab-pinned-uploads)   # --ab-pinned-uploads since removed (measured slower: 569 vs 616 / 628 faces/s)
    step "pipeline A/B/A on 1,024 photos: image uploads through page-locked staging, detector phases timed"
    folder512 220 10 --images 1024 --skip-serial --ab-pinned-uploads --detector-phases
    ;;
  ab-canvas-one-call)   # run with the canvas filled by one torch._foreach_copy_ (mtcnn_batched.ONE_CALL_FILL, since removed:
            # 587.2 / 629.7 vs 604.6 one copy per image, the fill phase unchanged at ~2.3 s)
    step "GPU tests: mtcnn (canvas filled in one call)"
    timeout 150 "$PY" -m pytest -q -m gpu tests/test_mtcnn_batched.py tests/test_throughput.py -p no:cacheprovider \
      2>&1 | grep -v -i warn | tail -6 >> "$LOG"
    step "pipeline A/B/A on 1,024 photos: detector canvas filled one copy per image vs one call, phases timed"
    folder512 220 10 --images 1024 --skip-serial --ab-fill-per-image --detector-phases
    ;;
  detector-process-1024-folder-256)
    step "pipeline on 1,024 photos, then with the detector in a process of its own (own GIL, own CUDA context)"
    folder512 220 10 --images 1024 --skip-serial --ab-detector-process
    step "throughput: serial and pipeline, 256 photos (the headline run)"
    folder512 200 10 --images 256
    ;;
  abab-detector-process)
    step "pipeline A/B/A/B on 1,024 photos: detector thread / detector process / thread / process"
    folder512 260 12 --images 1024 --skip-serial --ab-detector-process --ab-process-repeat
    ;;
  detector-process-4096)
    step "4,096 photos: pipeline with the detector thread, then with the detector process (steady state, timeline)"
    folder512 420 10 --images 4096 --skip-serial --ab-detector-process --no-warm-run
    ;;
  targets-4096-tests)
    step "4,096 photos, --detector-process: serial (first 256 photos) and pipeline in one run, checked against throughput.py's targets"
    folder512 300 8 --images 4096 --serial-images 256 --detector-process
    step "GPU tests (all)"
    timeout 250 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | grep -v -i warn | tail -8 >> "$LOG"
    ;;
  redesign-measurements)
    # needs .whl (facenet-pytorch, facexlib, filterpy, av), .ab_old (`git archive 8900259 gpen_tune
    # benchmarks/throughput.py`: the code before the redesign) and .data/solvay_conference_1927.png carried
    step "GPU tests (all)"
    timeout 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | grep -v -i warn | tail -12 >> "$LOG"
    step "folder A/B/A on 1,024 photos, --detector-process: the code before the redesign / after / before"
    for side in before after before; do
      if [ "$side" = before ]; then
        (cd .ab_old && PYTHONPATH="$PWD:${PYTHONPATH#*:}" timeout 110 "$PY" benchmarks/throughput.py \
          --model GPEN-BFR-512 --preset speed --batch 32 --images 1024 --skip-serial --detector-process \
          --out "$DEST" 2>&1 | tail -4 >> "$LOG")
      else
        folder512 110 4 --images 1024 --skip-serial --detector-process
      fi
    done
    step "video: 1080p one face and group, serial vs pipeline, flicker with and without smoothing"
    timeout 150 "$PY" benchmarks/video.py --model GPEN-BFR-512 --preset speed --frames 240 --out "$DEST" 2>&1 \
      | tail -8 >> "$LOG"
    step "6.8 MP group photo (Solvay x3, 29 faces), warm, seconds per image"
    timeout 60 "$PY" benchmarks/group_photo.py --image .data/solvay_conference_1927.png --model GPEN-BFR-512 \
      --preset speed --repeats 10 --out "$DEST" 2>&1 | tail -14 >> "$LOG"
    if [ -f benchmarks/low_memory.py ]; then
      step "4 GB mode: the whole pipeline under a 4 GiB cap, low-memory and auto"
      timeout 120 "$PY" benchmarks/low_memory.py --out "$DEST" 2>&1 | tail -10 >> "$LOG"
    fi
    ;;
  tests-low-memory)
    # needs .whl (facenet-pytorch, facexlib, filterpy, av, libcst, spandrel) carried and installed on PYTHONPATH
    step "GPU tests (all), tracebacks and JUnit XML in $DEST/gpu-tests.xml"
    timeout 260 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rfEs --tb=short \
      --junitxml="$DEST/gpu-tests.xml" 2>&1 | grep -v -i warn | tail -120 >> "$LOG"
    step "4 GB mode: the whole pipeline under a 4 GiB cap, low-memory, 64 photos"
    timeout 100 "$PY" benchmarks/low_memory.py --photos 64 --out "$DEST" 2>&1 | tail -40 >> "$LOG"
    ;;
  low-memory-where)
    step "the GPU-cut test"
    timeout 60 "$PY" -m pytest -q -m gpu tests/pipeline/test_threads.py -p no:cacheprovider -rfEs --tb=short 2>&1 \
      | grep -v -i warn | tail -30 >> "$LOG"
    step "4 GB mode, 24 photos: default (memory history), batch 1, CPU paste, expandable segments"
    timeout 60 "$PY" benchmarks/low_memory.py --photos 24 --snapshot "$DEST/low_memory_history.pickle" --out "$DEST" \
      2>&1 | tail -60 >> "$LOG"
    for lever in "--batch 1" "--paste cpu" "--expandable"; do
      timeout 50 "$PY" benchmarks/low_memory.py --photos 24 $lever --out "$DEST" 2>&1 | grep -E "mib|failed" >> "$LOG"
    done
    ;;
  low-memory-after)
    step "GPU tests: 4 GB mode, batched detector"
    timeout 120 "$PY" -m pytest -q -m gpu tests/tune/test_low_memory_gpu.py tests/face/test_mtcnn_batched.py \
      -p no:cacheprovider -rfEs --tb=short 2>&1 | grep -v -i warn | tail -40 >> "$LOG"
    step "4 GB mode, 64 photos: low-memory (memory history), with expandable segments, auto"
    timeout 60 "$PY" benchmarks/low_memory.py --photos 64 --snapshot "$DEST/low_memory_history.pickle" --out "$DEST" \
      2>&1 | tail -70 >> "$LOG"
    timeout 50 "$PY" benchmarks/low_memory.py --photos 64 --expandable --out "$DEST" 2>&1 | grep -E "mib|failed" >> "$LOG"
    timeout 50 "$PY" benchmarks/low_memory.py --photos 64 --preset auto --out "$DEST" 2>&1 | grep -E "mib|failed|preset" >> "$LOG"
    ;;
  low-memory-paste-tests)
    step "4 GB mode: 64 photos low-memory (memory history), auto; 256 photos low-memory"
    timeout 70 "$PY" benchmarks/low_memory.py --photos 64 --snapshot "$DEST/low_memory_history.pickle" --out "$DEST" \
      2>&1 | tail -80 >> "$LOG"
    timeout 50 "$PY" benchmarks/low_memory.py --photos 64 --preset auto --out "$DEST" 2>&1 | grep -E "mib|failed|preset" >> "$LOG"
    timeout 90 "$PY" benchmarks/low_memory.py --photos 256 --out "$DEST" 2>&1 | grep -E "mib|failed|faces" >> "$LOG"
    step "GPU tests (all)"
    timeout 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rfEs --tb=short \
      --junitxml="$DEST/gpu-tests.xml" 2>&1 | grep -v -i warn | tail -60 >> "$LOG"
    ;;
  parse-cost-tests)
    step "bench GPEN-BFR-512 default and preset speed, with the parse mask (synthetic ParseNet weights)"
    timeout 200 "$PY" -m gpen_tune bench --model GPEN-BFR-512 --device cuda --rows default,preset:speed --parse-mask \
      --batch-sizes 1,8,32 --repeats 5 --warmup 2 --max-minutes 2.5 -o "$DEST" 2>&1 | tail -40 >> "$LOG"
    step "6.8 MP group photo (Solvay x3, 29 faces), preset speed, with and without the parse mask"
    for mask in --parse-mask --no-parse-mask; do
      timeout 70 "$PY" benchmarks/group_photo.py --image .data/solvay_conference_1927.png --model GPEN-BFR-512 \
        --preset speed --repeats 5 $mask --out "$DEST" 2>&1 | tail -24 >> "$LOG"
    done
    step "GPU tests (all)"
    timeout 200 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rfEs --tb=short \
      --junitxml="$DEST/gpu-tests.xml" 2>&1 | grep -v -i warn | tail -60 >> "$LOG"
    ;;
  tests-own-mtcnn-nets)
    # needs .whl (facenet-pytorch for its weight files and the reference, facexlib, filterpy, av, libcst, spandrel)
    step "GPU tests (all), tracebacks and JUnit XML in $DEST/gpu-tests.xml"
    timeout 270 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rfEs --tb=short \
      --junitxml="$DEST/gpu-tests.xml" 2>&1 | grep -v -i warn | tail -60 >> "$LOG"
    step "detector speed (our P-/R-/O-Net), batches 1, 8, 32"
    timeout 70 "$PY" benchmarks/detector_speed.py --device cuda --out "$DEST" 2>&1 | tail -16 >> "$LOG"
    step "4 GB mode: the whole pipeline under a 4 GiB cap, low-memory, 64 photos"
    timeout 70 "$PY" benchmarks/low_memory.py --photos 64 --out "$DEST" 2>&1 | grep -E "mib|failed|faces" >> "$LOG"
    step "folder throughput GPEN-BFR-512, preset speed, pipeline only (256 photos)"
    folder512 110 14 --images 256 --skip-serial
    ;;
  gpu-tests-mirrored-layout)
    # needs .whl (facenet-pytorch for its weight files and the reference, facexlib, filterpy, av, libcst, spandrel)
    step "GPU tests (all) in the layout that mirrors the package; JUnit XML in $DEST/gpu-tests.xml"
    timeout 420 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider -rfEs --tb=short \
      --junitxml="$DEST/gpu-tests.xml" 2>&1 | grep -v -i warn | tail -60 >> "$LOG"
    ;;
  *) echo "usage: $0 NAME (the names are listed at the top of $0)" >&2; exit 2 ;;
esac
step "done"
cat "$LOG"
