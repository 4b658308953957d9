#!/bin/bash
# Issue 29: SmolLM2-135M passkey at 32k/24k/16k with independent prompts (30 per length, each
# with its own offset in the classic filler, depth and key; Wilson 95 % intervals; the classic
# filler because the unscaled model finds 3/9 keys in the plays at 2k, inside its own window, and
# 9/9 in the classic filler: benchmarks/results/passkey_haystack_smollm2), yarn:4
# against the tuned specs, in DTYPE (default bfloat16, as a GPU serves it; angles stay float32:
# a SmolLM2 16k forward on one AMX Xeon core takes 78 s against ~4 min in float32; on a CPU
# without AMX or avx512_bf16 bfloat16 runs ~45x slower, and the script refuses it: DTYPE=float32
# there starts a separate float32 series, the precision being part of each cell's settings).
# Resumable: rerun this script and finished prompts are taken from OUT (cells.jsonl,
# passkey_trials.jsonl). One prompt per invocation over every row and length (--max-trials 1:
# the depth bin with the fewest finished prompts first, across rows and lengths), so a run cut
# short still compares the rows evenly; it stops at the first invocation that finds every cell
# done (that one loads no model). The last invocation's report covers every row.
#   ROWS="yarn:4 benchmarks/results/tune_smollm2/tuned-yarn.json" bash benchmarks/passkey_smollm2.sh
# A GPU runs the same prompts in minutes: benchmarks/gpu_smollm2.sh.
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
methods=() specs=()
for row in $ROWS; do
    if [[ $row == *.json ]]; then specs+=("$row"); else methods+=("$row"); fi
done
joined=$(IFS=,; echo "${methods[*]}")
run() {
    .venv/bin/yarnlib eval passkey --model smollm2 --methods "$joined" ${specs[@]:+--spec "${specs[@]}"} \
        --lengths "${LENGTHS// /,}" --trials "$TRIALS" --haystack classic --dtype "$DTYPE" \
        --output "$OUT" "$@"
}
while [ "$(run --resume --max-trials 1 | tee /dev/stderr | grep -c "^stopped with" || true)" != 0 ]; do :; done
