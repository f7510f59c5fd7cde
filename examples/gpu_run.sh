#!/usr/bin/env bash
# On a lent GPU machine, from the `run` tool with `carry: [".whl"]` (made here by
# `python examples/gpu_bundle.py`): say what the machine is, install the carried wheels and the
# checkout without a network, and run gpu_check into $OUT. Arguments go to gpu_check.py;
# GPU_CHECK_SECONDS (default 540) bounds it.
set -uo pipefail
ldd --version | head -1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
pip install --quiet --no-index --no-deps --no-build-isolation -e . || exit 1
timeout "${GPU_CHECK_SECONDS:-540}" python examples/gpu_check.py --out "$OUT/gpu_check.md" "$@"
