#!/bin/bash
# The SmolLM2 measurements of issues 28 and 29 that remain, in order, as two lanes of one core
# each (each step resumes from its tracked files, so rerunning a lane skips what is done):
#   lane passkey: 32k rows of the needle-tuned and floored per-dim specs, then every spec row at
#     24k and 16k (benchmarks/passkey_smollm2.sh), the PoSE model's 16k in bfloat16, and the
#     mix-tuned spec's rows once its search has written tuned-mix.json;
#   lane search: the mix and nll --slow-in-range searches (benchmarks/tune_retrieval_smollm2.py),
#     then PoSE to 64k (benchmarks/pose_smollm2.py --target 65536: training, perplexity, passkey).
# bfloat16 throughout the passkey and the searches: a CPU with AMX or avx512_bf16 only (the
# scripts refuse others). Some 40 core-hours in all; a GPU would do it in well under one.
#   nohup nice -n 10 bash benchmarks/long_runs_smollm2.sh passkey > /tmp/lane_passkey.log 2>&1 &
#   nohup nice -n 10 bash benchmarks/long_runs_smollm2.sh search > /tmp/lane_search.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results/tune_smollm2
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

spec_rows() {  # every row of issue 29's comparison whose spec file exists
    local rows="yarn:4 $R/tuned-yarn.json $R/checks/per-dim-floor.json" f
    for f in $R/tuned-needle.json $R/tuned-mix.json $R/tuned-nll-slow.json; do
        if [[ -f $f ]]; then rows+=" $f"; fi
    done
    echo "$rows"
}

passkey() { ROWS="$1" LENGTHS="$2" bash benchmarks/passkey_smollm2.sh; }

case ${1:-} in
passkey)
    passkey "$R/tuned-needle.json $R/checks/per-dim-floor.json" 32768
    passkey "$(spec_rows)" 24576
    passkey "$(spec_rows)" 16384
    .venv/bin/python benchmarks/pose_smollm2.py --parts passkey  # PoSE 16k in bfloat16
    passkey "$(spec_rows)" "32768 24576 16384"                   # rows whose search ended late
    ;;
search)
    .venv/bin/python benchmarks/tune_retrieval_smollm2.py --only mix
    .venv/bin/python benchmarks/tune_retrieval_smollm2.py --only nll-slow
    .venv/bin/python benchmarks/pose_smollm2.py --target 65536
    ;;
*)
    echo "usage: $0 passkey|search" >&2
    exit 2
    ;;
esac
