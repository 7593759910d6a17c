#!/usr/bin/env bash
# One call on the H200 (device tool): kernel tests, kernel benchmarks, full-size verification
# against transformers, the end-to-end benchmark and the transformers peer, with logs under $OUT.
# Binaries are built on the development machine (scripts/build_for_gpu.sh) and carried in .device/.
#
#   bash tools/gpu_check.sh tests verify        # stages to run, in order
#   stages: tests attn_bench verify bench bench_fp8 bench120 serving moe_bench peer multi peer_ab sweep fixtures profile
#           ncu_decode moe_wgmma ncu_wgmma prefill_ab decode_ab sass ncu_moe profile120 ncu_step mma_v4_ab
#           gemv_bench ncu_gemv env_ab fp8kv_ab fp8_moe grouped_ab jit_ab attn_wgmma router_ab prefill8k decode_b1 ybf16_ab ncu_attn attn_tma attn_pipe bf16_out ncu_src tables mx norm_quant
#           decode_wg router_norm ncu_prefill fp8_experts narrow_tail prefill_tables mx_decode ncu_moe_decode ncu_sass decode_s17 rowq final18 next19 s19a s19b ncu_qraw decode_diag s20 s20b s20c s21 s21d s21b s21f ktrace s22a s22b s22c s22d boundary s23b s23c spec s27a s27b s27c s27d s27e s28a s28b s28c s28d s29a s29b s29c s29d s29e serve_cuda mask_overlap shared_prefix disagg s51 s52 s53
#   env: TEST_FILTER (gtest filter for tests), BENCH_ARGS, BENCH120_ARGS, PROFILE_ARGS, PROFILE_REPEATS
#        (prefill runs averaged by the profile, the first a warm-up: use several), VERIFY_ARGS (e.g. --fp8)
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
# Everything printed also lands in the archive (the tables the results READMEs quote).
exec > >(tee -a "$OUT/gpu_check_stdout.log") 2>&1
BIN=.device
[ -x $BIN/gptoss ] || { [ -f .device_pack/device.tgz ] && tar -xzf .device_pack/device.tgz; }
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

# An opt-in switch's stage: kernel tests (filter $3), the model and engine tests with $2=1, then 8k
# --fp8 prefill of each model of $5 with $2=1 and =0 (only if the tests pass), printing the
# latency row and the profile stages matching $4. Logs: $OUT/$1_*.
switch_prefill_ab() {
  local name=$1 var=$2 filter=$3 stages=$4 models=$5 rc rc2 m v
  timeout 150 $BIN/cuda_kernel_tests --gtest_filter="$filter" > "$OUT/${name}_tests.log" 2>&1
  rc=$?
  env "$var=1" timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' >> "$OUT/${name}_tests.log" 2>&1
  rc2=$?
  summary+=("$name tests rc=$rc model tests rc=$rc2")
  grep -E "OK \]|FAILED|Failure|real widths|fp8 \(|$name" "$OUT/${name}_tests.log" | head -40
  [ $rc = 0 ] && [ $rc2 = 0 ] || return
  for m in $models; do
    for v in 1 0; do
      env "$var=$v" GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
        --repeats 3 > "$OUT/${name}_${m}_$v.log" 2>&1
      summary+=("$name $m $var=$v rc=$?")
      echo "$m --fp8 8k prefill, $var=$v:"; grep -E "^\| [0-9]+ \||  ($stages|total) " "$OUT/${name}_${m}_$v.log" | head -8
    done
  done
}

