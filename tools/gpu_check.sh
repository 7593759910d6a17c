#!/usr/bin/env bash
# One call on the H200 (device tool): kernel tests, kernel benchmarks, full-size verification
# against transformers, the end-to-end benchmark and the transformers peer, with logs under $OUT.
# Binaries are built on the development machine (scripts/build_for_gpu.sh) and carried in .device/.
#
#   bash tools/gpu_check.sh tests verify        # stages to run, in order
#   stages: tests attn_bench verify bench bench_fp8 bench120 serving moe_bench peer multi peer_ab sweep fixtures profile
#   env: TEST_FILTER (gtest filter for tests), BENCH_ARGS, BENCH120_ARGS, PROFILE_ARGS, PROFILE_REPEATS
#        (prefill runs averaged by the profile, the first a warm-up: use several), VERIFY_ARGS (e.g. --fp8)
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
BIN=.device
export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WORK=${WORK:-/tmp/gptoss_work}
mkdir -p "$WORK"
summary=()
# NCCL for the multi-GPU stages: torch's wheel ships libnccl.so.2 (this machine has no other).
if [ -z "${GPTOSS_NCCL_LIBRARY:-}" ]; then
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    f=$(find "$d" -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$f" ] && export GPTOSS_NCCL_LIBRARY="$f" && break
  done
fi
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared hosts
echo "NCCL: ${GPTOSS_NCCL_LIBRARY:-not found}"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/nvidia_smi.txt"
git_rev=$(cat .device/REVISION 2>/dev/null || echo unknown)
echo "revision: $git_rev" | tee "$OUT/revision.txt"

for stage in "$@"; do
  t0=$(date +%s)
  case "$stage" in
    tests)
      $BIN/cuda_kernel_tests ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} > "$OUT/cuda_kernel_tests.log" 2>&1
      rc=$?
      grep -E '^\[attn\]|rel L2|whole-prompt|real widths|^\[  (PASSED|FAILED) |^\[  FAILED' "$OUT/cuda_kernel_tests.log" | grep -E 'FAIL|PASSED|whole-prompt|real widths' | head -40
      summary+=("tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/cuda_kernel_tests.log" | tr '\n' ' ')")
      ;;
    attn_bench)
      $BIN/attention_bench > "$OUT/attention_bench.log" 2>&1
      summary+=("attn_bench rc=$?")
      tail -30 "$OUT/attention_bench.log"
      if command -v cuobjdump >/dev/null; then
        cuobjdump --dump-sass $BIN/attention_bench | awk '/Function :/{f=$3} /HMMA|LDSM|LDL|STL/{split($2,a,".");c[f" "a[1]]++} END{for(k in c)print c[k],k}' | grep -i attention > "$OUT/attention_sass.txt"
        cat "$OUT/attention_sass.txt"
      fi
      ;;
    verify)
      python3 tools/verify_full_size.py --gptoss $BIN/gptoss --preset gpt-oss-20b --work "$WORK" ${VERIFY_ARGS:-} \
        --json "$OUT/verify_20b.json" 2>&1 | tee "$OUT/verify_20b.log" | grep -vE 'Loading|it/s' | tail -12
      summary+=("verify rc=${PIPESTATUS[0]}")
      ;;
    bench)
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --json "$OUT/bench_20b.json" --markdown "$OUT/bench_20b.md" \
        ${BENCH_ARGS:-} > "$OUT/bench_20b.log" 2>&1
      summary+=("bench rc=$?")
      cat "$OUT/bench_20b.md"
      ;;
    bench_fp8)
      # The same benchmark with FP8 weights (gptoss bench --fp8).
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      $BIN/gptoss bench --fp8 --model "$WORK/gpt-oss-20b" --json "$OUT/bench_20b_fp8.json" --markdown "$OUT/bench_20b_fp8.md" \
        ${BENCH_ARGS:-} > "$OUT/bench_20b_fp8.log" 2>&1
      summary+=("bench_fp8 rc=$?")
      cat "$OUT/bench_20b_fp8.md"
      ;;
    bench120)
      # gpt-oss-120b with random weights built in memory (the checkpoint exceeds the device's disk).
      $BIN/gptoss bench --synthetic gpt-oss-120b ${BENCH120_ARGS:---prefill 1024,8192 --batch 1,8,64,256 --context 1024 --decode-steps 8 --repeats 2} \
        --json "$OUT/bench_120b.json" --markdown "$OUT/bench_120b.md" > "$OUT/bench_120b.log" 2>&1
      summary+=("bench120 rc=$?")
      cat "$OUT/bench_120b.md"
      ;;
    serving)
      # Issue 6's serving bars on gpt-oss-120b: total (prompt + generated) tok/s by concurrency for
      # streams of 1k in / 1k out and 8k in / 1k out (SERVING_ARGS: e.g. --fp8). Plot afterwards:
      # /usr/bin/python3 tools/plot_serving.py serving_120b_*.log --out DIR
      # KV for 256 streams of 9k tokens (87 GB on 120b) does not fit beside the weights: 8k runs stop at 128.
      for io in "1024 1024 64,128,256" "8192 1024 32,64,128"; do
        set -- $io
        $BIN/gptoss bench-serve --backend cuda --synthetic gpt-oss-120b --prompt-len $1 --max-tokens $2 \
          --concurrency ${SERVING_CONCURRENCY:-$3} ${SERVING_ARGS:-} --json \
          --markdown "$OUT/serving_120b_$1_$2.md" > "$OUT/serving_120b_$1_$2.log" 2>&1
        summary+=("serving $1/$2 rc=$?")
        cat "$OUT/serving_120b_$1_$2.md"
      done
      ;;
    moe_bench)
      # MoE kernels alone (graph-replayed, 8 layers of weights): weight-only and grouped tensor-core.
      { $BIN/moe_bench 1 2 4 8; $BIN/moe_bench --mma 8 16 32 64 128 256; } > "$OUT/moe_bench.log" 2>&1
      summary+=("moe_bench rc=$?")
      grep "^|" "$OUT/moe_bench.log"
      ;;
    peer)
      python3 tools/bench_peer_transformers.py --model "$WORK/gpt-oss-20b" --json "$OUT/peer_20b.json" \
        > "$OUT/peer_20b.log" 2>&1
      summary+=("peer rc=$?")
      grep -v Loading "$OUT/peer_20b.log" | tail -8
      ;;
    multi)
      $BIN/cuda_kernel_tests --gtest_filter='NcclCommunicator*:ParallelCuda*:ParallelOps*:PeerAllReduce*' > "$OUT/multi_tests.log" 2>&1
      rc=$?
      grep -E '^\[parallel\]|FAILED|PASSED|SKIPPED|Skipped' "$OUT/multi_tests.log" | head -30
      summary+=("multi rc=$rc")
      ;;
    peer_ab)
      # TP2 decode with NCCL and with the one-shot peer all-reduce (GPTOSS_PEER_ALLREDUCE=1).
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      for peer in 0 1; do
        GPTOSS_PEER_ALLREDUCE=$peer $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --layout tp=2 --prefill "" \
          --batch 1,8 --context 1024 --decode-steps 16 --markdown "$OUT/peer_ab_$peer.md" > "$OUT/peer_ab_$peer.log" 2>&1
        summary+=("peer_ab $peer rc=$?")
        echo "peer all-reduce $peer:"; grep "^| 1024" "$OUT/peer_ab_$peer.md"
      done
      ;;
    sweep)
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --sweep ${SWEEP_ARGS:---prefill 1024,8192 --batch 1,8,64 --context 1024,8192 --decode-steps 8 --repeats 2} \
        --json "$OUT/sweep_20b.json" --markdown "$OUT/sweep_20b.md" > "$OUT/sweep_20b.log" 2>&1
      summary+=("sweep rc=$?")
      sed -n '/Best layout/,$p' "$OUT/sweep_20b.md"
      ;;
    fixtures)
      # Conditioned tiny fixtures (transformers computes the reference logits), then our CUDA
      # backend against them.
      python3 tools/make_test_checkpoints.py --out "$OUT/fixtures" --init conditioned > "$OUT/fixtures.log" 2>&1
      summary+=("fixtures make rc=$?")
      python3 tools/verify_full_size.py --gptoss $BIN/gptoss --fixtures-only --fixtures-dir "$OUT/fixtures" \
        >> "$OUT/fixtures.log" 2>&1
      summary+=("fixtures verify rc=$?")
      tail -12 "$OUT/fixtures.log"
      tar -C "$OUT" -czf "$OUT/fixtures.tar.gz" fixtures && rm -rf "$OUT/fixtures"  # one file comes back
      ;;
    profile)
      # Device time per stage (CUDA events between stages, no graphs): batch-1 decode and 8k prefill.
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      GPTOSS_PROFILE=1 $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --prefill "" --batch 1 --context 1024 \
        --decode-steps 8 ${PROFILE_ARGS:-} > "$OUT/profile_decode.log" 2>&1
      GPTOSS_PROFILE=1 $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --prefill 8192 --batch "" --repeats ${PROFILE_REPEATS:-5} \
        ${PROFILE_ARGS:-} > "$OUT/profile_prefill.log" 2>&1
      summary+=("profile rc=$?")
      grep -A20 GPTOSS_PROFILE "$OUT/profile_decode.log" | head -24
      grep -A20 GPTOSS_PROFILE "$OUT/profile_prefill.log" | head -24
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  echo "== stage $stage: $(( $(date +%s) - t0 )) s"
done
echo "===== summary ====="
printf '%s\n' "${summary[@]}"
# The device tool brings back only a few files per call: pack everything into one archive
# (GPU_CHECK_TAR=0 keeps the files as they are).
if [ "${GPU_CHECK_TAR:-1}" != 0 ]; then
  tar -C "$OUT" -czf /tmp/gpu_check.tar.gz . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu_check.tar.gz "$OUT/"
fi
