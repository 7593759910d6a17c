#!/usr/bin/env bash
# Make all golden test data on the GPU host (python3 with torch + transformers 5.x + safetensors +
# tokenizers + numpy; no network needed). Run from anywhere inside the repo:
#
#     bash tools/run_on_gpu_host.sh
#
# Inputs : .cache/tokenizer/tokenizer.json (override with TOKENIZER=path); it is git-ignored, so
#          the device tool must carry it (carry: [".cache/tokenizer"]).
# Outputs: tests/data/checkpoints/{tiny_a,tiny_a_bf16,tiny_b,MANIFEST.json}
#          tests/data/tokenizer_golden.jsonl
#          tests/data/logs/*.log
#          and, if $OUT is set, $OUT/fixtures.tar.gz (all of the above, paths relative to the repo
#          root; split into $OUT/fixtures_*.tar.gz if it would exceed 15 MiB) plus the logs.
# Exit status: non-zero if any tool reported a failed check (the outputs are still packed).
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TOKENIZER=${TOKENIZER:-.cache/tokenizer/tokenizer.json}
DATA=tests/data
CK=$DATA/checkpoints
LOGS=$DATA/logs
mkdir -p "$DATA" "$LOGS"

if [[ ! -f "$TOKENIZER" ]]; then
    echo "missing $TOKENIZER (carry .cache/tokenizer to this machine, or set TOKENIZER=...)" >&2
    exit 2
fi
python3 -c 'import sys, numpy, torch, transformers, safetensors, tokenizers; print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__, "transformers", transformers.__version__, "safetensors", safetensors.__version__, "tokenizers", tokenizers.__version__)' 2>&1 | tee "$LOGS/versions.log" || true

rc=0
python3 tools/test_gptoss_np.py 2>&1 | tee "$LOGS/test_gptoss_np.log" || rc=1
rm -rf "$CK"
python3 tools/make_test_checkpoints.py --out "$CK" 2>&1 | tee "$LOGS/make_test_checkpoints.log" || rc=1
python3 tools/make_tokenizer_golden.py --tokenizer "$TOKENIZER" --out "$DATA/tokenizer_golden.jsonl" \
    2>&1 | tee "$LOGS/make_tokenizer_golden.log" || rc=1

if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    parts=("$CK" "$DATA/tokenizer_golden.jsonl" "$LOGS")
    existing=()
    for p in "${parts[@]}"; do [[ -e "$p" ]] && existing+=("$p"); done
    tar -czf "$OUT/fixtures.tar.gz" "${existing[@]}"
    size=$(stat -c %s "$OUT/fixtures.tar.gz")
    if (( size > 15 * 1024 * 1024 )); then
        echo "fixtures.tar.gz is $size bytes: splitting"
        rm -f "$OUT/fixtures.tar.gz"
        for sub in "$CK"/*; do
            [[ -d "$sub" ]] && tar -czf "$OUT/fixtures_$(basename "$sub").tar.gz" "$sub"
        done
        tar -czf "$OUT/fixtures_rest.tar.gz" "$CK/MANIFEST.json" "$DATA/tokenizer_golden.jsonl" "$LOGS" 2>/dev/null || true
    fi
    cp "$LOGS/make_test_checkpoints.log" "$LOGS/make_tokenizer_golden.log" "$OUT/" 2>/dev/null || true
    ls -la "$OUT"
fi
if (( rc != 0 )); then
    echo "run_on_gpu_host.sh: at least one tool FAILED (see the logs above)"
fi
exit $rc