# prefill_bars <prefix>: the 8k prefill bars (20b --fp8, 120b --fp8 --fp8-experts), each report written through
# --json / --markdown as <prefix>_prefill_<model>.{json,md,log}; prints each table row.
prefill_bars() {
  local p=$1 m x
  for m in 20b 120b; do
    [ $m = 120b ] && x=--fp8-experts || x=
    timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$m --fp8 $x --prefill 8192 --batch "" --repeats 3 \
      --json "$OUT/${p}_prefill_$m.json" --markdown "$OUT/${p}_prefill_$m.md" > "$OUT/${p}_prefill_$m.log" 2>&1
    echo "${p}_prefill_$m: $(grep -E '^\| 8192 \|' "$OUT/${p}_prefill_$m.md" | head -1)"
  done
}
# One decode row at 1k context, batch-1-style bench (`--fp8`, 64 steps, 3 repeats) with the given environment:
# decode_row <log name> <model: 20b|120b> <batch> [VAR=value ...]; the log goes to $OUT/<log name>.log and its table
# row is printed after the name.
decode_row() {
  local name=$1 model=$2 batch=$3
  shift 3
  env "$@" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-$model --fp8 --prefill "" --batch $batch --context 1024 \
    --decode-steps 64 --repeats 3 > "$OUT/$name.log" 2>&1
  echo "$name: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/$name.log")"
}
# ab_pairs <prefix> <name A> <env A> <name B> <env B>: batch-1 decode rows of A and B interleaved, three pairs on
# 20b and two on 120b, named <prefix>_<model>_b1_<name>_<pass> (env "-": none).
ab_pairs() {
  local p=$1 na=$2 ea=$3 nb=$4 eb=$5 m n pass
  for m in "20b 3" "120b 2"; do
    set -- $m
    for pass in $(seq 1 "$2"); do
      if [ "$ea" = - ]; then decode_row "${p}_$1_b1_${na}_$pass" "$1" 1; else decode_row "${p}_$1_b1_${na}_$pass" "$1" 1 "$ea"; fi
      if [ "$eb" = - ]; then decode_row "${p}_$1_b1_${nb}_$pass" "$1" 1; else decode_row "${p}_$1_b1_${nb}_$pass" "$1" 1 "$eb"; fi
    done
  done
}
# s45a_rows: batch-1 rows of QKV attention tail mode 1 / 3 interleaved at 1k (ab_pairs), then 20b at 3,968 context
# one pair (32 chunks).
s45a_rows() {
  local v
  ab_pairs s45a tail1 GPTOSS_QKV_ATTN_TAIL=1 tail3 GPTOSS_QKV_ATTN_TAIL=3
  for v in 1 3; do
    env GPTOSS_QKV_ATTN_TAIL=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 \
      --context 3968 --decode-steps 64 --repeats 3 > "$OUT/s45a_20b_b1_ctx4k_tail$v.log" 2>&1
    echo "s45a_20b_b1_ctx4k_tail$v: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s45a_20b_b1_ctx4k_tail$v.log")"
  done
}
# s45bc_rows <120b passes>: batch-1 rows of the MoE prologue forms interleaved, three passes on 20b: old order
# (GPTOSS_MOE_PLAN_FIRST=0), plan first (r60's patch default), plan first + down prefetch.
s45bc_rows() {
  local m pass
  for m in "20b 3" "120b $1"; do
    set -- $m
    for pass in $(seq 1 "$2"); do
      decode_row "s45bc_$1_b1_old_$pass" "$1" 1 GPTOSS_MOE_PLAN_FIRST=0
      decode_row "s45bc_$1_b1_planfirst_$pass" "$1" 1
      decode_row "s45bc_$1_b1_both_$pass" "$1" 1 GPTOSS_MOE_DOWN_PREFETCH=1
    done
  done
}
# ncu_decode_attn <name> [ENV=value ...]: ncu of the decode attention kernel (either form) at one sequence, 32k, with
# DRAM rate, stall reasons and the source page; prints the duration, DRAM rate and the most-stalled SASS lines.
ncu_decode_attn() {
  local name=$1
  shift
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  env "$@" timeout 200 $ncu --clock-control none --cache-control none --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --metrics 'dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed' \
    -k regex:bf16_paged_attention_decode -s 4 -c 1 -f -o "$OUT/$name" $BIN/attention_bench "decode B=1 ctx=32768" \
    > "$OUT/$name.log" 2>&1
  summary+=("$name rc=$?")
  $ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
  $ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/${name}_src.csv" 2>&1
  grep -E "Duration|DRAM Throughput|dram__" "$OUT/${name}_details.txt" | head -6
  python3 tools/ncu_stall_top.py "$OUT/${name}_src.csv" 12 > "$OUT/${name}_top.txt" 2>&1
  head -16 "$OUT/${name}_top.txt"
  gzip -f "$OUT/${name}_src.csv"
}
# tests_row <name> <gtest filter> [VAR=val ...]: cuda_kernel_tests with that filter and environment (150 s at most) into
# $OUT/<name>.log, its result in the summary and in $rc, the pass / fail lines printed.
tests_row() {
  local name=$1 filter=$2
  shift 2
  env "$@" timeout 150 $BIN/cuda_kernel_tests --gtest_filter="$filter" > "$OUT/$name.log" 2>&1
  rc=$?
  summary+=("$name rc=$rc")
  grep -E "FAILED|Failure|PASSED" "$OUT/$name.log" | tail -6
}
# packed_check <prefix> <120b pairs> [batch ...]: the decode layout of the MXFP4 experts (kernels/cuda/moe.h
# moe_pack_decode; GPTOSS_MOE_PACKED=1): its kernel tests and the CUDA model / engine tests with it on; if they pass,
# three interleaved 20b batch-1 pairs (default = the published layout, GPTOSS_MOE_PACKED=0 since session 69 made
# the copy the default where it is small; packed), one pair at each further batch, and <120b pairs> 120b batch-1
# pairs where the copy fits (the H200: 62.5 GB beside 61 GB of experts).
packed_check() {
  local p=$1 n120=$2 pass b mem
  shift 2
  tests_row ${p}_tests 'CudaOps.MoePack*:CudaOps.MoeDecodeMma*:CudaOps.MoeMxfp4*:CudaOps.MoeResidualTail*'
  [ $rc = 0 ] || return 0
  tests_row ${p}_model 'CudaModel.*:CudaEngine.*' GPTOSS_MOE_PACKED=1
  for pass in 1 2 3; do
    decode_row "${p}_20b_b1_default_$pass" 20b 1 GPTOSS_MOE_PACKED=0
    decode_row "${p}_20b_b1_packed_$pass" 20b 1 GPTOSS_MOE_PACKED=1
  done
  for b in "$@"; do
    decode_row "${p}_20b_b${b}_default" 20b $b GPTOSS_MOE_PACKED=0
    decode_row "${p}_20b_b${b}_packed" 20b $b GPTOSS_MOE_PACKED=1
  done
  mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if [ "${mem:-0}" -gt 120000 ]; then
    for pass in $(seq 1 "$n120"); do
      decode_row "${p}_120b_b1_default_$pass" 120b 1 GPTOSS_MOE_PACKED=0
      decode_row "${p}_120b_b1_packed_$pass" 120b 1 GPTOSS_MOE_PACKED=1
    done
  fi
}
# issue6_tables: issue 6's tables (plots: tools/plot_bench.py on the JSON): prefill latency and cost by input length,
# decode tok/s per user against cost for batch 1-128 at 8k and 32k context; both models --fp8 with the bf16 KV cache,
# and 20b with the FP8 cache at 32k (batch 128 fits only so).
issue6_tables() {
  local m pf
  for m in gpt-oss-20b gpt-oss-120b; do
    [ $m = gpt-oss-20b ] && pf=1024,2048,4096,8192,16384 || pf=1024,2048,4096,8192
    timeout 240 $BIN/gptoss bench --synthetic $m --fp8 --prefill $pf --batch 1,2,4,8,16,32,64,128 \
      --context 8192,32768 --decode-steps 8 --repeats 2 --json "$OUT/tables_$m.json" --markdown "$OUT/tables_$m.md" \
      > "$OUT/tables_$m.log" 2>&1
    summary+=("tables $m rc=$?")
    grep -E "^\| [0-9]+ \|" "$OUT/tables_$m.md" | head -40
  done
  timeout 120 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --kv-cache-dtype fp8 --prefill "" \
    --batch 1,8,64,128 --context 32768 --decode-steps 8 --json "$OUT/tables_20b_kvfp8.json" \
    --markdown "$OUT/tables_20b_kvfp8.md" > "$OUT/tables_20b_kvfp8.log" 2>&1
  summary+=("tables 20b kv fp8 rc=$?")
  grep -E "^\| [0-9]+ \|" "$OUT/tables_20b_kvfp8.md"
}
# mask_timing <name>: session 49's structured-output masks beside the forward and masked draws on the device. A
# full-size random gpt-oss-20b served with --fp8 on the o200k tokenizer, three times: the default (masks beside the
# forward, masked draws deferred to the device), GPTOSS_DEFER_MASKED_DRAWS=0 (logits to the host, host draw) and
# both off (GPTOSS_MASK_OVERLAP=0 too: masks at the draw); each time 200-token completions: free (min_tokens 200: a
# mask of the stop ids), under a regex, under a GBNF grammar and under a JSON schema with a pattern, and `nomin`
# (no min_tokens, ignore_eos: no mask at all), and two host draws in every mode: `lp` (logprobs 5) and `pen`
# (temperature 0.7, top_p 0.9, frequency_penalty 0.5); seconds a request and ms a token into ${name}_times.txt.
mask_timing() {
  local name=$1 port=8393 i code ov kind body pid
  [ -f .device_pack/tokenizer.json.gz ] || { echo "$name: no tokenizer in .device_pack"; return; }
  gzip -dc .device_pack/tokenizer.json.gz > "$WORK/tokenizer.json"
  [ -d "$WORK/m20" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/m20" --seed 4 > "$OUT/${name}_init.log" 2>&1
  : > "$OUT/${name}_times.txt"
  for ov in 1 d 0; do
    local overlap=1 defer=1
    [ $ov = d ] && defer=0
    [ $ov = 0 ] && overlap=0 && defer=0
    GPTOSS_MASK_OVERLAP=$overlap GPTOSS_DEFER_MASKED_DRAWS=$defer $BIN/gptoss serve --model "$WORK/m20" --backend cuda --fp8 --port $port \
      --tokenizer "$WORK/tokenizer.json" > "$OUT/${name}_serve_ov$ov.log" 2>&1 &
    pid=$!
    wait_health $port $pid
    echo "$name overlap=$ov: /health $code after ~$((i / 2)) s"
    for kind in warm nomin topp free regex grammar json lp pen nomin topp free regex grammar json lp pen; do
      body='{"model":"m","prompt":"x","max_tokens":200,"min_tokens":200,"temperature":1,"seed":7'
      [ $kind = nomin ] && body='{"model":"m","prompt":"x","max_tokens":200,"ignore_eos":true,"temperature":1,"seed":7'
      # topp: a device draw with top_p 0.9 at T 0.7 (the sample kernel's nucleus search). lp: logprobs (host draws
      # in every mode); pen: a penalty with top_p (deferred by default, else the host sampler).
      [ $kind = topp ] && body='{"model":"m","prompt":"x","max_tokens":200,"ignore_eos":true,"temperature":0.7,"top_p":0.9,"seed":7'
      [ $kind = lp ] && body='{"model":"m","prompt":"x","max_tokens":200,"ignore_eos":true,"temperature":1,"seed":7,"logprobs":5'
      [ $kind = pen ] && body='{"model":"m","prompt":"x","max_tokens":200,"ignore_eos":true,"temperature":0.7,"top_p":0.9,"frequency_penalty":0.5,"seed":7'
      [ $kind = regex ] && body="$body"',"guided_regex":"[a-z ]+"'
      [ $kind = grammar ] && body="$body"',"guided_grammar":"root ::= w (\" \" w)*\nw ::= [a-z]+"'
      [ $kind = json ] && body="$body"',"guided_json":{"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z ]+$"}},"required":["id"]}'
      curl -s -m 120 -o "$OUT/${name}_ov${ov}_$kind.json" -w "$ov $kind %{time_total}\n" \
        http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "$body}" >> "$OUT/${name}_times.txt"
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
  done
  python3 - "$OUT/${name}_times.txt" "$OUT/${name}" <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print("mode: 1 = masks beside the forward + device draws, d = host draws, 0 = neither")
print("mode    kind      s/request  ms/token  tokens")
for ov, kind, t in rows:
    try:
        n = json.load(open(f"{sys.argv[2]}_ov{ov}_{kind}.json"))["usage"]["completion_tokens"]
    except Exception as e:
        n = 0
    print(f"{ov:>7} {kind:<9} {float(t):9.3f} {1000 * float(t) / max(n, 1):9.3f} {n:7d}")
PY
}

# shared_prefix_timing <name>: session 50's scheduler change (a waiting request whose next prompt blocks a running
# request is computing waits for them in the prefix cache; GPTOSS_SHARED_PREFIX_WAIT=0 turns it off) on a served
# random gpt-oss-20b with --fp8: completions of a ~2,000-token prompt (new words each time, so no earlier request's
# blocks help) with n = 1 and n = 4, 16 tokens each, three times per setting; prints seconds a request.
shared_prefix_timing() {
  local name=$1 port=8394 wait pid n t body
  [ -f .device_pack/tokenizer.json.gz ] || { echo "$name: no tokenizer in .device_pack"; return; }
  gzip -dc .device_pack/tokenizer.json.gz > "$WORK/tokenizer.json"
  [ -d "$WORK/m20" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/m20" --seed 4 > "$OUT/${name}_init.log" 2>&1
  : > "$OUT/${name}_times.txt"
  for wait in 256 0; do
    GPTOSS_SHARED_PREFIX_WAIT=$wait $BIN/gptoss serve --model "$WORK/m20" --backend cuda --fp8 --port $port \
      --tokenizer "$WORK/tokenizer.json" > "$OUT/${name}_serve_w$wait.log" 2>&1 &
    pid=$!
    wait_health $port $pid
    echo "$name wait=$wait: /health $code after ~$((i / 2)) s"
    for n in 1 4 1 4 1 4; do
      body=$(python3 -c "import json,random; print(json.dumps({'model':'m','prompt':' '.join('w%d' % random.randrange(10**6) for _ in range(700)),'max_tokens':16,'ignore_eos':True,'n':$n,'temperature':1}))")
      curl -s -m 120 -o "$OUT/${name}_last.json" -w "$wait $n %{time_total}\n" http://127.0.0.1:$port/v1/completions \
        -H 'Content-Type: application/json' -d "$body" >> "$OUT/${name}_times.txt"
    done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
  done
  echo "wait n s/request"
  cat "$OUT/${name}_times.txt"
}

# disagg_timing <name>: prefill/decode disaggregation (server/disaggregation.h) on one GPU: a prefill worker and a
# decode worker (each --gpu-memory-utilization 0.4, 0.47 on an H100) on the random gpt-oss-20b with --fp8; completions of fresh
# ~1k / 4k / 8k-token prompts (16 tokens), each sent to the decode worker (its KV fetched over HTTP and imported)
# and to the prefill worker alone; prints seconds a request and the decode worker's transfer counters.
disagg_timing() {
  local name=$1 pp=8395 dp=8396 ppid dpid len t body
  [ -f .device_pack/tokenizer.json.gz ] || { echo "$name: no tokenizer in .device_pack"; return; }
  gzip -dc .device_pack/tokenizer.json.gz > "$WORK/tokenizer.json"
  [ -d "$WORK/m20" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/m20" --seed 4 > "$OUT/${name}_init.log" 2>&1
  # Two servers share the GPU (the share is per server); each holds ~35 GB of --fp8 weights: 0.4 each on an H200
  # (141 GB), 0.47 on an H100 (80 GB: ~3 GB of KV cache each; 8k tokens of 20b KV are ~0.4 GB).
  local util=0.4 total
  total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  [ "${total:-0}" -lt 100000 ] && util=0.47
  $BIN/gptoss serve --model "$WORK/m20" --backend cuda --fp8 --port $pp --gpu-memory-utilization $util \
    --disaggregation-mode prefill --tokenizer "$WORK/tokenizer.json" > "$OUT/${name}_prefill.log" 2>&1 &
  ppid=$!
  wait_health $pp $ppid
  echo "$name prefill worker: /health $code after ~$((i / 2)) s"
  $BIN/gptoss serve --model "$WORK/m20" --backend cuda --fp8 --port $dp --gpu-memory-utilization $util \
    --disaggregation-mode decode --prefill-url http://127.0.0.1:$pp --tokenizer "$WORK/tokenizer.json" \
    > "$OUT/${name}_decode.log" 2>&1 &
  dpid=$!
  wait_health $dp $dpid
  echo "$name decode worker: /health $code after ~$((i / 2)) s"
  : > "$OUT/${name}_times.txt"
  for len in 350 1400 2800 350 1400 2800; do
    for port in $dp $pp; do
      body=$(python3 -c "import json,random; print(json.dumps({'model':'m','prompt':' '.join('w%d' % random.randrange(10**6) for _ in range($len)),'max_tokens':16,'ignore_eos':True,'temperature':0}))")
      curl -s -m 120 -o "$OUT/${name}_last_$port.json" -w "$([ $port = $dp ] && echo disagg || echo local) $len %{time_total} " \
        http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "$body" >> "$OUT/${name}_times.txt"
      python3 -c "import json,sys; u=json.load(open(sys.argv[1]))['usage']; print(u['prompt_tokens'], u.get('prompt_tokens_details',{}).get('cached_tokens'))" \
        "$OUT/${name}_last_$port.json" >> "$OUT/${name}_times.txt" 2>/dev/null || echo "no answer" >> "$OUT/${name}_times.txt"
    done
  done
  curl -s http://127.0.0.1:$dp/metrics | grep -E '^gptoss_(kv_|remote_prefill)' > "$OUT/${name}_decode_metrics.txt"
  kill $dpid $ppid 2>/dev/null; wait $dpid $ppid 2>/dev/null
  echo "path words s/request prompt_tokens cached"
  cat "$OUT/${name}_times.txt" "$OUT/${name}_decode_metrics.txt"
}

# wait_health <port> <pid>: polls /health until 200 (at most 200 s) or the server exits; sets `code` and `i`.
wait_health() {
  for i in $(seq 1 400); do
    code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$1/health || true)
    [ "$code" = 200 ] && break
    kill -0 $2 2>/dev/null || break
    sleep 0.5
  done
}
# vllm_flags_check <name> (session 55): `gptoss serve` with vLLM's --api-key, --max-model-len and --seed on the tiny
# checkpoint: 401 without the key, /v1/models' max_model_len, return_token_ids, continue_final_message, and cache_salt
# (a salted prompt served from the cache only to its own salt) on the backend's prefix cache.
# tiny_model <name>: the tiny random checkpoint in $WORK/serve_tiny (made once, unless `fresh`), and TINY_TOK the
# --tokenizer flag: the device has no tokenizer fixture, so .device_pack/tokenizer.json.gz (gzip of
# .cache/tokenizer/tokenizer.json) is carried beside the binaries.
tiny_model() {
  if [ "${2:-}" = fresh ] || [ ! -d "$WORK/serve_tiny" ]; then
    $BIN/gptoss init-model --preset tiny --out "$WORK/serve_tiny" --seed 3 > "$OUT/$1_init.log" 2>&1
  fi
  TINY_TOK=()
  if [ -f .device_pack/tokenizer.json.gz ]; then
    gzip -dc .device_pack/tokenizer.json.gz > "$WORK/tokenizer.json" && TINY_TOK=(--tokenizer "$WORK/tokenizer.json")
  fi
}
# s59_check <name>: session 59's front-end changes on the CUDA backend (tiny random model, real vocabulary): calls
# that tool_choice forces (named, not strict; required) have arguments that parse against the function's schema
# (device masks), stop_reason on a stop string, GET /version.
s59_check() {
  local name=$1 port=8394
  tiny_model "$name"
  $BIN/gptoss serve --model "$WORK/serve_tiny" --backend ${SERVE_BACKEND:-cuda} --port $port "${TINY_TOK[@]}" \
    > "$OUT/${name}.log" 2>&1 &
  local pid=$!
  wait_health $port $pid
  local h=(-H 'Content-Type: application/json') i
  local tools='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":12},"days":{"type":"integer"}},"required":["city","days"],"additionalProperties":false}}}]'
  for i in 1 2 3; do
    curl -s -m 120 http://127.0.0.1:$port/v1/chat/completions "${h[@]}" \
      -d '{"messages":[{"role":"user","content":"Weather?"}],'"$tools"',"tool_choice":{"type":"function","function":{"name":"get_weather"}},"max_tokens":400,"temperature":1,"seed":'$i'}' \
      > "$OUT/${name}_named$i.json"
  done
  curl -s -m 120 http://127.0.0.1:$port/v1/chat/completions "${h[@]}" \
    -d '{"messages":[{"role":"user","content":"Weather?"}],'"$tools"',"tool_choice":"required","max_tokens":400,"temperature":1,"seed":4}' \
    > "$OUT/${name}_required.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/completions "${h[@]}" \
    -d '{"prompt":"x","max_tokens":64,"temperature":1,"seed":5,"stop":["e"]}' > "$OUT/${name}_stop.json"
  curl -s -m 30 http://127.0.0.1:$port/version > "$OUT/${name}_version.json"
  kill -TERM $pid 2>/dev/null
  wait $pid
  local src=$?
  local line
  line=$(python3 - "$OUT/${name}" <<'PY'
import json, sys
p = sys.argv[1]
out = []
def args_ok(path):
    try:
        c = json.load(open(path))["choices"][0]
        calls = c["message"].get("tool_calls") or []
        if not calls:
            return f"nocall({c.get('finish_reason')})"
        a = json.loads(calls[0]["function"]["arguments"])
        ok = set(a) == {"city", "days"} and isinstance(a["city"], str) and len(a["city"]) <= 12 and isinstance(a["days"], int)
        return "ok" if ok else "schema-miss"
    except Exception as e:
        return f"bad({type(e).__name__})"
out.append("named=" + "/".join(args_ok(f"{p}_named{i}.json") for i in (1, 2, 3)))
out.append("required=" + args_ok(f"{p}_required.json"))
try:
    c = json.load(open(p + "_stop.json"))["choices"][0]
    out.append(f"stop_reason={c.get('stop_reason')!r} finish={c.get('finish_reason')}")
except Exception as e:
    out.append(f"stop unreadable ({e})")
try:
    out.append("version=" + json.load(open(p + "_version.json"))["version"])
except Exception as e:
    out.append(f"version unreadable ({e})")
print(" ".join(out))
PY
)
  echo "$name: $line exit=$src"
  summary+=("$name: $line exit=$src")
}
# s56_check <name>: session 56's front-end fixes on the CUDA backend (tiny random model, real vocabulary): a Responses
# request_id names the stored response (GET finds it; the same id again is a 400, one with '/' too), and chat
# logprobs give one entry a content token (return_token_ids against logprobs.content, forced into the final channel by
# continue_final_message so that the random model writes content).
s56_check() {
  local name=$1 port=8393
  tiny_model "$name"
  $BIN/gptoss serve --model "$WORK/serve_tiny" --backend ${SERVE_BACKEND:-cuda} --port $port "${TINY_TOK[@]}" \
    > "$OUT/${name}.log" 2>&1 &
  local pid=$!
  wait_health $port $pid
  local h=(-H 'Content-Type: application/json')
  curl -s -m 60 http://127.0.0.1:$port/v1/responses "${h[@]}" \
    -d '{"input":"Hi","max_output_tokens":8,"request_id":"s56-resp"}' > "$OUT/${name}_resp.json"
  curl -s -m 30 http://127.0.0.1:$port/v1/responses/s56-resp > "$OUT/${name}_get.json"
  curl -s -m 30 -o /dev/null -w '%{http_code} ' http://127.0.0.1:$port/v1/responses "${h[@]}" \
    -d '{"input":"Hi","max_output_tokens":8,"request_id":"s56-resp"}' > "$OUT/${name}_codes.txt"
  curl -s -m 30 -o /dev/null -w '%{http_code}' http://127.0.0.1:$port/v1/responses "${h[@]}" \
    -d '{"input":"Hi","max_output_tokens":8,"request_id":"a/b"}' >> "$OUT/${name}_codes.txt"
  curl -s -m 60 http://127.0.0.1:$port/v1/chat/completions "${h[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Sure:"}],"continue_final_message":true,"add_generation_prompt":false,"max_tokens":24,"seed":3,"logprobs":true,"return_token_ids":true,"ignore_eos":true}' \
    > "$OUT/${name}_lp.json"
  kill -TERM $pid 2>/dev/null
  wait $pid
  local src=$?
  local line
  line=$(python3 - "$OUT/${name}" <<'PY'
import json, sys
p = sys.argv[1]
out = []
try:
    r = json.load(open(p + "_resp.json")); g = json.load(open(p + "_get.json"))
    out.append(f"resp_id={r['id']} get_id={g.get('id')} codes={open(p + '_codes.txt').read().strip().replace(' ', '/')}")
except Exception as e:
    out.append(f"responses unreadable ({e})")
try:
    c = json.load(open(p + "_lp.json"))["choices"][0]
    lp = (c.get("logprobs") or {}).get("content") or []
    out.append(f"lp_entries={len(lp)} token_ids={len(c.get('token_ids', []))} finish={c.get('finish_reason')}")
except Exception as e:
    out.append(f"logprobs unreadable ({e})")
print(" ".join(out))
PY
)
  echo "$name: $line exit=$src"
  summary+=("$name $line server_exit=$src")
}
vllm_flags_check() {
  local name=$1 port=8392 i code
  tiny_model "$name"
  GPTOSS_API_KEY=sk-env $BIN/gptoss serve --model "$WORK/serve_tiny" --backend ${SERVE_BACKEND:-cuda} --port $port \
    "${TINY_TOK[@]}" --api-key sk-flag --max-model-len 2048 --seed 5 > "$OUT/${name}.log" 2>&1 &
  local pid=$!
  wait_health $port $pid
  local h=(-H 'Content-Type: application/json' -H 'Authorization: Bearer sk-env')
  curl -s -m 30 -o /dev/null -w '%{http_code}\n' http://127.0.0.1:$port/v1/models > "$OUT/${name}_nokey.txt"
  curl -s -m 30 http://127.0.0.1:$port/v1/models -H 'X-Api-Key: sk-flag' > "$OUT/${name}_models.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/chat/completions "${h[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"temperature":0,"return_token_ids":true}' \
    > "$OUT/${name}_ids.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/chat/completions "${h[@]}" \
    -d '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"The answer is"}],"continue_final_message":true,"max_tokens":8,"temperature":0,"echo":true}' \
    > "$OUT/${name}_continue.json"
  local salt k=0
  for salt in a b a; do
    k=$((k + 1))
    curl -s -m 60 http://127.0.0.1:$port/v1/completions "${h[@]}" \
      -d '{"prompt":"'"$(printf 'word %.0s' $(seq 1 120))"'","max_tokens":4,"temperature":0,"cache_salt":"'$salt'"}' \
      > "$OUT/${name}_salt$k.json"
  done
  kill -TERM $pid 2>/dev/null
  wait $pid
  local src=$?
  local line
  line=$(python3 - "$OUT/${name}" <<'PY'
import json, sys
p = sys.argv[1]
out = []
try:
    out.append("nokey=" + open(p + "_nokey.txt").read().strip())
    out.append(f"max_model_len={json.load(open(p + '_models.json'))['data'][0].get('max_model_len')}")
except Exception as e:
    out.append(f"auth unreadable ({e})")
try:
    j = json.load(open(p + "_ids.json"))
    c = j["choices"][0]
    out.append(f"token_ids={len(c['token_ids'])}/{j['usage']['completion_tokens']} prompt_ids={len(j['prompt_token_ids'])}/{j['usage']['prompt_tokens']}")
except Exception as e:
    out.append(f"return_token_ids unreadable ({e})")
try:
    c = json.load(open(p + "_continue.json"))["choices"][0]["message"]
    out.append(f"continue_echo_ok={(c.get('content') or '').startswith('The answer is') or c.get('content') is None}")
except Exception as e:
    out.append(f"continue unreadable ({e})")
try:
    cached = [json.load(open(p + f"_salt{k}.json"))["usage"]["prompt_tokens_details"]["cached_tokens"] for k in (1, 2, 3)]
    out.append(f"salt_cached={cached}")
except Exception as e:
    out.append(f"salt unreadable ({e})")
print(" ".join(out))
PY
)
  echo "$name: $line exit=$src"
  summary+=("$name $line server_exit=$src")
}
# serve_check <name>: `gptoss serve --backend cuda` on a tiny random checkpoint with the default KV sizing
# (--gpu-memory-utilization 0.9): waits for /health, sends a chat completion (plain and streamed) and a completion,
# prints the "KV cache" line and the answers, stops the server with SIGTERM and checks its exit status.
serve_check() {
  local name=$1 port=8391 i code
  tiny_model "$name" fresh
  $BIN/gptoss serve --model "$WORK/serve_tiny" --backend ${SERVE_BACKEND:-cuda} --port $port "${TINY_TOK[@]}" \
    > "$OUT/${name}.log" 2>&1 &
  local pid=$!
  wait_health $port $pid
  echo "$name: /health $code after ~$((i / 2)) s"
  curl -s -m 60 http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0}' \
    > "$OUT/${name}_chat.json"
  curl -s -m 60 -N http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"stream":true,"n":2}' \
    > "$OUT/${name}_stream.txt"
  curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":["a b c","d e"],"max_tokens":8,"temperature":0}' > "$OUT/${name}_completions.json"
  # Session 47: structured outputs and echoed prompt logprobs (lm-evaluation-harness's loglikelihood form) on CUDA.
  curl -s -m 60 http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","messages":[{"role":"user","content":"n?"}],"max_tokens":300,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}}}' \
    > "$OUT/${name}_json.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":[11,12,13,14,15,16,17,18,19],"max_tokens":1,"logprobs":1,"echo":true,"temperature":0,"prompt_logprobs":2}' \
    > "$OUT/${name}_echo.json"
  # Session 48: a GBNF grammar and a schema with a string pattern; then 200 tokens each unconstrained, under a regex
  # and under a grammar (the same language), to time what host masks cost a request on o200k.
  curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":"x","max_tokens":40,"temperature":1,"seed":5,"guided_grammar":"root ::= \"[\" item (\",\" item){0,3} \"]\"\nitem ::= [a-c] | root"}' \
    > "$OUT/${name}_grammar.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":"x","max_tokens":40,"temperature":1,"seed":5,"guided_json":{"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"}},"required":["id"]}}' \
    > "$OUT/${name}_pattern.json"
  # Session 54: a structural tag (one call at once, JSON arguments, then the end) drawn under device masks.
  curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":"x","max_tokens":60,"temperature":1,"seed":5,"structured_outputs":{"structural_tag":{"type":"structural_tag","format":{"type":"triggered_tags","triggers":["<f="],"at_least_one":true,"stop_after_first":true,"tags":[{"type":"tag","begin":"<f=sum>","end":"</f>","content":{"type":"json_schema","json_schema":{"type":"object","properties":{"xs":{"type":"array","items":{"type":"integer"},"maxItems":3}},"required":["xs"]}}}]}}}}' \
    > "$OUT/${name}_stag.json"
  # vLLM's allowed_token_ids (every draw among them, named by id through return_tokens_as_token_ids).
  curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"m","prompt":"x","max_tokens":16,"temperature":1,"seed":5,"allowed_token_ids":[300,301,302,777],"logprobs":0,"return_tokens_as_token_ids":true}' \
    > "$OUT/${name}_allowed.json"
  local kind body
  : > "$OUT/${name}_times.txt"
  for kind in free regex grammar; do
    body='{"model":"m","prompt":"x","max_tokens":200,"min_tokens":200,"temperature":1,"seed":7'
    [ $kind = regex ] && body="$body"',"guided_regex":"[a-z ]+"'
    [ $kind = grammar ] && body="$body"',"guided_grammar":"root ::= w (\" \" w)*\nw ::= [a-z]+"'
    curl -s -m 120 -o "$OUT/${name}_time_$kind.json" -w "$kind %{time_total}\n" http://127.0.0.1:$port/v1/completions \
      -H 'Content-Type: application/json' -d "$body}" >> "$OUT/${name}_times.txt"
  done
  # Session 53: stored responses on CUDA: a follow-up by previous_response_id (its prompt holds the first turn), and a
  # background response cancelled mid-generation (its sequence and KV blocks freed).
  local rid bid
  curl -s -m 60 http://127.0.0.1:$port/v1/responses -H 'Content-Type: application/json' \
    -d '{"model":"m","input":"Hi","max_output_tokens":8}' > "$OUT/${name}_resp1.json"
  rid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$OUT/${name}_resp1.json" 2>/dev/null)
  curl -s -m 60 http://127.0.0.1:$port/v1/responses -H 'Content-Type: application/json' \
    -d '{"model":"m","input":"Again","max_output_tokens":8,"previous_response_id":"'"$rid"'"}' > "$OUT/${name}_resp2.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/responses -H 'Content-Type: application/json' \
    -d '{"model":"m","input":"Again","max_output_tokens":8,"store":false}' > "$OUT/${name}_resp3.json"
  curl -s -m 60 http://127.0.0.1:$port/v1/responses -H 'Content-Type: application/json' \
    -d '{"model":"m","input":"Long","max_output_tokens":3000,"min_tokens":3000,"background":true}' > "$OUT/${name}_bg.json"
  bid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$OUT/${name}_bg.json" 2>/dev/null)
  sleep 0.5
  curl -s -m 30 -X POST http://127.0.0.1:$port/v1/responses/$bid/cancel > "$OUT/${name}_bg_cancel.json"
  sleep 0.5
  curl -s -m 10 http://127.0.0.1:$port/metrics | grep -E '^gptoss_(running_sequences|kv_blocks_in_use) ' \
    > "$OUT/${name}_bg_metrics.txt"
  local stored
  stored=$(python3 - "$OUT/${name}" <<'PY'
import json, sys
p = sys.argv[1]
try:
    u1, u2, u3 = (json.load(open(p + f"_resp{k}.json"))["usage"] for k in (1, 2, 3))
    chained = u2["input_tokens"] > u3["input_tokens"]  # the follow-up's prompt holds the first turn
    c = json.load(open(p + "_bg_cancel.json"))
    out = [f"stored: chained={chained} ({u2['input_tokens']} input tokens, {u3['input_tokens']} alone)",
           f"bg_cancel={c.get('status')} output_tokens={(c.get('usage') or {}).get('output_tokens')}"]
    out.append("metrics " + " ".join(l.split()[0].replace("gptoss_", "") + "=" + l.split()[1]
                                     for l in open(p + "_bg_metrics.txt")))
    print(" ".join(out))
except Exception as e:
    print(f"stored unreadable ({e})")
PY
)
  local extra
  extra=$(python3 - "$OUT/${name}_json.json" "$OUT/${name}_echo.json" "$OUT/${name}_grammar.json" \
    "$OUT/${name}_pattern.json" "$OUT/${name}_times.txt" "$OUT/${name}" <<'PY'
import json, math, re, sys
out = []
try:
    c = json.load(open(sys.argv[6] + "_stag.json"))["choices"][0]
    t = c["text"]
    ok = t.startswith("<f=sum>") or "<f=sum>".startswith(t)
    if c["finish_reason"] == "stop":
        doc = json.loads(t[len("<f=sum>"):-len("</f>")]) if t.endswith("</f>") else None
        ok = ok and isinstance(doc, dict) and all(isinstance(x, int) for x in doc["xs"]) and len(doc["xs"]) <= 3
    out.append(f"structural_tag finish={c['finish_reason']} text_ok={ok} text={t[:60]!r}")
except Exception as e:
    out.append(f"structural_tag unreadable ({e})")
try:
    toks = json.load(open(sys.argv[6] + "_allowed.json"))["choices"][0]["logprobs"]["tokens"]
    ids = [int(t.split(":")[1]) for t in toks]
    out.append(f"allowed_token_ids n={len(ids)} all_allowed={all(i in (300, 301, 302, 777) for i in ids)}")
except Exception as e:
    out.append(f"allowed_token_ids unreadable ({e})")
try:
    c = json.load(open(sys.argv[1]))["choices"][0]
    content = c["message"].get("content")
    try:
        ok = isinstance(json.loads(content or ""), dict)
    except Exception:
        ok = False
    out.append(f"json_schema finish={c['finish_reason']} content_parses={ok}")
except Exception as e:
    out.append(f"json_schema unreadable ({e})")
try:
    c = json.load(open(sys.argv[2]))["choices"][0]
    lp = c["logprobs"]["token_logprobs"]
    good = lp[0] is None and all(isinstance(x, float) and x <= 0 and math.isfinite(x) for x in lp[1:])
    plp = c["prompt_logprobs"]
    out.append(f"echo entries={len(lp)} first_null_rest_finite={good} prompt_logprobs={len(plp)}")
except Exception as e:
    out.append(f"echo unreadable ({e})")
def nested(t, i=0):  # the grammar's lists: the index after one at i, or -1
    if i >= len(t) or t[i] != "[":
        return -1
    j = i + 1
    for k in range(4):
        j = j + 1 if j < len(t) and t[j] in "abc" else nested(t, j)
        if j < 0 or j >= len(t):
            return -1
        if t[j] == "]":
            return j + 1
        if t[j] != "," or k == 3:
            return -1
        j += 1
    return -1
try:
    c = json.load(open(sys.argv[3]))["choices"][0]
    t = c["text"]
    ok = nested(t) == len(t) if c["finish_reason"] == "stop" else re.fullmatch(r"[\[\],a-c]*", t) is not None
    out.append(f"grammar finish={c['finish_reason']} text_ok={ok}")
except Exception as e:
    out.append(f"grammar unreadable ({e})")
try:
    c = json.load(open(sys.argv[4]))["choices"][0]
    ok = None
    if c["finish_reason"] == "stop":
        ok = re.fullmatch(r"[A-Z]{2}-[0-9]{3}", json.loads(c["text"])["id"]) is not None
    out.append(f"pattern finish={c['finish_reason']} id_ok={ok}")
except Exception as e:
    out.append(f"pattern unreadable ({e})")
try:
    for line in open(sys.argv[5]):
        kind, secs = line.split()
        c = json.load(open(f"{sys.argv[6]}_time_{kind}.json"))
        n = c["usage"]["completion_tokens"]
        text = c["choices"][0]["text"]
        valid = kind == "free" or re.fullmatch(r"[a-z ]+" if kind == "regex" else r"[a-z]+( [a-z]+)*", text) is not None
        out.append(f"{kind}: {n} tokens {float(secs):.3f} s ({n / float(secs):.0f} tok/s) valid={valid}")
except Exception as e:
    out.append(f"timing unreadable ({e})")
print(" ".join(out))
PY
)
  echo "$extra"
  kill -TERM $pid 2>/dev/null
  wait $pid
  local src=$?
  grep -E "KV cache|error|listening|ready" "$OUT/${name}.log" | head -8
  head -c 600 "$OUT/${name}_chat.json"; echo
  grep -c '^data: ' "$OUT/${name}_stream.txt" | sed 's/^/stream data lines: /'
  tail -c 300 "$OUT/${name}_stream.txt"; echo
  head -c 600 "$OUT/${name}_completions.json"; echo
  local kv
  kv=$(grep -o 'KV cache: [0-9]* MiB' "$OUT/${name}.log" | head -1)
  summary+=("$name health=$code server_exit=$src ${kv:-no KV cache line (sized by --kv-cache-mb or not by utilization)} $extra $stored")
}
# ktrace_row <name> <20b|120b> [VAR=val ...]: a kernel trace of 6 decode steps at batch 1, 1k context, and its summary.
ktrace_row() {
  local name=$1 model=$2
  shift 2
  env "$@" GPTOSS_KERNEL_TRACE="$OUT/$name.csv" timeout 150 $BIN/gptoss bench --synthetic gpt-oss-$model --fp8 \
    --prefill "" --batch 1 --context 1024 --decode-steps 6 --repeats 1 > "$OUT/$name.log" 2>&1
  summary+=("$name rc=$?")
  python3 tools/ktrace_summary.py "$OUT/$name.csv" | head -20
}
# Session 40's step-edge rows (s40a, s40b): off / on interleaved, each alone, the loop grid at 480, a 20b trace.
s40_edge_rows() {
  local p=$1
  for cfg in "20b 1 1" "120b 1 1" "20b 1 2" "20b 2 1" "20b 1 3"; do
    set -- $cfg
    decode_row "${p}_$1_b$2_off_$3" $1 $2 GPTOSS_STEP_EDGE_TAIL=0 GPTOSS_LMHEAD_ARGMAX=0
    decode_row "${p}_$1_b$2_on_$3" $1 $2
  done
  decode_row ${p}_20b_b1_edge_only 20b 1 GPTOSS_LMHEAD_ARGMAX=0
  decode_row ${p}_20b_b1_argmax_only 20b 1 GPTOSS_STEP_EDGE_TAIL=0
  decode_row ${p}_20b_b1_grid480 20b 1 GPTOSS_MOE_LOOP_GRID=480
  ktrace_row ${p}_ktrace_20b 20b
}

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
      # SERVING_MODEL (a synthetic preset, default gpt-oss-120b) and SERVING_IO ("in out concurrency"
      # triples separated by ';') make quick checks possible.
      smodel=${SERVING_MODEL:-gpt-oss-120b}
      IFS=';' read -ra ios <<< "${SERVING_IO:-1024 1024 64,128,256;8192 1024 32,64,128}"
      for io in "${ios[@]}"; do
        set -- $io
        tag="${smodel#gpt-oss-}_$1_$2"
        $BIN/gptoss bench-serve --backend cuda --synthetic $smodel --prompt-len $1 --max-tokens $2 \
          --concurrency ${SERVING_CONCURRENCY:-$3} ${SERVING_ARGS:-} --json \
          --markdown "$OUT/serving_$tag.md" > "$OUT/serving_$tag.log" 2>&1
        summary+=("serving $tag rc=$?")
        cat "$OUT/serving_$tag.md"
      done
      ;;
    moe_bench)
      # MoE kernels alone (graph-replayed, 8 layers of weights): weight-only and grouped tensor-core.
      { $BIN/moe_bench 1 2 4 8; $BIN/moe_bench --mma 8 16 32 64 128 256; } > "$OUT/moe_bench.log" 2>&1
      summary+=("moe_bench rc=$?")
      grep "^|" "$OUT/moe_bench.log"
      ;;
    moe_wgmma)
      # Prefill-sized MoE batches: the warpgroup kernels against moe_mma's 64-row tiles.
      # --wgmma-ws: the warp-specialized variant (its time includes gathering x); --w4a8: FP8 wgmma
      # (its time includes quantizing the activation rows).
      { $BIN/moe_bench --wgmma ${MOE_WGMMA_BATCHES:-64 256 1024 2048 8192}; \
        $BIN/moe_bench --wgmma-ws ${MOE_WGMMA_BATCHES:-64 256 1024 2048 8192}; \
        $BIN/moe_bench --w4a8 ${MOE_WGMMA_BATCHES:-64 256 1024 2048 8192}; \
        $BIN/moe_bench --mma ${MOE_WGMMA_BATCHES:-64 256 1024 2048 8192}; } > "$OUT/moe_wgmma.log" 2>&1
      summary+=("moe_wgmma rc=$?")
      grep "^|" "$OUT/moe_wgmma.log"
      ;;
    ncu_attn)
      # Pipe use and stall reasons of the wgmma prefill attention at 8k tokens, full causal (the first
      # launch of attention_bench's "prefill T=8192" case): which of tensor, MUFU (exp) and FMA binds.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      GPTOSS_ATTN_PREFILL_WGMMA=1 timeout 180 $NCU --clock-control none --cache-control none --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
        --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__sass_inst_executed.sum' \
        -k regex:prefill_wgmma -c 1 $BIN/attention_bench "prefill T=8192" > "$OUT/ncu_attn.txt" 2>&1
      summary+=("ncu_attn rc=$?")
      grep -E 'prefill_wgmma|Duration|Issued Warp|Eligible Warps|Active Warps Per|Registers|inst_executed.sum' "$OUT/ncu_attn.txt" | head -12
      awk '/(pipe_|issue_stalled)/ && $NF+0 > 3 && /pct/ {print "   ", $1, $NF} /issue_stalled/ && $NF+0 > 0.05 {print "   ", $1, $NF}' "$OUT/ncu_attn.txt" | head -40
      ;;
    ncu_wgmma)
      # Stall reasons of the warpgroup MoE kernels at an 8k-token prefill (gate_up, then down).
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      $NCU --clock-control none --cache-control none --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        -k regex:moe_wgmma -c 2 $BIN/moe_bench ${NCU_WGMMA_MODE:---wgmma} ${NCU_WGMMA_BATCH:-8192} > "$OUT/ncu_wgmma.txt" 2>&1
      summary+=("ncu_wgmma rc=$?")
      grep -E 'moe_wgmma|Duration|Throughput|Stall|Issued|Eligible|Active Warps|No Eligible|Registers' "$OUT/ncu_wgmma.txt" | head -60
      ;;
    sass)
      # SASS of the kernels matching SASS_KERNEL (default moe_mma_kernel) in moe_bench, and each
      # one's instruction count by opcode (cuobjdump from the device's CUDA toolkit).
      CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      $CUOBJDUMP -sass ${SASS_BIN:-$BIN/moe_bench} > "$OUT/sass_all.txt" 2>&1
      summary+=("sass rc=$?")
      python3 tools/sass_summary.py "$OUT/sass_all.txt" "${SASS_KERNEL:-moe_mma_kernel}" > "$OUT/sass_summary.txt"
      head -60 "$OUT/sass_summary.txt"
      ;;
    env_ab)
      # The decode benchmark under each environment setting of AB_ENVS (';'-separated, each a list of
      # VAR=value; an empty entry is the default), for each model of AB_MODELS (default 20b), with
      # AB_ARGS (default --fp8, batch 1,2,4,8, 1k context, 32 steps).
      IFS=';' read -ra abs <<< "${AB_ENVS:-;GPTOSS_GEMV_FP8=mma1}"
      for m in ${AB_MODELS:-20b}; do
        for i in "${!abs[@]}"; do
          e="${abs[$i]}"; tag="${m}_$i"
          eval "args=(${AB_ARGS:---fp8 --prefill '' --batch 1,2,4,8 --context 1024 --decode-steps 32})"
          env $e $BIN/gptoss bench --synthetic gpt-oss-$m "${args[@]}" \
            --markdown "$OUT/ab_$tag.md" > "$OUT/ab_$tag.log" 2>&1
          summary+=("env_ab $m [${e:-default}] rc=$?")
          echo "$m [${e:-default}]:"; grep -E "^\| [0-9]+ \|" "$OUT/ab_$tag.md"
        done
      done
      ;;
    fp8kv_ab)
      # The FP8 KV cache's decode attention: the widening pass (default) against the direct e4m3
      # fragments (GPTOSS_ATTN_FP8_DIRECT=1), the kernel alone and in 20b decode steps.
      for d in 0 1; do
        GPTOSS_ATTN_FP8_KV=1 GPTOSS_ATTN_FP8_DIRECT=$d $BIN/attention_bench decode > "$OUT/fp8kv_attn_$d.log" 2>&1
        summary+=("fp8kv_ab attention_bench direct=$d rc=$?")
        echo "attention decode, FP8 KV, direct $d:"; grep -E "B=(1|8|64|128) " "$OUT/fp8kv_attn_$d.log" | head -14
        GPTOSS_ATTN_FP8_DIRECT=$d $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --kv-cache-dtype fp8 --prefill "" \
          --batch 1,64,128 --context 8192,32768 --decode-steps 8 --markdown "$OUT/fp8kv_20b_$d.md" > "$OUT/fp8kv_20b_$d.log" 2>&1
        summary+=("fp8kv_ab 20b direct=$d rc=$?")
        echo "20b FP8 KV, direct $d:"; grep -E "^\| [0-9]+ \|" "$OUT/fp8kv_20b_$d.md"
      done
      ;;
    fp8_moe)
      # The grouped FP8 experts (moe_fp8): kernel tests first (a hang would show here, so under a
      # timeout), the kernels alone against the warp-specialized bf16 MXFP4 kernel, then 20b prefill
      # with them against the per-expert cuBLASLt W8A8 path (GPTOSS_MOE_FP8_GROUPED=0) and bf16.
      timeout 180 $BIN/cuda_kernel_tests --gtest_filter='CudaMoeFp8.*' > "$OUT/fp8_moe_tests.log" 2>&1
      summary+=("fp8_moe tests rc=$?")
      grep -E "moe_fp8|OK \]|FAILED" "$OUT/fp8_moe_tests.log" | head -20
      timeout 240 $BIN/moe_bench --fp8 ${FP8_MOE_TOKENS:-1024 4096 8192} > "$OUT/fp8_moe_bench.log" 2>&1
      summary+=("fp8_moe moe_bench --fp8 rc=$?")
      timeout 240 $BIN/moe_bench --wgmma-ws ${FP8_MOE_TOKENS:-1024 4096 8192} > "$OUT/fp8_moe_bench_ws.log" 2>&1
      summary+=("fp8_moe moe_bench --wgmma-ws rc=$?")
      echo "moe_fp8:"; grep -E "^\| [0-9]+ \|" "$OUT/fp8_moe_bench.log"
      echo "moe_wgmma ws (bf16, MXFP4):"; grep -E "^\| [0-9]+ \|" "$OUT/fp8_moe_bench_ws.log"
      for v in 1 0; do
        GPTOSS_MOE_FP8_GROUPED=$v $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill ${FP8_MOE_PREFILL:-1024,8192} \
          --batch "" --repeats 3 --markdown "$OUT/fp8_moe_prefill_$v.md" > "$OUT/fp8_moe_prefill_$v.log" 2>&1
        summary+=("fp8_moe 20b prefill grouped=$v rc=$?")
        echo "20b --fp8 prefill, grouped FP8 experts $v:"; grep -E "^\| [0-9]+ \|" "$OUT/fp8_moe_prefill_$v.md"
      done
      ;;
    grouped_ab)
      # Session 8's compiled-only grouped MoE variants: their tests first (under a timeout: a hang
      # would show here), then the persistent moe_fp8 against the one-CTA-an-item kernel
      # (GPTOSS_MOE_FP8_PERSISTENT) and the grouped bf16 kernels against per-expert cuBLAS on 20b
      # without --fp8 (GPTOSS_MOE_BF16_GROUPED).
      timeout 240 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaMoeFp8.*:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts' \
        > "$OUT/grouped_ab_tests.log" 2>&1
      summary+=("grouped_ab tests rc=$?")
      grep -E "moe_fp8|moe_bf16|real widths|OK \]|FAILED" "$OUT/grouped_ab_tests.log" | head -40
      for v in 0 1; do
        GPTOSS_MOE_FP8_PERSISTENT=$v timeout 120 $BIN/moe_bench --fp8 1024 8192 > "$OUT/grouped_ab_fp8_$v.log" 2>&1
        summary+=("grouped_ab moe_bench --fp8 persistent=$v rc=$?")
        echo "moe_fp8 persistent $v:"; grep -E "^\| [0-9]+ \|" "$OUT/grouped_ab_fp8_$v.log"
      done
      for v in 0 1; do
        GPTOSS_MOE_BF16_GROUPED=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --prefill 1024,8192 --batch "" \
          --repeats 3 --markdown "$OUT/grouped_ab_bf16_$v.md" > "$OUT/grouped_ab_bf16_$v.log" 2>&1
        summary+=("grouped_ab 20b bf16 prefill grouped=$v rc=$?")
        echo "20b bf16 prefill, grouped bf16 experts $v:"; grep -E "^\| [0-9]+ \|" "$OUT/grouped_ab_bf16_$v.md"
      done
      ;;
    attn_wgmma)
      # The warpgroup prefill attention (PagedAttentionArgs::prefill_wgmma): the attention tests
      # (prefill cases run both kernels), attention_bench prefill with and without it
      # (GPTOSS_ATTN_PREFILL_WGMMA), then 20b --fp8 prefill with and without.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.Prefill*:PagedAttentionCuda.Fp8KvCache' \
        > "$OUT/attn_wgmma_tests.log" 2>&1
      summary+=("attn_wgmma tests rc=$?")
      grep -E "FAIL|OK \]" "$OUT/attn_wgmma_tests.log" | head -20
      grep -E "prefill wgmma" "$OUT/attn_wgmma_tests.log" | head -6
      for v in 0 1; do
        GPTOSS_ATTN_PREFILL_WGMMA=$v timeout 120 $BIN/attention_bench prefill > "$OUT/attn_wgmma_bench_$v.log" 2>&1
        summary+=("attn_wgmma attention_bench prefill wgmma=$v rc=$?")
        echo "attention_bench prefill, wgmma $v:"; grep "prefill T" "$OUT/attn_wgmma_bench_$v.log"
      done
      for v in 0 1; do
        GPTOSS_ATTN_PREFILL_WGMMA=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill 1024,8192 \
          --batch "" --repeats 3 --markdown "$OUT/attn_wgmma_20b_$v.md" > "$OUT/attn_wgmma_20b_$v.log" 2>&1
        summary+=("attn_wgmma 20b --fp8 prefill wgmma=$v rc=$?")
        echo "20b --fp8 prefill, wgmma attention $v:"; grep -E "^\| [0-9]+ \|" "$OUT/attn_wgmma_20b_$v.md"
      done
      ;;
    router_ab)
      # The router logits on the tensor cores (GPTOSS_ROUTER_MMA=1, RouterTopkArgs::tensor_cores)
      # against the fp32 tiled kernel: CudaOps.RouterTopk first (it runs both), then prefill profiles
      # of 20b and 120b --fp8 at 8k with each (the A/B only if the test passes).
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.RouterTopk' > "$OUT/router_ab_tests.log" 2>&1
      rc=$?
      summary+=("router_ab tests rc=$rc")
      grep -E "tensor cores|OK \]|FAILED" "$OUT/router_ab_tests.log" | head -12
      if [ $rc = 0 ]; then
        for m in gpt-oss-20b gpt-oss-120b; do
          for v in 0 1; do
            GPTOSS_ROUTER_MMA=$v GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 \
              --batch "" --repeats 3 > "$OUT/router_ab_${m}_$v.log" 2>&1
            summary+=("router_ab $m mma=$v rc=$?")
            echo "$m --fp8 8k prefill, router on tensor cores $v:"
            if [ $v = 0 ]; then  # the whole profile once a model: where its 8k prefill goes
              grep -E "^\| [0-9]+ \|" "$OUT/router_ab_${m}_$v.log" | head -2; grep -A16 GPTOSS_PROFILE "$OUT/router_ab_${m}_$v.log"
            else
              grep -E "^\| [0-9]+ \||  router|  moe |  total" "$OUT/router_ab_${m}_$v.log" | head -5
            fi
          done
        done
      fi
      ;;
    jit_ab)
      # gpt-oss-120b --fp8 prefill with each layer's experts converted to FP8 into a scratch
      # (quantize_weight_fp8_mxfp4, then moe_fp8) against the MXFP4 warpgroup kernels
      # (GPTOSS_MOE_FP8_JIT=0); the conversion's and the model's tests first.
      timeout 200 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaFp8Gemm.Mxfp4LayerConversionMatchesLoadPath:CudaModel.Fp8WeightsStayCloseToFp32' \
        > "$OUT/jit_ab_tests.log" 2>&1
      summary+=("jit_ab tests rc=$?")
      grep -E "mxfp4 -> fp8|fp8 \(|converted|OK \]|FAILED" "$OUT/jit_ab_tests.log" | head -20
      for v in 0 1; do
        GPTOSS_MOE_FP8_JIT=$v timeout 240 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 \
          --prefill ${JIT_PREFILL:-4096,8192,16384} --batch "" --repeats 2 \
          --markdown "$OUT/jit_ab_120b_$v.md" > "$OUT/jit_ab_120b_$v.log" 2>&1
        summary+=("jit_ab 120b --fp8 prefill jit=$v rc=$?")
        echo "120b --fp8 prefill, experts converted a layer at a time $v:"; grep -E "^\| [0-9]+ \|" "$OUT/jit_ab_120b_$v.md"
      done
      ;;
    gemv_bench)
      # The decode GEMVs alone (lm_head, QKV, O shapes; FP8 and bf16 weights; 1, 4, 8 tokens).
      $BIN/gemv_bench ${GEMV_TOKENS:-1 2 4 8} > "$OUT/gemv_bench.log" 2>&1
      summary+=("gemv_bench rc=$?")
      cat "$OUT/gemv_bench.log"
      ;;
    ncu_gemv)
      # Sections of one GEMV launch from gemv_bench (NCU_GEMV_SKIP launches skipped: 0 is the first
      # FP8 lm_head launch at 1 token) — why the decode GEMVs stop at ~1.8 TB/s (r21).
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      timeout ${NCU_TIMEOUT:-240} $NCU --clock-control none --cache-control none --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        -k regex:${NCU_GEMV_KERNEL:-gemv_} --launch-skip ${NCU_GEMV_SKIP:-0} -c 1 $BIN/gemv_bench 1 > "$OUT/ncu_gemv.txt" 2>&1
      summary+=("ncu_gemv rc=$?")
      grep -E 'gemv_|Duration|Throughput|Stall|Issued|Eligible|Active Warps|No Eligible|Registers|Waves|Executed Ipc' \
        "$OUT/ncu_gemv.txt" | head -40
      ;;
    ncu_moe)
      # Instruction mix and stall reasons of the grouped MoE kernels at a decode-sized batch
      # (NCU_MOE_MODE, NCU_MOE_BATCH: moe_bench arguments; gate_up then down).
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      $NCU --clock-control none --cache-control none --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis \
        --metrics smsp__sass_inst_executed.sum,dram__bytes_read.sum,smsp__inst_executed_op_shared_ld.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
        -k regex:${NCU_MOE_KERNEL:-moe_mma_kernel} -c 2 $BIN/moe_bench ${NCU_MOE_MODE:---mma} ${NCU_MOE_BATCH:-64} \
        > "$OUT/ncu_moe.txt" 2>&1
      summary+=("ncu_moe rc=$?")
      grep -E 'moe_|Duration|Throughput|Issued|Eligible|Active Warps|No Eligible|Registers|inst_executed|dram__bytes|Executed Ipc' \
        "$OUT/ncu_moe.txt" | head -40
      # Stall reasons (warps stalled per issued instruction), the largest first, per kernel.
      awk '/moe_/{print; next} /issue_stalled/ && $NF+0 > 0.05 {print "   ", $1, $NF}' "$OUT/ncu_moe.txt" | head -40
      ;;
    ncu_step)
      # Kernel durations of decode steps of any model and batch (NCU_STEP_ARGS: bench model/batch
      # flags; default 120b, 256 sequences, 1k context); the first NCU_STEP_SKIP kernels (warm-up)
      # are skipped and the next NCU_STEP_COUNT profiled, then summed by kernel name.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --kernel-name 'regex:^(?!.*(weight_quant|mxfp4_to_bf16|fill_random|pad_fp8|fp8_block_to|fill_kv|init_)).*' \
        --launch-skip ${NCU_STEP_SKIP:-0} --launch-count ${NCU_STEP_COUNT:-1200} $BIN/gptoss bench \
        ${NCU_STEP_ARGS:---synthetic gpt-oss-120b --batch 256} --prefill "" --context 1024 --decode-steps 2 --repeats 1 \
        > "$OUT/ncu_step.csv" 2> "$OUT/ncu_step.err"
      summary+=("ncu_step rc=$?")
      tail -2 "$OUT/ncu_step.err"
      python3 tools/ncu_kernel_times.py "$OUT/ncu_step.csv" --steps ${NCU_STEP_STEPS:-0} | tee "$OUT/ncu_step_summary.md"
      ;;
    mma_v4_ab)
      # moe_mma's 16-row tiles: the shared-memory kernel (GPTOSS_MOE_MMA_V4=0) against the
      # register-weights kernel (2; 3: built for 3 CTAs an SM) and its variant with the weights
      # landing in shared memory (5): moe_bench, then 120b decode. MMA_V4_MODES picks.
      for v in ${MMA_V4_MODES:-0 2 5}; do
        echo "GPTOSS_MOE_MMA_V4=$v:"
        GPTOSS_MOE_MMA_V4=$v $BIN/moe_bench --mma ${MMA_V4_BATCHES:-16 64 128 256} > "$OUT/mma_v4_$v.log" 2>&1
        summary+=("mma_v4_ab moe_bench $v rc=$?")
        grep -E "^\| [0-9]+ \|" "$OUT/mma_v4_$v.log"
      done
      for v in ${MMA_V4_MODEL_MODES:-2 5}; do
        GPTOSS_MOE_MMA_V4=$v $BIN/gptoss bench --synthetic gpt-oss-120b --prefill "" --batch ${MMA_V4_BATCH120:-64,256} \
          --context 1024 --decode-steps 8 --markdown "$OUT/mma_v4_120b_$v.md" > "$OUT/mma_v4_120b_$v.log" 2>&1
        summary+=("mma_v4_ab 120b $v rc=$?")
        echo "120b GPTOSS_MOE_MMA_V4=$v:"; grep -E "^\| 1024 \|" "$OUT/mma_v4_120b_$v.md"
      done
      ;;
    profile120)
      # Device time per stage of 120b decode steps at PROFILE120_BATCH (CUDA events, no graphs).
      GPTOSS_PROFILE=1 $BIN/gptoss bench --synthetic gpt-oss-120b --prefill "" --batch ${PROFILE120_BATCH:-256} \
        --context 1024 --decode-steps 4 > "$OUT/profile120.log" 2>&1
      summary+=("profile120 rc=$?")
      grep -A24 GPTOSS_PROFILE "$OUT/profile120.log" | head -28
      ;;
    decode_ab)
      # Decode batches through moe_mma (default) and through the warp-specialized wgmma kernels with
      # 16/32-row tiles (GPTOSS_MOE_MMA_MAX_TOKENS=4 sends batches past the weight-only kernels to
      # them), 20b then 120b.
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      for v in mma ws; do
        envs=""; [ $v = ws ] && envs="GPTOSS_MOE_MMA_MAX_TOKENS=4 GPTOSS_MOE_WGMMA=1 GPTOSS_MOE_WGMMA_WS=1"
        env $envs $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --prefill "" --batch ${DECODE_AB_BATCH:-16,64,128} \
          --context 1024 --decode-steps 16 --markdown "$OUT/decode_ab_20b_$v.md" > "$OUT/decode_ab_20b_$v.log" 2>&1
        summary+=("decode_ab 20b $v rc=$?")
        echo "20b $v:"; grep -E "^\| 1024 \|" "$OUT/decode_ab_20b_$v.md"
        env $envs $BIN/gptoss bench --synthetic gpt-oss-120b --prefill "" --batch ${DECODE_AB_BATCH120:-64,256} \
          --context 1024 --decode-steps 8 --markdown "$OUT/decode_ab_120b_$v.md" > "$OUT/decode_ab_120b_$v.log" 2>&1
        summary+=("decode_ab 120b $v rc=$?")
        echo "120b $v:"; grep -E "^\| 1024 \|" "$OUT/decode_ab_120b_$v.md"
      done
      ;;
    prefill_ab)
      # Prefill with and without the warpgroup MoE kernels (GPTOSS_MOE_WGMMA), 20b then 120b.
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      for wg in 1 0; do
        GPTOSS_MOE_WGMMA=$wg $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --prefill ${PREFILL_AB_LENS:-1024,8192} --batch "" \
          --repeats 3 ${PREFILL_AB_ARGS:-} --markdown "$OUT/prefill_ab_20b_$wg.md" > "$OUT/prefill_ab_20b_$wg.log" 2>&1
        summary+=("prefill_ab 20b wgmma=$wg rc=$?")
        echo "20b wgmma=$wg:"; grep -E "^\| [0-9]+ \|" "$OUT/prefill_ab_20b_$wg.md"
      done
      if [ "${PREFILL_AB_120B:-1}" != 0 ]; then
        for wg in 1 0; do
          GPTOSS_MOE_WGMMA=$wg $BIN/gptoss bench --synthetic gpt-oss-120b --prefill ${PREFILL_AB_LENS:-1024,8192} --batch "" \
            --repeats 2 ${PREFILL_AB_ARGS:-} --markdown "$OUT/prefill_ab_120b_$wg.md" > "$OUT/prefill_ab_120b_$wg.log" 2>&1
          summary+=("prefill_ab 120b wgmma=$wg rc=$?")
          echo "120b wgmma=$wg:"; grep -E "^\| [0-9]+ \|" "$OUT/prefill_ab_120b_$wg.md"
        done
      fi
      ;;
    peer)
      # Hugging Face transformers on the same random 20b checkpoint (the peer the tables compare with).
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
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
    mx)
      # moe_mxfp4_fp8 (the grouped MoE on the MXFP4 experts as they are; default since r28, A/B
      # against GPTOSS_MOE_MX=0, the per-layer FP8 conversion): 120b only (20b holds an FP8 expert copy).
      switch_prefill_ab mx GPTOSS_MOE_MX 'CudaMoeMx.*:CudaMoeFp8.*:CudaModel.Fp8WeightsStayCloseToFp32' 'moe' \
        "gpt-oss-120b"
      ;;
    norm_quant)
      # The pre-attention norm writing the QKV GEMM's quantized rows itself (default since r28; A/B
      # against GPTOSS_NORM_QUANT=0).
      switch_prefill_ab norm_quant GPTOSS_NORM_QUANT 'CudaOps.ResidualRmsNorm*:CudaFp8Gemm.ActivationQuantizerMatchesCpuBitExactly' \
        'qkv_gemm|norm' "gpt-oss-20b gpt-oss-120b"
      ;;
    fp8_experts)
      # The experts kept only as the FP8 copy (--fp8-experts, CudaModelOptions::fp8_experts; session
      # 14, compiled only): the FP8 model test (its variant 7), then both models --fp8 with and
      # without it: 8k prefill and decode batch 1-8 at 1k context.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.Fp8*' > "$OUT/fp8_experts_tests.log" 2>&1
      rc=$?
      summary+=("fp8_experts tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|experts only" "$OUT/fp8_experts_tests.log" | head -20
      if [ $rc = 0 ]; then
        for m in gpt-oss-20b gpt-oss-120b; do
          for x in "" --fp8-experts; do
            timeout 240 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 1024,8192 --batch 1,2,4,8 --context 1024 \
              --decode-steps 16 --repeats 3 --markdown "$OUT/fp8_experts_${m}${x:+_on}.md" > "$OUT/fp8_experts_${m}${x:+_on}.log" 2>&1
            summary+=("fp8_experts $m [${x:-default}] rc=$?")
            echo "$m --fp8 ${x}:"; grep -E "^\| [0-9]+ \|" "$OUT/fp8_experts_${m}${x:+_on}.md"
          done
        done
      fi
      ;;
    narrow_tail)
      # Partial tiles on narrower wgmmas (MoeFp8Args::narrow_tail, default since r30; A/B against
      # GPTOSS_MOE_NARROW_TAIL=0): the bit-identity and CPU tests of both grouped kernels, then 8k
      # prefill with it and without: 20b --fp8, 120b --fp8 (MX kernel), 120b --fp8 --fp8-experts.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaMoeFp8.*:CudaMoeMx.*' > "$OUT/narrow_tail_tests.log" 2>&1
      rc=$?
      summary+=("narrow_tail tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|narrow tails" "$OUT/narrow_tail_tests.log" | head -60
      if [ $rc = 0 ]; then
        for cfg in "gpt-oss-20b" "gpt-oss-120b" "gpt-oss-120b --fp8-experts"; do
          tag=$(echo "$cfg" | tr -d ' -' | sed 's/gptoss//')
          for v in 1 0; do
            GPTOSS_MOE_NARROW_TAIL=$v GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $cfg --fp8 --prefill 8192 \
              --batch "" --repeats 3 > "$OUT/narrow_tail_${tag}_$v.log" 2>&1
            summary+=("narrow_tail [$cfg] NARROW_TAIL=$v rc=$?")
            echo "$cfg --fp8 8k prefill, GPTOSS_MOE_NARROW_TAIL=$v:"; grep -E "^\| [0-9]+ \||  (moe|attention|total) " "$OUT/narrow_tail_${tag}_$v.log" | head -8
          done
        done
      fi
      ;;
    mx_decode)
      # The MX kernels (moe_mxfp4_fp8) at decode batches: 8- and 16-token-wide wgmmas for an
      # expert's few rows (GPTOSS_MOE_NARROW_TAIL=8; session 15, compiled only), chosen at every
      # batch size by GPTOSS_MOE_FP8_JIT_MIN_TOKENS=1. The narrow-tail tests (all six widths) and the FP8 model
      # test (its variant 7: decode steps on the MX kernels), then, if they pass, decode at 1k
      # context with it (1) and without (0): 120b --fp8, and 20b --fp8 without its FP8 expert copy
      # (GPTOSS_FP8_EXPERT_COPY=0, the MXFP4 paths 120b takes).
      timeout 240 $BIN/cuda_kernel_tests --gtest_filter='CudaMoeFp8.NarrowTails*:CudaMoeMx.NarrowTails*:CudaModel.Fp8*' \
        > "$OUT/mx_decode_tests.log" 2>&1
      rc=$?
      # the model test again with 8- and 16-wide tails (its variant 7's decode steps)
      GPTOSS_MOE_NARROW_TAIL=8 timeout 120 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.Fp8*' >> "$OUT/mx_decode_tests.log" 2>&1
      r2=$?; [ $rc = 0 ] && rc=$r2  # (before r31: `&& rc=$?` took the test's status, dropping this run's)
      summary+=("mx_decode tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|narrow tails|every batch" "$OUT/mx_decode_tests.log" | head -30
      if [ $rc = 0 ]; then
        for m in gpt-oss-120b gpt-oss-20b; do
          for v in ${MX_DECODE_VS:-8 32 0}; do  # MX at every batch with tails down to 8 tokens, down to 32; the default paths
            env GPTOSS_FP8_EXPERT_COPY=0 $( [ $v != 0 ] && echo GPTOSS_MOE_FP8_JIT_MIN_TOKENS=1 GPTOSS_MOE_NARROW_TAIL=$v ) \
              timeout 200 $BIN/gptoss bench \
              --synthetic $m --fp8 --prefill "" --batch ${MX_DECODE_BATCHES:-1,2,4,8,16,64} --context 1024 --decode-steps 16 --repeats 3 \
              --markdown "$OUT/mx_decode_${m}_$v.md" > "$OUT/mx_decode_${m}_$v.log" 2>&1
            summary+=("mx_decode $m MX at decode=$v rc=$?")
            echo "$m --fp8 decode, MX kernels at every batch (narrowest tile $v; 0: default paths):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/mx_decode_${m}_$v.md"
          done
        done
      fi
      ;;
    ncu_moe_decode)
      # Where the batch-1 decode MoE's time goes: ncu sections (speed of light, scheduler, warp
      # states, instruction mix, pipes) of two launches (gate_up, down) of the decode MoE kernels
      # in 20b --fp8 batch-1 steps, for each GPTOSS_MOE_DECODE value in NCU_MOE_DECODE_VS (default 1:
      # moe_decode_mma). r31: ~200 s a value (the replays back up device memory); a third launch
      # failed to profile, so two.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for v in ${NCU_MOE_DECODE_VS:-1}; do
        GPTOSS_MOE_DECODE=$v timeout 200 $NCU --clock-control none --cache-control none --section SpeedOfLight \
          --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
          --metrics sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,smsp__sass_inst_executed.sum,sm__cycles_elapsed.avg.per_second,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
          -k regex:moe_decode -c 2 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --batch 1 --prefill "" \
          --context 1024 --decode-steps 2 --repeats 1 > "$OUT/ncu_moe_decode_$v.txt" 2>&1
        summary+=("ncu_moe_decode $v rc=$?")
        grep -E '  moe_decode|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Issued Ipc|Executed Ipc A|Eligible Warps|No Eligible|Active Warps Per|pipe_|dram__bytes|sass_inst|per_second|Warp Cycles Per Issued' \
          "$OUT/ncu_moe_decode_$v.txt" | head -60
        awk '/moe_decode/{print; next} /issue_stalled/ && $NF+0 > 0.1 {print "   ", $1, $NF}' "$OUT/ncu_moe_decode_$v.txt" | head -40
      done
      ;;
    ncu_sass)
      # Where a decode MoE kernel's instructions go, by SASS line: ncu's source counters (executed
      # instructions and stall samples a line) of the first gate_up launch in 20b --fp8 batch-1
      # steps, for each "GPTOSS_MOE_DECODE value:kernel regex" in NCU_SASS_VS (default
      # moe_decode_mma and moe_decode_wg), exported as csv; then the static SASS of the
      # moe_decode kernels (cuobjdump, if the host has it).
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for vk in ${NCU_SASS_VS:-1:moe_decode_mma_kernel 4:moe_decode_wg_kernel}; do
        v=${vk%%:*}; k=${vk#*:}
        GPTOSS_MOE_DECODE=$v timeout 200 $NCU --clock-control none \
          --cache-control none --section SourceCounters --section InstructionStats --section WarpStateStats \
          --section SpeedOfLight --section SchedulerStats -k regex:$k -c 1 -f -o "$WORK/ncu_sass_$v" \
          $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --batch 1 --prefill "" --context 1024 --decode-steps 2 \
          --repeats 1 > "$OUT/ncu_sass_$v.log" 2>&1
        summary+=("ncu_sass $v rc=$?")
        $NCU -i "$WORK/ncu_sass_$v.ncu-rep" --page details > "$OUT/ncu_sass_${v}_details.txt" 2>&1
        $NCU -i "$WORK/ncu_sass_$v.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass_${v}_source.csv" 2>&1
        summary+=("ncu_sass $v source rc=$? lines=$(wc -l < "$OUT/ncu_sass_${v}_source.csv")")
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Active Warps Per|Warp Cycles Per Issued" \
          "$OUT/ncu_sass_${v}_details.txt" | head -12
      done
      CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      [ -n "$CUOBJ" ] && $CUOBJ -sass $BIN/moe_bench 2>/dev/null | awk '/Function :/{p = /moe_decode/} p' > "$OUT/moe_decode_sass.txt"
      summary+=("cuobjdump lines=$(wc -l < "$OUT/moe_decode_sass.txt" 2>/dev/null)")
      ;;
    s20)
      # Ran once, at 41801be (r35 call 1); the switch it measures was removed after it (no gain on
      # sliding layers; bench/NOTES.md r35), so at later revisions its CTAS runs equal the default.
      # Session 20: the sliding layers' prompt attention as 2 CTAs an SM, each looping over query
      # tiles with the next tile's K/V and Q loading under the current one
      # (PagedAttentionArgs::prefill_ctas_per_sm; GPTOSS_ATTN_PREFILL_CTAS=n: n an SM on every
      # layer, 0: a CTA a query tile). The attention tests (the looping CTAs bit-identical in the
      # three TMA kernels, with q and with q_raw), the model and engine tests; attention_bench
      # prefill with the default and CTAS 0 / 1 / 3; 8k --fp8 prefill 20b default / CTAS=0 twice,
      # 120b default / CTAS=0 (GPTOSS_PROFILE stages).
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='PagedAttentionCuda.Prefill*:PagedAttentionCuda.Fp8KvCache:AttentionHarness.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s20_tests.log" 2>&1
      rc=$?
      summary+=("s20 tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s20_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|looping" "$OUT/s20_tests.log" | head -20
      if [ $rc = 0 ]; then
        for v in default 0 1 3; do
          if [ $v = default ]; then e=; else e=GPTOSS_ATTN_PREFILL_CTAS=$v; fi
          env $e timeout 120 $BIN/attention_bench prefill > "$OUT/s20_attn_ctas_$v.log" 2>&1
          echo "attention_bench CTAS=$v:"; grep -E "prefill T=" "$OUT/s20_attn_ctas_$v.log"
        done
        for cfg in gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_PREFILL_CTAS=0 gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_PREFILL_CTAS=0 \
            gpt-oss-120b: gpt-oss-120b:GPTOSS_ATTN_PREFILL_CTAS=0; do
          m=${cfg%%:*}; e=${cfg#*:}; tag="${m}_${e:-default}"
          env $e GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
            --repeats 3 >> "$OUT/s20_$tag.log" 2>&1
          summary+=("s20 $tag rc=$?")
          echo "$tag:"; grep -E "^\| [0-9]+ \||  (attention|rope_kv|total) " "$OUT/s20_$tag.log" | tail -4
        done
      fi
      ;;
    s20b)
      # Ran once, at 74421b8 (r35 call 4); GPTOSS_NORM_BLOCKS was removed after it (3 CTAs an SM
      # lost), so at later revisions its runs equal the default.
      # Session 20: the k/v-only RoPE kernel with each thread's row loads before its cos / sin
      # barrier (GPTOSS_ROPE_KV_FIRST, default on) and the wide norm kernel sized for 3 CTAs an SM
      # (85 registers, no spill; GPTOSS_NORM_BLOCKS=4: the former 64-register form). Tests (RoPE
      # bit-identity with and without q, e4m3 caches; the norm tests; model, engine), then 8k --fp8
      # prefill with GPTOSS_PROFILE: 20b default / ROPE_KV_FIRST=0 / NORM_BLOCKS=4 twice, 120b
      # default / both off.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.QkvBiasRopeKvWrite:CudaOps.ResidualRmsNorm*:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s20b_tests.log" 2>&1
      rc=$?
      summary+=("s20b tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s20b_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/s20b_tests.log" | head -20
      if [ $rc = 0 ]; then
        for cfg in gpt-oss-20b: gpt-oss-20b:GPTOSS_ROPE_KV_FIRST=0 gpt-oss-20b:GPTOSS_NORM_BLOCKS=4 \
            gpt-oss-20b: gpt-oss-20b:GPTOSS_ROPE_KV_FIRST=0 gpt-oss-20b:GPTOSS_NORM_BLOCKS=4 \
            gpt-oss-120b: "gpt-oss-120b:GPTOSS_ROPE_KV_FIRST=0 GPTOSS_NORM_BLOCKS=4"; do
          m=${cfg%%:*}; e=${cfg#*:}; tag="${m}_${e:-default}"; tag=${tag// /_}
          env $e GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
            --repeats 3 >> "$OUT/s20b_$tag.log" 2>&1
          summary+=("s20b $tag rc=$?")
          echo "$tag:"; grep -E "^\| [0-9]+ \||  (norm|rope_kv|total) " "$OUT/s20b_$tag.log" | tail -4
        done
      fi
      ;;
    s21)
      # Session 21: (a) the FP8 scales from the amax's bits (r35 item 8) in the attention's out_q
      # epilogue, the norm's quantized rows and the activation quantizer; (b) the RoPE (cos, sin)
      # table once a forward (GPTOSS_ROPE_TABLE, default on: rope_kv and the q_raw query tiles copy
      # it); (c) the decode GEMVs' weights asked of L2 a kernel ahead (GPTOSS_DECODE_L2_PREFETCH
      # 0-3, default 0). Tests (the model and engine ones also with each prefetch mode), then
      # attention_bench prefill (table 1 / 0, and the previous revision's binary in .device_ab if
      # present), 8k --fp8 prefill 20b default / TABLE=0 twice, 120b once each, decode 20b b1,4 at
      # 1k per prefetch mode, 120b b1 modes 0 / 1 / 3.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='PagedAttentionCuda.Prefill*:CudaOps.QkvBiasRopeKvWrite:CudaOps.ResidualRmsNorm*:CudaFp8Gemm*:CudaFp8Gemv.*:CudaQkvFused.*:CudaOps.MoeMxfp4MatchesCpu:CudaModel.*:CudaEngine.*' \
        > "$OUT/s21_tests.log" 2>&1
      rc=$?
      summary+=("s21 tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s21_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/s21_tests.log" | head -20
      for v in 1 2 3; do
        GPTOSS_DECODE_L2_PREFETCH=$v timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
          > "$OUT/s21_tests_prefetch$v.log" 2>&1
        summary+=("s21 tests prefetch=$v rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s21_tests_prefetch$v.log" | tr '\n' ' ')")
      done
      if [ $rc = 0 ]; then
        for i in 1 2; do
          for v in 1 0; do
            GPTOSS_ROPE_TABLE=$v timeout 60 $BIN/attention_bench prefill >> "$OUT/s21_attn_table$v.log" 2>&1
          done
          [ -x .device_ab/attention_bench_old ] && timeout 60 .device_ab/attention_bench_old prefill >> "$OUT/s21_attn_old.log" 2>&1
        done
        for f in "$OUT"/s21_attn_*.log; do echo "$(basename $f):"; grep -E "prefill T=(8192|32768)" "$f"; done
        for cfg in gpt-oss-20b: gpt-oss-20b:GPTOSS_ROPE_TABLE=0 gpt-oss-20b: gpt-oss-20b:GPTOSS_ROPE_TABLE=0 \
            gpt-oss-120b: gpt-oss-120b:GPTOSS_ROPE_TABLE=0; do
          m=${cfg%%:*}; e=${cfg#*:}; tag="${m}_${e:-default}"
          env $e GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
            --repeats 3 >> "$OUT/s21_$tag.log" 2>&1
          summary+=("s21 $tag rc=$?")
          echo "$tag:"; grep -E "^\| [0-9]+ \||  (attention|rope_kv|norm|qkv_gemm|o_gemm|total) " "$OUT/s21_$tag.log" | tail -7
        done
      fi
      ;;
    s21b)
      # Session 21 after s21: the k/v RoPE back to its own sincosf (its table form was slower) and the
      # L2 prefetch removed; the attention's table and the scales from bits kept. Tests, then 8k --fp8
      # prefill 20b default three times and TABLE=0 once, 120b default once.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='PagedAttentionCuda.Prefill*:CudaOps.QkvBiasRopeKvWrite:CudaModel.*:CudaEngine.*' \
        > "$OUT/s21b_tests.log" 2>&1
      rc=$?
      summary+=("s21b tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s21b_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/s21b_tests.log" | head -20
      if [ $rc = 0 ]; then
        for cfg in gpt-oss-20b: gpt-oss-20b:GPTOSS_ROPE_TABLE=0 gpt-oss-20b: gpt-oss-20b: gpt-oss-120b:; do
          m=${cfg%%:*}; e=${cfg#*:}; tag="${m}_${e:-default}"
          env $e GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
            --repeats 3 >> "$OUT/s21b_$tag.log" 2>&1
          summary+=("s21b $tag rc=$?")
          echo "$tag:"; grep -E "^\| [0-9]+ \||  (attention|rope_kv|norm|total) " "$OUT/s21b_$tag.log" | tail -5
        done
      fi
      ;;
    s21f)
      # Session 21's final figures at its last kernels: 8k --fp8 prefill 20b three times, 120b
      # once; batch-1 decode at 1k, 20b and 120b.
      for m in gpt-oss-20b gpt-oss-20b gpt-oss-20b gpt-oss-120b; do
        timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" --repeats 3 \
          >> "$OUT/s21f_prefill_$m.log" 2>&1
        summary+=("s21f prefill $m rc=$?")
        echo "$m:"; grep -E "prefill   8192" "$OUT/s21f_prefill_$m.log" | tail -1
      done
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
          --repeats 3 --markdown "$OUT/s21f_decode_$m.md" > "$OUT/s21f_decode_$m.log" 2>&1
        summary+=("s21f decode $m rc=$?")
        echo "$m decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s21f_decode_$m.md"
      done
      ;;
    s26c)
      # Ran once, at 8a6eda7 (r41 call 2: the model tests failed their bf16 bound with W4A8 decode, so
      # its A/B did not run; call 3 ran it by hand); moe_decode_wgk was removed after it, so at later
      # revisions GPTOSS_MOE_DECODE=6 is the default kernel.
      # Session 26: moe_decode_wgk, the W4A8 decode MoE with K split over a 4-CTA cluster
      # (GPTOSS_MOE_DECODE=6; 1 is moe_decode_mma, the default). Tests (its W4A8 bounds; model and
      # engine tests with it), moe_bench 1 / 6, then decode at 1k: 20b batch 1,2,8 twice each way,
      # 120b batch 1 once each way.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaMoeDecodeWgk.*:CudaMoeDecodeWg.MatchesCpuAtRealWidths' \
        > "$OUT/s26c_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_DECODE=6 timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        > "$OUT/s26c_tests_model.log" 2>&1
      rc2=$?
      summary+=("s26c tests rc=$rc model rc=$rc2")
      grep -E "OK \]|FAILED|Failure|moe_decode_wg" "$OUT/s26c_tests.log" "$OUT/s26c_tests_model.log" | head -40
      if [ $rc = 0 ] && [ $rc2 = 0 ]; then
        for v in 1 6; do
          GPTOSS_MOE_DECODE=$v timeout 60 $BIN/moe_bench 1 2 4 8 > "$OUT/s26c_moe_bench_$v.log" 2>&1
          echo "moe_bench MOE_DECODE=$v:"; grep "^|" "$OUT/s26c_moe_bench_$v.log" | tail -4
        done
        for i in 1 2; do
          for v in 1 6; do
            GPTOSS_MOE_DECODE=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,8 \
              --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s26c_20b_${v}_$i.log" 2>&1
            summary+=("s26c 20b $v $i rc=$?")
            echo "20b MOE_DECODE=$v ($i):"; grep -E "ms/step" "$OUT/s26c_20b_${v}_$i.log"
          done
        done
        for v in 1 6; do
          GPTOSS_MOE_DECODE=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
            --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s26c_120b_$v.log" 2>&1
          summary+=("s26c 120b $v rc=$?")
          echo "120b MOE_DECODE=$v:"; grep -E "ms/step" "$OUT/s26c_120b_$v.log"
        done
      fi
      ;;
    s26b)
      # Session 26's closing figures at the call's defaults: the batch-1 decode step kernel by kernel
      # (20b, CUPTI trace), decode batch 1 at 1k (20b, 120b), 8k --fp8 prefill (20b twice, 120b).
      GPTOSS_KERNEL_TRACE="$OUT/s26b_ktrace_20b.csv" timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
        --prefill "" --batch 1 --context 1024 --decode-steps 8 --repeats 1 > "$OUT/s26b_ktrace_20b.log" 2>&1
      summary+=("s26b ktrace rc=$?")
      python3 tools/ktrace_summary.py "$OUT/s26b_ktrace_20b.csv" | head -20
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
          --repeats 3 --markdown "$OUT/s26b_decode_$m.md" > "$OUT/s26b_decode_$m.log" 2>&1
        summary+=("s26b decode $m rc=$?")
        echo "$m decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s26b_decode_$m.md"
      done
      for m in gpt-oss-20b gpt-oss-20b gpt-oss-120b; do
        timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" --repeats 3 \
          >> "$OUT/s26b_prefill_$m.log" 2>&1
        summary+=("s26b prefill $m rc=$?")
        echo "$m:"; grep -E "prefill   8192" "$OUT/s26b_prefill_$m.log" | tail -1
      done
      ;;
    s26a)
      # Ran once, at 463ed9b (r41 call 1); both switches were removed after it (0ec3d19 has them), so
      # at later revisions every configuration is the default.
      # Session 26: gate_up and down of the decode MoE in one launch (moe_decode_pair; GPTOSS_MOE_PAIR
      # 0 two launches, 1 default, 2 with 4 CTAs an SM at 1-2 tokens) and the decode attention's KV
      # tiles requested before pdl_wait (GPTOSS_ATTN_EARLY_KV, default on). Tests (the pair against the
      # two launches bit for bit; attention; model and engine, also with PAIR=2), moe_bench per pair
      # mode, then decode at 1k: 20b batch 1,2,4,8 and 120b batch 1, each configuration twice. The
      # sampling kernels launch with PDL now (all configurations).
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.Sampling*:CudaOps.MoeDecodePair*:CudaOps.MoeMxfp4*:CudaOps.MoeDecodeMma*:PagedAttentionCuda.*:CudaDecodeFusion.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s26a_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_PAIR=2 timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        > "$OUT/s26a_tests_pair2.log" 2>&1
      rc2=$?
      summary+=("s26a tests rc=$rc pair2 rc=$rc2")
      grep -E "OK \]|FAILED|Failure" "$OUT/s26a_tests.log" "$OUT/s26a_tests_pair2.log" | head -60
      if [ $rc = 0 ] && [ $rc2 = 0 ]; then
        for v in 0 1 2; do
          GPTOSS_MOE_PAIR=$v timeout 60 $BIN/moe_bench 1 2 4 8 > "$OUT/s26a_moe_bench_pair$v.log" 2>&1
          echo "moe_bench pair=$v:"; grep "^|" "$OUT/s26a_moe_bench_pair$v.log" | tail -4
        done
        for i in 1 2; do
          for cfg in "GPTOSS_MOE_PAIR=0 GPTOSS_ATTN_EARLY_KV=0" "GPTOSS_MOE_PAIR=0" "GPTOSS_ATTN_EARLY_KV=0" \
              "GPTOSS_MOE_PAIR=1" "GPTOSS_MOE_PAIR=2"; do
            tag=${cfg// /_}
            env $cfg timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,8 \
              --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s26a_20b_${tag}_$i.log" 2>&1
            summary+=("s26a 20b $tag $i rc=$?")
            echo "20b $cfg ($i):"; grep -E "ms/step" "$OUT/s26a_20b_${tag}_$i.log"
          done
          [ $i = 2 ] && break  # 120b once (the call's time)
          for cfg in "GPTOSS_MOE_PAIR=0 GPTOSS_ATTN_EARLY_KV=0" "GPTOSS_MOE_PAIR=1" "GPTOSS_MOE_PAIR=2"; do
            tag=${cfg// /_}
            env $cfg timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s26a_120b_${tag}_$i.log" 2>&1
            summary+=("s26a 120b $tag $i rc=$?")
            echo "120b $cfg ($i):"; grep -E "ms/step" "$OUT/s26a_120b_${tag}_$i.log"
          done
        done
      fi
      ;;
    s25d)
      # Session 25: the routing plan as a stable ballot counting sort, and PDL launches for topk, the
      # plan, the tile list and the row gather. Tests (the plan against a host sort; every kernel
      # test that routes through the plan; model and engine), then the 8k trace (s25b), 8k --fp8
      # prefill untraced (20b twice, 120b) and batch 1 / 64 decode (20b; topk at 64).
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.*:CudaMoeFp8.*:CudaMoeMx.*:CudaDecodeFusion.*:CudaMoeDecodeWg.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s25d_tests.log" 2>&1
      rc=$?
      summary+=("s25d tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s25d_tests.log" | head -60
      if [ $rc = 0 ]; then
        GPU_CHECK_TAR=0 bash "$0" s25b
        for m in gpt-oss-20b gpt-oss-20b gpt-oss-120b; do
          timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" --repeats 3 \
            >> "$OUT/s25d_prefill_$m.log" 2>&1
          summary+=("s25d prefill $m rc=$?")
          echo "$m:"; grep -E "prefill   8192" "$OUT/s25d_prefill_$m.log" | tail -1
        done
        timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,64 --context 1024 \
          --decode-steps 32 --repeats 3 > "$OUT/s25d_decode.log" 2>&1
        summary+=("s25d decode rc=$?")
        grep -E "ms/step" "$OUT/s25d_decode.log"
      fi
      ;;
    s25e)
      # Session 25: the routing plan in one 8-CTA cluster (from 4,096 assignments). The plan test, the
      # model and engine tests, then the 8k trace (s25b) and an 8k --fp8 20b prefill untraced.
      timeout 200 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoePlan*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s25e_tests.log" 2>&1
      rc=$?
      summary+=("s25e tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s25e_tests.log" | head -30
      if [ $rc = 0 ]; then
        GPU_CHECK_TAR=0 bash "$0" s25b
        for m in gpt-oss-20b; do
          timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" --repeats 3 \
            >> "$OUT/s25e_prefill_$m.log" 2>&1
          summary+=("s25e prefill $m rc=$?")
          echo "$m:"; grep -E "prefill   8192" "$OUT/s25e_prefill_$m.log" | tail -1
        done
      fi
      ;;
    s25c)
      # Session 25: the host's timeline of an 8k --fp8 prefill against the GPU's (GPTOSS_HOST_TIMING=1:
      # host time and event time between points of the launch sequence), untraced, 20b and 120b.
      for m in gpt-oss-20b gpt-oss-120b; do
        GPTOSS_HOST_TIMING=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
          --repeats 3 > "$OUT/s25c_$m.log" 2>&1
        summary+=("s25c $m rc=$?")
        grep -E "host timing \(8192|prefill   8192" "$OUT/s25c_$m.log" | tail -4
      done
      ;;
    s25b)
      # Session 25: one 8k --fp8 prefill kernel by kernel (CUPTI; GPTOSS_KERNEL_TRACE), 20b and 120b:
      # where the time goes inside the run and how much of it the GPU sits idle between kernels.
      for m in gpt-oss-20b gpt-oss-120b; do
        GPTOSS_KERNEL_TRACE="$OUT/s25b_$m.csv" timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 \
          --batch "" --repeats 2 > "$OUT/s25b_$m.log" 2>&1
        summary+=("s25b $m rc=$?")
        grep -E "kernel trace|prefill   8192" "$OUT/s25b_$m.log"
        python3 tools/ktrace_summary.py "$OUT/s25b_$m.csv" | head -60
      done
      ;;
    s25a)
      # Session 25: the host's share of a decode step. GPTOSS_STEP_EVENTS=1 times each sampled step
      # on the device (upload to the ids' copy back) beside the bench's wall step; 20b batch 1, 4
      # and 64, 120b batch 1, 1k context.
      for m in gpt-oss-20b gpt-oss-120b; do
        bs=1,4,64; [ $m = gpt-oss-120b ] && bs=1
        GPTOSS_STEP_EVENTS=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch "$bs" \
          --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s25a_$m.log" 2>&1
        summary+=("s25a $m rc=$?")
        grep -E "ms/step" "$OUT/s25a_$m.log"
      done
      ;;
    s27a)
      # Session 27: the decode step jumps from 3.22 ms at 4 sequences to 4.59 at 5 (r42 call 2; 8:
      # ~5.2): trace batches 4, 5 and 8 (20b --fp8, 1k context) kernel by kernel.
      for b in 4 5 8; do
        GPTOSS_KERNEL_TRACE="$OUT/ktrace_b$b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch $b --context 1024 --decode-steps 6 > "$OUT/ktrace_b$b.log" 2>&1
        summary+=("s27a ktrace b$b rc=$?")
        python3 tools/ktrace_summary.py "$OUT/ktrace_b$b.csv"
      done
      ;;
    s27b)
      # Session 27: s27a found the MoE switching from moe_decode_mma (≤ 4 rows, kMxfp4MmaCrossover)
      # to the grouped moe_mma_v4 at 5 rows, +54 µs a layer (20b). A/B of the crossover at 4 (the
      # default) and 8 (GPTOSS_MXFP4_MAX_TOKENS) on batches 3-8, 20b and 120b --fp8, 1k context.
      for m in gpt-oss-20b gpt-oss-120b; do
        for v in 4 8; do
          GPTOSS_MXFP4_MAX_TOKENS=$v timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" \
            --batch 3,4,5,6,7,8 --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s27b_${m}_$v.log" 2>&1
          summary+=("s27b $m crossover $v rc=$?")
          echo "$m, weight-only MoE up to $v rows:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s27b_${m}_$v.log"
        done
      done
      ;;
    s27c)
      # Session 27: the weight-only MoE up to 5 rows now (kMxfp4MmaCrossover, from s27b): the MoE
      # kernel tests, the model and engine tests, then decode batches 1, 4, 5, 6 of 20b and 120b.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeMxfp4*:CudaOps.MoeDecodeMma*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s27c_tests.log" 2>&1
      summary+=("s27c tests rc=$?")
      grep -E "^\[spec\]|OK \]|FAILED|Failure" "$OUT/s27c_tests.log" | head -20
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1,4,5,6 --context 1024 \
          --decode-steps 32 --repeats 3 > "$OUT/s27c_$m.log" 2>&1
        summary+=("s27c $m rc=$?")
        echo "$m:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s27c_$m.log"
      done
      ;;
    s27d)
      # Ran at 3ecdd3c (r42 call 6). Since then the switch is GPTOSS_GEMV_X_F32 (QKV and lm_head) and
      # the test CudaModel.Fp8GemvsOnBf16RowsAreTheSameBits: s27e.
      # Session 27: the CUDA engine tests (the speculative test's near-tie form), the lm_head GEMV on
      # the final norm's bf16 rows (same bits: its test), then its A/B in the same run
      # (GPTOSS_LM_HEAD_X_F32=1 the fp32 rows, as before) at batches 1, 4, 8 (20b) and 1 (120b).
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaEngine.*:CudaModel.Fp8LmHead*' > "$OUT/s27d_tests.log" 2>&1
      summary+=("s27d tests rc=$?")
      grep -E "^\[spec\]|OK \]|FAILED|Failure" "$OUT/s27d_tests.log" | head -20
      for pass in 1 2; do
        for v in 0 1; do
          GPTOSS_LM_HEAD_X_F32=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,4,8 \
            --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s27d_20b_${v}_$pass.log" 2>&1
          summary+=("s27d 20b x_f32=$v pass $pass rc=$?")
          echo "20b, lm_head x fp32=$v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s27d_20b_${v}_$pass.log"
        done
      done
      for v in 0 1; do
        GPTOSS_LM_HEAD_X_F32=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
          --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s27d_120b_$v.log" 2>&1
        summary+=("s27d 120b x_f32=$v rc=$?")
        echo "120b, lm_head x fp32=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s27d_120b_$v.log"
      done
      ;;
    s27e)
      # Session 27: the fused decode QKV GEMV on the norm's bf16 rows too (same bits; one switch
      # for both GEMVs now, GPTOSS_GEMV_X_F32=1 the fp32 rows): the test, then 20b batch 1 and 4,
      # interleaved, twice.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.Fp8Gemvs*:CudaModel.Fp8Weights*:CudaEngine.DeviceSampling*' > "$OUT/s27e_tests.log" 2>&1
      summary+=("s27e tests rc=$?")
      grep -E "OK \]|FAILED|Failure" "$OUT/s27e_tests.log" | head -10
      for pass in 1 2; do
        for v in 0 1; do
          GPTOSS_GEMV_X_F32=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,4 \
            --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s27e_20b_${v}_$pass.log" 2>&1
          summary+=("s27e 20b x_f32=$v pass $pass rc=$?")
          echo "20b, GEMV x fp32=$v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s27e_20b_${v}_$pass.log"
        done
      done
      ;;
    s28a)
      # Session 28: (1) the engine and GEMV tests at the speculative changes never run on a GPU
      # (drafts beyond max_num_seqs, the flat drawn vector), and the CLI at --max-num-seqs 1 with
      # drafts on tiny_a (drafts must be fed and kept: the runner is sized for them); (2) ncu on the
      # MX prompt MoE (120b's) against the FP8 one on the same 20b 8k prompt (GPTOSS_FP8_EXPERT_COPY=0
      # sends 20b to the MX kernel): SOL, pipes, stalls by instruction; (3) ncu on the TMA prefill
      # attention (pipes and stalls at 8k, full causal).
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaEngine.*:CudaModel.Fp8Gemvs*' > "$OUT/s28a_tests.log" 2>&1
      summary+=("s28a tests rc=$?")
      grep -E "^\[spec\]|OK \]|FAILED|Failure|first difference" "$OUT/s28a_tests.log" | head -20
      ids=$(python3 -c 'import random; r=random.Random(5); print(",".join(str(r.randrange(64)) for _ in range(24)))')
      for k in 0 4; do
        timeout 100 $BIN/gptoss generate --model tests/data/checkpoints/tiny_a --backend cuda --ids "$ids" --max-tokens 400 \
          --temperature 0 --ignore-eos --max-num-seqs 1 --speculative-tokens $k > "$OUT/s28a_gen_$k.json" 2> "$OUT/s28a_gen_$k.err"
        summary+=("s28a generate max-num-seqs 1 k=$k rc=$?")
      done
      python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {k: json.load(open(f"{out}/s28a_gen_{k}.json")) for k in (0, 4)}
