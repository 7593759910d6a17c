#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device/lib
gunzip -c .device/tokenizer.json.gz > /tmp/tokenizer.json
export GPTOSS_TOKENIZER=/tmp/tokenizer.json
W=/tmp/w; .device/gptoss init-model --preset gpt-oss-20b --out $W/m --seed 1 2>&1 | tail -1
printf '{"ids":[1,2,3],"max_tokens":6,"temperature":0}\n{"ids":[7,8,9,10,11,12],"max_tokens":6,"temperature":0.8,"seed":3}\n{"ids":[1,2,3],"max_tokens":6,"temperature":0}\n' > /tmp/b.jsonl
echo "== batch cuda"; .device/gptoss generate --backend cuda --model $W/m --batch-file /tmp/b.jsonl 2>&1 | tail -4
echo "== batch cpu"; .device/gptoss generate --backend cpu --model $W/m --batch-file /tmp/b.jsonl 2>&1 | tail -4
echo "== one 12-token prompt cuda"; .device/gptoss generate --backend cuda --model $W/m --ids 7,8,9,10,11,12,1,2,3,1,2,3 --max-tokens 4 --temperature 0 2>&1 | tail -2
echo "== logits cuda 12"; .device/gptoss logits --backend cuda --model $W/m --ids 7,8,9,10,11,12,1,2,3,1,2,3 --out /tmp/l.safetensors 2>&1 | tail -2; python3 -c "
from safetensors.torch import load_file; import torch; l=load_file('/tmp/l.safetensors')['logits']; print('finite', torch.isfinite(l).all().item(), l.shape)"
