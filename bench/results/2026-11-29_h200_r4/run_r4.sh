#!/usr/bin/env bash
# r4: MoE v2 kernels, engine integration smoke tests, full bench.
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device/lib
gunzip -c .device/tokenizer.json.gz > /tmp/tokenizer.json
export GPTOSS_TOKENIZER=/tmp/tokenizer.json
echo "== kernel tests"; .device/cuda_kernel_tests --gtest_filter='CudaOps.*:CudaModel.*' > $OUT/tests.log 2>&1; grep -E "^\[ +(OK|FAILED) \]|rel L2 median|real widths" $OUT/tests.log | head -30
echo "== moe bench"; .device/moe_bench 2>&1 | tee $OUT/moe_bench.log | tail -10
W=/tmp/w; .device/gptoss init-model --preset gpt-oss-20b --out $W/m --seed 1 2>&1 | tail -1
echo "== profile b1"; GPTOSS_PROFILE=1 .device/gptoss bench --model $W/m --prefill "" --batch 1 --context 1024 --decode-steps 8 2>&1 | grep -A14 GPTOSS_PROFILE
echo "== generate cuda"; .device/gptoss generate --backend cuda --model $W/m --ids 1,2,3,4,5 --max-tokens 8 --temperature 0 2>&1 | tail -2
echo "== generate cpu";  .device/gptoss generate --backend cpu --model $W/m --ids 1,2,3,4,5 --max-tokens 8 --temperature 0 2>&1 | tail -2
echo "== serve cuda"; (.device/gptoss serve --backend cuda --model $W/m --port 8123 --kv-cache-mb 8192 > $OUT/serve.log 2>&1 &)
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:8123/v1/chat/completions -H 'content-type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":16}' | head -c 600; echo
pkill -f "gptoss serve" ; sleep 1
echo "== bench"; .device/gptoss bench --model $W/m --prefill 128,1024,2048,8192,32768 --batch 1,2,4,8,16,32,64,128 --context 1024,8192,32768 --decode-steps 8 --repeats 2 --json $OUT/bench.json --markdown $OUT/bench.md > $OUT/bench.log 2>&1; cat $OUT/bench.md