for k, r in runs.items():
    t = r["timing"]
    print(f"tiny_a --max-num-seqs 1, drafts {k}: steps {t.get('steps', '-')}, fed {t.get('draft_tokens', 0)}, "
          f"kept {t.get('accepted_tokens', 0)}, ids = plain: {r['ids'] == runs[0]['ids']}")
PY
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1 > /dev/null
      for kind in ${S28A_NCU_KINDS:-mx fp8}; do
        if [ $kind = mx ]; then kern=moe_mx_persistent; copy=0; else kern=moe_fp8_persistent; copy=1; fi
        GPTOSS_FP8_EXPERT_COPY=$copy timeout 300 $NCU --clock-control none --cache-control none --section SourceCounters \
          --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy \
          --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,smsp__sass_inst_executed.sum' \
          -k regex:$kern -c 1 -f -o "$OUT/s28a_ncu_$kind" $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --fp8 --prefill 8192 \
          --batch "" --repeats 1 > "$OUT/s28a_ncu_$kind.log" 2>&1
        summary+=("s28a ncu $kind rc=$?")
        $NCU -i "$OUT/s28a_ncu_$kind.ncu-rep" --page source --csv --print-source sass > "$OUT/s28a_ncu_${kind}_src.csv" 2>&1
        $NCU -i "$OUT/s28a_ncu_$kind.ncu-rep" --page details > "$OUT/s28a_ncu_${kind}_details.txt" 2>&1
        echo "== $kern (20b 8k, gate_up's first launch)"
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issued Warp|Eligible Warps|Executed Ipc|Registers Per|inst_executed.sum" "$OUT/s28a_ncu_${kind}_details.txt" | head -12
        awk '/(pipe_)/ && $NF+0 > 3 && /pct/ {print "   ", $1, $NF}' "$OUT/s28a_ncu_${kind}_details.txt" | head -24
        grep -E "Stall|stall" "$OUT/s28a_ncu_${kind}_details.txt" | head -12
        python3 tools/ncu_stall_top.py "$OUT/s28a_ncu_${kind}_src.csv" 25 | tee "$OUT/s28a_ncu_${kind}_top.txt"
      done
      [ "${S28A_NCU_ATTN:-1}" = 1 ] || continue
      timeout 180 $NCU --clock-control none --cache-control none --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
        --metrics 'regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__sass_inst_executed.sum' \
        -k regex:prefill_tma -c 1 $BIN/attention_bench "prefill T=8192" > "$OUT/s28a_ncu_attn.txt" 2>&1
      summary+=("s28a ncu attn rc=$?")
      echo "== prefill attention (TMA kernel, 8k full causal)"
      grep -E 'prefill_tma|Duration|Issued Warp|Eligible Warps|Active Warps Per|Registers|inst_executed.sum' "$OUT/s28a_ncu_attn.txt" | head -12
      awk '/(pipe_|issue_stalled)/ && $NF+0 > 3 && /pct/ {print "   ", $1, $NF} /issue_stalled/ && $NF+0 > 0.05 {print "   ", $1, $NF}' "$OUT/s28a_ncu_attn.txt" | head -40
      ;;
    s28b)
      # Session 28: the MoE prompt kernels' K loops with fewer instructions (ring slot and phase as
      # counters, descriptors by offset, the MX kernel's conversion interleaved with its wgmmas). The
      # MoE, model and engine tests, then 8k --fp8 prefill with the previous binary (gptoss_old.gz in
      # .device_pack, the revision before) and this one, interleaved: 20b (FP8 kernel), 20b with
      # GPTOSS_FP8_EXPERT_COPY=0 (the MX kernel), 120b (MX kernel). Latency rows and profile stages.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaMoeMx.*:CudaMoeFp8.*:CudaModel.*:CudaEngine.*' > "$OUT/s28b_tests.log" 2>&1
      rc=$?
      summary+=("s28b tests rc=$rc")
      grep -E "^\[spec\]|OK \]|FAILED|Failure|moe_mxfp4_fp8 (gate_up|down) \(E 3" "$OUT/s28b_tests.log" | head -40
      [ $rc = 0 ] || [ "${S28B_FORCE:-0}" = 1 ] || continue
      gunzip -c .device_pack/gptoss_old.gz > $BIN/gptoss_old && chmod +x $BIN/gptoss_old
      for pass in 1 2; do
        for m in "20b" "20b_mx" "120b"; do
          [ $m = 120b ] && [ $pass = 2 ] && continue
          for b in old new; do
            exe=$BIN/gptoss; [ $b = old ] && exe=$BIN/gptoss_old
            model=gpt-oss-20b; [ $m = 120b ] && model=gpt-oss-120b
            copy=1; [ $m = 20b_mx ] && copy=0
            GPTOSS_FP8_EXPERT_COPY=$copy GPTOSS_PROFILE=1 timeout 200 $exe bench --synthetic $model --fp8 --prefill 8192 \
              --batch "" --repeats 3 > "$OUT/s28b_${m}_${b}_$pass.log" 2>&1
            summary+=("s28b $m $b pass $pass rc=$?")
            echo "$m $b (pass $pass):"; grep -E "prefill +8192 tokens|  (moe|total) " "$OUT/s28b_${m}_${b}_$pass.log" | head -4
          done
        done
      done
      ;;
    s28c)
      # Session 28: (1) the MX prompt kernel's K loop in SASS (gate_up): where its four QGMMAs sit
      # among the conversion's PRMT/LOP3 (was the conversion interleaved with the wgmmas?); (2) ncu
      # of the decode attention at one sequence and at eight, 32k context (attention_bench's cases):
      # memory throughput, stalls.
      CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      $CUOBJDUMP -sass -fun '_ZN6gptoss7kernels4cuda43_GLOBAL__N__d5678c0d_10_moe_fp8_cu_27fbc23e24moe_mx_persistent_kernelILb1EEEvNS1_10MoeFp8ArgsE14CUtensorMap_stS5_' \
        $BIN/gptoss > "$OUT/s28c_mx.sass" 2>&1 || $CUOBJDUMP -sass $BIN/gptoss 2>/dev/null | awk '/Function :.*moe_mx_persistent_kernelILb1/{p=1} p&&/Function :/&&!/moe_mx_persistent_kernelILb1/{p=0} p' > "$OUT/s28c_mx.sass"
      summary+=("s28c sass lines $(wc -l < "$OUT/s28c_mx.sass")")
      python3 - "$OUT/s28c_mx.sass" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1]) if re.search(r"/\*[0-9a-f]{4}\*/", l)]
ops = [(i, l.split("*/", 1)[1].strip().split(";")[0]) for i, l in enumerate(lines)]
q = [i for i, o in ops if "QGMMA" in o and "E4M3" in o]
print(f"{len(lines)} instructions, {len(q)} QGMMA at", q[:12])
# Between consecutive QGMMAs of the main (width-128) loop: how many conversion ops.
for a, b in zip(q, q[1:]):
    if b - a > 400: continue
    seg = [o for _, o in ops[a + 1:b]]
    print(f"  QGMMA {a} -> {b}: {sum('PRMT' in o for o in seg)} PRMT, {sum('LOP3' in o for o in seg)} LOP3, {len(seg)} instructions")
