"""HF transformers embeddings the plain way, the baseline of ``spyglass bench embed``.

``AutoModel`` runs padded batches of the prompts (right-padded, with an attention mask) and each
prompt's vector is its last real token's ``last_hidden_state`` (or the mean of its real tokens',
or its first token's, as the engine's pooling type says), scaled to unit length. The model
lives in one child process (``python -m spyglass.core.cli.bench.hf_embed``) for the whole bench:
it loads once, then times one pass over the prompts each time it is asked. So HF never shares the
bench's process (`hf_static` measured Spyglass 5-15% slower beside HF in one process) and its
load time stays out of every repeat. Test-and-benchmark-only: needs ``transformers``.
"""

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from spyglass.core.cli.bench.hf_static import load_hf_model
from spyglass.core.engine.config import dtype_name


@dataclass(frozen=True, slots=True)
class HFPass:
    """One timed pass over the prompts: the seconds it took, the pad tokens it ran beside the
    prompts' own, and the unit vectors ``[num prompts, hidden]`` in prompt order (float32)."""

    seconds: float
    num_pad_tokens: int
    embeddings: torch.Tensor


class HFEmbedder:
    """The child process holding HF's model for ``prompts``; a context manager, `run` times a pass.

    ``length_sorted`` batches the prompts in order of length (as sentence-transformers does, which
    keeps padding small) instead of in the order given.
    """

    def __init__(
        self,
        model: str | None,
        dtype: torch.dtype,
        prompts: list[list[int]],
        batch_size: int,
        length_sorted: bool,
        device: str = "cpu",
        pooling_type: str = "last",
    ):
        self._files = contextlib.ExitStack()
        directory = Path(self._files.enter_context(tempfile.TemporaryDirectory(prefix="hf-embed-")))
        self._vectors = directory / "embeddings.pt"
        self._stderr = self._files.enter_context((directory / "stderr.txt").open("w+"))
        command = [
            sys.executable,
            "-m",
            "spyglass.core.cli.bench.hf_embed",
            "--dtype",
            dtype_name(dtype),
            "--num-threads",
            str(torch.get_num_threads()),
            "--device",
            device,
            "--batch-size",
            str(batch_size),
            "--vectors",
            str(self._vectors),
            "--pooling-type",
            pooling_type,
        ]
        if length_sorted:
            command.append("--length-sorted")
        if model is not None:
            command += ["--model", model]
        self._child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        try:
            self._ask(json.dumps(prompts))  # answered once the model is loaded
        except RuntimeError:
            self.__exit__()
            raise

    def run(self) -> HFPass:
        """Time one pass over every prompt in the child; its vectors come back through a file."""
        answer = self._ask("run")
        return HFPass(answer["seconds"], answer["num_pad_tokens"], torch.load(self._vectors))

    def _ask(self, line: str) -> dict:
        try:
            self._child.stdin.write(line + "\n")
            self._child.stdin.flush()
            answer = self._child.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            self._child.wait()
            self._stderr.seek(0)
            raise RuntimeError(f"HF embedding failed:\n{self._stderr.read()[-2000:]}")
        return json.loads(answer)

    def __enter__(self) -> "HFEmbedder":
        return self

    def __exit__(self, *exc_info) -> None:
        """Close the child's input (it exits at end of input) and remove its files."""
        with contextlib.suppress(BrokenPipeError):
            self._child.stdin.close()
        self._child.wait()
        self._files.close()


def embed_batches(
    model,
    prompts: list[list[int]],
    batch_size: int,
    length_sorted: bool,
    device: str,
    pooling_type: str = "last",
) -> tuple[torch.Tensor, int]:
    """Every prompt's unit vector (pooled as ``pooling_type`` says: its last token's, the mean of
    its tokens', its first token's), in prompt order, from right-padded batches of
    ``batch_size``; and how many pad tokens the batches held."""
    order = list(range(len(prompts)))
    if length_sorted:
        order.sort(key=lambda i: len(prompts[i]))
    vectors = torch.empty(len(prompts), model.config.hidden_size)
    num_pad_tokens = 0
    for start in range(0, len(prompts), batch_size):
        rows = order[start : start + batch_size]
        lengths = torch.tensor([len(prompts[i]) for i in rows])
        input_ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
        for row, index in enumerate(rows):
            input_ids[row, : len(prompts[index])] = torch.tensor(prompts[index])
        mask = (torch.arange(input_ids.shape[1]) < lengths[:, None]).long()
        mask, lengths = mask.to(device), lengths.to(device)
        hidden = model(input_ids=input_ids.to(device), attention_mask=mask).last_hidden_state
        if pooling_type == "mean":
            pooled = (hidden.float() * mask[..., None]).sum(dim=1) / lengths[:, None]
        elif pooling_type == "cls":
            pooled = hidden[:, 0]
        else:
            pooled = hidden[torch.arange(len(rows)), lengths - 1]
        # On a GPU, copying to the host waits for the batch: the pass needs no synchronize.
        vectors[rows] = torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()
        num_pad_tokens += int((1 - mask).sum())
    return vectors, num_pad_tokens


def main() -> None:
    """Child-process entry: the prompts as one JSON line on stdin, answered once the model is
    loaded; then one ``run`` line per pass, answered with its timing as a JSON line (the vectors
    go to ``--vectors``). Exits at the end of its input."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--num-threads", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--length-sorted", action="store_true")
    parser.add_argument("--vectors", required=True)
    parser.add_argument("--pooling-type", default="last")
    args = parser.parse_args()
    # Whatever the libraries print goes to stderr, off the replies.
    answers, sys.stdout = sys.stdout, sys.stderr
    torch.set_num_threads(args.num_threads)
    prompts = json.loads(sys.stdin.readline())
    from transformers import AutoModel

    model = load_hf_model(AutoModel, args.model, getattr(torch, args.dtype), args.device)
    print(json.dumps({"loaded": True}), file=answers, flush=True)
    for _ in sys.stdin:
        with torch.inference_mode():
            start = time.perf_counter()
            vectors, num_pad_tokens = embed_batches(
                model, prompts, args.batch_size, args.length_sorted, args.device, args.pooling_type
            )
            seconds = time.perf_counter() - start
        torch.save(vectors, args.vectors)
        reply = {"seconds": seconds, "num_pad_tokens": num_pad_tokens}
        print(json.dumps(reply), file=answers, flush=True)


if __name__ == "__main__":
    main()
