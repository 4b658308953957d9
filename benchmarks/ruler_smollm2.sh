#!/bin/bash
# Issue 51: RULER (lm-eval 0.4.13's tasks, offline) on SmolLM2-135M: the model as it is at 4k
# and 8k (its native context is 8192: the `none` row's average at 8k is the threshold of the
# effective length), then yarn:4 at 16k and 32k, and ROWS (spec files or METHOD:FACTOR) beside
# it. TASKS default to two tasks a CPU can afford: niah_single_1 (RULER's noise haystack,
# exactly RULER) and niah_single_2 (Paul Graham's essays replaced by the packaged plays).
# Every task answers up to 128 greedy tokens per prompt: on the shared 2-core CPU one 4k prompt
# took ~5 min in float32 (decode steps 1.7 s against 3.8 s in bfloat16, prefill 76 s against
# 50 s, while 5 other jobs ran), so the default is float32 (DTYPE=bfloat16 starts a separate
# series: the precision is part of each cell's settings).
# Resumable: rerun it and finished cells are taken from OUT (cells.jsonl); the last command
# writes the report of every row and length (ruler.md, ruler.json, ruler.png).
# A GPU adds 64k and 128k: LONG_LENGTHS="65536,131072" on a lent device (benchmarks/gpu_128k.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/ruler_smollm2}
TASKS=${TASKS:-niah_single_1,niah_single_2}
SAMPLES=${SAMPLES:-5}
DTYPE=${DTYPE:-float32}
NATIVE_LENGTHS=${NATIVE_LENGTHS:-4096,8192}
LONG_LENGTHS=${LONG_LENGTHS:-16384,32768}
ROWS=${ROWS:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
methods=yarn:4 specs=()
for row in $ROWS; do
    if [[ $row == *.json ]]; then specs+=("$row"); else methods+=",$row"; fi
done
run() {
    .venv/bin/yarnlib eval ruler --model smollm2 --tasks "$TASKS" --samples "$SAMPLES" \
        --dtype "$DTYPE" --output "$OUT" --resume "$@"
}
run --methods none --lengths "$NATIVE_LENGTHS"
run --methods "$methods" ${specs[@]:+--spec "${specs[@]}"} --lengths "$LONG_LENGTHS"
run --report --methods "none,$methods" ${specs[@]:+--spec "${specs[@]}"} \
    --lengths "$NATIVE_LENGTHS,$LONG_LENGTHS"
