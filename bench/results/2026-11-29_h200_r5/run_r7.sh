#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device/lib
gunzip -c .device/tokenizer.json.gz > /tmp/tokenizer.json
export GPTOSS_TOKENIZER=/tmp/tokenizer.json
W=/tmp/w; [ -f $W/m/config.json ] || .device/gptoss init-model --preset gpt-oss-20b --out $W/m --seed 1 2>&1 | tail -1
(.device/gptoss serve --backend cuda --model $W/m --port 8123 --kv-cache-mb 8192 > /tmp/serve.log 2>&1 &)
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
echo "== chat"; curl -s http://127.0.0.1:8123/v1/chat/completions -H 'content-type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":16}' | head -c 600; echo
echo "== stream"; curl -sN http://127.0.0.1:8123/v1/chat/completions -H 'content-type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}' | tail -c 500; echo
echo "== 16 concurrent"; for i in $(seq 1 16); do curl -s http://127.0.0.1:8123/v1/completions -H 'content-type: application/json' -d "{\"model\":\"m\",\"prompt\":\"Hello number $i\",\"max_tokens\":32}" -o /tmp/c$i.json & done; wait; grep -c '"finish_reason"' /tmp/c*.json | tail -3
curl -s http://127.0.0.1:8123/metrics | grep -E "^gptoss_(kv_blocks_in_use|running_sequences|generation_tokens_total|http_requests_total)" | head
pkill -f "gptoss serve"; sleep 1; tail -4 /tmp/serve.log
