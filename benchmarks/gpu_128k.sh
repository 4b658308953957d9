#!/usr/bin/env bash
# Issue 49: SmolLM2-135M to 128k with PoSE on a lent GPU (benchmarks/gpu_128k.py; the calls in
# order: benchmarks/README.md, "128k on a GPU").
#
#   bash benchmarks/gpu_128k.sh split               # here: .gpu_128k/p0 .. pN (ignored by git)
#   # device tool, one call per part; the last one runs (the machine stays warm between calls):
#   #   run("bash benchmarks/gpu_128k.sh stash", carry=[".gpu_128k/p0"], timeout_s=60)  ...
#   #   run("bash benchmarks/gpu_128k.sh run", carry=[".gpu_128k/pN"], timeout_s=540)
#   bash benchmarks/gpu_128k.sh unpack FILES...     # here: the returned files into results/
#   bash benchmarks/gpu_128k.sh dry-run DIR         # here: the whole run on CPU, tiny and short
#
# `run` (the device's own Python, or PYTHON=...) works for BUDGET seconds (default: the call's
# 540 s less 40 s to start and pack), then stops; `timeout` ends it at BUDGET + 20 s at the
# latest, and the results are packed into $OUT either way (also after every task).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUDGET=${BUDGET:-500}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

case "${1:-}" in
split)
    shift
    .venv/bin/python benchmarks/gpu_128k.py split "$@"
    ;;
stash)
    "$PYTHON" benchmarks/gpu_128k.py stash
    ;;
run)
    shift
    unset TRITON_INTERPRET  # the Makefile exports it for the CPU; the GPU compiles the kernel
    timeout --kill-after=10 $((BUDGET + 20)) "$PYTHON" benchmarks/gpu_128k.py run \
        --budget "$BUDGET" --out "${OUT:?the device tool sets OUT}" "$@"
    code=$?
    "$PYTHON" benchmarks/gpu_128k.py pack --out "$OUT"
    ls -l "$OUT"
    exit $code
    ;;
unpack)
    shift
    .venv/bin/python benchmarks/gpu_128k.py unpack "$@"
    ;;
dry-run)
    .venv/bin/python benchmarks/gpu_128k.py dry-run --state "${2:?dry-run DIR}/state" \
        --out "$2/out"
    ;;
*)
    echo "usage: bash benchmarks/gpu_128k.sh split|stash|run|unpack FILES|dry-run DIR" >&2
    exit 2
    ;;
esac
