#!/usr/bin/env bash
# The device check, in one call of under 8 minutes: the tests of tests/test_devices.py on CUDA, then
# the core benchmark (bench/md_core.py --device cuda: the md_core_cuda and md_baseline_cuda sections
# of bench/RESULTS.md) and the engine benchmark (bench/gpu_engine.py: engine_cuda) on the GPU.
# Run from anywhere on a machine with a CUDA build of torch, pytest and transformers:
# `bash bench/gpu.sh`. Logs and the updated bench/RESULTS.md go to $OUT (the device tool's folder)
# when it is set, else bench/gpu-out/. Exit status: 0 when every step passed, 1 when one failed,
# 2 when there is no CUDA device (or no torch / pytest in $PYTHON, default python3).
# A dry run of the script itself on CPU (nothing written to bench/RESULTS.md): DEVICE=cpu
# PYTHON=.venv/bin/python ENGINE_ARGS="--layers 2 --hidden 64 --heads 4 --kv-heads 2 --mlp 128
# --exit 1 --vocabs 6000 --new-tokens 8 --repeats 1" bash bench/gpu.sh
set -uo pipefail
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
PY="${PYTHON:-python3}"
case $PY in */*) PY=$(abspath "$PY") ;; esac  # a relative interpreter path, resolved before the cd
OUT=$(abspath "${OUT:-$(dirname "$0")/gpu-out}")
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT"
DEVICE="${DEVICE:-cuda}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
if ! "$PY" -c "import torch, pytest" 2>/dev/null; then
    echo "gpu.sh: $PY cannot import torch and pytest (set PYTHON to the interpreter that holds them)" >&2
    exit 2
fi
WRITE=()
if [ "$DEVICE" = cpu ]; then
    WRITE=(--no-write)
elif ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: no CUDA device here (torch.cuda.is_available() is False in $PY)" >&2
    exit 2
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    "$PY" -c "import sys, numpy, pytest, torch, transformers; print(sys.version.split()[0], 'torch', \
torch.__version__, 'numpy', numpy.__version__, 'pytest', pytest.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit (then SIGKILL 10 s later), log to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit} s)"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" || { echo "== $name FAILED"; status=1; }
}
# --noconftest: tests/test_devices.py needs neither the suite's conftest nor hypothesis (the
# offline variables are exported above); the limits add up to 7 minutes
step cuda_tests 140 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/test_devices.py
step "md_core_$DEVICE" 170 "$PY" bench/md_core.py --device "$DEVICE" ${WRITE[@]+"${WRITE[@]}"}
# shellcheck disable=SC2086  # ENGINE_ARGS: extra flags, split on spaces
step "engine_$DEVICE" 110 "$PY" bench/gpu_engine.py --device "$DEVICE" ${WRITE[@]+"${WRITE[@]}"} ${ENGINE_ARGS:-}
cp bench/RESULTS.md "$OUT/RESULTS.md"
exit $status
