#!/usr/bin/env bash
# The GPU tables of benchmarks/RESULTS.md, one part per table (each within ~10 minutes on one H200). Run from the
# repository root on the GPU machine; JSON results go to $OUT (or benchmarks/results), each part's output to
# $OUT/YYYYMMDD-HHMM-gpu-PART.log. PYTHON=echo prints the commands without running them.
#   bash benchmarks/gpu_tables.sh PART        (no PART: the list)
# Parts:
#   generator      the generator against its limit, GPEN-BFR-512 (benchmarks/generator_limit.py --quick)
#   bench-512      `gpen-tune bench`: the fp32 default, the six steps cumulative and alone, GPEN-BFR-512
#   bench-256      the same on GPEN-BFR-256
#   bench-presets  `gpen-tune bench` rows of the presets and single switches, GPEN-BFR-512
#   parse-mask     `gpen-tune bench --parse-mask`: the ParseNet paste mask next to the generator
#   folder         4,096 photos, file in to file out: serial vs pipeline (benchmarks/throughput.py)
#   video          1080p clips, one face and a group: serial vs pipeline, flicker (benchmarks/video.py)
#   key-frames     the user's video command with --detect-every 4 against every frame, interleaved
#                  (benchmarks/doors_ab.py), and the detector alone: full detection vs following (key_frames.py)
#   group-photo    the 29-face Solvay photo x3 (6.8 MP), with and without the parse mask (benchmarks/group_photo.py)
#   low-memory     a 4 GiB GPU emulated: peak memory over 64 and 256 photos (benchmarks/low_memory.py)
#   detector       batched MTCNN against facenet-pytorch's driver (benchmarks/detector_speed.py)
#   plain-bs1      the plain generator at batch 1, eager vs CUDA-graph replay (benchmarks/plain_bs1.py)
#   face-crop      --face-crop on vs off on a >= 12 MP photo (benchmarks/face_crop_bench.py)
#   scaling        1..8 GPUs of one host and 1..8 Ray actors (benchmarks/scaling.py; needs a multi-GPU host)
#   serve          `gpen-tune serve`: 64 concurrent single-face clients vs one at a time, with
#                  --detector-thread, then --detector-process (benchmarks/serve_load.py)
#   serve-replicas the same 64 clients over 3 servers sharing the GPU (--replicas 3), then over one
#   serve-detectors the 64 clients against 1, 2, 3 detector processes, 128 request threads, then 1 again (A/B/A)
#   serve-request-processes the 64 clients against the server as started (4 request processes on a GPU of 64 GiB
#                   or more), each between runs with none (one detector process), A/B/A/B; then the default at
#                   strength 0 (no generator call: the ceiling of what surrounds it)
#   serve-mps      the 64 clients against the server as started, then with --mps (a private MPS daemon), A/B/A/B
#   serve-shared-detector the 64 clients against the server as started, then with --shared-detector (one detector
#                  process for the request processes), A/B/A/B; then --mps with and without it
#   generator-gil  the service's generator call (1, 8, 16 faces) alone and beside 1, 2, 4 GIL-holding threads, GIL hand-over
#                  interval 200 and 50 us (benchmarks/generator_gil.py)
#   serve-ab       the 64 clients under --mps against the checkout in $BASE (e.g. `git worktree add /tmp/base REV`)
#                  and this one, A/B/A/B: an A/B of a change to the server
#   serve-shared-detector-mps the 64 clients under --mps with and without --shared-detector, B/A/B
#   serve-contention the 64 clients under --mps, then at strength 0 (no generator call: detection with the GPU to
#                  itself, and the ceiling of the request path), A/B/A/B
#   serve-profile  the 64 clients under --mps with py-spy on the server and its request processes, summarised per
#                  thread (benchmarks/pyspy_summary.py): where the request path's CPU goes
#   targets        the speed and service targets in one call (~8 minutes on an H200): every door of `gpen-tune
#                  enhance` (benchmarks/doors.py, the Solvay photo from $IMAGE or the shared data), then the 64 clients
#                  under --mps, two rounds, and at strength 0 (no generator call)
#   serve-request-sweep the 64 clients under --mps against 4, 8 and 12 request processes, then 4 again (each ~6.4 GiB
#                  beside the generator's ~27: 8 and 12 need more than an H100's 80 GB, e.g. an H200's 141)
#   encoder-repeat x264 on the GPU host's CPU: its own instruction sets against the writer's list without AVX-512,
#                  A/B x3 on 1080p at veryfast (the video door's encoder), and whether small clips repeat
#                  (benchmarks/encoder_repeat.py)
#   enhance-detectors the folder and long video commands with --detector-processes 2 against the default, interleaved
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-benchmarks/results}
PART=${1:-}
PYSPY=$(command -v py-spy || true)                 # where installed: the server's threads sampled (part serve)
if [[ -z "$PART" ]]; then sed -n '/^# Parts:/,/^set /p' "$0" | sed '$d'; exit 2; fi
mkdir -p "$DEST"
LOG="$DEST/$(date -u +%Y%m%d-%H%M)-gpu-$PART.log"
[[ "$PY" == echo ]] && LOG=/dev/null                 # a dry run (PYTHON=echo) writes no log
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
run() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; }
bench() { run timeout 590 "$PY" -m gpen_tune bench --device cuda --repeats 6 --warmup 2 -o "$DEST" "$@"; }
load64() { run timeout 290 "$PY" benchmarks/serve_load.py --device cuda --model GPEN-BFR-512 --weights synthetic \
             --preset speed --detector mtcnn --clients 64 --requests 2048 --sequential-requests 32 --rounds 2 \
             --batch-size 64 --max-wait-ms 5 --out "$DEST" "$@"; }   # 64 single-face clients, two rounds (the 2nd: steady state)

