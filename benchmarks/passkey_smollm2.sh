#!/bin/bash
# Issue 29: SmolLM2-135M passkey at 32k/24k/16k with independent prompts (30 per length, each
# with its own offset in the classic filler, depth and key; Wilson 95 % intervals; the classic
# filler because the unscaled model finds 3/9 keys in the plays at 2k, inside its own window, and
# 9/9 in the classic filler: benchmarks/results/passkey_haystack_smollm2), yarn:4
# against the tuned specs, in DTYPE (default bfloat16, as a GPU serves it; angles stay float32:
# a SmolLM2 16k forward on one AMX Xeon core takes 78 s against ~4 min in float32; on a CPU
# without AMX or avx512_bf16 bfloat16 runs ~45x slower, and the script refuses it: DTYPE=float32
# there starts a separate float32 series, the precision being part of each cell's settings).
# Resumable: rerun this script and
# finished prompts are taken from OUT (cells.jsonl, passkey_trials.jsonl). One prompt per
# invocation (--max-trials 1: the depth bin with the fewest finished prompts first), the rows
# taking turns, so that a run cut short compares the rows evenly at the longest length first.
# At the end one --report over all the rows writes OUT/passkey.json with every row (run that line
# alone for the state of a run cut short).
#   nohup nice -n 10 bash benchmarks/passkey_smollm2.sh > /tmp/passkey_smollm2.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results/tune_smollm2
OUT=${OUT:-$R/passkey-independent}
ROWS=${ROWS:-"yarn:4 $R/tuned-yarn.json $R/checks/per-dim-floor.json"}
LENGTHS=${LENGTHS:-"32768 24576 16384"}
TRIALS=${TRIALS:-30}
DTYPE=${DTYPE:-bfloat16}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
if [[ $DTYPE == bfloat16 ]] && ! .venv/bin/python -c \
    'import sys, torch; sys.exit(not torch.ops.mkldnn._is_mkldnn_bf16_supported())'; then
    echo "passkey_smollm2: this CPU has no AMX/avx512_bf16 (bfloat16 ~45x slower than float32)" >&2
    exit 2
fi
for length in $LENGTHS; do
    for _ in $(seq "$TRIALS"); do
        for row in $ROWS; do
            if [[ $row == *.json ]]; then what=(--methods "" --spec "$row"); else what=(--methods "$row"); fi
            .venv/bin/yarnlib eval passkey --model smollm2 "${what[@]}" --lengths "$length" \
                --trials "$TRIALS" --haystack classic --dtype "$DTYPE" --output "$OUT" --resume --max-trials 1
        done
    done
done
# passkey.json of every row (each invocation above names one row: its file holds that row only)
methods=() specs=()
for row in $ROWS; do
    if [[ $row == *.json ]]; then specs+=("$row"); else methods+=("$row"); fi
done
joined=$(IFS=,; echo "${methods[*]}")
.venv/bin/yarnlib eval passkey --model smollm2 --methods "$joined" ${specs[@]:+--spec "${specs[@]}"} \
    --lengths "${LENGTHS// /,}" --trials "$TRIALS" --haystack classic --dtype "$DTYPE" \
    --output "$OUT" --report
