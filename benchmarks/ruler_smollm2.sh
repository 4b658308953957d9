#!/bin/bash
# Issue 51: RULER (lm-eval 0.4.13's tasks, offline) on SmolLM2-135M: the model as it is at 4k
# and 8k (its native context is 8192: the `none` row's average at 8k is the threshold of the
# effective length), then yarn:4 at 16k and 32k, ROWS (spec files or METHOD:FACTOR) beside it,
# and the PoSE x4 model (benchmarks/pose_smollm2.py's adapter, merged on first use; its own
# table in OUT/pose, since it is another model) at the same lengths. TASKS default to two tasks
# a CPU can afford: niah_single_1 (RULER's noise haystack, exactly RULER) and niah_single_2
# (Paul Graham's essays replaced by the packaged plays).
# Cost: every task answers up to 128 greedy tokens per prompt. On 2 idle cores of an AMD EPYC
# with avx512_bf16, SmolLM2 in bfloat16 prefills 4k tokens in 8 s (float32 12 s) and 16k in
# ~65 s (float32 102 s), a decode step 0.11-0.3 s: bfloat16 is the default here (check your CPU:
# without bf16 units it is ~8x slower, DTYPE=float32; the precision is part of each cell's
# settings, so the two are separate series).
# Lengths run in order (all rows at 16k before any at 32k), yarn:4 and PoSE first in each.
# Resumable: rerun it and finished cells are taken from OUT (cells.jsonl); the report commands
# write ruler.md, ruler.json, ruler.png for the rows of REPORT_ROWS (default ROWS) at
# REPORT_LENGTHS (default the lengths run), each cell finished so far, and
# benchmarks/ruler_summary.py one table of them all (OUT/summary.md).
# A GPU adds 64k and 128k: LONG_LENGTHS="65536,131072" on a lent device (benchmarks/gpu_128k.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/ruler_smollm2}
TASKS=${TASKS:-niah_single_1,niah_single_2}
SAMPLES=${SAMPLES:-5}
DTYPE=${DTYPE:-bfloat16}
NATIVE_LENGTHS=${NATIVE_LENGTHS:-4096,8192}
LONG_LENGTHS=${LONG_LENGTHS:-16384,32768}
ROWS=${ROWS:-}
REPORT_ROWS=${REPORT_ROWS:-$ROWS}  # the report's rows: every row run so far, not only this call's
POSE=${POSE-benchmarks/results/pose_smollm2}  # empty: no PoSE rows
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
split_rows() {  # ROWS-style words → methods (after yarn:4) and spec files
    methods=yarn:4 specs=()
    for row in $1; do
        if [[ $row == *.json ]]; then specs+=("$row"); else methods+=",$row"; fi
    done
}
split_rows "$ROWS"
run() {
    .venv/bin/yarnlib eval ruler --tasks "$TASKS" --samples "$SAMPLES" --dtype "$DTYPE" \
        --resume "$@"
}
base() { run --model smollm2 --output "$OUT" "$@"; }
pose_model() {  # the merged PoSE folder (not in git), rebuilt from the committed adapter
    [[ -f $POSE/train/model/model.safetensors ]] || .venv/bin/python -c "
import argparse, sys; from pathlib import Path; sys.path.insert(0, 'benchmarks')
from pose_smollm2 import merged
p = Path('$POSE'); merged(argparse.Namespace(model='smollm2'), p / 'adapter', p / 'spec.json',
                          p / 'train' / 'model')" >&2
    echo "$POSE/train/model"
}
# the PoSE model's config already scales (yarn x4 from 8192): its row is the model as saved
pose() { run --model "$(pose_model)" --output "$OUT/pose" --methods none "$@"; }
base --methods none --lengths "$NATIVE_LENGTHS"
threshold=$(.venv/bin/python -c "
import json; rows = json.load(open('$OUT/ruler.json'))['averages']
print(next(r['score'] for r in rows if r['method'] == 'none' and r['length'] == 8192))" \
    2>/dev/null || true)
for length in ${LONG_LENGTHS//,/ }; do  # per length: yarn:4, the PoSE model, then the rest
    base --methods yarn:4 --lengths "$length"
    [[ -z $POSE ]] || pose --lengths "$length"
    base --methods "$methods" ${specs[@]:+--spec "${specs[@]}"} --lengths "$length"
done
split_rows "$REPORT_ROWS"
base --report --methods "none,$methods" ${specs[@]:+--spec "${specs[@]}"} \
    --lengths "$NATIVE_LENGTHS,${REPORT_LENGTHS:-$LONG_LENGTHS}"
[[ -z $POSE ]] || pose --report --lengths "${REPORT_LENGTHS:-$LONG_LENGTHS}" ${threshold:+--threshold "$threshold"}
.venv/bin/python benchmarks/ruler_summary.py "$OUT"  # one table of every row: OUT/summary.md
