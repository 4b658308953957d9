#!/bin/bash
# The SmolLM2 measurements of issues 28 and 29 that remain, in order, as two lanes of one core
# each (each step resumes from its tracked files, so rerunning a lane skips what is done):
#   lane passkey: 32k rows of the needle-tuned and floored per-dim specs, then every spec row at
#     24k and 16k (benchmarks/passkey_smollm2.sh), then every length again for rows whose spec
#     file came late, then issue 15's tuned per-dim table (0/15 classic passkeys at 32k);
#   lane search: the mix search (benchmarks/tune_retrieval_smollm2.py), yarn:4 and tuned yarn at
#     16k, the PoSE model's 16k in bfloat16, the perplexity of the check rows (checks/*.json:
#     the candidate a mix weight of 0.1 picks, benchmarks/mix_weights.py) and that candidate's
#     32k passkey, the nll --slow-in-range search, then PoSE to 64k
#     (benchmarks/pose_smollm2.py --target 65536: training, perplexity, passkey; its 64k passkey
#     is most of the lane's hours, so the search of issue 29 goes first).
# A 32k prompt takes ~4.5 min on an AMX core, ~13 min on an avx512_bf16 core of an AMD EPYC.
# bfloat16 throughout the passkey and the searches: a CPU with AMX or avx512_bf16 only (the
# scripts refuse others). Some 40 core-hours on AMX, three times that on the EPYC; a GPU does
# it in well under one.
#   nohup nice -n 10 bash benchmarks/long_runs_smollm2.sh passkey > /tmp/lane_passkey.log 2>&1 &
#   nohup nice -n 10 bash benchmarks/long_runs_smollm2.sh search > /tmp/lane_search.log 2>&1 &
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
    passkey "$R/tuned-needle.json $R/checks/per-dim-floor.json" 32768
    passkey "$(spec_rows)" 24576
    passkey "$(spec_rows)" 16384
    passkey "$(spec_rows)" "32768 24576 16384"                   # rows whose search ended late
    passkey "$R/tuned-per-dim.json" "32768 24576 16384"
    ;;
search)
    .venv/bin/python benchmarks/tune_retrieval_smollm2.py --only mix
    passkey "yarn:4 $R/tuned-yarn.json" 16384                   # also issue 28's baseline
    .venv/bin/python benchmarks/pose_smollm2.py --parts passkey  # PoSE 16k in bfloat16
    .venv/bin/python benchmarks/tune_retrieval_smollm2.py --report
    passkey "$R/checks/mix-0.1.json" 32768
    .venv/bin/python benchmarks/tune_retrieval_smollm2.py --only nll-slow
    .venv/bin/python benchmarks/pose_smollm2.py --target 65536
    ;;
*)
    echo "usage: $0 passkey|search" >&2
    exit 2
    ;;
esac
