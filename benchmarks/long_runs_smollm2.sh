#!/bin/bash
# The SmolLM2 measurements of issues 28 and 29 that remain, as two lanes of one core each (each
# step resumes from its tracked files, so rerunning a lane skips what is done; a done
# passkey_smollm2.sh step still loads the model once per row and prompt, minutes in all):
#   lane passkey: the cells of issue 29's table still short of 30 prompts (on 2026-12-04 only
#     the needle table at 24k), then the nll --slow-in-range search (benchmarks/
#     tune_retrieval_smollm2.py; optional: the defaults are decided without it, docs/tune.md);
#   lane pose64: PoSE to 64k (benchmarks/pose_smollm2.py --target 65536: perplexity, then
#     passkey at 64k and 32k for the trained model and yarn:8 untrained, issue 29's 8x row).
# A 32k prompt takes ~4.5 min on an AMX core, ~11 min on an avx512_bf16 core of an AMD EPYC, a
# 64k one ~4x that; bfloat16 throughout the passkey and the searches: a CPU with AMX or
# avx512_bf16 only (the scripts refuse others). On a GPU all of it is minutes:
# benchmarks/gpu_smollm2.sh.
#   nohup nice -n 10 bash benchmarks/long_runs_smollm2.sh passkey > /tmp/lane_passkey.log 2>&1 &
#   nohup nice -n 10 bash benchmarks/long_runs_smollm2.sh pose64 > /tmp/lane_pose64.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results/tune_smollm2
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

spec_rows() {  # every row of issue 29's comparison whose spec file exists, a spec equal to an
    # earlier row's once only (the mix search ended on the needle search's table)
    local rows="yarn:4" f
    for f in $R/tuned-yarn.json $R/checks/per-dim-floor.json $R/tuned-needle.json \
        $R/tuned-mix.json $R/tuned-nll-slow.json; do
        if [[ -f $f ]]; then rows+=" $f"; fi
    done
    .venv/bin/python -c '
import json, sys
seen, keep = [], []
for row in sys.argv[1:]:
    spec = json.load(open(row))["spec"] if row.endswith(".json") else row
    if spec not in seen:
        seen.append(spec)
        keep.append(row)
print(" ".join(keep))' $rows
}

passkey() { ROWS="$1" LENGTHS="$2" bash benchmarks/passkey_smollm2.sh; }

case ${1:-} in
passkey)
    passkey "$(spec_rows) $R/checks/mix-0.1.json $R/tuned-per-dim.json" "32768 24576 16384"
    .venv/bin/python benchmarks/tune_retrieval_smollm2.py --only nll-slow
    ;;
pose64)
    .venv/bin/python benchmarks/pose_smollm2.py --target 65536
    ;;
*)
    echo "usage: $0 passkey|pose64" >&2
    exit 2
    ;;
esac