case "$PART" in
  generator)     run timeout 590 "$PY" benchmarks/generator_limit.py --quick --budget-s 125 \
                   --profile fused_bf16_triton --out "$DEST" ;;
  bench-512)     bench --model GPEN-BFR-512 --batch-sizes 1,4,16 --max-minutes 5.6 ;;
  bench-256)     bench --model GPEN-BFR-256 --batch-sizes 1,4,16 --max-minutes 3.6 ;;
  bench-presets) bench --model GPEN-BFR-512 --batch-sizes 1,4,16 --max-minutes 3.0 \
                   --rows default,amp,cuda_graph,preset:balanced,compile,preset:speed ;;
  parse-mask)    bench --model GPEN-BFR-512 --batch-sizes 1,8,32 --max-minutes 2.5 --rows default,preset:speed \
                   --parse-mask ;;
  folder)        run timeout 590 "$PY" benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 4096 \
                   --batch 32 --serial-images 256 --detector-process --out "$DEST" ;;
  video)         run timeout 590 "$PY" benchmarks/video.py --model GPEN-BFR-512 --preset speed --frames 240 \
                   --out "$DEST" ;;
  key-frames)    run timeout 400 "$PY" benchmarks/doors_ab.py --code . --code . --code-extra "" \
                   --code-extra "--detect-every 4" --only clip_one,clip_group --rounds 2 --tag key-frames --out "$DEST"
                 run timeout 150 "$PY" benchmarks/key_frames.py --device cuda --frames 48 --out "$DEST" ;;
  group-photo)   run timeout 290 "$PY" benchmarks/group_photo.py --model GPEN-BFR-512 --preset speed --repeats 10 \
                   --out "$DEST"
                 run timeout 290 "$PY" benchmarks/group_photo.py --model GPEN-BFR-512 --preset speed --repeats 5 \
                   --parse-mask --out "$DEST" ;;
  low-memory)    run timeout 290 "$PY" benchmarks/low_memory.py --photos 64 --out "$DEST"
                 run timeout 290 "$PY" benchmarks/low_memory.py --photos 256 --out "$DEST" ;;
  detector)      run timeout 590 "$PY" benchmarks/detector_speed.py --device cuda --out "$DEST" ;;
  plain-bs1)     run timeout 590 "$PY" benchmarks/plain_bs1.py --model GPEN-BFR-512 --out "$DEST" ;;
  face-crop)     run timeout 590 "$PY" benchmarks/face_crop_bench.py --device cuda --model GPEN-BFR-512 --repeats 3 \
                   --out "$DEST" ;;
  scaling)       run timeout 590 "$PY" benchmarks/scaling.py --device cuda --workers 1,2,4,8 --ray-actors 1,2,4,8 \
                   --images 2000 --model GPEN-BFR-512 --out "$DEST" ;;
  serve)         run timeout 590 "$PY" benchmarks/serve_load.py --device cuda --model GPEN-BFR-512 --weights synthetic \
                   --preset speed --detector mtcnn --clients 64 --requests 2048 --sequential-requests 64 --rounds 2 \
                   --batch-size 64 --max-wait-ms 5 --detector-thread --client-ceiling --out "$DEST" \
                   ${PYSPY:+--py-spy "$DEST/serve-server.folded"}
                 run timeout 590 "$PY" benchmarks/serve_load.py --device cuda --model GPEN-BFR-512 --weights synthetic \
                   --preset speed --detector mtcnn --clients 64 --requests 2048 --sequential-requests 64 --rounds 2 \
                   --batch-size 64 --max-wait-ms 5 --detector-process --out "$DEST" ;;
  serve-replicas) for n in 3 1; do
                   run timeout 290 "$PY" benchmarks/serve_load.py --device cuda --model GPEN-BFR-512 --weights synthetic \
                     --preset speed --detector mtcnn --clients 64 --requests 1024 --sequential-requests 32 --rounds 2 \
                     --batch-size 64 --max-wait-ms 5 --replicas $n --out "$DEST"
                 done ;;
  serve-detectors) for extra in "--detector-processes 1" "--detector-processes 2" "--detector-processes 3" \
                        "--detector-processes 2 --server-args=--request-threads=128" "--detector-processes 1"; do
                   load64 $extra
                 done ;;
  serve-request-processes) for extra in "--server-args=--request-processes=0" "--tag=default" \
                        "--server-args=--request-processes=0" "--tag=default" "--strength=0 --tag=strength0"; do
                   load64 $extra
                 done ;;
  serve-mps)     for extra in "--tag=default" "--server-args=--mps --tag=mps" "--tag=default" \
                        "--server-args=--mps --tag=mps"; do
                   load64 $extra
                 done ;;
  serve-shared-detector) for pair in "default:" "shared:--shared-detector" "default:" "shared:--shared-detector" \
                        "mps:--mps" "shared-mps:--shared-detector --mps"; do
                   load64 --tag "${pair%%:*}" --server-args="${pair#*:}"
                 done ;;
  serve-shared-detector-mps) for pair in "shared-mps:--mps --shared-detector" "mps:--mps" \
                        "shared-mps:--mps --shared-detector"; do
                   load64 --tag "${pair%%:*}" --server-args="${pair#*:}"
                 done ;;
  generator-gil) run timeout 290 "$PY" benchmarks/generator_gil.py --batches 1,8,16 --intervals-us 200,50 --out "$DEST" ;;
  serve-ab)      [[ -d "${BASE:-}/gpen_tune" ]] || { echo "serve-ab: set BASE to a checkout to compare" >&2; exit 2; }
                 for code in "$BASE" . "$BASE" .; do
                   load64 --server-args=--mps --code "$code" --tag "mps-$([[ $code == . ]] && echo this || echo base)"
                 done ;;
  serve-contention) for extra in "--tag=mps" "--strength=0 --tag=mps-strength0" "--tag=mps" \
                        "--strength=0 --tag=mps-strength0"; do
                   load64 --server-args=--mps $extra
                 done ;;
  serve-profile) [[ -n "$PYSPY" ]] || { echo "serve-profile: needs py-spy on PATH" >&2; exit 2; }
                 load64 --server-args=--mps --tag mps-pyspy --py-spy "$DEST/serve-mps.folded"
                 run "$PY" benchmarks/pyspy_summary.py "$DEST/serve-mps.folded" --depth 3 --top 8 --tag serve_pyspy \
                   --out "$DEST" ;;
  targets)       doors=(); [[ -n "${IMAGE:-}" ]] && doors=(--image "$IMAGE")
                 run timeout 290 "$PY" benchmarks/doors.py "${doors[@]}" --out "$DEST"
                 load64 --server-args=--mps --tag mps
                 load64 --server-args=--mps --strength 0 --tag mps-strength0 ;;
  serve-request-sweep) for n in 4 8 12 4; do
                   load64 --server-args="--mps --request-processes $n" --tag "mps-rp$n"
                 done ;;
  encoder-repeat) run timeout 290 "$PY" benchmarks/encoder_repeat.py --size 1920x1080 --frames 48 --writes 3 \
                   --preset veryfast --x264-params --ab-rounds 3 --out "$DEST"
                 run timeout 120 "$PY" benchmarks/encoder_repeat.py --size 480x270 --frames 24 --writes 10 --out "$DEST" ;;
  enhance-detectors) run timeout 590 "$PY" benchmarks/doors_ab.py --code . --code . --code-extra "" \
                   --code-extra "--detector-processes 2" --only folder,clip_one,clip_group --video-frames 1440 \
                   --rounds 1 --tag detector-processes --out "$DEST" ;;
  *) echo "unknown part $PART; bash $0 lists them" >&2; exit 2 ;;
esac
