#!/usr/bin/env bash
# The GPU pass in one command (benchmarks/README.md, "GPU"; `make gpu-check` runs it):
#   bash benchmarks/gpu_check.sh [--out DIR] [--steps a,b] [--dry-run]
# The machine's own Python and packages; yarnlib from this working tree without dependencies;
# Liger-Kernel from benchmarks/wheels/ when a wheel lies there. Results: $OUT or --out DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this tree first, installed or not
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_NO_INDEX=1
unset TRITON_INTERPRET  # `make` exports it for the CPU tests; on a GPU the kernel must compile

case " $* " in
*" --dry-run "*) ;;  # the CPU rehearsal installs nothing
*)
    if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
        echo "gpu_check.sh: $PYTHON sees no CUDA device; --dry-run rehearses on CPU" >&2
        exit 2
    fi
    "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e . ||
        echo "gpu_check.sh: pip install -e . failed; yarnlib comes from PYTHONPATH"
    for wheel in benchmarks/wheels/liger_kernel-*.whl; do
        [ -f "$wheel" ] || continue
        site=$(mktemp -d)
        "$PYTHON" -m pip install -q --no-deps --target "$site" "$wheel" &&
            export PYTHONPATH="$PYTHONPATH:$site"
    done
    ;;
esac
exec "$PYTHON" benchmarks/gpu_check.py "$@"
