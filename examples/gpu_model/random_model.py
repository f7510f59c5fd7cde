"""A Hugging Face model directory of a shipped shape with random weights and the default model's real tokenizer.

For machines that cannot fetch the default model (a GPU lent without network, or a checkout copied
under a size limit): this folder ships the shapes and the tokenizer (about 600 KB), not weights.

- ``default``: SmolLM2-135M-Instruct's shape (30 layers, 576 wide, 9/3 heads of 64, tied embeddings).
- ``1b``: Llama-3.2-1B's shape (16 layers, 2048 wide, 32/8 heads of 64) with SmolLM2's vocabulary.

    python examples/gpu_model/random_model.py default /tmp/smollm2-shape [--device cuda]

The weights are transformers' own initialisation (seeded), saved as safetensors; the directory loads
in Spyglass (``--model DIR`` or ``SPYGLASS_DEFAULT_MODEL=DIR``) and in transformers alike.
"""

import argparse
import gzip
import json
import shutil
from pathlib import Path

import torch

HERE = Path(__file__).parent
SHAPES = {"default": "smollm2-135m.json", "1b": "llama-1b-shape.json"}


def build(
    shape: str,
    directory: Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> Path:
    """Write the ``shape`` model with random weights into ``directory`` (created); returns it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**json.loads((HERE / SHAPES[shape]).read_text()))
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    (directory / "tokenizer.json").write_bytes(
        gzip.decompress((HERE / "tokenizer.json.gz").read_bytes())
    )
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(HERE / name, directory / name)
    return directory


def main() -> None:
    """Command line: ``SHAPE DIRECTORY [--device D] [--dtype T]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    build(args.shape, args.directory, args.device, getattr(torch, args.dtype))
    print(args.directory)


if __name__ == "__main__":
    main()