first = q[0] if q else 0
seg = [o for _, o in ops[max(0, first - 200):first]]
print(f"  200 before the first QGMMA: {sum('PRMT' in o for o in seg)} PRMT")
PY
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for c in "B=1 ctx=32768" "B=8 ctx=32768"; do
        tag=$(echo "$c" | tr -d ' =')
        timeout 120 $NCU --clock-control none --cache-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section WarpStateStats --section Occupancy --section LaunchStats \
          --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed' \
          -k regex:decode_kernel -c 1 $BIN/attention_bench "decode $c" > "$OUT/s28c_ncu_attn_$tag.txt" 2>&1
        summary+=("s28c ncu attn $tag rc=$?")
        echo "== decode attention $c"
        grep -E "decode_kernel|Duration|DRAM Throughput|Memory Throughput|dram__|Grid Size|Waves Per SM|Achieved Occupancy|Issued Warp" "$OUT/s28c_ncu_attn_$tag.txt" | head -14
        awk '/issue_stalled/ && $NF+0 > 0.2 {print "   ", $1, $NF}' "$OUT/s28c_ncu_attn_$tag.txt" | head -12
      done
      ;;
    s28d)
      # Session 28: the decode attention's cluster variant (<= 2 sequences) on a 7-stage ring
      # (GPTOSS_ATTN_DECODE_STAGES=4: the old 4-stage ring). Tests (attention, model, engine), then
      # attention_bench at one sequence both ways, then 20b --fp8 decode at batch 1 and 2, contexts
      # 1k and 32k, both ways, interleaved.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8Weights*:CudaEngine.*' \
        > "$OUT/s28d_tests.log" 2>&1
      rc=$?
      summary+=("s28d tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s28d_tests.log" | head -30
      [ $rc = 0 ] || continue
      for v in 4 7; do
        GPTOSS_ATTN_DECODE_STAGES=$v timeout 60 $BIN/attention_bench "decode B=1 ctx" > "$OUT/s28d_attn_$v.log" 2>&1
        echo "attention_bench, cluster ring $v stages:"; grep -E "^decode" "$OUT/s28d_attn_$v.log"
      done
      for pass in 1 2; do
        for v in 4 7; do
          GPTOSS_ATTN_DECODE_STAGES=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
            --context 1024,32768 --decode-steps 32 --repeats 3 > "$OUT/s28d_20b_${v}_$pass.log" 2>&1
          summary+=("s28d 20b stages=$v pass $pass rc=$?")
          echo "20b, cluster ring $v stages (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s28d_20b_${v}_$pass.log"
        done
      done
      ;;
    s29a)
      # Session 29: the decode attention's cluster variant (<= 2 sequences) with 8 warps in two
      # streams of tiles (GPTOSS_ATTN_DECODE_STREAMS=2, the default; 1 = the r43 kernel, 4 warps; 3 =
      # 8 warps on a 6-slot ring, 96 KB). Tests with each mode, attention_bench at 1 and 2 sequences
      # each mode (and the whole decode table once, default), then 20b --fp8 decode at batch 1 and 2,
      # contexts 1k / 8k / 32k, each mode, interleaved, two passes.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8Weights*:CudaEngine.*' \
        > "$OUT/s29a_tests.log" 2>&1
      rc=$?
      for v in 1 3; do
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 100 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.Decode*:PagedAttentionCuda.Fp8KvCache' \
          > "$OUT/s29a_tests_$v.log" 2>&1
        rc=$((rc + $?))
      done
      summary+=("s29a tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT"/s29a_tests*.log | head -40
      [ $rc = 0 ] || continue
      for v in 1 2 3; do
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 60 $BIN/attention_bench "decode B=1 " > "$OUT/s29a_attn_$v.log" 2>&1
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 60 $BIN/attention_bench "decode B=2 " >> "$OUT/s29a_attn_$v.log" 2>&1
        echo "attention_bench, streams mode $v:"; grep -E "^decode" "$OUT/s29a_attn_$v.log"
      done
      timeout 200 $BIN/attention_bench "decode" > "$OUT/s29a_attn_all.log" 2>&1
      summary+=("s29a attention_bench all rc=$?")
      echo "attention_bench decode, default:"; grep -E "^decode" "$OUT/s29a_attn_all.log"
      for pass in 1 2; do
        for v in 1 2 3; do
          GPTOSS_ATTN_DECODE_STREAMS=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
            --context 1024,8192,32768 --decode-steps 32 --repeats 3 > "$OUT/s29a_20b_${v}_$pass.log" 2>&1
          summary+=("s29a 20b streams=$v pass $pass rc=$?")
          echo "20b, streams mode $v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s29a_20b_${v}_$pass.log"
        done
      done
      ;;
    s29b)
      # Session 29, call 2: s29a again with the 8-warp variants at 128 registers (two CTAs an SM;
      # call 1 had 179, one CTA an SM). Decode attention tests with modes 2 and 3, attention_bench at
      # 1 and 2 sequences each mode, then 20b --fp8 decode at batch 1 and 2, contexts 1k / 8k / 32k,
      # each mode once.
      rc=0
      for v in 2 3; do
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 100 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.Decode*:PagedAttentionCuda.Fp8KvCache' \
          > "$OUT/s29b_tests_$v.log" 2>&1
        rc=$((rc + $?))
      done
      summary+=("s29b tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT"/s29b_tests*.log | head -40
      [ $rc = 0 ] || continue
      for v in 1 2 3; do
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 60 $BIN/attention_bench "decode B=1 " > "$OUT/s29b_attn_$v.log" 2>&1
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 60 $BIN/attention_bench "decode B=2 " >> "$OUT/s29b_attn_$v.log" 2>&1
        echo "attention_bench, streams mode $v:"; grep -E "^decode" "$OUT/s29b_attn_$v.log"
      done
      # The cluster merge at 4 and 8 sequences too (GPTOSS_ATTN_DECODE_CLUSTER=all), modes 1 and 2.
      for v in 1 2; do
        for b in 4 8; do
          GPTOSS_ATTN_DECODE_CLUSTER=all GPTOSS_ATTN_DECODE_STREAMS=$v timeout 60 $BIN/attention_bench "decode B=$b " \
            >> "$OUT/s29b_attn_all_$v.log" 2>&1
        done
        echo "attention_bench, cluster at any batch, streams mode $v:"; grep -E "^decode" "$OUT/s29b_attn_all_$v.log"
      done
      for v in 1 2 3; do
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
          --context 1024,8192,32768 --decode-steps 32 --repeats 3 > "$OUT/s29b_20b_$v.log" 2>&1
        summary+=("s29b 20b streams=$v rc=$?")
        echo "20b, streams mode $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s29b_20b_$v.log"
      done
      ;;
    s29c)
      # Session 29, call 3: does the decode attention's bandwidth at few sequences follow the KV
      # cache layout? attention_bench with the head-major layout (GPTOSS_ATTN_KV_HEAD_MAJOR=1: a kv
      # head's keys of a block contiguous; random data, so only the access pattern changes) against
      # the model's, for the cluster path (streams modes 1 and 3), the combine path at one sequence
      # (GPTOSS_ATTN_DECODE_CLUSTER=0) and the cluster path at 4 and 8 sequences (=all).
      for hm in 0 1; do
        for v in 1 3; do
          f="$OUT/s29c_attn_hm${hm}_m$v.log"
          for b in 1 2 4 8 32; do
            GPTOSS_ATTN_KV_HEAD_MAJOR=$hm GPTOSS_ATTN_DECODE_STREAMS=$v timeout 60 $BIN/attention_bench "decode B=$b " >> "$f" 2>&1
          done
          echo "attention_bench, head-major $hm, streams mode $v:"; grep -E "^decode" "$f"
        done
        f="$OUT/s29c_attn_hm${hm}_nocluster.log"
        GPTOSS_ATTN_KV_HEAD_MAJOR=$hm GPTOSS_ATTN_DECODE_CLUSTER=0 timeout 60 $BIN/attention_bench "decode B=1 " >> "$f" 2>&1
        GPTOSS_ATTN_KV_HEAD_MAJOR=$hm GPTOSS_ATTN_DECODE_CLUSTER=0 timeout 60 $BIN/attention_bench "decode B=2 " >> "$f" 2>&1
        echo "attention_bench, head-major $hm, no cluster:"; grep -E "^decode" "$f"
        f="$OUT/s29c_attn_hm${hm}_cluster_all.log"
        for b in 4 8; do
          GPTOSS_ATTN_KV_HEAD_MAJOR=$hm GPTOSS_ATTN_DECODE_CLUSTER=all GPTOSS_ATTN_DECODE_STREAMS=1 timeout 60 $BIN/attention_bench "decode B=$b " >> "$f" 2>&1
        done
        echo "attention_bench, head-major $hm, cluster at any batch:"; grep -E "^decode" "$f"
      done
      summary+=("s29c done")
      ;;
    s29d)
      # Session 29, call 4: the default by batch size (8 warps on 6 slots at one sequence, 4 warps at
      # two). Tests (attention, model, engine), then 20b and 120b --fp8 decode at batch 1 and 2, 1k and
      # 32k, default against GPTOSS_ATTN_DECODE_STREAMS=1 (the r43 kernel), interleaved.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8Weights*:CudaEngine.*' \
        > "$OUT/s29d_tests.log" 2>&1
      rc=$?
      summary+=("s29d tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s29d_tests.log" | head -30
      [ $rc = 0 ] || continue
      for pass in 1 2; do
        for v in "" 1; do
          GPTOSS_ATTN_DECODE_STREAMS=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
            --context 1024,32768 --decode-steps 32 --repeats 3 > "$OUT/s29d_20b_${v:-auto}_$pass.log" 2>&1
          summary+=("s29d 20b streams=${v:-auto} pass $pass rc=$?")
          echo "20b, streams ${v:-auto} (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s29d_20b_${v:-auto}_$pass.log"
        done
      done
      for v in "" 1; do
        GPTOSS_ATTN_DECODE_STREAMS=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
          --context 1024,32768 --decode-steps 32 --repeats 3 > "$OUT/s29d_120b_${v:-auto}.log" 2>&1
        summary+=("s29d 120b streams=${v:-auto} rc=$?")
        echo "120b, streams ${v:-auto}:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s29d_120b_${v:-auto}.log"
      done
      ;;
    s30a)
      # Ran at ba3ed5d / 5ce394c (r45 calls 1-2): slower (20b batch 1 1.604-1.623 -> 1.695-1.720 ms a
      # step); the switch, kernel variant and tests were removed after it (5ce394c has them). Kept as
      # the record of what ran.
      # Session 30: the norm after each decode MoE inside its down kernel (kc::MoeTailNorm; the last
      # CTA by a ticket; GPTOSS_DECODE_NORM_IN_DOWN=n up to n tokens, default 2, 0 never). Tests (the
      # kernel against the norm kernel bit for bit, the model's logits bit for bit, the model, engine
      # and decode MoE tests), then 20b and 120b --fp8 decode at batch 1 and 2, 1k context, off (0)
      # against on (2), interleaved; the kernel trace with it on; 120b 8k prefill with --fp8-experts.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.ResidualRmsNorm*:CudaModel.NormInsideTheDecodeMoeIsTheSameBits:CudaModel.Fp8GemvsOnBf16RowsAreTheSameBits:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8Weights*:CudaEngine.*' \
        > "$OUT/s30a_tests.log" 2>&1
      rc=$?
      summary+=("s30a tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s30a_tests.log" | head -30
      [ $rc = 0 ] || continue
      for pass in 1 2; do
        for v in 0 2; do
          GPTOSS_DECODE_NORM_IN_DOWN=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
            --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30a_20b_${v}_$pass.log" 2>&1
          summary+=("s30a 20b norm_in_down=$v pass $pass rc=$?")
          echo "20b, norm in down $v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30a_20b_${v}_$pass.log"
        done
      done
      for v in 0 2; do
        GPTOSS_DECODE_NORM_IN_DOWN=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
          --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30a_120b_$v.log" 2>&1
        summary+=("s30a 120b norm_in_down=$v rc=$?")
        echo "120b, norm in down $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30a_120b_$v.log"
      done
      GPTOSS_KERNEL_TRACE="$OUT/s30a_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" \
        --batch 1 --context 1024 --decode-steps 6 > "$OUT/s30a_ktrace_20b.log" 2>&1
      summary+=("s30a ktrace 20b rc=$?")
      python3 tools/ktrace_summary.py "$OUT/s30a_ktrace_20b.csv"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill 8192 --batch "" --repeats 3 \
        > "$OUT/s30a_120b_fp8x_prefill.log" 2>&1
      summary+=("s30a 120b fp8-experts 8k prefill rc=$?")
      grep -E "prefill +8192" "$OUT/s30a_120b_fp8x_prefill.log"
      ;;
    s30b)
      # Ran at 5ce394c (r45 call 2); the switches were removed after it (see s30a).
      # Session 30, call 2: s30a measured the norm in the down kernel slower (20b batch 1 1.604-1.614
      # -> 1.707-1.712 ms; down adds 18.6 us a layer against 10.6 + the norm's 5). Where its ~8 us go:
      # the ticket as one acq_rel atomic (GPTOSS_DECODE_TAIL_TICKET=acqrel, the default now) against
      # fence + atomicAdd + fence (=fence), and the ticket alone (GPTOSS_DECODE_NORM_IN_DOWN_DIAG=1:
      # no norm; a timing diagnostic). Then the prefill stage profiles of 120b --fp8 --fp8-experts and
      # 20b --fp8 at 8k (GPTOSS_PROFILE=1).
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMmaTailNorm*:CudaModel.NormInsideTheDecodeMoeIsTheSameBits' \
        > "$OUT/s30b_tests.log" 2>&1
      rc=$?
      summary+=("s30b tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s30b_tests.log" | head -30
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in off acqrel fence diag; do
            env_v="GPTOSS_DECODE_NORM_IN_DOWN=2"
            case $v in
              off) env_v="GPTOSS_DECODE_NORM_IN_DOWN=0" ;;
              fence) env_v="GPTOSS_DECODE_NORM_IN_DOWN=2 GPTOSS_DECODE_TAIL_TICKET=fence" ;;
              diag) env_v="GPTOSS_DECODE_NORM_IN_DOWN=2 GPTOSS_DECODE_NORM_IN_DOWN_DIAG=1" ;;
            esac
            env $env_v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30b_20b_${v}_$pass.log" 2>&1
            summary+=("s30b 20b $v pass $pass rc=$?")
            echo "20b, $v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30b_20b_${v}_$pass.log"
          done
        done
      fi
      GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill 8192 --batch "" \
        --repeats 3 > "$OUT/s30b_120b_fp8x_profile.log" 2>&1
      summary+=("s30b 120b fp8-experts profile rc=$?")
      grep -E "prefill +8192|^  [a-z_]+ +[0-9.]+ ms" "$OUT/s30b_120b_fp8x_profile.log"
      GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill 8192 --batch "" \
        --repeats 3 > "$OUT/s30b_20b_profile.log" 2>&1
      summary+=("s30b 20b profile rc=$?")
      grep -E "prefill +8192|^  [a-z_]+ +[0-9.]+ ms" "$OUT/s30b_20b_profile.log"
      ;;
    s30c)
      # Ran at c785f65 (r45 call 3) and, down only, s30d at 0cbcc61 (call 4): not kept (both launches
      # slower; down only within the spread at batch 1 and slower at 2-5); the switch, kernel variant
      # and test were removed (0cbcc61 has them). Kept as the record of what ran.
      # Session 30, call 3: moe_decode_mma with its weights through shared memory (cp.async, one
      # commit group a K step, so that a warp's math on step i waits only for step i's words;
      # GPTOSS_MOE_DECODE_SMEM=1; 64-79 registers, 6 CTAs an SM). Tests (the same bits as the
      # register kernel; the decode MoE, model and engine tests with it on), moe_bench at 1-8 tokens
      # each way, then 20b --fp8 decode at batch 1, 2, 4, 5 and 120b at batch 1, 1k, off against on,
      # interleaved.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*' > "$OUT/s30c_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_DECODE_SMEM=1 timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeMxfp4*:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8*:CudaEngine.*' \
        >> "$OUT/s30c_tests.log" 2>&1
      rc2=$?
      summary+=("s30c tests rc=$rc, with smem weights rc=$rc2")
      grep -E "OK \]|FAILED|Failure" "$OUT/s30c_tests.log" | head -40
      if [ $rc = 0 ] && [ $rc2 = 0 ]; then
        for v in 0 1; do
          GPTOSS_MOE_DECODE_SMEM=$v timeout 100 $BIN/moe_bench 1 2 4 8 > "$OUT/s30c_moe_bench_$v.log" 2>&1
          echo "moe_bench, smem weights $v:"; grep "^|" "$OUT/s30c_moe_bench_$v.log"
        done
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_MOE_DECODE_SMEM=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,5 \
              --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30c_20b_${v}_$pass.log" 2>&1
            summary+=("s30c 20b smem=$v pass $pass rc=$?")
            echo "20b, smem weights $v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30c_20b_${v}_$pass.log"
          done
        done
        for v in 0 1; do
          GPTOSS_MOE_DECODE_SMEM=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
            --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30c_120b_$v.log" 2>&1
          summary+=("s30c 120b smem=$v rc=$?")
          echo "120b, smem weights $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30c_120b_$v.log"
        done
        GPTOSS_MOE_DECODE_SMEM=1 GPTOSS_KERNEL_TRACE="$OUT/s30c_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b \
          --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s30c_ktrace_20b.log" 2>&1
        summary+=("s30c ktrace 20b rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s30c_ktrace_20b.csv"
      fi
      ;;
    s30d)
      # Ran at 0cbcc61 (r45 call 4); the switch was removed after it (see s30c).
      # Session 30, call 4: s30c had the shared-memory weights slower in all (20b batch 1 1.630-1.634
      # -> 1.651-1.659 ms; gate_up adds 26.0 us a layer against 21.7) but down faster (7.6 against
      # 10.6: its 720 CTAs in one wave at 6 an SM). Down only (GPTOSS_MOE_DECODE_SMEM=2): tests,
      # moe_bench, 20b batch 1, 2, 4, 5 and 120b batch 1 at 1k, off against on, interleaved; trace.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*' > "$OUT/s30d_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_DECODE_SMEM=2 timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8*:CudaEngine.*' \
        >> "$OUT/s30d_tests.log" 2>&1
      rc2=$?
      summary+=("s30d tests rc=$rc, with smem weights in down rc=$rc2")
      grep -E "OK \]|FAILED|Failure" "$OUT/s30d_tests.log" | head -40
      if [ $rc = 0 ] && [ $rc2 = 0 ]; then
        for v in 0 2; do
          GPTOSS_MOE_DECODE_SMEM=$v timeout 100 $BIN/moe_bench 1 2 4 8 > "$OUT/s30d_moe_bench_$v.log" 2>&1
          echo "moe_bench, smem weights $v:"; grep "^| [0-9]" "$OUT/s30d_moe_bench_$v.log"
        done
        for pass in 1 2; do
          for v in 0 2; do
            GPTOSS_MOE_DECODE_SMEM=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,5 \
              --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30d_20b_${v}_$pass.log" 2>&1
            summary+=("s30d 20b smem=$v pass $pass rc=$?")
            echo "20b, smem weights $v (pass $pass):"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30d_20b_${v}_$pass.log"
          done
        done
        for v in 0 2; do
          GPTOSS_MOE_DECODE_SMEM=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1,2 \
            --context 1024 --decode-steps 32 --repeats 3 > "$OUT/s30d_120b_$v.log" 2>&1
          summary+=("s30d 120b smem=$v rc=$?")
          echo "120b, smem weights $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30d_120b_$v.log"
        done
        GPTOSS_MOE_DECODE_SMEM=2 GPTOSS_KERNEL_TRACE="$OUT/s30d_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b \
          --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s30d_ktrace_20b.log" 2>&1
        summary+=("s30d ktrace 20b rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s30d_ktrace_20b.csv"
      fi
      ;;
    s31a)
      # Session 31: the 8k prefill kernel by kernel (CUPTI trace of the last repeat; the traced
      # latency is not the engine's): 20b --fp8, 120b --fp8 --fp8-experts, 120b --fp8 (MX experts);
      # then attention_bench's prefill rows.
      for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts" "gpt-oss-120b|"; do
        m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
        GPTOSS_KERNEL_TRACE="$OUT/s31a_ptrace_$tag.csv" timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x \
          --prefill 8192 --batch "" --repeats 2 > "$OUT/s31a_ptrace_$tag.log" 2>&1
        summary+=("s31a ptrace $tag rc=$?")
        grep -E "prefill +8192" "$OUT/s31a_ptrace_$tag.log"
        python3 tools/ktrace_summary.py "$OUT/s31a_ptrace_$tag.csv" | head -40
      done
      timeout 120 $BIN/attention_bench prefill > "$OUT/s31a_attention_bench.log" 2>&1
      summary+=("s31a attention_bench rc=$?")
      grep -E "prefill" "$OUT/s31a_attention_bench.log" | head
      ;;
    s31b)
      # Ran at 9dd093f (r46 call 2): no faster (sliding 8k 156.6 -> 157.8 us), and the switch,
      # kernel variant and tests were removed after it; kept as the record of what ran.
      # Session 31: PagedAttentionArgs::prefill_next_q (sliding layers, several query tiles a CTA,
      # the next one's Q and first KV tiles under the current one). Attention tests (the bits
      # against the pipelined kernel), the model tests, then attention_bench prefill and 8k
      # prefill A/B (GPTOSS_ATTN_NEXTQ=0 / 1, interleaved, profile stages).
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s31b_tests.log" 2>&1
      rc=$?
      summary+=("s31b tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|differs" "$OUT/s31b_tests.log" | head -40
      if [ $rc = 0 ]; then
        for v in 0 1 2 4; do
          GPTOSS_ATTN_NEXTQ=$v timeout 60 $BIN/attention_bench prefill > "$OUT/s31b_attn_$v.log" 2>&1
          echo "GPTOSS_ATTN_NEXTQ=$v"; grep -E "sliding" "$OUT/s31b_attn_$v.log"
        done
        for pass in 1 2; do
          for m in gpt-oss-20b gpt-oss-120b; do
            for v in 0 1; do
              GPTOSS_ATTN_NEXTQ=$v GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 \
                --batch "" --repeats 3 > "$OUT/s31b_${m}_${v}_$pass.log" 2>&1
              summary+=("s31b $m nextq=$v pass $pass rc=$?")
              echo "$m NEXTQ=$v pass $pass:"; grep -E "prefill +8192|  (attention|total) " "$OUT/s31b_${m}_${v}_$pass.log"
            done
          done
        done
      fi
      ;;
    s31c)
      # Session 31: the TMA prompt attention zeroes V rows only where one may be an unwritten slot
      # (PagedAttentionArgs::prefill_zero_all_rows; GPTOSS_ATTN_ZERO_ALL=1: every tile with rows
      # outside the query tile's keys, as before). Attention tests (the bits against the old rule,
      # NaN in unused slots), model tests, then attention_bench prefill and 8k prefill A/B.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s31c_tests.log" 2>&1
      rc=$?
      summary+=("s31c tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|changes the output" "$OUT/s31c_tests.log" | head -40
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 1 0; do
            GPTOSS_ATTN_ZERO_ALL=$v timeout 60 $BIN/attention_bench prefill > "$OUT/s31c_attn_${v}_$pass.log" 2>&1
            echo "GPTOSS_ATTN_ZERO_ALL=$v pass $pass"; grep -E "prefill T=(8192|32768)" "$OUT/s31c_attn_${v}_$pass.log"
          done
        done
        for pass in 1 2; do
          for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
            m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
            for v in 1 0; do
              GPTOSS_ATTN_ZERO_ALL=$v GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 \
                --batch "" --repeats 3 > "$OUT/s31c_${tag}_${v}_$pass.log" 2>&1
              summary+=("s31c $tag zero_all=$v pass $pass rc=$?")
              echo "$tag ZERO_ALL=$v pass $pass:"; grep -E "prefill +8192|  (attention|total) " "$OUT/s31c_${tag}_${v}_$pass.log"
            done
          done
        done
      fi
      ;;
    s31d)
      # Session 31, the closing run on the shipped code: the bars. 20b and 120b --fp8 batch-1 decode
      # at 1k; 8k prefill of 20b, 120b (MX experts) and 120b --fp8-experts.
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
          --repeats 3 > "$OUT/s31d_decode_$m.log" 2>&1
        summary+=("s31d decode $m rc=$?")
        echo "$m batch 1:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s31d_decode_$m.log"
      done
      for cfg in "gpt-oss-20b|" "gpt-oss-120b|" "gpt-oss-120b|--fp8-experts"; do
        m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
        timeout 120 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 3 > "$OUT/s31d_prefill_$tag.log" 2>&1
        summary+=("s31d prefill $tag rc=$?")
        echo "$tag:"; grep -E "prefill +8192" "$OUT/s31d_prefill_$tag.log"
      done
      ;;
    s31e)
      # Ran at 0db548b (r46 call 5): the same speed (router stage 20b 1.226 -> 1.215 ms, 120b
      # 2.986 -> 2.910), and the kernel was removed after it; kept as the record of what ran.
      # Session 31: the prompt router's logits on wgmma (GPTOSS_ROUTER_WGMMA=0: the mma.sync kernel).
      # Router and model tests; 8k prefill A/B (20b, 120b --fp8-experts; router stage); then the
      # closing bars if the tests pass: batch-1 decode 20b / 120b, 120b MX 8k prefill.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.Router*:CudaModel.*:CudaEngine.*' > "$OUT/s31e_tests.log" 2>&1
      rc=$?
      summary+=("s31e tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|router logits on tensor" "$OUT/s31e_tests.log" | head -40
      if [ $rc = 0 ]; then
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          for v in 0 1; do
            GPTOSS_ROUTER_WGMMA=$v GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 \
              --batch "" --repeats 3 > "$OUT/s31e_${tag}_$v.log" 2>&1
            summary+=("s31e $tag router_wgmma=$v rc=$?")
            echo "$tag ROUTER_WGMMA=$v:"; grep -E "prefill +8192|  (router|total) " "$OUT/s31e_${tag}_$v.log"
          done
        done
        for m in gpt-oss-20b gpt-oss-120b; do
          timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
            --repeats 3 > "$OUT/s31e_decode_$m.log" 2>&1
          summary+=("s31e decode $m rc=$?")
          echo "$m batch 1:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s31e_decode_$m.log"
        done
        timeout 120 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill 8192 --batch "" --repeats 3 > "$OUT/s31e_prefill_120b_mx.log" 2>&1
        summary+=("s31e prefill 120b MX rc=$?")
        echo "120b MX:"; grep -E "prefill +8192" "$OUT/s31e_prefill_120b_mx.log"
      fi
      ;;
    s32a)
      # Session 32: where the full-layer prompt attention's instructions go. ncu source counters
      # (executed warp instructions and stall samples a SASS line) of the first ping-pong kernel
      # launch of attention_bench "prefill T=8192" (full causal, 8k), its details page, and the
      # static SASS of attention_bench's prefill_tma kernels.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      timeout 240 $NCU --clock-control none --cache-control none --section SourceCounters --section InstructionStats \
        --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
        --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1' -c 1 -f -o "$WORK/s32a_attn" \
        $BIN/attention_bench "prefill T=8192" > "$OUT/s32a_ncu.log" 2>&1
      summary+=("s32a ncu rc=$?")
      $NCU -i "$WORK/s32a_attn.ncu-rep" --page details > "$OUT/s32a_details.txt" 2>&1
      $NCU -i "$WORK/s32a_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s32a_source.csv" 2>&1
      summary+=("s32a source lines=$(wc -l < "$OUT/s32a_source.csv")")
      grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Active Warps Per|Warp Cycles Per Issued|Registers|Pipe" \
        "$OUT/s32a_details.txt" | head -20
      python3 tools/ncu_sass_mix.py "$OUT/s32a_source.csv" --top 25 | head -40
      CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      [ -n "$CUOBJ" ] && $CUOBJ -sass $BIN/attention_bench 2>/dev/null | awk '/Function :/{p = /prefill_tma/} p' > "$OUT/s32a_sass.txt"
      summary+=("s32a sass lines=$(wc -l < "$OUT/s32a_sass.txt" 2>/dev/null)")
      ;;
    s32b)
      # Ran at cee2aa8 (r47 call 3): full 8k 1,436 -> 1,374 us, sliding and 1k 2-3% slower, 12% more
      # instructions (the ring counters' descriptors in vector registers); reworked after it (s32c).
      # Session 32: the TMA prompt-attention kernels with each warp's lane 0 issuing one of a KV
      # tile's eight boxes, the stage descriptors from one base and ring counters (cee2aa8). The
      # attention, model and engine tests; attention_bench prefill against the previous binary
      # (.device_pack/attention_bench_old.gz, 0db548b: the r46 kernels), interleaved, two passes;
      # ncu source counters of the new full-layer kernel (as s32a); 8k prefill with the stage
      # profile (20b --fp8, 120b --fp8 --fp8-experts).
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s32b_tests.log" 2>&1
      rc=$?
      summary+=("s32b tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s32b_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs" "$OUT/s32b_tests.log" | head -20
      if [ $rc = 0 ]; then
        gunzip -c .device_pack/attention_bench_old.gz > "$WORK/attention_bench_old" && chmod +x "$WORK/attention_bench_old"
        for pass in 1 2; do
          for v in old new; do
            b=$BIN/attention_bench; [ $v = old ] && b="$WORK/attention_bench_old"
            timeout 90 $b prefill > "$OUT/s32b_attn_${v}_$pass.log" 2>&1
            echo "attention_bench $v pass $pass:"; grep -E "^prefill" "$OUT/s32b_attn_${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters --section InstructionStats \
          --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1' -c 1 -f -o "$WORK/s32b_attn" \
          $BIN/attention_bench "prefill T=8192" > "$OUT/s32b_ncu.log" 2>&1
        summary+=("s32b ncu rc=$?")
        $NCU -i "$WORK/s32b_attn.ncu-rep" --page details > "$OUT/s32b_details.txt" 2>&1
        $NCU -i "$WORK/s32b_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s32b_source.csv" 2>&1
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued" "$OUT/s32b_details.txt" | head -8
        python3 tools/ncu_sass_mix.py "$OUT/s32b_source.csv" --top 12 | head -16
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 3 \
            > "$OUT/s32b_prefill_$tag.log" 2>&1
          summary+=("s32b prefill $tag rc=$?")
          echo "$tag:"; grep -E "prefill +8192|  (attention|moe|total) " "$OUT/s32b_prefill_$tag.log"
        done
      fi
      ;;
    s32c)
      # Session 32, second form: the spread issue in the ping-pong kernel only, the pipelined
      # kernels' descriptors from one base by the uniform stage index (no ring counters). The
      # attention, model and engine tests; attention_bench prefill against the previous binary
      # (.device_pack/attention_bench_old.gz, 0db548b: the r46 kernels), interleaved, two passes;
      # ncu source counters of the new full-layer kernel (as s32a); 8k prefill with the stage
      # profile (20b --fp8, 120b --fp8 --fp8-experts).
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s32c_tests.log" 2>&1
      rc=$?
      summary+=("s32c tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s32c_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs" "$OUT/s32c_tests.log" | head -20
      if [ $rc = 0 ]; then
        gunzip -c .device_pack/attention_bench_old.gz > "$WORK/attention_bench_old" && chmod +x "$WORK/attention_bench_old"
        for pass in 1 2; do
          for v in old new; do
            b=$BIN/attention_bench; [ $v = old ] && b="$WORK/attention_bench_old"
            timeout 90 $b prefill > "$OUT/s32c_attn_${v}_$pass.log" 2>&1
            echo "attention_bench $v pass $pass:"; grep -E "^prefill" "$OUT/s32c_attn_${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters --section InstructionStats \
          --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1' -c 1 -f -o "$WORK/s32c_attn" \
          $BIN/attention_bench "prefill T=8192" > "$OUT/s32c_ncu.log" 2>&1
        summary+=("s32c ncu rc=$?")
        $NCU -i "$WORK/s32c_attn.ncu-rep" --page details > "$OUT/s32c_details.txt" 2>&1
        $NCU -i "$WORK/s32c_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s32c_source.csv" 2>&1
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued" "$OUT/s32c_details.txt" | head -8
        python3 tools/ncu_sass_mix.py "$OUT/s32c_source.csv" --top 12 | head -16
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 3 \
            > "$OUT/s32c_prefill_$tag.log" 2>&1
          summary+=("s32c prefill $tag rc=$?")
          echo "$tag:"; grep -E "prefill +8192|  (attention|moe|total) " "$OUT/s32c_prefill_$tag.log"
        done
      fi
      ;;
    s32d)
      # Ran at 2c2bca6 (r47 call 6); the switch (PagedAttentionArgs::prefill_issue) was removed after
      # it, form 2 kept as the only one. Session 32, experiment: the KV issue forms (GPTOSS_ATTN_ISSUE 0 thread 0, 1 eight warps a box
      # each, 2 four warps two boxes each by tile parity; unset: the kernel's choice, 1 in the
      # ping-pong kernel, 0 elsewhere). Attention tests (every form the same bits), then
      # attention_bench prefill per form, interleaved, two passes.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*' > "$OUT/s32d_tests.log" 2>&1
      rc=$?
      summary+=("s32d tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s32d_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|changes" "$OUT/s32d_tests.log" | head -20
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 1 2 d; do
            if [ $v = d ]; then
              timeout 90 $BIN/attention_bench prefill > "$OUT/s32d_attn_${v}_$pass.log" 2>&1
            else
              GPTOSS_ATTN_ISSUE=$v timeout 90 $BIN/attention_bench prefill > "$OUT/s32d_attn_${v}_$pass.log" 2>&1
            fi
            echo "GPTOSS_ATTN_ISSUE=$v pass $pass:"; grep -E "^prefill" "$OUT/s32d_attn_${v}_$pass.log"
          done
        done
      fi
      ;;
    s32e)
      # Session 32, the closing run: the shipped code (the KV tiles issued by one warpgroup's four
      # lane 0s, alternating by tile). Attention, model and engine tests; attention_bench prefill
      # against the r46 binary (.device_pack/attention_bench_old.gz), interleaved, two passes; ncu
      # source counters of the full-layer kernel; the bars: batch-1 decode at 1k (20b, 120b --fp8),
      # 8k prefill (20b; 120b MX experts; 120b --fp8-experts) with the stage profile.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s32e_tests.log" 2>&1
      rc=$?
      summary+=("s32e tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s32e_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs" "$OUT/s32e_tests.log" | head -20
      if [ $rc = 0 ]; then
        [ -f .device_pack/attention_bench_old.gz ] &&
          gunzip -c .device_pack/attention_bench_old.gz > "$WORK/attention_bench_old" && chmod +x "$WORK/attention_bench_old"
        for pass in 1 2; do
          for v in old new; do
            b=$BIN/attention_bench; [ $v = old ] && b="$WORK/attention_bench_old"
            [ -x "$b" ] || { echo "no $b (.device_pack/attention_bench_old.gz: the r46 attention_bench)"; continue; }
            timeout 90 $b prefill > "$OUT/s32e_attn_${v}_$pass.log" 2>&1
            echo "attention_bench $v pass $pass:"; grep -E "^prefill" "$OUT/s32e_attn_${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters --section InstructionStats \
          --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1' -c 1 -f -o "$WORK/s32e_attn" \
          $BIN/attention_bench "prefill T=8192" > "$OUT/s32e_ncu.log" 2>&1
        summary+=("s32e ncu rc=$?")
        $NCU -i "$WORK/s32e_attn.ncu-rep" --page details > "$OUT/s32e_details.txt" 2>&1
        $NCU -i "$WORK/s32e_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s32e_source.csv" 2>&1
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued" "$OUT/s32e_details.txt" | head -8
        for m in gpt-oss-20b gpt-oss-120b; do
          timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
            --repeats 3 > "$OUT/s32e_decode_$m.log" 2>&1
          summary+=("s32e decode $m rc=$?")
          echo "$m batch 1:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s32e_decode_$m.log"
        done
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 3 \
            > "$OUT/s32e_prefill_$tag.log" 2>&1
          summary+=("s32e prefill $tag rc=$?")
          echo "$tag:"; grep -E "prefill +8192|  (attention|moe|total) " "$OUT/s32e_prefill_$tag.log"
        done
      fi
      ;;
    s32f)
      # Ran at bcdba6a (r47 call 9): full 8k 1,352-1,355 us against the r46 binary's 1,441-1,442,
      # where 7f7aa2e (Q fragments in registers) ran 1,271-1,285 against 1,427-1,433 (call 7): slower,
      # reverted (22ad563). Session 32, last call: the pipelined kernels' S = Q·Kᵀ with Q from shared memory (wgmma
      # SS; no Q fragments in registers). Attention, model and engine tests; attention_bench prefill
      # against the r46 binary, interleaved, two passes; ncu source counters of the full-layer
      # kernel; one 20b 8k prefill.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s32f_tests.log" 2>&1
      rc=$?
      summary+=("s32f tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s32f_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs" "$OUT/s32f_tests.log" | head -20
      if [ $rc = 0 ]; then
        gunzip -c .device_pack/attention_bench_old.gz > "$WORK/attention_bench_old" && chmod +x "$WORK/attention_bench_old"
        for pass in 1 2; do
          for v in old new; do
            b=$BIN/attention_bench; [ $v = old ] && b="$WORK/attention_bench_old"
            timeout 90 $b prefill > "$OUT/s32f_attn_${v}_$pass.log" 2>&1
            echo "attention_bench $v pass $pass:"; grep -E "^prefill" "$OUT/s32f_attn_${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 100 $NCU --clock-control none --cache-control none --section SourceCounters --section InstructionStats \
          --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1' -c 1 -f -o "$WORK/s32f_attn" \
          $BIN/attention_bench "prefill T=8192" > "$OUT/s32f_ncu.log" 2>&1
        $NCU -i "$WORK/s32f_attn.ncu-rep" --page details > "$OUT/s32f_details.txt" 2>&1
        $NCU -i "$WORK/s32f_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s32f_source.csv" 2>&1
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued" "$OUT/s32f_details.txt" | head -6
        timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill 8192 --batch "" --repeats 3 > "$OUT/s32f_prefill_20b.log" 2>&1
        summary+=("s32f prefill 20b rc=$?")
        grep -E "prefill +8192" "$OUT/s32f_prefill_20b.log"
      fi
      ;;
    s33a)
      # Session 33, call 1: branch s33-pv-overlap (P(t) packed into a second register set before the
      # P·V wait; loop by two tiles). Attention, model and engine tests; attention_bench prefill
      # against the r47 binary (.device_pack/attention_bench_old.gz = 8c07e86), interleaved, two
      # passes; ncu source counters of the full-layer kernel; 20b and 120b --fp8-experts 8k prefill
      # with the stage profile.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s33a_tests.log" 2>&1
      rc=$?
      summary+=("s33a tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s33a_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs" "$OUT/s33a_tests.log" | head -20
      if [ $rc = 0 ]; then
        [ -f .device_pack/attention_bench_old.gz ] &&
          gunzip -c .device_pack/attention_bench_old.gz > "$WORK/attention_bench_old" && chmod +x "$WORK/attention_bench_old"
        for pass in 1 2; do
          for v in old new; do
            b=$BIN/attention_bench; [ $v = old ] && b="$WORK/attention_bench_old"
            [ -x "$b" ] || { echo "no $b"; continue; }
            timeout 90 $b prefill > "$OUT/s33a_attn_${v}_$pass.log" 2>&1
            echo "attention_bench $v pass $pass:"; grep -E "^prefill" "$OUT/s33a_attn_${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters --section InstructionStats \
          --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section ComputeWorkloadAnalysis \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1' -c 1 -f -o "$WORK/s33a_attn" \
          $BIN/attention_bench "prefill T=8192" > "$OUT/s33a_ncu.log" 2>&1
        summary+=("s33a ncu rc=$?")
        $NCU -i "$WORK/s33a_attn.ncu-rep" --page details > "$OUT/s33a_details.txt" 2>&1
        $NCU -i "$WORK/s33a_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s33a_source.csv" 2>&1
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued" "$OUT/s33a_details.txt" | head -8
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 3 \
            > "$OUT/s33a_prefill_$tag.log" 2>&1
          summary+=("s33a prefill $tag rc=$?")
          echo "$tag:"; grep -E "prefill +8192|  (attention|moe|total) " "$OUT/s33a_prefill_$tag.log"
        done
      fi
      ;;
    s33c)
      # Session 33, closing call: the persistent MoE kernels load an item's x rows by a box of its
      # width (XMaps; GPTOSS_MOE_NARROW_X=0 the old 128-row boxes). MoE, attention, model and
      # engine tests; 8k prefill with the stage profile, 120b --fp8-experts narrow on / off twice,
      # 120b MX on / off, 20b on; batch-1 decode at 1k, 20b and 120b (the bars).
      timeout 240 $BIN/cuda_kernel_tests --gtest_filter='CudaMoeFp8*:CudaMoeMx*:PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s33c_tests.log" 2>&1
      rc=$?
      summary+=("s33c tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s33c_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs" "$OUT/s33c_tests.log" | head -20
      if [ $rc = 0 ]; then
        for cfg in "gpt-oss-120b|--fp8-experts|1" "gpt-oss-120b|--fp8-experts|0" "gpt-oss-120b|--fp8-experts|1" \
                   "gpt-oss-120b|--fp8-experts|0" "gpt-oss-120b||1" "gpt-oss-120b||0" "gpt-oss-20b||1"; do
          m=${cfg%%|*}; r=${cfg#*|}; x=${r%%|*}; nx=${r#*|}; tag=$m${x:+_fp8x}_nx$nx
          GPTOSS_MOE_NARROW_X=$nx GPTOSS_PROFILE=1 timeout 100 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" \
            --repeats 2 > "$OUT/s33c_prefill_$tag.log" 2>&1
          summary+=("s33c $tag rc=$?")
          echo "$tag: $(grep -E "prefill +8192" "$OUT/s33c_prefill_$tag.log" | head -1)"
          grep -E "^  (moe|attention) " "$OUT/s33c_prefill_$tag.log"
        done
        for m in gpt-oss-20b gpt-oss-120b; do
          timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
            --repeats 3 > "$OUT/s33c_decode_$m.log" 2>&1
          summary+=("s33c decode $m rc=$?")
          echo "$m batch 1:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s33c_decode_$m.log"
        done
      fi
      ;;
    s33d)
      # Session 33, last call: s33c's A/B again with the off path fixed (s33c's GPTOSS_MOE_NARROW_X=0
      # runs hung: the producer expected the narrow bytes from 128-row boxes). 120b --fp8-experts
      # 8k prefill, narrow x boxes on / off, interleaved, twice.
      pass=0
      for nx in 1 0 1 0; do
        tag=gpt-oss-120b_fp8x_nx$nx
        GPTOSS_MOE_NARROW_X=$nx GPTOSS_PROFILE=1 timeout 70 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill 8192 --batch "" \
          --repeats 2 > "$OUT/s33d_prefill_${tag}_$pass$nx.log" 2>&1
        summary+=("s33d $tag rc=$?")
        echo "$tag: $(grep -E "prefill +8192" "$OUT/s33d_prefill_${tag}_$pass$nx.log" | head -1)"
        grep -E "^  moe " "$OUT/s33d_prefill_${tag}_$pass$nx.log"
        pass=$((pass + 1))
      done
      ;;
    s34a)
      # Session 34, call 1: the cleanups (persistent MoE maps encoded once; tile_mask_max_exp shared)
      # and Q by descriptor from shared memory in the pipelined prompt attention (GPTOSS_ATTN_Q_SMEM=1,
      # kQs). Tests; attention_bench prefill with Q_SMEM 0 / 1 interleaved, two passes; ncu source of
      # the kQs ping-pong kernel at 8k (DEPBAR 0x0 against the MUFUs); 120b --fp8-experts 8k prefill
      # with 0 / 1 twice, with the stage profile.
      timeout 240 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaMoeFp8.MatchesCpuSchemeAtRealWidths:CudaMoeFp8.NarrowTails*:CudaMoeMx.MatchesCpuAtRealWidths:CudaMoeMx.NarrowTails*:CudaModel.*:CudaEngine.*' > "$OUT/s34a_tests.log" 2>&1
      rc=$?
      summary+=("s34a tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s34a_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs|changes" "$OUT/s34a_tests.log" | head -20
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_ATTN_Q_SMEM=$v timeout 90 $BIN/attention_bench prefill > "$OUT/s34a_attn_qs${v}_$pass.log" 2>&1
            echo "attention_bench Q_SMEM=$v pass $pass:"; grep -E "^prefill" "$OUT/s34a_attn_qs${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        GPTOSS_ATTN_Q_SMEM=1 timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters \
          --section InstructionStats --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1, .bool.0, .bool.1' -c 1 -f \
          -o "$WORK/s34a_attn" $BIN/attention_bench "prefill T=8192" > "$OUT/s34a_ncu.log" 2>&1
        summary+=("s34a ncu rc=$?")
        $NCU -i "$WORK/s34a_attn.ncu-rep" --page details > "$OUT/s34a_details.txt" 2>&1
        $NCU -i "$WORK/s34a_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s34a_source.csv" 2>&1
        grep -E "Duration|Issue Slots Busy|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued|Registers Per" "$OUT/s34a_details.txt" | head -8
        for v in 0 1 0 1; do
          GPTOSS_ATTN_Q_SMEM=$v GPTOSS_PROFILE=1 timeout 100 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts \
            --prefill 8192 --batch "" --repeats 2 > "$OUT/s34a_prefill_120b_qs$v.$RANDOM.log" 2>&1
          summary+=("s34a 120b qs=$v rc=$?")
          f=$(ls -t "$OUT"/s34a_prefill_120b_qs$v.*.log | head -1)
          echo "120b --fp8-experts Q_SMEM=$v: $(grep -E "prefill +8192" "$f" | head -1)"
          grep -E "^  (moe|attention|total) " "$f"
        done
      fi
      ;;
    s34b)
      # Session 34, call 2: the softmax ordered before the P·V wait by a store of the row sums
      # (GPTOSS_ATTN_SOFTMAX_ORDER=1, kOrder), alone and with Q from shared memory. Attention tests;
      # attention_bench prefill opts 0 / 2 / 3 interleaved, two passes; ncu source of the kOrder
      # ping-pong kernel at 8k; 120b --fp8-experts 8k prefill order 0 / 1 twice if full 8k gained >= 1%.
      timeout 120 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*' > "$OUT/s34b_tests.log" 2>&1
      rc=$?
      summary+=("s34b tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s34b_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs|changes" "$OUT/s34b_tests.log" | head -20
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for o in 0 2 3; do
            GPTOSS_ATTN_Q_SMEM=$((o & 1)) GPTOSS_ATTN_SOFTMAX_ORDER=$((o >> 1)) timeout 90 $BIN/attention_bench prefill \
              > "$OUT/s34b_attn_opt${o}_$pass.log" 2>&1
            echo "attention_bench opt $o pass $pass:"; grep -E "^prefill" "$OUT/s34b_attn_opt${o}_$pass.log"
          done
        done
        full8k() { cat "$OUT"/s34b_attn_opt$1_*.log | awk -F'|' '/^prefill T=8192 +full/ {s += $2; n++} END {print s / n}'; }
        f0=$(full8k 0); f2=$(full8k 2)
        echo "full 8k mean: opt 0 $f0 us, opt 2 $f2 us"
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        GPTOSS_ATTN_SOFTMAX_ORDER=1 timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters \
          --section InstructionStats --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1, .bool.0, 2' -c 1 -f \
          -o "$WORK/s34b_attn" $BIN/attention_bench "prefill T=8192" > "$OUT/s34b_ncu.log" 2>&1
        summary+=("s34b ncu rc=$?")
        $NCU -i "$WORK/s34b_attn.ncu-rep" --page details > "$OUT/s34b_details.txt" 2>&1
        $NCU -i "$WORK/s34b_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s34b_source.csv" 2>&1
        grep -E "Duration|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued" "$OUT/s34b_details.txt" | head -6
        if awk -v a="$f0" -v b="$f2" 'BEGIN {exit !(b < 0.99 * a)}'; then
          for v in 0 1 0 1; do
            f="$OUT/s34b_prefill_120b_order$v.$RANDOM.log"
            GPTOSS_ATTN_SOFTMAX_ORDER=$v GPTOSS_PROFILE=1 timeout 100 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 \
              --fp8-experts --prefill 8192 --batch "" --repeats 2 > "$f" 2>&1
            summary+=("s34b 120b order=$v rc=$?")
            echo "120b --fp8-experts ORDER=$v: $(grep -E "prefill +8192" "$f" | head -1)"
            grep -E "^  (moe|attention|total) " "$f"
          done
        fi
      fi
      ;;
    s34c)
      # Session 34, closing call: kOrder on by default (GPTOSS_ATTN_SOFTMAX_ORDER=0 the old schedule),
      # Q from shared memory removed. Attention, model and engine tests; attention_bench prefill
      # order 1 / 0 interleaved, two passes; ncu source of the default ping-pong kernel at 8k; the
      # bars: 8k prefill 20b, 120b --fp8-experts (stage profile), batch-1 decode at 1k 20b and 120b.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' > "$OUT/s34c_tests.log" 2>&1
      rc=$?
      summary+=("s34c tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s34c_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs|changes" "$OUT/s34c_tests.log" | head -20
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 1 0; do
            GPTOSS_ATTN_SOFTMAX_ORDER=$v timeout 90 $BIN/attention_bench prefill > "$OUT/s34c_attn_order${v}_$pass.log" 2>&1
            echo "attention_bench order $v pass $pass:"; grep -E "^prefill T=(8192|32768)" "$OUT/s34c_attn_order${v}_$pass.log"
          done
        done
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 120 $NCU --clock-control none --cache-control none --section SourceCounters \
          --section InstructionStats --section WarpStateStats --section SpeedOfLight --section SchedulerStats \
          --kernel-name-base demangled -k 'regex:prefill_tma_kernel<.bool.1, .bool.1, .bool.0, .bool.1' -c 1 -f \
          -o "$WORK/s34c_attn" $BIN/attention_bench "prefill T=8192" > "$OUT/s34c_ncu.log" 2>&1
        summary+=("s34c ncu rc=$?")
        $NCU -i "$WORK/s34c_attn.ncu-rep" --page details > "$OUT/s34c_details.txt" 2>&1
        $NCU -i "$WORK/s34c_attn.ncu-rep" --page source --csv --print-source sass > "$OUT/s34c_source.csv" 2>&1
        grep -E "Duration|Executed Instructions  |Eligible Warps|Warp Cycles Per Issued" "$OUT/s34c_details.txt" | head -6
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          GPTOSS_PROFILE=1 timeout 100 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 2 \
            > "$OUT/s34c_prefill_$tag.log" 2>&1
          summary+=("s34c prefill $tag rc=$?")
          echo "$tag: $(grep -E "prefill +8192" "$OUT/s34c_prefill_$tag.log" | head -1)"
          grep -E "^  (moe|attention|total) " "$OUT/s34c_prefill_$tag.log"
        done
        for m in gpt-oss-20b gpt-oss-120b; do
          timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
            --repeats 3 > "$OUT/s34c_decode_$m.log" 2>&1
          summary+=("s34c decode $m rc=$?")
          echo "$m batch 1:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s34c_decode_$m.log"
        done
      fi
      ;;
    s34d)
      # Session 34, last call: Q's fragments loaded before the KV tile's issue and wait (tile_front).
      # Attention tests; attention_bench prefill against the s34c binary (.device_pack/attention_bench_old.gz
      # = 199dde4), interleaved, two passes; 8k prefill 20b and 120b --fp8-experts (stage profile).
      timeout 120 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*' > "$OUT/s34d_tests.log" 2>&1
      rc=$?
      summary+=("s34d tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s34d_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|differs|changes" "$OUT/s34d_tests.log" | head -20
      if [ $rc = 0 ]; then
        gunzip -c .device_pack/attention_bench_old.gz > "$WORK/attention_bench_old" && chmod +x "$WORK/attention_bench_old"
        for pass in 1 2; do
          for v in old new; do
            b=$BIN/attention_bench; [ $v = old ] && b="$WORK/attention_bench_old"
            timeout 90 $b prefill > "$OUT/s34d_attn_${v}_$pass.log" 2>&1
            echo "attention_bench $v pass $pass:"; grep -E "^prefill" "$OUT/s34d_attn_${v}_$pass.log"
          done
        done
        for cfg in "gpt-oss-20b|" "gpt-oss-120b|--fp8-experts"; do
          m=${cfg%%|*}; x=${cfg#*|}; tag=$m${x:+_fp8x}
          GPTOSS_PROFILE=1 timeout 100 $BIN/gptoss bench --synthetic $m --fp8 $x --prefill 8192 --batch "" --repeats 2 \
            > "$OUT/s34d_prefill_$tag.log" 2>&1
          summary+=("s34d prefill $tag rc=$?")
          echo "$tag: $(grep -E "prefill +8192" "$OUT/s34d_prefill_$tag.log" | head -1)"
          grep -E "^  (moe|attention|total) " "$OUT/s34d_prefill_$tag.log"
        done
      fi
      ;;
    s34e)
      # Session 34, budget's end: with the softmax now ahead of the P·V wait (kOrder), are the
      # ping-pong turns still worth it on full layers? attention_bench prefill (the model's rule /
      # GPTOSS_ATTN_PINGPONG=0), interleaved, two passes; 120b --fp8-experts 8k prefill once each.
      for pass in 1 2; do
        for v in rule 0; do
          if [ $v = rule ]; then e=(env); else e=(env GPTOSS_ATTN_PINGPONG=0); fi
          "${e[@]}" GPTOSS_ATTN_OUT_Q=1 timeout 60 $BIN/attention_bench prefill > "$OUT/s34e_attn_pp${v}_$pass.log" 2>&1
          echo "attention_bench pingpong $v pass $pass:"; grep -E "^prefill T=(8192|32768) +full" "$OUT/s34e_attn_pp${v}_$pass.log"
        done
      done
      for v in rule 0; do
        if [ $v = rule ]; then e=(env); else e=(env GPTOSS_ATTN_PINGPONG=0); fi
        "${e[@]}" GPTOSS_PROFILE=1 timeout 80 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill 8192 \
          --batch "" --repeats 2 > "$OUT/s34e_prefill_120b_pp$v.log" 2>&1
        summary+=("s34e 120b pingpong $v rc=$?")
        echo "120b --fp8-experts pingpong $v: $(grep -E "prefill +8192" "$OUT/s34e_prefill_120b_pp$v.log" | head -1)"
        grep -E "^  (moe|attention|total) " "$OUT/s34e_prefill_120b_pp$v.log"
      done
      ;;
    s35a)
      # Session 35: the FP8 GEMVs' MMAs in f16 (e4m3 -> f16 by cvt, x staged once a CTA as f16;
      # GemvArgs::mma_f16, GPTOSS_GEMV_F16=0 for the bf16 MMAs). Tests, gemv_bench both ways, then
      # decode at 1k interleaved (20b batches 1-8 two passes, 120b batch 1), and the 20b kernel trace.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaFp8Gemv.*:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s35a_tests.log" 2>&1
      rc=$?
      summary+=("s35a tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s35a_tests.log" | head -40
      if [ $rc = 0 ]; then
        for v in 0 1; do
          GPTOSS_GEMV_F16=$v timeout 120 $BIN/gemv_bench 1 4 8 > "$OUT/s35a_gemv_f16$v.log" 2>&1
          echo "gemv_bench f16=$v:"; grep -E "^\|" "$OUT/s35a_gemv_f16$v.log" | grep -v -- "---"
        done
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_GEMV_F16=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,8 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s35a_20b_f16${v}_$pass.log" 2>&1
            summary+=("s35a 20b f16=$v pass $pass rc=$?")
            echo "20b f16=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35a_20b_f16${v}_$pass.log"
          done
        done
        for v in 0 1; do
          GPTOSS_GEMV_F16=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
            --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s35a_120b_f16$v.log" 2>&1
          summary+=("s35a 120b f16=$v rc=$?")
          echo "120b f16=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35a_120b_f16$v.log"
        done
        GPTOSS_KERNEL_TRACE="$OUT/s35a_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s35a_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s35a_ktrace_20b.csv"
      fi
      ;;
    s35b)
      # Session 35: s35a's f16 MMAs at one token only, and lm_head's 12,568 tiles on the 2-an-SM
      # kernel in f16 (kAuto). Tests, gemv_bench, decode at 1k interleaved (20b batches 1-2 two
      # passes, 120b batch 1 two passes), the 20b kernel trace.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaFp8Gemv.*:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s35b_tests.log" 2>&1
      rc=$?
      summary+=("s35b tests rc=$rc")
      grep -E "OK \]|FAILED|Failure" "$OUT/s35b_tests.log" | head -40
      if [ $rc = 0 ]; then
        timeout 120 $BIN/gemv_bench 1 > "$OUT/s35b_gemv.log" 2>&1
        grep -E "^\| (lm_head|qkv|o_proj)" "$OUT/s35b_gemv.log" | grep mma
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_GEMV_F16=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s35b_20b_f16${v}_$pass.log" 2>&1
            summary+=("s35b 20b f16=$v pass $pass rc=$?")
            echo "20b f16=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35b_20b_f16${v}_$pass.log"
          done
        done
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_GEMV_F16=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s35b_120b_f16${v}_$pass.log" 2>&1
            summary+=("s35b 120b f16=$v pass $pass rc=$?")
            echo "120b f16=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35b_120b_f16${v}_$pass.log"
          done
        done
        GPTOSS_KERNEL_TRACE="$OUT/s35b_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s35b_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s35b_ktrace_20b.csv"
      fi
      ;;
    s35c)
      # Session 35: decode MoE on the FP8 copy of the experts (moe_decode_fp8; the model takes it up to
      # GPTOSS_MOE_DECODE_FP8_MAX_TOKENS rows, default 8, 0 = the MXFP4 kernels). Tests, then decode at
      # 1k interleaved: 20b batches 1-8 two passes, 120b --fp8-experts batches 1-2 (its FP8 copy is the
      # only one: off = the grouped prompt kernels), and the 20b kernel trace.
      timeout 400 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeFp8*:CudaOps.MoeDecodeMma*:CudaFp8Gemv.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s35c_tests.log" 2>&1
      rc=$?
      summary+=("s35c tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|moe decode fp8" "$OUT/s35c_tests.log" | head -40
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 8; do
            GPTOSS_MOE_DECODE_FP8_MAX_TOKENS=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" \
              --batch 1,2,4,8 --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s35c_20b_fp8moe${v}_$pass.log" 2>&1
            summary+=("s35c 20b fp8 moe max $v pass $pass rc=$?")
            echo "20b decode MoE on FP8 up to $v rows, pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35c_20b_fp8moe${v}_$pass.log"
          done
        done
        for v in 0 8; do
          GPTOSS_MOE_DECODE_FP8_MAX_TOKENS=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts \
            --prefill "" --batch 1,2 --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s35c_120b_fp8moe$v.log" 2>&1
          summary+=("s35c 120b --fp8-experts fp8 moe max $v rc=$?")
          echo "120b --fp8-experts, decode MoE on FP8 up to $v rows:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35c_120b_fp8moe$v.log"
        done
        GPTOSS_KERNEL_TRACE="$OUT/s35c_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s35c_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s35c_ktrace_20b.csv"
      fi
      ;;
    s35d)
      # Session 35, the closing run: the changed tests, then the bars with the shipped defaults (f16
      # GEMVs at one token; moe_decode_fp8 only where the FP8 experts are the only copy, at 1 row):
      # batch-1 decode at 1k (20b, 120b, 120b --fp8-experts), 8k prefill (20b, 120b --fp8-experts).
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaModel.Fp8WeightsStayCloseToFp32:CudaOps.MoeDecodeFp8*:CudaFp8Gemv.*:CudaQkvFused.*' \
        > "$OUT/s35d_tests.log" 2>&1
      summary+=("s35d tests rc=$?")
      grep -E "OK \]|FAILED|Failure|decode MoE on the FP8|experts only vs|converted a layer" "$OUT/s35d_tests.log" | head -30
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,8 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s35d_20b_decode.log" 2>&1
      summary+=("s35d 20b decode rc=$?")
      echo "20b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35d_20b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s35d_120b_decode.log" 2>&1
      summary+=("s35d 120b decode rc=$?")
      echo "120b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35d_120b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill 8192 --batch 1 --context 1024 \
        --decode-steps 64 --repeats 2 > "$OUT/s35d_120b_fp8x.log" 2>&1
      summary+=("s35d 120b --fp8-experts rc=$?")
      echo "120b --fp8 --fp8-experts:"; grep -E "prefill +8192|^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35d_120b_fp8x.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill 8192 --batch "" --repeats 3 \
        > "$OUT/s35d_20b_prefill.log" 2>&1
      summary+=("s35d 20b prefill rc=$?")
      echo "20b --fp8 8k prefill: $(grep -E "prefill +8192" "$OUT/s35d_20b_prefill.log" | head -1)"
      ;;
    s35e)
      # Session 35, budget's end: the f16 GEMVs (GPTOSS_GEMV_F16=0 / default) at 8k and 32k context,
      # 20b batch 1 interleaved; 120b batch 1 at 1k once more (the bar's figure, a second sample).
      for v in 0 1; do
        GPTOSS_GEMV_F16=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 \
          --context 8192,32768 --decode-steps 64 --repeats 3 > "$OUT/s35e_20b_f16$v.log" 2>&1
        summary+=("s35e 20b f16=$v rc=$?")
        echo "20b f16=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35e_20b_f16$v.log"
      done
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s35e_120b.log" 2>&1
      summary+=("s35e 120b rc=$?")
      echo "120b:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35e_120b.log"
      ;;
    s35f)
      # Session 35, after the review's refactor (moe_decode_fp8 through moe_decode_mma's epilogue; the
      # model's decode MoE arguments shared; PTX of moe_decode_mma unchanged): the tests, 20b batch 1.
      timeout 200 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeFp8*:CudaFp8Gemv.*:CudaModel.*:CudaEngine.*' > "$OUT/s35f_tests.log" 2>&1
      summary+=("s35f tests rc=$?")
      grep -E "OK \]|FAILED|Failure" "$OUT/s35f_tests.log" | head -20
      timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s35f_20b.log" 2>&1
      summary+=("s35f 20b rc=$?")
      echo "20b:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s35f_20b.log"
      ;;
    s36a)
      # Session 36: the residual update after each decode MoE in its down launch (MoeResidualTail) and
      # the next norm's 1 / rms in the QKV GEMV (no norm kernel between them; GPTOSS_MOE_TAIL=0 off).
      # Tests, then decode at 1k interleaved (20b batches 1-2 and 120b batch 1, two passes each), the
      # 20b kernel trace with the tail.
      timeout 450 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeResidualTail*:CudaOps.MoeDecodeFp8*:CudaOps.MoeDecodeMma*:CudaFp8Gemv.*:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s36a_tests.log" 2>&1
      rc=$?
      summary+=("s36a tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|residual tail|x_ss_parts" "$OUT/s36a_tests.log" | head -60
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_MOE_TAIL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s36a_20b_tail${v}_$pass.log" 2>&1
            summary+=("s36a 20b tail=$v pass $pass rc=$?")
            echo "20b tail=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36a_20b_tail${v}_$pass.log"
          done
        done
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_MOE_TAIL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s36a_120b_tail${v}_$pass.log" 2>&1
            summary+=("s36a 120b tail=$v pass $pass rc=$?")
            echo "120b tail=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36a_120b_tail${v}_$pass.log"
          done
        done
        GPTOSS_KERNEL_TRACE="$OUT/s36a_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s36a_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s36a_ktrace_20b.csv"
      fi
      ;;
    s36b)
      # s36a's measurements without its tests (the binary's tests ran in s36a): decode at 1k
      # interleaved, GPTOSS_MOE_TAIL 0 / 1 (20b batches 1-2 and 120b batch 1, two passes), the 20b trace.
      for pass in 1 2; do
        for v in 0 1; do
          GPTOSS_MOE_TAIL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
            --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s36b_20b_tail${v}_$pass.log" 2>&1
          summary+=("s36b 20b tail=$v pass $pass rc=$?")
          echo "20b tail=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36b_20b_tail${v}_$pass.log"
        done
      done
      for pass in 1 2; do
        for v in 0 1; do
          GPTOSS_MOE_TAIL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
            --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s36b_120b_tail${v}_$pass.log" 2>&1
          summary+=("s36b 120b tail=$v pass $pass rc=$?")
          echo "120b tail=$v pass $pass:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36b_120b_tail${v}_$pass.log"
        done
      done
      GPTOSS_KERNEL_TRACE="$OUT/s36b_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
        --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s36b_ktrace_20b.log" 2>&1
      python3 tools/ktrace_summary.py "$OUT/s36b_ktrace_20b.csv"
      ;;
    s36c)
      # Session 36, the closing run: s36a's tests on the shipped code, then the batch-1 decode bars at 1k
      # with the residual tail on (the default): 20b batches 1-8, 120b, 120b --fp8-experts.
      timeout 450 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeResidualTail*:CudaOps.MoeDecodeFp8*:CudaOps.MoeDecodeMma*:CudaFp8Gemv.*:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s36c_tests.log" 2>&1
      summary+=("s36c tests rc=$?")
      grep -E "OK \]|FAILED|Failure|residual tail" "$OUT/s36c_tests.log" | head -40
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,8 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s36c_20b_decode.log" 2>&1
      summary+=("s36c 20b decode rc=$?")
      echo "20b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36c_20b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s36c_120b_decode.log" 2>&1
      summary+=("s36c 120b decode rc=$?")
      echo "120b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36c_120b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s36c_120b_fp8x_decode.log" 2>&1
      summary+=("s36c 120b --fp8-experts decode rc=$?")
      echo "120b --fp8 --fp8-experts decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36c_120b_fp8x_decode.log"
      ;;
    s36d)
      # (Measured slower and removed after the run: ce9dc31 has the form.)
      # Session 36: MoeResidualTail::cluster (GPTOSS_MOE_TAIL=2: the down launch as clusters of a tile's
      # CTAs meeting in CTA 0's shared memory) against the ticket (1) and no tail (0). Tests (the tail
      # test covers both forms; the model test with =2), then decode at 1k interleaved: 20b batch 1
      # two passes, 120b one (=0 is s36b's); the 20b trace with =2.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeResidualTail*:CudaQkvFused.AppliesTheNormScale' \
        > "$OUT/s36d_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_TAIL=2 timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.Fp8ResidualTailStaysClose' \
        >> "$OUT/s36d_tests.log" 2>&1
      rc=$((rc + $?))
      summary+=("s36d tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|residual tail" "$OUT/s36d_tests.log" | head -20
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 1 2; do
            GPTOSS_MOE_TAIL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s36d_20b_tail${v}_$pass.log" 2>&1
            echo "20b tail=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36d_20b_tail${v}_$pass.log")"
          done
          for v in 1 2; do
            [ $pass = 2 ] && continue  # one pass (device budget)
            GPTOSS_MOE_TAIL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s36d_120b_tail${v}_$pass.log" 2>&1
            echo "120b tail=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s36d_120b_tail${v}_$pass.log")"
          done
        done
        GPTOSS_MOE_TAIL=2 GPTOSS_KERNEL_TRACE="$OUT/s36d_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b \
          --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s36d_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s36d_ktrace_20b.csv"
      fi
      ;;
    s38b)
      # Branch s38-down-loop (session 37, compiled only): moe_decode_mma_down_loop_kernel, down at 1-2 tokens
      # as a loop over tiles (GPTOSS_MOE_DOWN_LOOP=1). The bitwise test (with MoeResidualTail), the model and
      # engine tests with it on, then decode at 1k interleaved 0 / 1: 20b and 120b batch 1, 20b batch 2, two passes.
      timeout 120 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMmaLoop*' > "$OUT/s38b_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_DOWN_LOOP=1 timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        >> "$OUT/s38b_tests.log" 2>&1
      rc=$((rc + $?))
      summary+=("s38b tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38b_tests.log" | tail -6
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for cfg in "20b 1" "120b 1" "20b 2"; do
            set -- $cfg
            for v in 0 1; do
              GPTOSS_MOE_DOWN_LOOP=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$1 --fp8 --prefill "" \
                --batch $2 --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38b_$1_b$2_down${v}_$pass.log" 2>&1
              echo "$1 batch $2 down_loop=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38b_$1_b$2_down${v}_$pass.log")"
            done
          done
        done
      fi
      ;;
    s42a)
      # Needs bench/results/2026-12-04_h200_r56/s42-spin-stagger-down5.patch (or s42-combined.patch) applied (git
      # apply; build_for_gpu.sh).
      # Session 42 (written in session 41, compiled only), from r56's stamps: (1) the gate_up loop kernel's stagger
      # waiting on %globaltimer from pdl_wait (GPTOSS_MOE_STAGGER_SPIN=1; __nanosleep slept at most ~0.8 µs, so W 2000
      # was a 0.4-0.8 µs stagger); (2) down's one-tile kernel at 5 CTAs an SM (GPTOSS_MOE_DOWN_MINBLOCKS=5: 96
      # registers, 104 bytes of spill; 660 of 720 tiles resident, a second round of 60 instead of 192). Tests with
      # both on, then 20b batch 1 default / spin W 2000 / 3000 / 4000 / down5 two passes, 120b default / spin 3000 /
      # down5, and stamped 20b rows of spin 3000 and down5.
      tests_row s42a_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*' GPTOSS_MOE_STAGGER_SPIN=1 GPTOSS_MOE_DOWN_MINBLOCKS=5
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          decode_row "s42a_20b_b1_default_$pass" 20b 1
          for w in 2000 3000 4000; do
            decode_row "s42a_20b_b1_spin${w}_$pass" 20b 1 GPTOSS_MOE_STAGGER_SPIN=1 GPTOSS_MOE_STAGGER_NS=$w
          done
          decode_row "s42a_20b_b1_down5_$pass" 20b 1 GPTOSS_MOE_DOWN_MINBLOCKS=5
        done
        decode_row s42a_120b_b1_default 120b 1
        decode_row s42a_120b_b1_spin3000 120b 1 GPTOSS_MOE_STAGGER_SPIN=1 GPTOSS_MOE_STAGGER_NS=3000
        decode_row s42a_120b_b1_down5 120b 1 GPTOSS_MOE_DOWN_MINBLOCKS=5
        decode_row s42a_20b_b1_spin3000_stamps 20b 1 GPTOSS_MOE_STAGGER_SPIN=1 GPTOSS_MOE_STAGGER_NS=3000 \
          GPTOSS_MOE_STAMPS="$OUT/s42a_stamps_spin3000.csv"
        decode_row s42a_20b_b1_down5_stamps 20b 1 GPTOSS_MOE_DOWN_MINBLOCKS=5 GPTOSS_MOE_STAMPS="$OUT/s42a_stamps_down5.csv"
        for f in spin3000 down5; do
          python3 tools/moe_stamps.py "$OUT/s42a_stamps_$f.csv" > "$OUT/s42a_stamps_$f.txt" 2>&1
          head -40 "$OUT/s42a_stamps_$f.txt"
        done
        gzip -f "$OUT"/s42a_stamps_*.csv
      fi
      ;;
    s42b)
      # Needs bench/results/2026-12-04_h200_r56/s42-combined.patch applied (r55's stage and wait-first switches, r56's
      # down2 and s42a's switches, with the stamping instantiations of the stage form and of down2; compiled only).
      # The per-CTA timelines of the forms that lost without a reason (NOTES r56 Next 2-3): the gate_up stage form 2
      # and down2 (second tiles copied before pdl_wait), beside a stamped default row; the bits test (stage
      # variants 7-12, down2 13-15) first.
      # The q loop's second multiply decided a step at a time (GPTOSS_MOE_STEP_TWO=1: the first MMA waits for its own
      # step's loads only, not for the tile's last scale): its tests and a stamped row (its A/B is s42c).
      tests_row s42b_tests_bits 'CudaOps.MoeDecodeMmaLoopIsTheSameBits'
      failed=$rc
      tests_row s42b_tests_steptwo 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' GPTOSS_MOE_STEP_TWO=1
      failed=$((failed + rc))
      # The loop's q loop in two halves, the next tile's halves loaded as each half's registers free up
      # (GPTOSS_MOE_LOOP_HALVES=1; the same bits): its tests with the model and engine tests.
      tests_row s42b_tests_halves 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*' \
        GPTOSS_MOE_LOOP_HALVES=1
      if [ $((failed + rc)) = 0 ]; then
        decode_row s42b_20b_b1_halves_stamps 20b 1 GPTOSS_MOE_LOOP_HALVES=1 GPTOSS_MOE_STAMPS="$OUT/s42b_stamps_halves.csv"
        decode_row s42b_20b_b1_default_stamps 20b 1 GPTOSS_MOE_STAMPS="$OUT/s42b_stamps_default.csv"
        decode_row s42b_20b_b1_stage2_stamps 20b 1 GPTOSS_MOE_LOOP_STAGE=2 GPTOSS_MOE_STAMPS="$OUT/s42b_stamps_stage2.csv"
        decode_row s42b_20b_b1_down2_stamps 20b 1 GPTOSS_MOE_DOWN2=1 GPTOSS_MOE_STAMPS="$OUT/s42b_stamps_down2.csv"
        decode_row s42b_20b_b1_steptwo_stamps 20b 1 GPTOSS_MOE_STEP_TWO=1 GPTOSS_MOE_STAMPS="$OUT/s42b_stamps_steptwo.csv"
        # The loop kernels' SASS (the default's and kStepTwo's: where the q loop's first MMA waits on the tile's
        # loads, i.e. which scoreboards the first step's uses wait for), for reading offline.
        CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
        if [ -n "$CUOBJDUMP" ]; then
          $CUOBJDUMP -sass $BIN/gptoss | awk '/Function :/{p = ($3 ~ /moe_decode_mma_loop_kernel/)} p' \
            > "$OUT/s42b_loop_sass.txt" 2>&1
          gzip -f "$OUT/s42b_loop_sass.txt"
        fi
        for f in default stage2 down2 steptwo halves; do
          python3 tools/moe_stamps.py "$OUT/s42b_stamps_$f.csv" > "$OUT/s42b_stamps_$f.txt" 2>&1
          head -22 "$OUT/s42b_stamps_$f.txt"
        done
        gzip -f "$OUT"/s42b_stamps_*.csv
      fi
      ;;
    s44a)
      # Needs bench/results/2026-12-04_h200_r56/s42-combined.patch applied (session 44: r56's queue in one call, A/B
      # only, no stamps). The switches: the q loop's second multiply decided a step at a time (GPTOSS_MOE_STEP_TWO=1),
      # the q loop in halves with the next tile's halves loaded as they free up (GPTOSS_MOE_LOOP_HALVES=1), the stagger
      # spinning on %globaltimer (GPTOSS_MOE_STAGGER_SPIN=1, W 3000 ns) and down's one-tile kernel at 5 CTAs an SM
      # (GPTOSS_MOE_DOWN_MINBLOCKS=5). Their tests, the CUDA serve check, then 20b batch 1 at 1k two interleaved
      # passes of the five forms, 120b default / step-two / halves.
      tests_row s44a_tests_bits 'CudaOps.MoeDecodeMmaLoopIsTheSameBits'
      failed=$rc
      tests_row s44a_tests_steptwo 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' GPTOSS_MOE_STEP_TWO=1
      failed=$((failed + rc))
      tests_row s44a_tests_halves 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*' \
        GPTOSS_MOE_LOOP_HALVES=1
      failed=$((failed + rc))
      tests_row s44a_tests_spin_down5 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' GPTOSS_MOE_STAGGER_SPIN=1 \
        GPTOSS_MOE_DOWN_MINBLOCKS=5
      failed=$((failed + rc))
      serve_check s44a_serve
      if [ $failed = 0 ]; then
        for pass in 1 2; do
          decode_row "s44a_20b_b1_default_$pass" 20b 1
          decode_row "s44a_20b_b1_steptwo_$pass" 20b 1 GPTOSS_MOE_STEP_TWO=1
          decode_row "s44a_20b_b1_halves_$pass" 20b 1 GPTOSS_MOE_LOOP_HALVES=1
          decode_row "s44a_20b_b1_spin3000_$pass" 20b 1 GPTOSS_MOE_STAGGER_SPIN=1 GPTOSS_MOE_STAGGER_NS=3000
          decode_row "s44a_20b_b1_down5_$pass" 20b 1 GPTOSS_MOE_DOWN_MINBLOCKS=5
        done
        decode_row s44a_120b_b1_default 120b 1
        decode_row s44a_120b_b1_steptwo 120b 1 GPTOSS_MOE_STEP_TWO=1
        decode_row s44a_120b_b1_halves 120b 1 GPTOSS_MOE_LOOP_HALVES=1
      fi
      ;;
    s44t)
      # Session 44's closing call: issue 6's tables on the shipped build (the `tables` stage: prefill by input length,
      # decode batch 1-128 at 8k and 32k, 20b with the FP8 KV cache at 32k), the 120b --fp8-experts prefill rows, the
      # batch-1 bars, and the CUDA serve check; first the model and engine tests (host-side loading changed).
      tests_row s44t_tests 'CudaModel.*:CudaEngine.*'
      decode_row s44t_20b_b1 20b 1
      decode_row s44t_120b_b1 120b 1
      issue6_tables
      timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8-experts --fp8 --prefill 1024,2048,4096,8192 --batch "" \
        --repeats 3 --json "$OUT/prefill_120bfp8experts.json" --markdown "$OUT/prefill_120bfp8experts.md" \
        > "$OUT/prefill_120bfp8experts.log" 2>&1
      summary+=("prefill 120b fp8-experts rc=$?")
      grep -E "^\| [0-9]+ \|" "$OUT/prefill_120bfp8experts.md"
      serve_check s44t_serve
      ;;
    s45a_ab)
      # s45a's rows without its test gate (r61 call 1: the model test found mode 3 giving mode 1's bits, i.e. the
      # full layers' split not taken there): 20b / 120b batch 1 at 1k tail1 / tail3 interleaved, 20b at 3,968.
      s45a_rows
      ;;
    s45bc_ab)
      # s45bc's rows without its test gate (r61 call 2: its filter took in the mode-3 model test, which fails;
      # the MoE tests passed): 20b three interleaved passes of old / plan first / both, 120b one.
      s45bc_rows 1
      ;;
    s45bc)
      # s45b and s45c in one call (session 46: device time for two calls only): needs the plan-first and
      # down-prefetch patches of bench/results/2026-12-05_h200_r60 applied. Their tests with both on (and the loop's
      # same-bits test in the old order), then 20b batch 1 at 1k three interleaved passes of old order (PLAN_FIRST=0) /
      # plan first (the patch's default) / plan first + down prefetch, 120b two passes. No stamps.
      tests_row s45bc_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*' \
        GPTOSS_MOE_DOWN_PREFETCH=1
      failed=$rc
      tests_row s45bc_tests_old 'CudaOps.MoeDecodeMmaLoopIsTheSameBits' GPTOSS_MOE_PLAN_FIRST=0
      if [ $((failed + rc)) = 0 ]; then
        s45bc_rows 2
      fi
      ;;
    s45c)
      # Needs bench/results/2026-12-05_h200_r60/s45-down-prefetch.patch applied (session 45, compiled only; applies
      # with the other two). GPTOSS_MOE_DOWN_PREFETCH=1: down's one-tile kernel at one token, CTA b < grid − R (R the
      # resident CTAs) asks L2 for tile R + b's weights and scales after its pdl_wait (gate_up done), so that down's
      # second round (r56: ~6-7 µs a layer, its loads issued at its start) reads L2. The same bits: the MoE / model /
      # engine tests with it on; then 20b batch 1 at 1k off / on three interleaved pairs, 120b two (the stamping
      # instantiation has no prefetch: GPTOSS_MOE_STAMPS takes precedence).
      tests_row s45c_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*' \
        GPTOSS_MOE_DOWN_PREFETCH=1
      if [ "$rc" = 0 ]; then
        ab_pairs s45c off - prefetch GPTOSS_MOE_DOWN_PREFETCH=1
      fi
      ;;
    s45b)
      # Needs bench/results/2026-12-05_h200_r60/s45-plan-first.patch applied (session 45, compiled only; it applies
      # with or without s45-split-tail.patch). The gate_up loop kernel's warp 0 requests the plan's offsets, then its
      # share of x, and reads the offsets after (kPlanFirst; GPTOSS_MOE_PLAN_FIRST=0 the old order): r56's stamps had
      # find_all then the staging, 1.4 µs from pdl_wait to the first tile's loads. The same bits (the loop test), then
      # 20b batch 1 at 1k new / old three interleaved pairs, 120b two, and a stamped row of each (event 2: the
      # barrier before the first tile's loads).
      tests_row s45b_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*'
      failed=$rc
      tests_row s45b_tests_old 'CudaOps.MoeDecodeMmaLoopIsTheSameBits' GPTOSS_MOE_PLAN_FIRST=0
      if [ $((failed + rc)) = 0 ]; then
        ab_pairs s45b planfirst - old GPTOSS_MOE_PLAN_FIRST=0
        decode_row s45b_20b_b1_planfirst_stamps 20b 1 GPTOSS_MOE_STAMPS="$OUT/s45b_stamps_planfirst.csv"
        decode_row s45b_20b_b1_old_stamps 20b 1 GPTOSS_MOE_PLAN_FIRST=0 GPTOSS_MOE_STAMPS="$OUT/s45b_stamps_old.csv"
        for f in planfirst old; do
          python3 tools/moe_stamps.py "$OUT/s45b_stamps_$f.csv" > "$OUT/s45b_stamps_$f.txt" 2>&1
          head -12 "$OUT/s45b_stamps_$f.txt"
        done
        gzip -f "$OUT"/s45b_stamps_*.csv
      fi
      ;;
    s45a)
      # Needs bench/results/2026-12-05_h200_r60/s45-split-tail.patch applied (session 45, compiled only; r57's Next item
      # 2). GPTOSS_QKV_ATTN_TAIL=3: sliding layers as 1, and each full layer's decode attention split over its kv head's
      # 40 QKV CTAs: chunk c (keys 128c ..) in the CTA of q head 8·kvh + c / 4, tile c % 4, copied into shared memory
      # before pdl_wait; after the projection a spin on the kv head's ticket (the grid is resident: checked), the
      # token's own row, the chunk, a partial a head; the last split merges them with the sink. Its tests (the kernel
      # against the CPU and the decode kernel, to 4,096 keys; the model and engine with =3), then 20b batch 1 at 1k
      # mode 1 / 3 three interleaved pairs, 120b two, 20b at 3,968 context (32 chunks) one pair, a 20b trace with =3.
      tests_row s45a_tests 'CudaQkvFused.*:PagedAttentionCuda.Decode*'
      failed=$rc
      tests_row s45a_tests_model 'CudaModel.Fp8*:CudaEngine.*' GPTOSS_QKV_ATTN_TAIL=3
      if [ $((failed + rc)) = 0 ]; then
        s45a_rows
        ktrace_row s45a_ktrace_20b_tail3 20b GPTOSS_QKV_ATTN_TAIL=3
        gzip -f "$OUT"/s45a_ktrace_*.csv
      fi
      ;;
    shared_prefix)
      # Session 50 (no device that session): the engine tests after the scheduler's shared-prefix wait, the serve
      # check, and n = 4 completions with and without the wait (see shared_prefix_timing).
      # Also the sample kernels' tests: sampling.cu's shared helpers (90119e8) were checked by their PTX only.
      serve_check shared_prefix_serve
      tests_row shared_prefix_tests 'CudaEngine.*:CudaModel.Fp8*:CudaOps.Split*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      shared_prefix_timing shared_prefix_20b
      decode_row shared_prefix_20b_b1 20b 1
      ;;
    vllm_only)
      vllm_flags_check vllm_only  # (SERVE_BACKEND=cpu: on the development machine)
      ;;
    serve_only)
      # The serve check alone (SERVE_BACKEND=cpu runs it on the development machine, .device/gptoss a build's binary).
      serve_check serve_only
      ;;
    s57)
      # Needs bench/results/2026-12-06_h100_r72/s57-down-smem.patch applied (r72: slower in every form, not in src/).
      # Session 57: down at one token with its words in shared memory, all 720 CTAs resident
      # (moe_decode_mma_down_smem_kernel, GPTOSS_MOE_DOWN_SMEM=1..4; off by default). Its tests (the same bits as the
      # register kernel; edge shapes against the CPU), the model / engine tests with form 3, then 20b batch 1 at 1k
      # two interleaved passes of the default and forms 1-4, 120b default / 2 / 3 / default / 3, and a 20b kernel
      # trace of the default and form 3.
      tests_row s57_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*'
      failed=$rc
      tests_row s57_tests_model 'CudaModel.Fp8*:CudaEngine.*' GPTOSS_MOE_DOWN_SMEM=3
      failed=$((failed + rc))
      if [ $failed = 0 ]; then
        for pass in 1 2; do
          decode_row "s57_20b_b1_default_$pass" 20b 1
          for f in 1 2 3 4; do decode_row "s57_20b_b1_smem${f}_$pass" 20b 1 GPTOSS_MOE_DOWN_SMEM=$f; done
        done
        decode_row s57_120b_b1_default_1 120b 1
        decode_row s57_120b_b1_smem2_1 120b 1 GPTOSS_MOE_DOWN_SMEM=2
        decode_row s57_120b_b1_smem3_1 120b 1 GPTOSS_MOE_DOWN_SMEM=3
        decode_row s57_120b_b1_default_2 120b 1
        decode_row s57_120b_b1_smem3_2 120b 1 GPTOSS_MOE_DOWN_SMEM=3
        ktrace_row s57_ktrace_default 20b
        ktrace_row s57_ktrace_smem3 20b GPTOSS_MOE_DOWN_SMEM=3
      fi
      ;;
    s57b)
      # Needs bench/results/2026-12-06_h100_r72/s57-down-smem.patch applied.
      # Session 57, call 2: down's shared-memory forms 5 / 6 (3 / 4 with pdl_trigger after the q loop, so that the next
      # QKV GEMV's CTAs and their early weight loads come only after down's burst). Tests with 5, then 20b batch 1 two
      # interleaved passes of default / 3 / 5 / 6, 120b default / 5, a 20b trace of form 5.
      tests_row s57b_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*' GPTOSS_MOE_DOWN_SMEM=5
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          decode_row "s57b_20b_b1_default_$pass" 20b 1
          for f in 3 5 6; do decode_row "s57b_20b_b1_smem${f}_$pass" 20b 1 GPTOSS_MOE_DOWN_SMEM=$f; done
        done
        decode_row s57b_120b_b1_default 120b 1
        decode_row s57b_120b_b1_smem5 120b 1 GPTOSS_MOE_DOWN_SMEM=5
        ktrace_row s57b_ktrace_smem5 20b GPTOSS_MOE_DOWN_SMEM=5
      fi
      ;;
    s57c)
      # Needs bench/results/2026-12-06_h100_r72/s57-down-smem.patch applied.
      # Session 57, call 3: where down's shared-memory forms lose (r72: +6 µs a layer). Stamped 20b batch-1 rows of the
      # register kernel (default), form 3 (copies after pdl_wait, a step at a time) and form 1 (copies before the wait),
      # each summarised by tools/moe_stamps.py; the down kernels' SASS for reading offline.
      for cfg in "default" "smem3 GPTOSS_MOE_DOWN_SMEM=3" "smem1 GPTOSS_MOE_DOWN_SMEM=1"; do
        set -- $cfg
        n=$1
        shift
        decode_row "s57c_20b_b1_${n}_stamps" 20b 1 "$@" GPTOSS_MOE_STAMPS="$OUT/s57c_stamps_$n.csv"
        python3 tools/moe_stamps.py "$OUT/s57c_stamps_$n.csv" > "$OUT/s57c_stamps_$n.txt" 2>&1
        echo "== $n"; head -45 "$OUT/s57c_stamps_$n.txt"
      done
      CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      if [ -n "$CUOBJDUMP" ]; then
        $CUOBJDUMP -sass $BIN/gptoss | awk '/Function :/{p = ($3 ~ /moe_decode_mma_(down_smem_kernel|kernelILb0ELi4ELb0ELi0ELb0)/)} p' \
          > "$OUT/s57c_down_sass.txt" 2>&1
        gzip -f "$OUT/s57c_down_sass.txt"
      fi
      ;;
    s63)
      # Session 63: the decode layout, batch 1 (two 120b pairs on an H200).
      packed_check s63 2
      ;;
    s63b)
      # Session 63, second call: 20b batch 2 / 4 / 8 each way, stamped 20b batch-1 rows each way (tools/moe_stamps.py).
      for b in 2 4 8; do
        decode_row "s63b_20b_b${b}_default" 20b $b
        decode_row "s63b_20b_b${b}_packed" 20b $b GPTOSS_MOE_PACKED=1
      done
      for cfg in "default" "packed GPTOSS_MOE_PACKED=1"; do
        set -- $cfg
        n=$1
        shift
        decode_row "s63b_20b_b1_${n}_stamps" 20b 1 "$@" GPTOSS_MOE_STAMPS="$OUT/s63b_stamps_$n.csv"
        python3 tools/moe_stamps.py "$OUT/s63b_stamps_$n.csv" > "$OUT/s63b_stamps_$n.txt" 2>&1
        rm -f "$OUT/s63b_stamps_$n.csv"
        echo "== $n"; head -30 "$OUT/s63b_stamps_$n.txt"
      done
      ;;
    s77)
      # Session 64 (r77): the decode layout with its scale pair as two byte loads (r77 call 2's stamps: the 16-bit
      # load's split waited in the loop kernel's epilogue); batches 1, 2, 4, stamps of the packed kernel, one 120b pair.
      packed_check s77 1 2 4
      if [ $rc = 0 ]; then
        decode_row "s77_20b_b1_packed_stamps" 20b 1 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_STAMPS="$OUT/s77_stamps.csv"
        python3 tools/moe_stamps.py "$OUT/s77_stamps.csv" > "$OUT/s77_stamps.txt" 2>&1
        rm -f "$OUT/s77_stamps.csv"
      fi
      ;;
    s80)
      # Session 67: r79's TMA decode pieces measured slower or equal (H100: attention_bench at one sequence, 32k,
      # 33.5 → 35.7 µs in the default shape; 20b batch 1 at 1k 1.495 → 1.536-1.539 ms) and taken out, the attention
      # source back to session 65's (808b7f8). The attention tests and the model / engine tests on it, 20b batch 1 at
      # 1k and 32k, 120b batch 1 at 1k.
      tests_row s80_attn 'PagedAttentionCuda.*'
      tests_row s80_model 'CudaModel.*:CudaEngine.*'
      for c in 1024 32768; do
        timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context $c \
          --decode-steps 64 --repeats 3 > "$OUT/s80_20b_b1_ctx$c.log" 2>&1
        echo "s80_20b_b1_ctx$c: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s80_20b_b1_ctx$c.log")"
      done
      timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s80_120b_b1_ctx1024.log" 2>&1
      echo "s80_120b_b1_ctx1024: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s80_120b_b1_ctx1024.log")"
      ;;
    s78)
      # Session 65: the FP8 scale floor's device test (compiled only since session 64), then what holds one
      # sequence's decode attention at long context (r44 Next 2, never run): attention_bench's decode rows at 1, 2, 4
      # and 8 sequences with and without the cluster merge, and ncu of the decode kernel at one sequence, 32k (cluster
      # and combine paths) against eight sequences, 32k (4.2 TB/s in r44): DRAM rate, occupancy, stall reasons, the
      # most-stalled SASS lines.
      tests_row s78_fp8 'CudaFp8Gemm.ActivationQuantizer*'
      for b in 1 2 4 8; do
        timeout 60 $BIN/attention_bench "decode B=$b ctx" > "$OUT/s78_attn_b$b.log" 2>&1
        GPTOSS_ATTN_DECODE_CLUSTER=0 timeout 60 $BIN/attention_bench "decode B=$b ctx" > "$OUT/s78_attn_b${b}_nocl.log" 2>&1
        echo "== B=$b (cluster merge where the default takes it; then without)"
        grep -E "^decode" "$OUT/s78_attn_b$b.log"
        grep -E "^decode" "$OUT/s78_attn_b${b}_nocl.log"
      done
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for cfg in "b1_cl 1 -" "b1_nocl 1 0" "b8 8 -"; do
        set -- $cfg
        tag=$1 b=$2 cl=$3
        envs=()
        [ "$cl" = - ] || envs=(GPTOSS_ATTN_DECODE_CLUSTER=$cl)
        env "${envs[@]}" timeout 200 $NCU --clock-control none --cache-control none --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
          --section LaunchStats --section SourceCounters \
          --metrics 'dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__sass_inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active' \
          -k regex:bf16_paged_attention_decode_kernel -s 4 -c 1 -f -o "$OUT/s78_ncu_$tag" $BIN/attention_bench \
          "decode B=$b ctx=32768" > "$OUT/s78_ncu_$tag.log" 2>&1
        summary+=("s78 ncu $tag rc=$?")
        $NCU -i "$OUT/s78_ncu_$tag.ncu-rep" --page details > "$OUT/s78_ncu_${tag}_details.txt" 2>&1
        $NCU -i "$OUT/s78_ncu_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/s78_ncu_${tag}_src.csv" 2>&1
        echo "== ncu $tag (decode B=$b ctx=32768)"
        grep -E "Duration|DRAM Throughput|Memory Throughput|dram__|lts__t_sector_hit|Achieved Occupancy|Theoretical Occupancy|Issued Warp|Eligible Warps|Active Warps Per|Registers Per|Grid Size|Cluster Size|Waves Per SM|inst_executed.sum|warps_active" \
          "$OUT/s78_ncu_${tag}_details.txt" | head -24
        awk '/issue_stalled/ && $NF+0 > 0.05 {print "   ", $1, $NF}' "$OUT/s78_ncu_${tag}_details.txt" | head -20
        python3 tools/ncu_stall_top.py "$OUT/s78_ncu_${tag}_src.csv" 20 > "$OUT/s78_ncu_${tag}_top.txt" 2>&1
        head -24 "$OUT/s78_ncu_${tag}_top.txt"
        gzip -f "$OUT/s78_ncu_${tag}_src.csv"
      done
      decode_row s78_20b_b1 20b 1
      ;;
    s78b)
      # Session 65, second call: the decode kernel's block-table entries read a ring round early
      # (PagedAttentionArgs::decode_table_ahead; GPTOSS_ATTN_TABLE_AHEAD=0 the old loads). Tests (the decode cases
      # compare both forms bit for bit), attention_bench's decode rows each way, 20b model rows each way (batch 1 at
      # 32k twice, 8k, 1k; batch 8 at 32k), 120b batch 1 at 32k, ncu of one sequence at 32k with it. Measured equal
      # (r78 call 2) and removed: needs fdce2f7's src/.
      tests_row s78b_attn 'PagedAttentionCuda.*'
      [ $rc = 0 ] || continue
      tests_row s78b_model 'CudaModel.*:CudaEngine.*'
      for b in 1 2 4 8; do
        for v in 0 1; do
          GPTOSS_ATTN_TABLE_AHEAD=$v timeout 60 $BIN/attention_bench "decode B=$b ctx" > "$OUT/s78b_attn_b${b}_ahead$v.log" 2>&1
          echo "== B=$b ahead=$v"
          grep -E "^decode" "$OUT/s78b_attn_b${b}_ahead$v.log"
        done
      done
      for cfg in "1 32768 a" "1 32768 b" "1 8192 a" "1 1024 a" "8 32768 a"; do
        set -- $cfg
        for v in 0 1; do
          GPTOSS_ATTN_TABLE_AHEAD=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" \
            --batch $1 --context $2 --decode-steps 64 --repeats 3 > "$OUT/s78b_20b_b$1_ctx$2_ahead${v}_$3.log" 2>&1
          echo "s78b_20b_b$1_ctx$2_ahead${v}_$3: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s78b_20b_b$1_ctx$2_ahead${v}_$3.log")"
        done
      done
      for ctx in 32768; do
        for v in 0 1; do
          GPTOSS_ATTN_TABLE_AHEAD=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" \
            --batch 1 --context $ctx --decode-steps 64 --repeats 3 > "$OUT/s78b_120b_b1_ctx${ctx}_ahead$v.log" 2>&1
          echo "s78b_120b_b1_ctx${ctx}_ahead$v: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s78b_120b_b1_ctx${ctx}_ahead$v.log")"
        done
      done
      ncu_decode_attn s78b_ncu_b1_cl
      ;;
    s78c)
      # Session 65, closing check of the host changes that run in the CUDA runner: the model fingerprint each runner
      # computes at start (KvFormat::model_id, wire format version 2), the fetch cancel; CUDA engine tests, the serve
      # check, then a prefill / decode pair on the 20b (its imports show that both workers' fingerprints agree).
      tests_row s78c_engine 'CudaEngine.*'
      serve_check s78c_serve
      disagg_timing s78c_disagg_20b
      ;;
    s85)
      # Session 69, second check (r81): the decode-layout copy as the default where it is small (GPTOSS_MOE_PACKED
      # unset). The CUDA model / engine tests as they run by default (tiny models: the copy on), 20b batch-1 rows
      # unset and =0 interleaved (the copy on an H200, not on an H100: each log says which), and on an H200 the
      # 120b batch-1 bar and the 8k prefill bars.
      tests_row s85_model 'CudaModel.*:CudaEngine.*'
      for pass in 1 2; do
        decode_row "s85_20b_b1_unset_$pass" 20b 1
        decode_row "s85_20b_b1_published_$pass" 20b 1 GPTOSS_MOE_PACKED=0
      done
      grep -l "moe_decode_packed: a decode-layout copy" "$OUT"/s85_20b_b1_*.log | sed 's|.*/|copy made: |'
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        decode_row s85_120b_b1 120b 1
        prefill_bars s85
      fi
      ;;
    s84)
      # Session 69 (r81): the decode layout's code words in the decode bit order (kernels/mxfp4_bits.h
      # e2m1x8_to_decode_bits: 8 integer ops a word to bf16 instead of 13). First the SASS op mix of the batch-1
      # kernels each way (gate_up loop kernel, down one-tile kernel; spills as LDL / STL), then packed_check (its
      # tests, three 20b batch-1 pairs, batch 4, two 120b pairs where the copy fits: on an H200 its default rows are
      # also the batch-1 bars), a kernel trace each way, and on an H200 the 8k prefill bars.
      CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
      if [ -n "$CUOBJDUMP" ]; then
        $CUOBJDUMP -sass $BIN/gptoss 2>/dev/null | awk '/Function :/{p = ($3 ~ /moe_decode_mma_loop_kernelILi4ELb1ELb1ELb0ELb[01]E|moe_decode_mma_kernelILb0ELi4ELb0ELi0ELb0ELb[01]E/)} p' \
          > "$OUT/s84_sass.txt"
        awk '/Function :/{f = $3} match($0, /\/\*[0-9a-f]+\*\//) {split(substr($0, RSTART + RLENGTH), b, " "); op = b[1]; if (op ~ /^@/) op = b[2];
             sub(/\..*/, "", op); n[f" "op]++} END {for (k in n) print k, n[k]}' "$OUT/s84_sass.txt" |
          grep -E " (LOP3|IMAD|SHF|HMUL2|HMMA|LDS|LDL|STL|LDG) " | sort > "$OUT/s84_sass_mix.txt"
        sed -E 's/_ZN6gptoss7kernels4cuda[0-9]+_GLOBAL__N__[0-9a-f_]+moe_decode_cu_[0-9a-f]+[0-9]{2}//' "$OUT/s84_sass_mix.txt"
        gzip -f "$OUT/s84_sass.txt"
      fi
      packed_check s84 2 4
      if [ $rc = 0 ]; then
        ktrace_row s84_trace_default 20b
        ktrace_row s84_trace_packed 20b GPTOSS_MOE_PACKED=1
      fi
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then prefill_bars s84; fi
      ;;
    s83)
      # Session 68's closing check of the bars, on an H200 only (an H100 neither holds 120b's FP8 experts nor gives
      # the bars' numbers): 20b batch 1 at 1k twice, 120b once, the 8k prefill of both.
      if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        echo "s83: not an H200 ($(nvidia-smi --query-gpu=name --format=csv,noheader)); skipped"
      else
        decode_row s83_20b_b1_1 20b 1
        decode_row s83_120b_b1 120b 1
        decode_row s83_20b_b1_2 20b 1
        [ "${S83_QUICK:-0}" = 1 ] || prefill_bars s83  # S83_QUICK=1: the decode rows only
      fi
      ;;
    s82)
      # Session 68 (r80): gate_up and down in one launch at one token (GPTOSS_MOE_FUSED=1: down split over K into
      # partial rows, summed by a reduction launch that does the residual tail). Measured slower and removed from src/:
      # needs results/2026-12-07_h100_r80/s68-moe-fused.patch applied. Its kernel tests and the CUDA model / engine
      # tests with it on; if the kernel tests pass, three interleaved 20b batch-1 pairs, one 120b pair (where the copy
      # fits) and a kernel trace each way.
      tests_row s82_kernels 'CudaOps.MoeDecodeFused*:CudaOps.MoeResidualTail*'
      krc=$rc
      tests_row s82_model 'CudaModel.*:CudaEngine.*' GPTOSS_MOE_FUSED=1
      if [ $krc = 0 ]; then
        for pass in 1 2 3; do
          decode_row "s82_20b_b1_default_$pass" 20b 1
          decode_row "s82_20b_b1_fused_$pass" 20b 1 GPTOSS_MOE_FUSED=1
        done
        decode_row s82_120b_b1_default 120b 1
        decode_row s82_120b_b1_fused 120b 1 GPTOSS_MOE_FUSED=1
        ktrace_row s82_trace_default 20b
        ktrace_row s82_trace_fused 20b GPTOSS_MOE_FUSED=1
      fi
      ;;
    s81)
      # Session 68: the bars on the code as it stands (no forward kernel changed since r77 / r80) and session 64's
      # unrun knobs of the decode layout (s77b's rows): 20b batch 1 default / packed / packed one-tile gate_up /
      # packed without the stagger, two interleaved passes; 120b batch 1 default twice; the 8k prefill bars.
      for pass in 1 2; do
        decode_row "s81_20b_b1_default_$pass" 20b 1
        decode_row "s81_20b_b1_packed_$pass" 20b 1 GPTOSS_MOE_PACKED=1
        decode_row "s81_20b_b1_packed_onetile_$pass" 20b 1 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_LOOP=0
        decode_row "s81_20b_b1_packed_stagger0_$pass" 20b 1 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_STAGGER_NS=0
        decode_row "s81_120b_b1_default_$pass" 120b 1
      done
      prefill_bars s81
      ;;
    s77b)
      # Session 64, second call: the loop kernels' knobs with the decode layout on, 20b. Batch 1 in two interleaved
      # passes: default, packed, packed with the one-tile gate_up (GPTOSS_MOE_LOOP=0), packed without the
      # stagger; batch 2 once: default, packed, packed with the one-tile down, packed with the one-tile gate_up.
      # First the activation quantizer's test, which since session 64 covers the FP8 scale floor (compiled only then).
      tests_row s77b_fp8 'CudaFp8Gemm.ActivationQuantizer*'
      for pass in 1 2; do
        decode_row "s77b_20b_b1_default_$pass" 20b 1
        decode_row "s77b_20b_b1_packed_$pass" 20b 1 GPTOSS_MOE_PACKED=1
        decode_row "s77b_20b_b1_packed_onetile_$pass" 20b 1 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_LOOP=0
        decode_row "s77b_20b_b1_packed_stagger0_$pass" 20b 1 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_STAGGER_NS=0
      done
      decode_row s77b_20b_b2_default 20b 2
      decode_row s77b_20b_b2_packed 20b 2 GPTOSS_MOE_PACKED=1
      decode_row s77b_20b_b2_packed_downtile 20b 2 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_DOWN_LOOP=0
      decode_row s77b_20b_b2_packed_onetile 20b 2 GPTOSS_MOE_PACKED=1 GPTOSS_MOE_LOOP=0
      ;;
    s59)
      # Session 59: the front-end changes on CUDA (forced tool calls held to their schema, stop_reason, /version), the
      # CUDA model and engine tests (the loader and the CUDA init changed), the serve check, batch-1 rows.
      s59_check s59_front
      tests_row s59_model 'CudaModel.*'
      tests_row s59_tests 'CudaEngine.*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      serve_check s59_serve
      decode_row s59_20b_b1 20b 1
      decode_row s59_120b_b1 120b 1
      decode_row s59_20b_b1_again 20b 1
      ;;
    s59_front)
      s59_check s59_front
      ;;
    s61b)
      # The CUDA suite's tests s61 left (its 150 s ran out): the negative filter in .device_pack/s61b_filter.txt.
      env timeout 420 $BIN/cuda_kernel_tests --gtest_filter="$(cat .device_pack/s61b_filter.txt)" > "$OUT/s61b_rest.log" 2>&1
      summary+=("s61b_rest rc=$? $(grep -cE '^\[       OK' "$OUT/s61b_rest.log") ok")
      grep -E "FAILED|Failure|PASSED" "$OUT/s61b_rest.log" | tail -6
      ;;
    s61)
      # Session 61: the whole CUDA suite; the 8k prefill bars (20b --fp8, 120b --fp8 --fp8-experts), each report
      # written through --json / --markdown (the output files are resolved before the run and written whole now).
      tests_row s61_all '*'
      for m in 20b 120b; do
        [ $m = 120b ] && x=--fp8-experts || x=
        timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$m --fp8 $x --prefill 8192 --batch "" --repeats 3 \
          --json "$OUT/s61_prefill_$m.json" --markdown "$OUT/s61_prefill_$m.md" > "$OUT/s61_prefill_$m.log" 2>&1
        summary+=("s61_prefill_$m rc=$? json=$(test -s "$OUT/s61_prefill_$m.json" && echo ok) $(grep -E '^\| 8192 \|' "$OUT/s61_prefill_$m.md" | head -1)")
        echo "s61_prefill_$m: $(grep -E '^\| 8192 \|' "$OUT/s61_prefill_$m.md" | head -1)"
      done
      ;;
    s58)
      # Session 58: transformers' rope values for the config variants (tests/data/hf_rope_cases.json), the CUDA model
      # and engine tests after the rope-config changes, the serve check, batch-1 rows of both models.
      python3 tools/hf_rope_probe.py --out "$OUT/hf_rope_cases.json" > "$OUT/hf_rope_probe.log" 2>&1
      summary+=("hf_rope_probe rc=$?")
      tail -45 "$OUT/hf_rope_probe.log" | grep -v Warning
      tests_row s58_model 'CudaModel.*'
      tests_row s58_tests 'CudaEngine.*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      serve_check s58_serve
      decode_row s58_20b_b1 20b 1
      decode_row s58_120b_b1 120b 1
      decode_row s58_20b_b1_again 20b 1
      ;;
    s56)
      # Session 56: the front-end fixes on CUDA, session 55's checks, the engine tests, batch-1 rows of both models.
      s56_check s56_front
      vllm_flags_check s56_vllm
      serve_check s56_serve
      tests_row s56_tests 'CudaEngine.*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      decode_row s56_20b_b1 20b 1
      decode_row s56_120b_b1 120b 1
      decode_row s56_20b_b1_again 20b 1
      ;;
    s56_only)
      s56_check s56_front
      ;;
    s55)
      # Session 55: vLLM's serve flags and request fields on CUDA, the serve check, the engine tests, a batch-1 row.
      vllm_flags_check s55_vllm
      serve_check s55_serve
      tests_row s55_tests 'CudaEngine.*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      decode_row s55_20b_b1 20b 1
      ;;
    s54)
      # Session 54: the serve check (structural tags under device masks among the rest), then the structured-output
      # and engine tests.
      serve_check s54_serve
      tests_row s54_tests 'CudaEngine.*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      decode_row s54_20b_b1 20b 1
      ;;
    s53)
      # Session 53: the serve check with stored responses (previous_response_id, a background response cancelled) on
      # CUDA; the engine tests with the shared test gate (f9a9859, compiled only in session 52); batch-1 rows (120b
      # only where it fits: more than 100 GB).
      serve_check s53_serve
      tests_row s53_tests 'CudaEngine.*:CudaModel.Fp8*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      decode_row s53_20b_b1 20b 1
      mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
      [ "${mem_mib:-0}" -gt 100000 ] && decode_row s53_120b_b1 120b 1
      ;;
    s52)
      # Session 52: the KV transfer without whole-message copies (pieces on the prefill side, read into the
      # transfer's buffers on the decode side); the per-server --gpu-memory-utilization share.
      serve_check s52_serve
      disagg_timing s52_disagg_20b
      ;;
    s51)
      # Session 51's one call: session 50's checks (the engine and sample-kernel tests, the serve check) and session
      # 51's KV transfer tests in one test run, then the disaggregated serving timing, the shared-prefix timing and a
      # batch-1 row (most important first: the device time may run out).
      serve_check s51_serve
      tests_row s51_tests 'CudaEngine.*:CudaModel.Fp8*:CudaOps.Split*:CudaOps.Sampling*:CudaOps.LogitEdits*'
      disagg_timing s51_disagg_20b
      shared_prefix_timing s51_shared_prefix_20b
      decode_row s51_20b_b1 20b 1
      ;;
    disagg)
      # Session 51: the KV block copies and disaggregated prefill on CUDA (CudaEngine.KvBlocks*, .Disaggregated*),
      # then two servers on one GPU (see disagg_timing).
      tests_row disagg_tests 'CudaEngine.KvBlocks*:CudaEngine.Disaggregated*'
      disagg_timing disagg_20b
      ;;
    mask_overlap)
      # Session 49: structured-output masks beside the forward and masked draws on the device (see mask_timing),
      # after the tiny serve check and the tests they touch.
      serve_check mask_overlap_serve
      tests_row mask_overlap_tests 'CudaEngine.*:CudaOps.Sampling*:CudaOps.LogitEdits*:CudaModel.Fp8*'
      mask_timing mask_overlap_20b
      ;;
    serve_cuda)
      # `gptoss serve --backend cuda` end to end (session 43's --gpu-memory-utilization KV sizing): see serve_check;
      # then the engine tests and a batch-1 row of each model (the closing check of a host-side change).
      serve_check serve_cuda
      tests_row serve_cuda_tests 'CudaEngine.*:CudaModel.Fp8*'
      decode_row serve_cuda_20b_b1 20b 1
      decode_row serve_cuda_120b_b1 120b 1
      ;;
    s43b)
      # Session 43's closing check of the shipped build (host-side changes after s43a: logits, convert).
      tests_row s43b_tests 'CudaQkvFused.*:CudaModel.Fp8*:CudaEngine.*'
      decode_row s43b_20b_b1 20b 1
      decode_row s43b_120b_b1 120b 1
      ;;
    s43a)
      # Session 43, the check of the shipped code with the attention in the QKV kernel's tail on by default in
      # sliding layers (r58 call 1's s42d: mode 1 won, mode 2 lost): the QKV / attention / model / engine tests at the
      # default, then 20b batch 1 default against GPTOSS_QKV_ATTN_TAIL=0 (three interleaved pairs), 120b two pairs,
      # 20b batch 2.
      tests_row s43a_tests 'CudaQkvFused.*:PagedAttentionCuda.*:CudaModel.*:CudaEngine.*'
      if [ "$rc" = 0 ]; then
        for pass in 1 2 3; do
          decode_row "s43a_20b_b1_default_$pass" 20b 1
          decode_row "s43a_20b_b1_off_$pass" 20b 1 GPTOSS_QKV_ATTN_TAIL=0
        done
        for pass in 1 2; do
          decode_row "s43a_120b_b1_default_$pass" 120b 1
          decode_row "s43a_120b_b1_off_$pass" 120b 1 GPTOSS_QKV_ATTN_TAIL=0
        done
        decode_row s43a_20b_b2_default 20b 2
      fi
      ;;
    s42d)
      # Needs bench/results/2026-12-04_h200_r57/s42d-attn-tail.patch applied (session 42, compiled only). The decode
      # attention at one token inside the QKV kernel (GPTOSS_QKV_ATTN_TAIL=1: sliding layers, =2: full layers too;
      # gemv.h QkvAttnTailArgs): the last of each kv head's 40 CTAs (ticket) reads q and the visible K / V (the
      # first 256 keys prefetched into L2 before pdl_wait) in 128-key chunks and writes the output; no attention
      # launch. r56's trace: the attention adds ~7.3 µs after the QKV kernel's end in sliding and full layers alike.
      # Its tests (against the CPU and the decode kernel), the FP8 model and engine tests with =2; then 20b batch 1
      # off / 1 / 2 three passes, batch 2 (the tail does not apply: equal), 120b off / 1 / 2, a 20b trace with =2.
      tests_row s42d_tests 'CudaQkvFused.*:PagedAttentionCuda.Decode*'
      failed=$rc
      tests_row s42d_tests_model 'CudaModel.Fp8*:CudaEngine.*' GPTOSS_QKV_ATTN_TAIL=2
      if [ $((failed + rc)) = 0 ]; then
        for pass in 1 2 3; do
          for v in 0 1 2; do decode_row "s42d_20b_b1_tail${v}_$pass" 20b 1 GPTOSS_QKV_ATTN_TAIL=$v; done
        done
        decode_row s42d_20b_b2_tail0 20b 2
        decode_row s42d_20b_b2_tail2 20b 2 GPTOSS_QKV_ATTN_TAIL=2
        for v in 0 1 2; do decode_row "s42d_120b_b1_tail$v" 120b 1 GPTOSS_QKV_ATTN_TAIL=$v; done
        ktrace_row s42d_ktrace_20b_tail2 20b GPTOSS_QKV_ATTN_TAIL=2
        gzip -f "$OUT"/s42d_ktrace_*.csv
      fi
      ;;
    s42c)
      # Needs s42-combined.patch (see s42b; run s42b first for the tests). The A/B of the two loop forms s42b stamps:
      # the second multiply decided a step at a time (GPTOSS_MOE_STEP_TWO=1) and the q loop in halves with the next
      # tile's halves loaded as they free up (GPTOSS_MOE_LOOP_HALVES=1): three interleaved 20b pairs each, one 120b.
      for pass in 1 2 3; do
        decode_row "s42c_20b_b1_default_$pass" 20b 1
        decode_row "s42c_20b_b1_steptwo_$pass" 20b 1 GPTOSS_MOE_STEP_TWO=1
        decode_row "s42c_20b_b1_halves_$pass" 20b 1 GPTOSS_MOE_LOOP_HALVES=1
      done
      decode_row s42c_120b_b1_default 120b 1
      decode_row s42c_120b_b1_steptwo 120b 1 GPTOSS_MOE_STEP_TWO=1
      decode_row s42c_120b_b1_halves 120b 1 GPTOSS_MOE_LOOP_HALVES=1
      ;;
    s41e)
      # Session 41, the closing check of the shipped code (r55's plus the GPTOSS_MOE_STAMPS instantiations, off by
      # default): the decode MoE, residual tail, FP8 model and engine tests; 20b and 120b batch 1 at 1k.
      tests_row s41e_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*'
      decode_row s41e_20b_b1 20b 1
      decode_row s41e_120b_b1 120b 1
      ;;
    s41d)
      # Needs bench/results/2026-12-04_h200_r56/s41d-down2.patch applied (ran in r56 call 3: same bits, slower; removed).
      # Session 41: down at one token with the tiles past its resident grid (192 of 720) as second tiles of its first
      # CTAs, through shared memory (GPTOSS_MOE_DOWN2=1: copied before pdl_wait; =2: after it). r56 call 2's stamps
      # put that second round at ~7 µs of down's ~13 a layer. The bits test (variants 7-9) and the decode MoE, FP8
      # model and engine tests with it on; then 20b batch 1 at 1k 0 / 1 / 2 two passes, 120b 0 / 1 / 2, a 20b trace.
      tests_row s41d_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.Fp8*:CudaEngine.*' GPTOSS_MOE_DOWN2=1
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 1 2; do decode_row "s41d_20b_b1_down2_${v}_$pass" 20b 1 GPTOSS_MOE_DOWN2=$v; done
        done
        for v in 0 1 2; do decode_row "s41d_120b_b1_down2_$v" 120b 1 GPTOSS_MOE_DOWN2=$v; done
        ktrace_row s41d_ktrace_20b_down2 20b GPTOSS_MOE_DOWN2=1
      fi
      ;;
    s41c)
      # Session 41: the decode MoE's per-CTA timeline (GPTOSS_MOE_STAMPS: %globaltimer stamps of the gate_up loop
      # kernel's and the one-tile down kernel's events, the last step; tools/moe_stamps.py), 20b and 120b batch 1
      # at 1k, with a 20b row without stamps beside it (what the stamps cost); then the sliding layers' attention
      # in one split (GPTOSS_ATTN_SINGLE_SPLIT_TILES=3: no 2-CTA cluster) against the default, interleaved.
      tests_row s41c_tests 'CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' GPTOSS_MOE_STAMPS="$OUT/s41c_stamps_test.csv"
      rm -f "$OUT/s41c_stamps_test.csv"
      decode_row s41c_20b_b1_base 20b 1
      decode_row s41c_20b_b1_stamps 20b 1 GPTOSS_MOE_STAMPS="$OUT/s41c_stamps_20b.csv"
      python3 tools/moe_stamps.py "$OUT/s41c_stamps_20b.csv" > "$OUT/s41c_stamps_20b.txt" 2>&1
      cat "$OUT/s41c_stamps_20b.txt"
      decode_row s41c_120b_b1_stamps 120b 1 GPTOSS_MOE_STAMPS="$OUT/s41c_stamps_120b.csv"
      python3 tools/moe_stamps.py "$OUT/s41c_stamps_120b.csv" > "$OUT/s41c_stamps_120b.txt" 2>&1
      gzip -f "$OUT"/s41c_stamps_*.csv
      for pass in 1 2; do
        decode_row "s41c_20b_b1_ss0_$pass" 20b 1
        decode_row "s41c_20b_b1_ss3_$pass" 20b 1 GPTOSS_ATTN_SINGLE_SPLIT_TILES=3
      done
      decode_row s41c_120b_b1_ss0 120b 1
      decode_row s41c_120b_b1_ss3 120b 1 GPTOSS_ATTN_SINGLE_SPLIT_TILES=3
      ;;
    s41a)
      # Needs bench/results/2026-12-04_h200_r55/s41-stage-and-wait-first.patch applied on 55899f8 (git apply; then
      # build_for_gpu.sh); on later main, r56's s42-combined.patch holds the same switches. Ran in r56 call 1.
      # For session 41 (written in session 40 after the device time ran out; compiled only): the gate_up loop kernel's
      # next tile through a shared-memory stage (GPTOSS_MOE_LOOP_STAGE=1: r53's form, the first fill at the start;
      # =2: the first fill once the first tile's words have arrived). The loop test's bits (stage variants 7-12) and
      # the decode MoE tests, then 20b batch 1 at 1k stage 0 / 1 / 2 two passes, 120b 0 / 2.
      timeout 120 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' \
        > "$OUT/s41a_tests.log" 2>&1
      rc=$?
      summary+=("s41a tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s41a_tests.log" | tail -6
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 1 2; do decode_row "s41a_20b_b1_stage${v}_$pass" 20b 1 GPTOSS_MOE_LOOP_STAGE=$v; done
        done
        for v in 0 2; do decode_row "s41a_120b_b1_stage${v}" 120b 1 GPTOSS_MOE_LOOP_STAGE=$v; done
      fi
      ;;
    s41b)
      # Needs bench/results/2026-12-04_h200_r55/s41-stage-and-wait-first.patch applied on 55899f8 (git apply; then
      # build_for_gpu.sh); on later main, r56's s42-combined.patch holds the same switches. Ran in r56 call 1.
      # For session 41 (compiled only in session 40): down's weight loads after its pdl_wait (GPTOSS_MOE_DOWN_WAIT_FIRST=1)
      # against before (the default); r55 found every kernel's early prefetch slowing the kernel it overlaps. The
      # MoE tests with it, then 20b batch 1 at 1k 0 / 1 three passes, 120b 0 / 1, and a 20b trace with it.
      GPTOSS_MOE_DOWN_WAIT_FIRST=1 timeout 120 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' > "$OUT/s41b_tests.log" 2>&1
      rc=$?
      summary+=("s41b tests (wait first) rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s41b_tests.log" | tail -4
      if [ $rc = 0 ]; then
        for pass in 1 2 3; do
          for v in 0 1; do decode_row "s41b_20b_b1_wf${v}_$pass" 20b 1 GPTOSS_MOE_DOWN_WAIT_FIRST=$v; done
        done
        for v in 0 1; do decode_row "s41b_120b_b1_wf${v}" 120b 1 GPTOSS_MOE_DOWN_WAIT_FIRST=$v; done
        ktrace_row s41b_ktrace_20b 20b GPTOSS_MOE_DOWN_WAIT_FIRST=1
      fi
      ;;
    s40f)
      # Session 40, the closing check of the shipped code (the gate_up loop kernel's first tiles staggered over 2,000 ns
      # at one token, the default now): the decode MoE's tests against the CPU and the loop's bits, the FP8 model tests,
      # the engine tests; then 20b batch 1 at 1k.
      timeout 90 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaModel.Fp8*:CudaEngine.*' \
        > "$OUT/s40f_tests.log" 2>&1
      summary+=("s40f tests rc=$?")
      grep -E "FAILED|PASSED" "$OUT/s40f_tests.log" | tail -4
      decode_row s40f_20b_b1 20b 1
      ;;
    s40e)
      # Session 40: the gate_up loop kernel's first-tile requests staggered over W ns (GPTOSS_MOE_STAGGER_NS=W; CTA b
      # sleeps b / grid of W): s40d's slowdown said gate_up waits on DRAM's queue, and with every CTA's first tile
      # requested at once, fair interleaving completes all of them late. The loop test's bits with W = 2000, then
      # 20b batch 1 at W 0 / 1000 / 2000 / 4000 two passes, 120b batch 1 at 0 / 2000.
      GPTOSS_MOE_STAGGER_NS=2000 timeout 60 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMmaLoopIsTheSameBits' \
        > "$OUT/s40e_tests.log" 2>&1
      summary+=("s40e loop bits test with stagger rc=$?")
      grep -E "FAILED|PASSED" "$OUT/s40e_tests.log" | tail -3
      for pass in 1 2; do
        for w in 0 1000 2000 4000; do decode_row "s40e_20b_b1_w${w}_$pass" 20b 1 GPTOSS_MOE_STAGGER_NS=$w; done
      done
      for w in 0 2000; do decode_row "s40e_120b_b1_w${w}" 120b 1 GPTOSS_MOE_STAGGER_NS=$w; done
      ;;
    s40d)
      # Session 40: down with its tile's weights in shared memory (moe_decode_mma_down_smem_kernel; GPTOSS_MOE_DOWN_SMEM
      # unset: at 1 token, =0 never, =1 at 1-2). Tests (the decode MoE against the CPU and the loop / smem variants'
      # bits, the residual tail, the model and engine), then decode at 1k interleaved smem 0 / default: 20b batch 1
      # three pairs, 120b batch 1 two; 20b batch 2 0 / 1 one pair; then a 20b kernel trace at the default.
      timeout 240 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s40d_tests.log" 2>&1
      rc=$?
      summary+=("s40d tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s40d_tests.log" | tail -8
      if [ $rc = 0 ]; then
        for cfg in "20b 1 1" "120b 1 1" "20b 1 2" "120b 1 2" "20b 1 3"; do
          set -- $cfg
          decode_row "s40d_$1_b$2_smem0_$3" $1 $2 GPTOSS_MOE_DOWN_SMEM=0
          decode_row "s40d_$1_b$2_smemdef_$3" $1 $2
        done
        decode_row s40d_20b_b2_smem0 20b 2 GPTOSS_MOE_DOWN_SMEM=0
        decode_row s40d_20b_b2_smem1 20b 2 GPTOSS_MOE_DOWN_SMEM=1
        ktrace_row s40d_ktrace_20b 20b
      fi
      ;;
    s40c)
      # Session 40, after s40b: the final norm back as a kernel (its fold cost the lm_head +96 µs), the embedding
      # kernel lets the first QKV GEMV launch at once (PDL), the lm_head's keys spread over 32 slots a row. Tests,
      # then decode at 1k interleaved off (both 0) / on: 20b batch 1 three pairs, 120b batch 1 one; each alone once
      # on 20b; 20b kernel traces off and on, a 120b trace on.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.Embedding*:CudaOps.Sampling*:CudaFp8Gemv.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s40c_tests.log" 2>&1
      rc=$?
      summary+=("s40c tests rc=$rc")
      grep -E "FAILED|Failure|PASSED|residual tail" "$OUT/s40c_tests.log" | tail -12
      if [ $rc = 0 ]; then
        for cfg in "20b 1 1" "120b 1 1" "20b 1 2" "20b 1 3"; do
          set -- $cfg
          decode_row "s40c_$1_b$2_off_$3" $1 $2 GPTOSS_STEP_EDGE_TAIL=0 GPTOSS_LMHEAD_ARGMAX=0
          decode_row "s40c_$1_b$2_on_$3" $1 $2
        done
        decode_row s40c_20b_b1_edge_only 20b 1 GPTOSS_LMHEAD_ARGMAX=0
        decode_row s40c_20b_b1_argmax_only 20b 1 GPTOSS_STEP_EDGE_TAIL=0
        ktrace_row s40c_ktrace_20b_off 20b GPTOSS_STEP_EDGE_TAIL=0 GPTOSS_LMHEAD_ARGMAX=0
        ktrace_row s40c_ktrace_20b_on 20b
        ktrace_row s40c_ktrace_120b_on 120b
      fi
      ;;
    s40b)
      # Session 40, after s40a's one failure (CudaModel.Fp8ResidualTailStaysClose: moe_decode_wg's bound 2e-2, measured
      # 2.64e-2 with the edges): that test with the edges off (the r51 figure 1.07e-2 expected) and on (bound now 4e-2),
      # then s40a's decode rows and trace.
      for v in 0 1; do
        GPTOSS_STEP_EDGE_TAIL=$v timeout 60 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.Fp8ResidualTailStaysClose' \
          > "$OUT/s40b_tail_test_edge$v.log" 2>&1
        summary+=("s40b tail test edge=$v rc=$?")
        grep -E "residual tail|FAILED|PASSED" "$OUT/s40b_tail_test_edge$v.log" | head -5
      done
      s40_edge_rows s40b
      ;;
    s40a)
      # Session 40: the step's edges. GPTOSS_STEP_EDGE_TAIL (the embedding kernel writes layer 0's h and Σ x² parts,
      # the last layer's down launch the final norm's: no norm kernel in a decode step) and GPTOSS_LMHEAD_ARGMAX (the
      # lm_head GEMV leaves each greedy row's token in a 64-bit key: no arg-max kernel). Tests (the new kernel tests,
      # sampling, the FP8 GEMVs, the tail, the model and engine), then decode at 1k interleaved off (both 0) / on
      # (the defaults): 20b batch 1 three pairs, 120b batch 1 one, 20b batch 2 one; each alone once on 20b; the
      # gate_up loop grid at 480 (three whole rounds of tiles) once; then a 20b kernel trace at the defaults.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.Embedding*:CudaOps.Sampling*:CudaFp8Gemv.*:CudaOps.MoeResidualTail*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s40a_tests.log" 2>&1
      rc=$?
      summary+=("s40a tests rc=$rc")
      grep -E "FAILED|Failure|PASSED|residual tail" "$OUT/s40a_tests.log" | tail -12
      [ $rc = 0 ] && s40_edge_rows s40a
      ;;
    s39d)
      # Session 39, the closing check of the shipped code (after comment-only commits and a static_assert): the
      # decode MoE, router and model / engine tests, then the bars at 1k (20b and 120b batch 1, the defaults).
      timeout 240 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaOps.Router*:CudaDecodeFusion.Router*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s39d_tests.log" 2>&1
      rc=$?
      summary+=("s39d tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s39d_tests.log" | tail -6
      decode_row s39d_20b_b1 20b 1
      decode_row s39d_120b_b1 120b 1
      ;;
    s39c)
      # Session 39: the gate_up loop kernel's grid (GPTOSS_MOE_LOOP_GRID; default the resident 660 = 5 an SM). Fewer
      # gate_up CTAs an SM leave registers for down's first CTAs to become resident early and issue their weight
      # loads before their pdl_wait. 20b batch 1 at 1k: 660 / 528 / 594 / 396, two passes; 120b 660 / 528; then a
      # 20b trace at 528.
      for pass in 1 2; do
        for gr in 660 528 594 396; do decode_row "s39c_20b_grid${gr}_$pass" 20b 1 GPTOSS_MOE_LOOP_GRID=$gr; done
      done
      for gr in 660 528; do decode_row "s39c_120b_grid${gr}" 120b 1 GPTOSS_MOE_LOOP_GRID=$gr; done
      GPTOSS_MOE_LOOP_GRID=528 GPTOSS_KERNEL_TRACE="$OUT/s39c_ktrace_20b_528.csv" timeout 100 $BIN/gptoss bench \
        --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 --repeats 1 \
        > "$OUT/s39c_ktrace_20b_528.log" 2>&1
      python3 tools/ktrace_summary.py "$OUT/s39c_ktrace_20b_528.csv" | head -20
      ;;
    s39b)
      # Session 39: the router folded into the O projection (GPTOSS_ROUTER_FOLD=1, opt-in). Its tests and the tests
      # of the kernels it touched, the model and engine tests with the fold on, then decode at 1k interleaved fold
      # 0 / 1: 20b batch 1 two pairs, 120b batch 1 two; then a 20b kernel trace with the fold.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='*RouterFold*:CudaFp8Gemv.*:CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaOps.Router*:CudaDecodeFusion.*' \
        > "$OUT/s39b_tests.log" 2>&1
      rc=$?
      summary+=("s39b tests rc=$rc")
      grep -E "FAILED|Failure|PASSED|router fold|fold " "$OUT/s39b_tests.log" | tail -24
      GPTOSS_ROUTER_FOLD=1 timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        > "$OUT/s39b_tests_fold_env.log" 2>&1
      rc2=$?
      summary+=("s39b model/engine tests with GPTOSS_ROUTER_FOLD=1 rc=$rc2")
      grep -E "FAILED|PASSED" "$OUT/s39b_tests_fold_env.log" | tail -12
      if [ $rc = 0 ]; then
        for cfg in "20b 1" "120b 1" "20b 2" "120b 2"; do
          set -- $cfg
          for v in 0 1; do decode_row "s39b_$1_fold${v}_$2" $1 1 GPTOSS_ROUTER_FOLD=$v; done
        done
        GPTOSS_ROUTER_FOLD=1 GPTOSS_KERNEL_TRACE="$OUT/s39b_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic \
          gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 --repeats 1 > "$OUT/s39b_ktrace_20b.log" 2>&1
        summary+=("s39b ktrace rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s39b_ktrace_20b.csv" | head -20
      fi
      ;;
    s39a)
      # Session 39: the gate_up loop kernel's tile stepping without runtime divisions (r53's s39-tile-step.patch;
      # GPTOSS_MOE_TILE_STEP=0 the division form). Tests (the loop's bits, MoeDecodeMma* against the CPU,
      # MoeResidualTail*, the model and engine), then decode at 1k interleaved step 0 / 1: 20b batch 1 three
      # pairs, 120b batch 1 two, 20b batch 2 one; then a 120b kernel trace at the default.
      timeout 240 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s39a_tests.log" 2>&1
      rc=$?
      summary+=("s39a tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s39a_tests.log" | tail -6
      if [ $rc = 0 ]; then
        for cfg in "20b 1 1" "120b 1 1" "20b 1 2" "20b 2 1" "120b 1 2" "20b 1 3"; do
          set -- $cfg
          for v in 0 1; do decode_row "s39a_$1_b$2_step${v}_$3" $1 $2 GPTOSS_MOE_TILE_STEP=$v; done
        done
        GPTOSS_KERNEL_TRACE="$OUT/s39a_ktrace_120b.csv" timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 --repeats 1 > "$OUT/s39a_ktrace_120b.log" 2>&1
        summary+=("s39a ktrace rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s39a_ktrace_120b.csv" | head -20
      fi
      ;;
    s38h)
      # Session 38: s38f's lean index math with an opaque zero that keeps it out of the loop kernel's hoisting (no
      # spill now). Tests (MoeDecodeMma* against the CPU and the loop's bits, MoeResidualTail*), then 20b batch 1
      # lean 0 / 1 two passes and 120b batch 1 one, at 1k.
      timeout 120 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' \
        > "$OUT/s38h_tests.log" 2>&1
      rc=$?
      summary+=("s38h tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38h_tests.log" | tail -4
      if [ $rc = 0 ]; then
        for cfg in "20b 0" "20b 1" "120b 0" "120b 1" "20b 0" "20b 1"; do
          set -- $cfg
          GPTOSS_MOE_LEAN_LOAD=$2 timeout 70 $BIN/gptoss bench --synthetic gpt-oss-$1 --fp8 --prefill "" --batch 1 \
            --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38h_$1_lean$2_$SECONDS.log" 2>&1
          echo "$1 batch 1 lean=$2: $(grep -hE "^\| [0-9]+ \| [0-9]+ \|" $(ls -t "$OUT"/s38h_$1_lean$2_*.log | head -1))"
        done
      fi
      ;;
    s38g)
      # Session 38, the closing run: down as the loop at 2 tokens by default (GPTOSS_MOE_DOWN_LOOP unset). The loop
      # test, the model and engine tests at the default, then 20b batch 2 default / =0 and batch 1 at 1k.
      timeout 150 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMmaLoop*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s38g_tests.log" 2>&1
      rc=$?
      summary+=("s38g tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38g_tests.log" | tail -6
      for cfg in "2 " "2 0" "1 "; do
        set -- $cfg
        env ${2:+GPTOSS_MOE_DOWN_LOOP=$2} timeout 60 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" \
          --batch $1 --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38g_20b_b$1_down${2:-default}.log" 2>&1
        echo "20b batch $1 down=${2:-default}: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38g_20b_b$1_down${2:-default}.log")"
      done
      ;;
    s38f)
      # Session 38: decode_load's lean index math (one 64-bit base a row; GPTOSS_MOE_LEAN_LOAD=0 the old, in
      # the gate_up loop kernel; the one-tile kernels take the lean form always). Tests (MoeDecodeMma* against
      # the CPU and the loop's bits, the model and engine), then decode at 1k interleaved lean 0 / 1: 20b batch
      # 1 two passes, 120b batch 1 and 20b batch 2 one.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s38f_tests.log" 2>&1
      rc=$?
      summary+=("s38f tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38f_tests.log" | tail -8
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for cfg in "20b 1" "120b 1" "20b 2"; do
            set -- $cfg
            [ $pass = 2 ] && [ "$1 $2" != "20b 1" ] && continue
            for v in 0 1; do
              GPTOSS_MOE_LEAN_LOAD=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$1 --fp8 --prefill "" --batch $2 \
                --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38f_$1_b$2_lean${v}_$pass.log" 2>&1
              echo "$1 batch $2 lean=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38f_$1_b$2_lean${v}_$pass.log")"
            done
          done
        done
      fi
      ;;
    s38e)
      # Session 38: down as a loop at 2 tokens (GPTOSS_MOE_DOWN_LOOP=0 / 1), 20b batch 2 at 1k, two passes.
      for pass in 1 2; do
        for v in 0 1; do
          GPTOSS_MOE_DOWN_LOOP=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 2 \
            --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38e_20b_b2_down${v}_$pass.log" 2>&1
          echo "20b batch 2 down=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38e_20b_b2_down${v}_$pass.log")"
        done
      done
      ;;
    s38d)
      # Session 38: the loop kernels' next tile through a shared-memory stage by bulk copy (GPTOSS_MOE_LOOP_STAGE=1;
      # gate_up's loop, and down's loop when GPTOSS_MOE_DOWN_LOOP=1). The bitwise test (13 variants), the model
      # and engine tests with both staged loops on, then decode at 1k interleaved stage/down 0/0, 1/0, 1/1:
      # 20b batch 1 two passes, 120b batch 1 and 20b batch 2 one; the 20b trace with the stage on.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMmaLoop*' > "$OUT/s38d_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_LOOP_STAGE=1 GPTOSS_MOE_DOWN_LOOP=1 timeout 200 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaModel.*:CudaEngine.*' >> "$OUT/s38d_tests.log" 2>&1
      rc=$((rc + $?))
      summary+=("s38d tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38d_tests.log" | tail -8
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for cfg in "20b 1" "120b 1" "20b 2"; do
            set -- $cfg
            [ $pass = 2 ] && [ "$1 $2" != "20b 1" ] && continue
            for v in "0 0" "1 0" "1 1"; do
              set -- $cfg $v
              GPTOSS_MOE_LOOP_STAGE=$3 GPTOSS_MOE_DOWN_LOOP=$4 timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$1 \
                --fp8 --prefill "" --batch $2 --context 1024 --decode-steps 64 --repeats 3 \
                > "$OUT/s38d_$1_b$2_stage$3_down$4_$pass.log" 2>&1
              echo "$1 batch $2 stage=$3 down=$4 pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38d_$1_b$2_stage$3_down$4_$pass.log")"
            done
          done
        done
        GPTOSS_MOE_LOOP_STAGE=1 GPTOSS_KERNEL_TRACE="$OUT/s38d_ktrace_20b.csv" timeout 100 $BIN/gptoss bench \
          --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s38d_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s38d_ktrace_20b.csv"
      fi
      ;;
    s38c)
      # Session 38, first call: s38a and s38b in one. gate_up's loop kernel (the default since session 37, run
      # only by s38q) and the down loop kernel (GPTOSS_MOE_DOWN_LOOP=1, never run). Kernel tests (the same bits
      # as the one-tile kernels, with MoeResidualTail), the model and engine tests with both loops on (and with
      # gate_up's alone should that fail), then decode at 1k interleaved: loop=0 / loop=1 / loop=1 + down=1
      # (20b batch 1 two passes, 20b batch 2 one; 120b batch 1 without loop=0, which s38q measured); the trace.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' \
        > "$OUT/s38c_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_DOWN_LOOP=1 timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        >> "$OUT/s38c_tests.log" 2>&1
      rc_down=$?
      if [ $rc_down != 0 ]; then
        timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' > "$OUT/s38c_tests_loop.log" 2>&1
        summary+=("s38c model tests, gate_up loop alone rc=$?")
      fi
      summary+=("s38c tests rc=$rc down rc=$rc_down")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38c_tests.log" | tail -8
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for cfg in "20b 1" "120b 1" "20b 2"; do
            set -- $cfg
            [ $pass = 2 ] && [ "$1 $2" != "20b 1" ] && continue
            for v in "0 0" "1 0" "1 1"; do
              set -- $cfg $v
              [ $1 = 120b ] && [ $3 = 0 ] && continue
              [ $rc_down != 0 ] && [ $4 = 1 ] && continue
              GPTOSS_MOE_LOOP=$3 GPTOSS_MOE_DOWN_LOOP=$4 timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$1 --fp8 \
                --prefill "" --batch $2 --context 1024 --decode-steps 64 --repeats 3 \
                > "$OUT/s38c_$1_b$2_loop$3_down$4_$pass.log" 2>&1
              echo "$1 batch $2 loop=$3 down=$4 pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38c_$1_b$2_loop$3_down$4_$pass.log")"
            done
          done
        done
        GPTOSS_MOE_DOWN_LOOP=$((rc_down == 0)) GPTOSS_KERNEL_TRACE="$OUT/s38c_ktrace_20b.csv" timeout 100 $BIN/gptoss bench \
          --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s38c_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s38c_ktrace_20b.csv"
      fi
      ;;
    s38q)
      # Session 37's last minutes of device time: s38a cut to the bitwise test and one interleaved pass.
      timeout 60 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMmaLoop*' > "$OUT/s38q_tests.log" 2>&1
      rc=$?
      summary+=("s38q tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38q_tests.log" | tail -4
      if [ $rc = 0 ]; then
        for m in 20b 120b; do
          for v in 0 1; do
            GPTOSS_MOE_LOOP=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-$m --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38q_${m}_loop$v.log" 2>&1
            echo "$m batch 1 loop=$v: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38q_${m}_loop$v.log")"
          done
        done
      fi
      ;;
    s38a)
      # For session 38: moe_decode_mma_loop_kernel (the default since session 37, whose last call, s38q, ran only
      # its bitwise test and one pass): gate_up at 1-2 tokens as a loop over tiles on the resident grid.
      # Tests (the same bits as the one-tile kernel; the model and engine with it on), then decode at 1k
      # interleaved GPTOSS_MOE_LOOP=0 / 1: 20b and 120b batch 1 and 20b batch 2, two passes; the 20b trace.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaOps.MoeResidualTail*' \
        > "$OUT/s38a_tests.log" 2>&1
      rc=$?
      GPTOSS_MOE_LOOP=1 timeout 300 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        >> "$OUT/s38a_tests.log" 2>&1
      rc=$((rc + $?))
      summary+=("s38a tests rc=$rc")
      grep -E "FAILED|Failure|PASSED" "$OUT/s38a_tests.log" | tail -6
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for cfg in "20b 1" "120b 1" "20b 2"; do
            set -- $cfg
            for v in 0 1; do
              GPTOSS_MOE_LOOP=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$1 --fp8 --prefill "" --batch $2 \
                --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s38a_$1_b$2_loop${v}_$pass.log" 2>&1
              echo "$1 batch $2 loop=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s38a_$1_b$2_loop${v}_$pass.log")"
            done
          done
        done
        GPTOSS_MOE_LOOP=1 GPTOSS_KERNEL_TRACE="$OUT/s38a_ktrace_20b.csv" timeout 100 $BIN/gptoss bench \
          --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s38a_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s38a_ktrace_20b.csv"
      fi
      ;;
    s37d)
      # Session 37, the closing run: the shipped code (the r51 decode path with the router's top-k as two
      # warp reductions a round). Tests, then the bars: 20b batches 1-8, 120b, 120b --fp8-experts at 1k.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaDecodeFusion.Router*:CudaOps.Router*:CudaFp8Gemv.*:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s37d_tests.log" 2>&1
      summary+=("s37d tests rc=$?")
      grep -E "FAILED|Failure|PASSED" "$OUT/s37d_tests.log" | tail -5
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,8 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s37d_20b_decode.log" 2>&1
      summary+=("s37d 20b decode rc=$?")
      echo "20b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37d_20b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s37d_120b_decode.log" 2>&1
      summary+=("s37d 120b decode rc=$?")
      echo "120b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37d_120b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s37d_120b_fp8x_decode.log" 2>&1
      summary+=("s37d 120b --fp8-experts decode rc=$?")
      echo "120b --fp8 --fp8-experts decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37d_120b_fp8x_decode.log"
      ;;
    s37c)
      # Session 37: the f16 GEMVs' staging with a thread's two chunks in flight and the x_ss_parts sum from
      # shared memory (cp.async) in the epilogue, against the r51 forms (GPTOSS_GEMV_SERIAL=1): the same
      # bits. Tests (GEMVs, QKV, the decode MoE's f16 staging, the model and engine), then 20b / 120b batch
      # 1 at 1k interleaved serial 1 / 0, two passes; the trace; the bars (20b batches 1-8, 120b,
      # 120b --fp8-experts).
      timeout 400 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaFp8Gemv.*:CudaQkvFused.*:CudaDecodeFusion.*:CudaOps.MoeDecodeFp8*:CudaOps.MoeResidualTail*:CudaOps.Router*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s37c_tests.log" 2>&1
      rc=$?
      summary+=("s37c tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|tests ran|PASSED" "$OUT/s37c_tests.log" | tail -8
      grep -cE "OK \]" "$OUT/s37c_tests.log"
      for pass in 1 2; do
        for m in 20b 120b; do
          for v in 1 0; do
            GPTOSS_GEMV_SERIAL=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$m --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s37c_${m}_s${v}_$pass.log" 2>&1
            echo "$m serial=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37c_${m}_s${v}_$pass.log")"
          done
        done
      done
      GPTOSS_KERNEL_TRACE="$OUT/s37c_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b \
        --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s37c_ktrace_20b.log" 2>&1
      python3 tools/ktrace_summary.py "$OUT/s37c_ktrace_20b.csv"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4,8 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s37c_20b_decode.log" 2>&1
      summary+=("s37c 20b decode rc=$?")
      echo "20b --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37c_20b_decode.log"
      timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill "" --batch 1 --context 1024 \
        --decode-steps 64 --repeats 3 > "$OUT/s37c_120b_fp8x_decode.log" 2>&1
      summary+=("s37c 120b --fp8-experts decode rc=$?")
      echo "120b --fp8 --fp8-experts decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37c_120b_fp8x_decode.log"
      ;;
    s37b)
      # Session 37: s37a after its look back: the router's top-k as two warp reductions a round (both
      # forms), the O tail's logit parts by 4-lane trees and its last CTA's loads issued 16 at a time.
      # Tests, then 20b / 120b batch 1 at 1k interleaved GPTOSS_ROUTER_IN_O=0 / 1, two passes; the trace.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaDecodeFusion.*:CudaOps.Router*:CudaOps.MoeDecodeApplies*:CudaModel.Fp8RouterInO*:CudaModel.Fp8ResidualTail*' \
        > "$OUT/s37b_tests.log" 2>&1
      rc=$?
      summary+=("s37b tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|rel L2 [0-9.e-]+ over" "$OUT/s37b_tests.log" | head -40
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for m in 20b 120b; do
            for v in 0 1; do
              GPTOSS_ROUTER_IN_O=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-$m --fp8 --prefill "" --batch 1 \
                --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s37b_${m}_o${v}_$pass.log" 2>&1
              echo "$m router_in_o=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37b_${m}_o${v}_$pass.log")"
            done
          done
        done
        GPTOSS_KERNEL_TRACE="$OUT/s37b_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b \
          --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s37b_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s37b_ktrace_20b.csv"
      fi
      ;;
    s37a)
      # Session 37: GemvRouterTail (the post-attention norm and the router in the O GEMV at one token,
      # GPTOSS_ROUTER_IN_O=0 off). Tests (the kernel against the host, h_inv_rms in the decode MoE, the
      # model against the router launch, the neighbours), then decode at 1k interleaved off / on: 20b
      # batch 1 two passes, 120b two, 120b --fp8-experts one, 20b batch 2 once (off the path); then the
      # 20b trace with it on.
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaDecodeFusion.*:CudaOps.MoeDecodeApplies*:CudaOps.MoeResidualTail*:CudaOps.MoeDecodeFp8*:CudaFp8Gemv.*:CudaModel.Fp8RouterInO*:CudaModel.Fp8ResidualTail*:CudaModel.Fp8GemvsOnBf16*' \
        > "$OUT/s37a_tests.log" 2>&1
      rc=$?
      summary+=("s37a tests rc=$rc")
      grep -E "OK \]|FAILED|Failure|rel L2" "$OUT/s37a_tests.log" | head -40
      if [ $rc = 0 ]; then
        for pass in 1 2; do
          for v in 0 1; do
            GPTOSS_ROUTER_IN_O=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s37a_20b_o${v}_$pass.log" 2>&1
            echo "20b router_in_o=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37a_20b_o${v}_$pass.log")"
          done
          for v in 0 1; do
            GPTOSS_ROUTER_IN_O=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s37a_120b_o${v}_$pass.log" 2>&1
            echo "120b router_in_o=$v pass $pass: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37a_120b_o${v}_$pass.log")"
          done
        done
        for v in 0 1; do
          GPTOSS_ROUTER_IN_O=$v timeout 200 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --fp8-experts --prefill "" \
            --batch 1 --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s37a_120bx_o${v}.log" 2>&1
          echo "120b --fp8-experts router_in_o=$v: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37a_120bx_o${v}.log")"
        done
        timeout 200 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 2 \
          --context 1024 --decode-steps 64 --repeats 3 > "$OUT/s37a_20b_b2.log" 2>&1
        echo "20b batch 2: $(grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s37a_20b_b2.log")"
        GPTOSS_KERNEL_TRACE="$OUT/s37a_ktrace_20b.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b \
          --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s37a_ktrace_20b.log" 2>&1
        python3 tools/ktrace_summary.py "$OUT/s37a_ktrace_20b.csv"
      fi
      ;;
    s30e)
      # Session 30, the last call: the shipped code (the r44 kernels; the session's experiments
      # removed). Tests (decode MoE, model, engine), then the bars: 20b and 120b --fp8 batch-1
      # decode at 1k, 20b and 120b (MX experts) 8k prefill.
      timeout 120 $BIN/cuda_kernel_tests --gtest_filter='CudaOps.MoeDecodeMma*:CudaModel.MatchesCpuAtRealWidthsWithBatchesAndLongPrompts:CudaModel.Fp8*:CudaEngine.*' \
        > "$OUT/s30e_tests.log" 2>&1
      summary+=("s30e tests rc=$?")
      grep -E "OK \]|FAILED|Failure" "$OUT/s30e_tests.log" | head -20
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
          --repeats 3 > "$OUT/s30e_decode_$m.log" 2>&1
        summary+=("s30e decode $m rc=$?")
        echo "$m batch 1:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s30e_decode_$m.log"
      done
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" --repeats 3 > "$OUT/s30e_prefill_$m.log" 2>&1
        summary+=("s30e prefill $m rc=$?")
        grep -E "prefill +8192" "$OUT/s30e_prefill_$m.log"
      done
      ;;
    s29e)
      # Session 29: ncu of the decode attention at 8 sequences, 32k, launched as clusters
      # (GPTOSS_ATTN_DECODE_CLUSTER=all: 70-75% of the bandwidth in attention_bench) and without
      # (92-100%): does the cluster kernel run slower by itself (placement), or only back to back?
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for cl in all 1; do
        GPTOSS_ATTN_DECODE_CLUSTER=$cl timeout 120 $NCU --clock-control none --cache-control none --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
          --metrics 'dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,gpu__time_duration.sum' \
          -k regex:decode_kernel --launch-skip 4 -c 1 $BIN/attention_bench "decode B=8 ctx=32768" > "$OUT/s29e_ncu_cluster_$cl.txt" 2>&1
        summary+=("s29e ncu cluster=$cl rc=$?")
        echo "== decode attention B=8 32k, GPTOSS_ATTN_DECODE_CLUSTER=$cl"
        grep -E "decode_kernel|Duration|DRAM Throughput|Memory Throughput|dram__|lts__|Cluster|Grid Size|Achieved Occupancy|L2 Hit" "$OUT/s29e_ncu_cluster_$cl.txt" | head -20
      done
      ;;
    spec)
      # Session 27: n-gram speculative decoding on the CUDA runner. The engine tests (the speculative
      # one prints its step counts), then 20b --fp8 greedy generation of 1,024 tokens from a random
      # 64-token prompt with 0 / 2 / 4 drafts a step (decode tok/s, steps, drafts kept, and whether
      # the ids match the plain run), then the decode step at 1-5 sequences (a verification of k
      # drafts is a k + 1-entry decode step).
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaEngine.*' > "$OUT/spec_tests.log" 2>&1
      summary+=("spec tests rc=$?")
      grep -E "^\[spec\]|OK \]|FAILED|Failure|first difference" "$OUT/spec_tests.log" | head -20
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1 > /dev/null
      ids=$(python3 -c 'import random; r=random.Random(5); print(",".join(str(r.randrange(200000)) for _ in range(64)))')
      for k in 0 2 4; do
        timeout 150 $BIN/gptoss generate --model "$WORK/gpt-oss-20b" --backend cuda --fp8 --ids "$ids" --max-tokens 1024 \
          --temperature 0 --ignore-eos --max-num-seqs 8 --speculative-tokens $k --ngram-min 1 --ngram-max 4 \
          --speculative-max-running 0 > "$OUT/spec_gen_$k.json" 2> "$OUT/spec_gen_$k.err"
        summary+=("spec generate k=$k rc=$?")
      done
      python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {k: json.load(open(f"{out}/spec_gen_{k}.json")) for k in (0, 2, 4)}
base = runs[0]["ids"]
print("| drafts | decode tok/s | steps | drafts fed | kept | ids = plain |")
print("|---:|---:|---:|---:|---:|---|")
for k, r in runs.items():
    t = r["timing"]
    print(f"| {k} | {t['decode_tok_per_s']:.1f} | {t.get('steps', '-')} | {t.get('draft_tokens', 0)} | "
          f"{t.get('accepted_tokens', 0)} | {r['ids'] == base} |")
cyc = next((i for i in range(1, len(base)) if base[i:i + 8] in [base[j:j + 8] for j in range(i)]), None)
print("first 8-gram repeat in the plain output at token", cyc)
PY
      timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,3,4,5 --context 1024 \
        --decode-steps 32 --repeats 3 > "$OUT/spec_steps.log" 2>&1
      summary+=("spec steps rc=$?")
      grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/spec_steps.log" | head -8
      ;;
    ktrace)
      # Session 21: one decode step kernel by kernel inside the replayed graph (CUPTI activity
      # records, GPTOSS_KERNEL_TRACE; cli/kernel_trace.h): 20b then 120b --fp8, batch 1, 1k context.
      # The step times of a traced run are not the engine's (tracing costs time).
      for m in gpt-oss-20b gpt-oss-120b; do
        GPTOSS_KERNEL_TRACE="$OUT/ktrace_$m.csv" timeout 100 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" \
          --batch 1 --context 1024 --decode-steps 6 > "$OUT/ktrace_$m.log" 2>&1
        summary+=("ktrace $m rc=$?")
        grep -E "kernel trace|KERNEL_TRACE|^\| [0-9]+ \| [0-9]+ \|" "$OUT/ktrace_$m.log"
        python3 tools/ktrace_summary.py "$OUT/ktrace_$m.csv"
      done
      ;;
    s22a)
      # Ran at 50126cd (r37 call 1): slower (20b 1.77 → 1.85 ms a step), and the switch, kernel and
      # test were removed after it; kept as the record of what ran.
      # Written in session 21 (compiled only): the decode input norm inside the QKV GEMV
      # (GPTOSS_DECODE_NORM_IN_QKV=1, QkvNormArgs). Its test (same bits as the norm kernel + the
      # GEMV), the model and engine tests with it on, then 20b / 120b --fp8 batch-1 decode at 1k
      # with it off / on / off (untraced), and the kernel trace with it on.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaQkvFused.*' > "$OUT/s22a_tests.log" 2>&1
      rc=$?
      GPTOSS_DECODE_NORM_IN_QKV=1 timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaModel.*:CudaEngine.*' \
        >> "$OUT/s22a_tests.log" 2>&1
      rc2=$?
      summary+=("s22a tests rc=$rc model tests (norm in qkv) rc=$rc2")
      grep -E "FAILED|Failure|OK \]" "$OUT/s22a_tests.log" | head -30
      if [ $rc = 0 ] && [ $rc2 = 0 ]; then
        for m in gpt-oss-20b gpt-oss-120b; do
          for v in 0 1 0 1; do
            GPTOSS_DECODE_NORM_IN_QKV=$v timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 \
              --context 1024 --decode-steps 32 --markdown "$OUT/s22a_${m}_$v.md" >> "$OUT/s22a_${m}_$v.log" 2>&1
            summary+=("s22a $m norm_in_qkv=$v rc=$?")
            echo "$m norm_in_qkv=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s22a_${m}_$v.md"
          done
        done
        # The sliding layers' attention in one split (no combine launch; r28's switch, now with the trace).
        for v in 0 3; do
          GPTOSS_DECODE_NORM_IN_QKV=1 GPTOSS_ATTN_SINGLE_SPLIT_TILES=$v timeout 100 $BIN/gptoss bench --synthetic \
            gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 32 \
            --markdown "$OUT/s22a_split$v.md" > "$OUT/s22a_split$v.log" 2>&1
          summary+=("s22a single split tiles=$v rc=$?")
          echo "20b norm_in_qkv=1 single_split_tiles=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s22a_split$v.md"
          GPTOSS_DECODE_NORM_IN_QKV=1 GPTOSS_ATTN_SINGLE_SPLIT_TILES=$v GPTOSS_KERNEL_TRACE="$OUT/s22a_ktrace_split$v.csv" \
            timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1 --context 1024 \
            --decode-steps 6 > "$OUT/s22a_ktrace_split$v.log" 2>&1
          summary+=("s22a ktrace split=$v rc=$?")
          python3 tools/ktrace_summary.py "$OUT/s22a_ktrace_split$v.csv"
        done
      fi
      ;;
    # Stages of removed switches are gone from here; each ran at the revision its results README
    # names, where the script still has it (r38: s23a at 8f90f54, moe_loop at e524c5d, l2pf at
    # 3e416b8, pf at bae59b6).
    s23b)
      # Written in session 22 (compiled only): the decode router in clusters of up to 16 CTAs
      # (GPTOSS_ROUTER_CLUSTER=16; 120b: 16 CTAs of 8 experts, half the rows a CTA stages after its
      # late cluster start). Router tests (cluster_ctas 0 and 16) and the model and engine tests (the
      # default router gained an entry cluster barrier after r37's run), 120b batch 1 at 1k 1 / 16
      # twice, and the trace with 16.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaDecodeFusion.Router*:CudaModel.*:CudaEngine.*' > "$OUT/s23b_tests.log" 2>&1
      rc=$?
      summary+=("s23b tests rc=$rc")
      grep -E "FAILED|Failure|OK \]" "$OUT/s23b_tests.log" | head -20
      if [ $rc = 0 ]; then
        for v in 1 16 1 16; do
          GPTOSS_ROUTER_CLUSTER=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
            --context 1024 --decode-steps 32 --markdown "$OUT/s23b_$v.md" >> "$OUT/s23b_$v.log" 2>&1
          summary+=("s23b 120b router_cluster=$v rc=$?")
          echo "120b router_cluster=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s23b_$v.md"
        done
        GPTOSS_ROUTER_CLUSTER=16 GPTOSS_KERNEL_TRACE="$OUT/s23b_ktrace.csv" timeout 100 $BIN/gptoss bench --synthetic \
          gpt-oss-120b --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s23b_ktrace.log" 2>&1
        summary+=("s23b ktrace rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s23b_ktrace.csv"
      fi
      ;;
    s23c)
      # The decode attention's cluster merge at batches 2-4 (r37 measured 1: faster, 8: slower):
      # GPTOSS_ATTN_DECODE_CLUSTER=all against the default (one sequence only), twice.
      for v in 1 all 1 all; do
        GPTOSS_ATTN_DECODE_CLUSTER=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" \
          --batch 1,2,4 --context 1024 --decode-steps 32 --markdown "$OUT/s23c_$v.md" >> "$OUT/s23c_$v.log" 2>&1
        summary+=("s23c attn_cluster=$v rc=$?")
        echo "20b attn_cluster=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s23c_$v.md"
      done
      ;;
    boundary)
      # What a phase boundary costs: N dependent phases as graph launches with / without PDL and as
      # one persistent kernel with a grid barrier (bench/kernels/boundary_bench.cu; NOTES r37 Next 1).
      timeout 120 $BIN/boundary_bench 256 > "$OUT/boundary_bench.log" 2>&1
      summary+=("boundary_bench rc=$?")
      cat "$OUT/boundary_bench.log"
      ;;
    s22d)
      # Session 22: s22c with up to 16 splits a cluster (non-portable size) and the auto split count
      # capped there, so the full layers' merge runs in the kernel too. Tests, then decode off / on.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s22d_tests.log" 2>&1
      rc=$?
      summary+=("s22d tests rc=$rc")
      grep -E "FAILED|Failure|OK \]" "$OUT/s22d_tests.log" | head -40
      if [ $rc = 0 ]; then
        for run in "gpt-oss-20b 1,8 1024 0" "gpt-oss-20b 1,8 1024 1" "gpt-oss-20b 1,8 1024 0" "gpt-oss-20b 1,8 1024 1" \
                   "gpt-oss-120b 1 1024 0" "gpt-oss-120b 1 1024 1" "gpt-oss-20b 1 8192 0" "gpt-oss-20b 1 8192 1"; do
          set -- $run
          GPTOSS_ATTN_DECODE_CLUSTER=$4 timeout 120 $BIN/gptoss bench --synthetic $1 --fp8 --prefill "" --batch $2 \
            --context $3 --decode-steps 32 --markdown "$OUT/s22d_$1_$3_$4.md" >> "$OUT/s22d_$1_$3_$4.log" 2>&1
          summary+=("s22d $run rc=$?")
          echo "$1 ctx $3 attn_cluster=$4:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s22d_$1_$3_$4.md"
        done
        GPTOSS_KERNEL_TRACE="$OUT/s22d_ktrace.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s22d_ktrace.log" 2>&1
        summary+=("s22d ktrace rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s22d_ktrace.csv"
      fi
      ;;
    s22c)
      # Session 22: the decode attention's split merge inside the kernel (splits of a kv head in one
      # cluster, partials read from the CTAs' shared memory; GPTOSS_ATTN_DECODE_CLUSTER=0 the combine
      # launch). Attention and model / engine tests, then 20b / 120b --fp8 decode at 1k (batch 1, 8),
      # off / on twice, and the 20b kernel trace with it on.
      timeout 300 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s22c_tests.log" 2>&1
      rc=$?
      summary+=("s22c tests rc=$rc")
      grep -E "FAILED|Failure|OK \]" "$OUT/s22c_tests.log" | head -40
      if [ $rc = 0 ]; then
        for m in gpt-oss-20b gpt-oss-120b; do
          for v in 0 1 0 1; do
            GPTOSS_ATTN_DECODE_CLUSTER=$v timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1,8 \
              --context 1024 --decode-steps 32 --markdown "$OUT/s22c_${m}_$v.md" >> "$OUT/s22c_${m}_$v.log" 2>&1
            summary+=("s22c $m attn_cluster=$v rc=$?")
            echo "$m attn_cluster=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s22c_${m}_$v.md"
          done
        done
        GPTOSS_KERNEL_TRACE="$OUT/s22c_ktrace.csv" timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
          --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s22c_ktrace.log" 2>&1
        summary+=("s22c ktrace rc=$?")
        python3 tools/ktrace_summary.py "$OUT/s22c_ktrace.csv"
      fi
      ;;
    s22b)
      # Session 22: the decode router in one thread-block cluster (router_plan_cluster_kernel, logits
      # through CTA 0's shared memory; GPTOSS_ROUTER_CLUSTER=0 the ticket kernel). Router tests (both
      # kernels), model and engine tests, then 20b / 120b --fp8 decode at 1k, cluster off / on twice,
      # and the kernel trace with it on.
      timeout 200 $BIN/cuda_kernel_tests --gtest_filter='CudaDecodeFusion.Router*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s22b_tests.log" 2>&1
      rc=$?
      summary+=("s22b tests rc=$rc")
      grep -E "FAILED|Failure|OK \]" "$OUT/s22b_tests.log" | head -30
      if [ $rc = 0 ]; then
        for m in gpt-oss-20b gpt-oss-120b; do
          for v in 0 1 0 1; do
            GPTOSS_ROUTER_CLUSTER=$v timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1,8 \
              --context 1024 --decode-steps 32 --markdown "$OUT/s22b_${m}_$v.md" >> "$OUT/s22b_${m}_$v.log" 2>&1
            summary+=("s22b $m router_cluster=$v rc=$?")
            echo "$m router_cluster=$v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s22b_${m}_$v.md"
          done
        done
        for m in gpt-oss-20b gpt-oss-120b; do
          GPTOSS_KERNEL_TRACE="$OUT/s22b_ktrace_$m.csv" timeout 100 $BIN/gptoss bench --synthetic $m --fp8 \
            --prefill "" --batch 1 --context 1024 --decode-steps 6 > "$OUT/s22b_ktrace_$m.log" 2>&1
          summary+=("s22b ktrace $m rc=$?")
          python3 tools/ktrace_summary.py "$OUT/s22b_ktrace_$m.csv"
        done
      fi
      ;;
    s21d)
      # Session 21 (c): decode with the L2 prefetch modes (see s21).
      for v in 0 1 2 3 0; do
        GPTOSS_DECODE_L2_PREFETCH=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,4 \
          --context 1024 --decode-steps 32 --repeats 3 --markdown "$OUT/s21_decode20_$v.md" >> "$OUT/s21_decode20_$v.log" 2>&1
        summary+=("s21 decode 20b prefetch=$v rc=$?")
        echo "20b prefetch $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s21_decode20_$v.md"
      done
      for v in 0 1 3; do
        GPTOSS_DECODE_L2_PREFETCH=$v timeout 150 $BIN/gptoss bench --synthetic gpt-oss-120b --fp8 --prefill "" --batch 1 \
          --context 1024 --decode-steps 32 --repeats 3 --markdown "$OUT/s21_decode120_$v.md" >> "$OUT/s21_decode120_$v.log" 2>&1
        summary+=("s21 decode 120b prefetch=$v rc=$?")
        echo "120b prefetch $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/s21_decode120_$v.md"
      done
      ;;
    s20c)
      # Ran at 4d7383c (r35 call 5).
      # Session 20: the prompt attention writing its rows quantized for the O projection's FP8 GEMM
      # (PagedAttentionArgs::out_q; GPTOSS_ATTN_OUT_Q, default on in the FP8 model). Tests (the
      # e4m3 rows and scales equal to quantize_act_fp8_bf16 of each kernel's bf16 rows; model,
      # engine), attention_bench prefill with OUT_Q 1 / 0 twice, 8k --fp8 prefill 20b default /
      # OUT_Q=0 twice, 120b default / OUT_Q=0 (GPTOSS_PROFILE stages).
      timeout 300 $BIN/cuda_kernel_tests \
        --gtest_filter='PagedAttentionCuda.Prefill*:AttentionHarness.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/s20c_tests.log" 2>&1
      rc=$?
      summary+=("s20c tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/s20c_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|out_q" "$OUT/s20c_tests.log" | head -20
      if [ $rc = 0 ]; then
        for v in 1 0 1 0; do
          GPTOSS_ATTN_OUT_Q=$v timeout 60 $BIN/attention_bench prefill >> "$OUT/s20c_attn_outq$v.log" 2>&1
        done
        for v in 1 0; do echo "attention_bench OUT_Q=$v:"; grep -E "prefill T=" "$OUT/s20c_attn_outq$v.log"; done
        for cfg in gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_OUT_Q=0 gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_OUT_Q=0 \
            gpt-oss-120b: gpt-oss-120b:GPTOSS_ATTN_OUT_Q=0; do
          m=${cfg%%:*}; e=${cfg#*:}; tag="${m}_${e:-default}"
          env $e GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
            --repeats 3 >> "$OUT/s20c_$tag.log" 2>&1
          summary+=("s20c $tag rc=$?")
          echo "$tag:"; grep -E "^\| [0-9]+ \||  (attention|o_gemm|total) " "$OUT/s20c_$tag.log" | tail -4
        done
      fi
      ;;
    decode_diag)
      # The decode MoE's fixed part in the model (NOTES r34 item 2): 20b --fp8 batch 1-2 steps with
      # moe_decode_mma as is (0), loads only (1), math only (2), neither (3). Outputs of 1-3 are
      # garbage (timing only: the routing then follows garbage too, so the experts differ).
      for v in 0 1 2 3; do
        GPTOSS_MOE_DECODE_DIAG=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2 \
          --context 1024 --decode-steps 32 --repeats 3 --markdown "$OUT/decode_diag_$v.md" > "$OUT/decode_diag_$v.log" 2>&1
        summary+=("decode_diag $v rc=$?")
        echo "diag $v:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/decode_diag_$v.md"
      done
      ;;
    ncu_qraw)
      # Session 19: where the prefill attention's q_raw path spends its ~2.5 us a query tile: ncu source
      # counters (executed instructions, stall samples a SASS line) of the first TMA prefill launch of
      # attention_bench "prefill T=1024" (full causal, 1k) with GPTOSS_ATTN_QROPE 1 and 0.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      for v in 1 0; do
        GPTOSS_ATTN_QROPE=$v timeout 150 $NCU --clock-control none --cache-control none --section SourceCounters \
          --section WarpStateStats --section SpeedOfLight -k regex:prefill_tma -c 1 -f -o "$WORK/ncu_qraw_$v" \
          $BIN/attention_bench "prefill T=1024" > "$OUT/ncu_qraw_$v.log" 2>&1
        summary+=("ncu_qraw $v rc=$?")
        $NCU -i "$WORK/ncu_qraw_$v.ncu-rep" --page details > "$OUT/ncu_qraw_${v}_details.txt" 2>&1
        $NCU -i "$WORK/ncu_qraw_$v.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_qraw_${v}_source.csv" 2>&1
        gzip -f "$OUT/ncu_qraw_${v}_source.csv"
        echo "QROPE=$v:"; grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Stall" "$OUT/ncu_qraw_${v}_details.txt" | head -12
      done
      ;;
    s19a | s19b)
      # Session 19: the prompt attention's q from the QKV rows (GPTOSS_ATTN_QROPE, default on), the
      # k/v-only RoPE kernel and the ping-pong kernel on full layers of >= 2k-query batches: the
      # attention tests (q_raw bit-identity in every prefill kernel), RoPE, model and engine tests;
      # attention_bench prefill with QROPE 1 / 0; 8k --fp8 prefill A/B runs (with GPTOSS_PROFILE).
      # s19a (calls 2-3): 20b default / QROPE=0 / PINGPONG=0, 120b default / QROPE=0, then moe_bench
      # with GPTOSS_MOE_DECODE_DIAG 0 / 3. s19b (calls 4-5): 20b default / QROPE=0 twice, 120b
      # default / QROPE=0.
      t=$stage
      timeout 420 $BIN/cuda_kernel_tests \
        --gtest_filter='PagedAttentionCuda.*:AttentionHarness.*:CudaOps.QkvBiasRopeKvWrite:CudaQkvFused.*:CudaModel.*:CudaEngine.*' \
        > "$OUT/${t}_tests.log" 2>&1
      rc=$?
      summary+=("$t tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/${t}_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure|q_raw" "$OUT/${t}_tests.log" | head -20
      if [ $rc = 0 ]; then
        for v in 1 0; do
          GPTOSS_ATTN_QROPE=$v timeout 120 $BIN/attention_bench prefill > "$OUT/${t}_attn_qrope$v.log" 2>&1
          echo "attention_bench QROPE=$v:"; grep -E "prefill T=" "$OUT/${t}_attn_qrope$v.log"
        done
        if [ $t = s19a ]; then
          cfgs="gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_QROPE=0 gpt-oss-20b:GPTOSS_ATTN_PINGPONG=0"
        else
          cfgs="gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_QROPE=0 gpt-oss-20b: gpt-oss-20b:GPTOSS_ATTN_QROPE=0"
        fi
        for cfg in $cfgs gpt-oss-120b: gpt-oss-120b:GPTOSS_ATTN_QROPE=0; do
          m=${cfg%%:*}; e=${cfg#*:}; tag="${m}_${e:-default}"
          env $e GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" \
            --repeats 3 >> "$OUT/${t}_$tag.log" 2>&1
          summary+=("$t $tag rc=$?")
          echo "$tag:"; grep -E "^\| [0-9]+ \||  (attention|rope_kv|total) " "$OUT/${t}_$tag.log" | tail -4
        done
      fi
      if [ $t = s19a ]; then
        for v in 0 3; do
          GPTOSS_MOE_DECODE_DIAG=$v timeout 100 $BIN/moe_bench 1 2 4 8 > "$OUT/s19a_moe_diag$v.log" 2>&1
          echo "moe_bench diag=$v:"; grep -E "^\| [0-9]+ \|" "$OUT/s19a_moe_diag$v.log"
        done
      fi
      ;;
    next19)
      # Written in session 18 (compiled only), to run first in session 19 (~3 min):
      # 1. the prefill attention's warpgroups taking turns at the tensor cores (GPTOSS_ATTN_PINGPONG=1):
      #    its tests (bit-identical to the pipelined kernel), attention_bench prefill both ways twice,
      #    20b 8k --fp8 prefill both ways;
      # 2. moe_decode_mma's diagnostic forms (GPTOSS_MOE_DECODE_DIAG=1 loads only, 2 math only) in
      #    moe_bench at 1-8 tokens beside the kernel (0).
      timeout 150 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.Prefill*' > "$OUT/next19_tests.log" 2>&1
      rc=$?
      summary+=("next19 tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/next19_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/next19_tests.log" | head -20
      if [ $rc = 0 ]; then
        for v in 0 1 0 1; do
          GPTOSS_ATTN_PINGPONG=$v timeout 120 $BIN/attention_bench prefill >> "$OUT/next19_attn_$v.log" 2>&1
        done
        for v in 0 1; do echo "attention_bench pingpong=$v:"; grep -E "prefill T=" "$OUT/next19_attn_$v.log"; done
        for v in 1 0; do
          GPTOSS_ATTN_PINGPONG=$v GPTOSS_PROFILE=1 timeout 150 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
            --prefill 8192 --batch "" --repeats 3 > "$OUT/next19_20b_pingpong$v.log" 2>&1
          summary+=("next19 20b 8k pingpong=$v rc=$?")
          echo "20b 8k pingpong=$v:"; grep -E "^\| [0-9]+ \||  (attention|total) " "$OUT/next19_20b_pingpong$v.log" | head -4
        done
      fi
      for v in 0 1 2; do
        GPTOSS_MOE_DECODE_DIAG=$v timeout 100 $BIN/moe_bench 1 2 4 8 > "$OUT/next19_moe_diag$v.log" 2>&1
        echo "moe_bench diag=$v:"; grep -E "^\| [0-9]+ \|" "$OUT/next19_moe_diag$v.log"
      done
      ;;
    final18)
      # Session 18's last check: the tests its changes touch (decode MoE, norm rows and gather, the
      # model and engine tests) at the final revision, then 20b --fp8 decode at batch 1-4.
      timeout 200 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeDecodeMmaEdgeShapesAndScales:CudaOps.MoeMxfp4MatchesCpu:CudaOps.ResidualRmsNorm*:CudaModel.*:CudaEngine.*' \
        > "$OUT/final18_tests.log" 2>&1
      rc=$?
      summary+=("final18 tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/final18_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/final18_tests.log" | head -20
      if [ $rc = 0 ]; then
        timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill "" --batch 1,2,4 --context 1024 \
          --decode-steps 32 --repeats 3 --markdown "$OUT/final18_gpt-oss-20b.md" > "$OUT/final18_gpt-oss-20b.log" 2>&1
        summary+=("final18 20b decode rc=$?")
        grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/final18_gpt-oss-20b.md"
      fi
      ;;
    rowq)
      # Session 18: the post-attention norm writes the MoE's e4m3 token rows, the grouped FP8 / MX
      # MoE gathers them per assignment (GPTOSS_MOE_ROWQ=1, default) instead of quantizing h's rows
      # per assignment: bit-identity tests, the model tests, 8k --fp8 prefill of both models.
      switch_prefill_ab rowq GPTOSS_MOE_ROWQ 'CudaOps.ResidualRmsNorm*:CudaMoeFp8.MatchesCpuSchemeAtRealWidths:CudaMoeMx.MatchesCpuAtRealWidths' \
        'moe|norm' "gpt-oss-20b gpt-oss-120b"
      ;;
    decode_s17)
      # Session 17's decode MoE changes (moe_decode_mma; the router's one fence): the MoE, model,
      # engine and router tests; moe_bench at 1-8 tokens; if they pass, decode at 1k of both models
      # --fp8 at batch 1-8; then (DECODE_S17_NCU=1, the default) ncu's instruction count and
      # duration of the two launches (gate_up, down) at 20b batch 1.
      timeout 250 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaOps.MoeMxfp4MatchesCpu:CudaOps.MoeDecodeMmaEdgeShapesAndScales:CudaDecodeFusion.Router*:CudaModel.*:CudaEngine.*' \
        > "$OUT/decode_s17_tests.log" 2>&1
      rc=$?
      summary+=("decode_s17 tests rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/decode_s17_tests.log" | tr '\n' ' ')")
      grep -E "FAILED|Failure" "$OUT/decode_s17_tests.log" | head -20
      if [ $rc = 0 ]; then
        timeout 100 $BIN/moe_bench 1 2 4 8 > "$OUT/decode_s17_moe_bench.log" 2>&1
        echo "moe_bench:"; grep -E "^\| [0-9]+ \|" "$OUT/decode_s17_moe_bench.log"
        for m in gpt-oss-20b gpt-oss-120b; do
          timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1,2,4,8 --context 1024 \
            --decode-steps 32 --repeats 3 --markdown "$OUT/decode_s17_$m.md" > "$OUT/decode_s17_$m.log" 2>&1
          summary+=("decode_s17 $m rc=$?")
          echo "$m --fp8 decode:"; grep -E "^\| [0-9]+ \| [0-9]+ \|" "$OUT/decode_s17_$m.md"
        done
      fi
      if [ $rc = 0 ] && [ "${DECODE_S17_NCU:-1}" = 1 ]; then  # r32 call 4: ~150 s was not enough for both launches
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
        timeout 150 $NCU --clock-control none --cache-control none --section SpeedOfLight --section InstructionStats \
          --section SchedulerStats -k regex:moe_decode_mma -c 2 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --batch 1 \
          --prefill "" --context 1024 --decode-steps 2 --repeats 1 > "$OUT/decode_s17_ncu.txt" 2>&1
        summary+=("decode_s17 ncu rc=$?")
        grep -E "  moe_decode|Duration|Executed Instructions  |Issue Slots Busy|DRAM Throughput" "$OUT/decode_s17_ncu.txt" | head -12
      fi
      ;;
    prefill_tables)
      # The prefill rows of issue 6's tables (latency and cost by input length) without the decode
      # sweep of `tables`: both models --fp8, and 120b with --fp8-experts.
      for cfg in "gpt-oss-20b" "gpt-oss-120b" "gpt-oss-120b --fp8-experts"; do
        tag=$(echo "$cfg" | tr -d ' -' | sed 's/gptoss//')
        [ "$cfg" = gpt-oss-20b ] && pf=1024,2048,4096,8192,16384 || pf=1024,2048,4096,8192
        timeout 200 $BIN/gptoss bench --synthetic $cfg --fp8 --prefill $pf --batch "" --repeats 3 \
          --json "$OUT/prefill_$tag.json" --markdown "$OUT/prefill_$tag.md" > "$OUT/prefill_$tag.log" 2>&1
        summary+=("prefill_tables [$cfg] rc=$?")
        echo "$cfg --fp8:"; grep -E "^\| [0-9]+ \|" "$OUT/prefill_$tag.md"
      done
      ;;
    router_norm)
      # The router normalizing the residual itself (default since session 13, measured in r29; A/B
      # against GPTOSS_ROUTER_NORM=0, the norm's fp32 copy): the bit-exactness test, the model tests
      # with it, then 8k --fp8 prefill of both models with it and without.
      switch_prefill_ab router_norm GPTOSS_ROUTER_NORM 'CudaOps.RouterNormalizingTheResidualMatchesTheNormsRows:CudaOps.ResidualRmsNorm*:CudaOps.RouterTopk' \
        'router|norm' "gpt-oss-20b gpt-oss-120b"
      ;;
    decode_wg)
      # moe_decode_wg (GPTOSS_MOE_DECODE=4, CudaModelOptions::moe_decode_wg; session 13, opt-in
      # since r29 measured it slower): its kernel tests and the FP8 model test, then, only if they
      # pass, moe_bench's weight-only MoE (1-8 tokens, 20b-shaped) and batch 1-8 decode of both
      # models --fp8 at 1k, with it (4) and with moe_decode_mma (1).
      timeout 240 $BIN/cuda_kernel_tests \
        --gtest_filter='CudaMoeDecodeWg.*:CudaModel.Fp8WeightsStayCloseToFp32:CudaOps.MoeMxfp4MatchesCpu' \
        > "$OUT/decode_wg_tests.log" 2>&1
      rc=$?
      summary+=("decode_wg tests rc=$rc")
      grep -E "OK \]|FAILED|moe_decode_wg|W4A8|Failure" "$OUT/decode_wg_tests.log" | head -40
      if [ $rc = 0 ]; then
        for v in 1 4; do
          GPTOSS_MOE_DECODE=$v timeout 60 $BIN/moe_bench 1 2 4 8 > "$OUT/decode_wg_moe_bench_$v.log" 2>&1
          echo "moe_bench GPTOSS_MOE_DECODE=$v:"; grep "^|" "$OUT/decode_wg_moe_bench_$v.log"
        done
        for m in gpt-oss-20b gpt-oss-120b; do
          for v in 1 4; do
            GPTOSS_MOE_DECODE=$v timeout 150 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1,2,4,8 \
              --context 1024 --decode-steps 32 --markdown "$OUT/decode_wg_${m}_$v.md" > "$OUT/decode_wg_${m}_$v.log" 2>&1
            summary+=("decode_wg $m GPTOSS_MOE_DECODE=$v rc=$?")
            echo "$m --fp8 GPTOSS_MOE_DECODE=$v:"; grep -E "^\| [0-9]+ \|" "$OUT/decode_wg_${m}_$v.md"
          done
        done
      fi
      ;;
    tables)
      # Issue 6's tables (plots: tools/plot_bench.py on the JSON): prefill latency and cost by input
      # length, decode tok/s per user against cost for batch 1-128 at 8k and 32k context; both models
      # --fp8 with the bf16 KV cache, and 20b with the FP8 cache at 32k (batch 128 fits only so).
      issue6_tables
      ;;
    ncu_prefill)
      # Kernel durations of prefill forwards (NCU_PREFILL_ARGS: model and length; default 20b --fp8
      # 8k; the bench runs 2 forwards, the first a warm-up), summed by kernel name per forward.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --kernel-name 'regex:^(?!.*(weight_quant|mxfp4_to_bf16|fill_random|pad_fp8|fp8_block_to|fill_kv|init_)).*' \
        --launch-count ${NCU_PREFILL_COUNT:-2000} $BIN/gptoss bench \
        ${NCU_PREFILL_ARGS:---synthetic gpt-oss-20b --fp8 --prefill 8192} --batch "" --repeats 1 \
        > "$OUT/ncu_prefill.csv" 2> "$OUT/ncu_prefill.err"
      summary+=("ncu_prefill rc=$?")
      tail -2 "$OUT/ncu_prefill.err"
      python3 tools/ncu_kernel_times.py "$OUT/ncu_prefill.csv" --top 30 | tee "$OUT/ncu_prefill_summary.md"
      ;;
    prefill8k)
      # 8k-token --fp8 prefill of both models with the stage profile (GPTOSS_PROFILE; the latency
      # row is from the timed runs without it).
      for m in gpt-oss-20b gpt-oss-120b; do
        GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 --batch "" --repeats 3 \
          > "$OUT/prefill8k_$m.log" 2>&1
        summary+=("prefill8k $m rc=$?")
        echo "$m --fp8 8k prefill:"; grep -E "^\| [0-9]+ \|" "$OUT/prefill8k_$m.log" | head -1
        grep -A12 GPTOSS_PROFILE "$OUT/prefill8k_$m.log"
      done
      ;;
    bf16_out)
      # The prompt path's FP8 QKV / output projections writing bf16 (GPTOSS_GEMM_BF16_OUT, default on).
      switch_prefill_ab bf16_out GPTOSS_GEMM_BF16_OUT 'CudaFp8Gemm.*:CudaOps.QkvBiasRopeKvWrite:CudaOps.ResidualRmsNorm' \
        'qkv_gemm|o_gemm|rope_kv|norm' "gpt-oss-20b gpt-oss-120b"
      ;;
    ncu_src)
      # Where a kernel's warps stall, by SASS instruction: one launch of NCU_SRC_KERNEL (default the
      # grouped FP8 MoE, moe_fp8_persistent; the MX one: moe_mx_persistent with NCU_SRC_ARGS
      # "--synthetic gpt-oss-120b --fp8 --prefill 8192 --batch '' --repeats 1") in NCU_SRC_ARGS' run
      # (shell words, as AB_ARGS; default 20b --fp8 8k prefill)
      # with ncu's source counters, then the 30 instructions with the most stall samples.
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      eval "args=(${NCU_SRC_ARGS:---synthetic gpt-oss-20b --fp8 --prefill 8192 --batch "''" --repeats 1})"
      timeout 300 $NCU --clock-control none --cache-control none --section SourceCounters --section WarpStateStats \
        --section SpeedOfLight \
        -k regex:${NCU_SRC_KERNEL:-moe_fp8_persistent} -c 1 -f -o "$OUT/ncu_src" $BIN/gptoss bench \
        "${args[@]}" > "$OUT/ncu_src.log" 2>&1
      summary+=("ncu_src rc=$?")
      $NCU -i "$OUT/ncu_src.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_src.csv" 2>&1
      $NCU -i "$OUT/ncu_src.ncu-rep" --page details --csv 2>/dev/null | grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput)"' \
        | awk -F'","' '{print $(NF-2), $(NF-1), $NF}' | tee "$OUT/ncu_src_sol.txt"
      python3 tools/ncu_stall_top.py "$OUT/ncu_src.csv" 30 | tee "$OUT/ncu_src_top.txt"
      ;;
    attn_pipe)
      # The TMA prefill attention with P·V of the previous tile under the current softmax
      # (GPTOSS_ATTN_PREFILL_PIPE=1, PagedAttentionArgs::prefill_pipe): the prefill attention tests
      # (they run it and compare its bytes with the TMA kernel's), then attention_bench and 20b
      # --fp8 8k prefill against the TMA kernel, only if they pass.
      timeout 150 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.Prefill*:PagedAttentionCuda.Fp8KvCache' \
        > "$OUT/attn_pipe_tests.log" 2>&1
      rc=$?
      summary+=("attn_pipe tests rc=$rc")
      grep -E "OK \]|FAILED|pipelined" "$OUT/attn_pipe_tests.log" | head -12
      if [ $rc = 0 ]; then
        for v in 0 1 0 1; do
          GPTOSS_ATTN_PREFILL_WGMMA=1 GPTOSS_ATTN_PREFILL_TMA=1 GPTOSS_ATTN_PREFILL_PIPE=$v timeout 60 \
            $BIN/attention_bench "prefill T=" > "$OUT/attn_pipe_bench_$v.log" 2>&1
          echo "attention_bench prefill, pipe $v:"; grep -E "^prefill" "$OUT/attn_pipe_bench_$v.log"
        done
        for v in 0 1; do
          GPTOSS_ATTN_PREFILL_PIPE=$v GPTOSS_PROFILE=1 timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 \
            --prefill 8192 --batch "" --repeats 3 > "$OUT/attn_pipe_20b_$v.log" 2>&1
          summary+=("attn_pipe 20b pipe=$v rc=$?")
          echo "20b --fp8 8k prefill, pipe $v:"; grep -E "^\| [0-9]+ \||  attention|  total" "$OUT/attn_pipe_20b_$v.log" | head -3
        done
      fi
      ;;
    attn_tma)
      # The wgmma prefill attention with K/V by TMA into an mbarrier ring (GPTOSS_ATTN_PREFILL_TMA=1,
      # PagedAttentionArgs::prefill_tma): the prefill attention tests (they run it), then
      # attention_bench and 20b --fp8 8k prefill against the cp.async kernel, only if they pass.
      timeout 150 $BIN/cuda_kernel_tests --gtest_filter='PagedAttentionCuda.Prefill*:PagedAttentionCuda.Fp8KvCache' \
        > "$OUT/attn_tma_tests.log" 2>&1
      rc=$?
      summary+=("attn_tma tests rc=$rc")
      grep -E "prefill tma|OK \]|FAILED" "$OUT/attn_tma_tests.log" | grep -E "FAIL|OK \]" | head -12
      if [ $rc = 0 ]; then
        for v in 0 1; do
          GPTOSS_ATTN_PREFILL_WGMMA=1 GPTOSS_ATTN_PREFILL_TMA=$v timeout 60 $BIN/attention_bench "prefill T=" \
            > "$OUT/attn_tma_bench_$v.log" 2>&1
          echo "attention_bench prefill, TMA $v:"; grep -E "^prefill" "$OUT/attn_tma_bench_$v.log"
        done
        for v in 0 1; do
          GPTOSS_ATTN_PREFILL_TMA=$v timeout 100 $BIN/gptoss bench --synthetic gpt-oss-20b --fp8 --prefill 8192 \
            --batch "" --repeats 5 > "$OUT/attn_tma_20b_$v.log" 2>&1
          summary+=("attn_tma 20b tma=$v rc=$?")
          echo "20b --fp8 8k prefill, TMA $v:"; grep -E "^\| [0-9]+ \|" "$OUT/attn_tma_20b_$v.log" | head -1
        done
      fi
      ;;
    ybf16_ab)
      # moe_fp8's y as bf16 (default) against fp32 (GPTOSS_MOE_Y_BF16=0), 8k --fp8 prefill, both models.
      for m in gpt-oss-20b gpt-oss-120b; do
        for v in 1 0; do
          GPTOSS_MOE_Y_BF16=$v GPTOSS_PROFILE=1 timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill 8192 \
            --batch "" --repeats 3 > "$OUT/ybf16_${m}_$v.log" 2>&1
          summary+=("ybf16_ab $m y_bf16=$v rc=$?")
          echo "$m --fp8 8k prefill, y bf16 $v:"; grep -E "^\| [0-9]+ \|" "$OUT/ybf16_${m}_$v.log" | head -1
          grep -E "^  (moe|norm|total) " "$OUT/ybf16_${m}_$v.log"
        done
      done
      ;;
    decode_b1)
      # Batch-1 decode at 1k context of both models (--fp8: FP8 attention/lm_head weights, MXFP4
      # experts), ms a step.
      for m in gpt-oss-20b gpt-oss-120b; do
        timeout 200 $BIN/gptoss bench --synthetic $m --fp8 --prefill "" --batch 1 --context 1024 --decode-steps 64 \
          --repeats 3 > "$OUT/decode_b1_$m.log" 2>&1
        summary+=("decode_b1 $m rc=$?")
        echo "$m --fp8 batch 1, 1k context:"; grep -E "^\| [0-9]+ \| 1 \|" "$OUT/decode_b1_$m.log" | head -2
      done
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
    ncu_decode)
      # Kernel durations of batch-1 decode steps (ncu with clocks and caches left alone): their sum
      # against the step time gives the launch gaps. NCU_ARGS: extra bench flags (e.g. --fp8).
      [ -f "$WORK/gpt-oss-20b/config.json" ] || $BIN/gptoss init-model --preset gpt-oss-20b --out "$WORK/gpt-oss-20b" --seed 1
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
      $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
        --kernel-name 'regex:^(?!.*(weight_quant|mxfp4_to_bf16|fill_random|pad_fp8|fp8_block_to)).*' \
        --launch-count ${NCU_COUNT:-1500} $BIN/gptoss bench --model "$WORK/gpt-oss-20b" --prefill "" --batch 1 \
        --context 128 --decode-steps 4 --repeats 1 ${NCU_ARGS:-} > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err"
      summary+=("ncu_decode rc=$?")
      tail -3 "$OUT/ncu_decode.err"; wc -l "$OUT/ncu_decode.csv"
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  echo "== stage $stage: $(( $(date +%s) - t0 )) s"
done
echo "===== summary ====="
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
sleep 1  # tee's last lines into gpu_check_stdout.log before the archive
# The device tool brings back only a few files per call: pack everything into one archive
# (GPU_CHECK_TAR=0 keeps the files as they are).
if [ "${GPU_CHECK_TAR:-1}" != 0 ]; then
  tar -C "$OUT" -czf /tmp/gpu_check.tar.gz . && find "$OUT" -mindepth 1 -delete && mv /tmp/gpu_check.tar.gz "$OUT/"
fi
