"""What the vision-model tests share: seeded images, and the check that an output of ours is
transformers' greedy generation for the same prompt ids and pixels, token for token and logprob
for logprob."""

import base64
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def noise_image(seed: int, size=(50, 40), mode="RGB") -> Image.Image:
    """A seeded random image (its aspect ratio is not the tower's square)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels).convert(mode)


def data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def mp4_bytes(seed: int, frames: int = 6, size=(48, 32), rate: int = 8) -> bytes:
    """An mp4 (MPEG-4 part 2) of ``frames`` seeded random frames of ``size`` at ``rate`` a
    second, written by PyAV."""
    import io

    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = *size, "yuv420p"
        for index in range(frames):
            pixels = np.asarray(noise_image(seed * 100 + index, size))
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def assert_greedy_as_transformers(output, model, inputs: dict, max_tokens: int) -> None:
    """``output`` has ``inputs``' prompt ids and the greedy tokens and logprobs transformers'
    ``model.generate(**inputs)`` gives (float32, to 2e-4)."""
    prompt_ids = inputs["input_ids"][0].tolist()
    assert output.prompt_token_ids == prompt_ids
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    logprobs = [
        torch.log_softmax(score[0].float(), -1)[token].item()
        for score, token in zip(out.scores, tokens)
    ]
    completion = output.outputs[0]
    assert completion.token_ids == tokens
    np.testing.assert_allclose([e.logprob for e in completion.logprobs], logprobs, atol=2e-4)


def assert_blocks_returned(llm) -> None:
    """Every KV block of ``llm``'s engine is back in its pool, and the cache is consistent."""
    llm.engine.kv.check_integrity()
    pool = llm.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks


def prefix_cache_runs(
    model_dir, prompt: str, image_start_token: int, images: list, kind: str = "image"
) -> list:
    """Greedy outputs of ``prompt`` with each of ``images`` in turn (the first and third the
    same image, the second another of its size; ``kind``: ``"video"`` for videos) on a
    prefix-caching engine of 4-token blocks, after checking that the second reused only the
    blocks before the image (whose first token is ``image_start_token``) and the third every
    full block of the first's prompt, with the first's tokens; every block is back in the pool
    after."""
    from spyglass.core.engine.sampling_params import SamplingParams
    from spyglass.core.llm import LLM

    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_kv_blocks=128,
        plugins=["fcfs", "prefix_cache"],
    )
    greedy = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
    a, b, c = (
        llm.generate({"prompt": prompt, "multi_modal_data": {kind: image}}, greedy)[0]
        for image in images
    )
    assert a.prompt_token_ids == b.prompt_token_ids  # same size: the same tokens
    image_start = a.prompt_token_ids.index(image_start_token)
    assert b.num_cached_tokens == image_start // 4 * 4
    assert c.num_cached_tokens == (len(a.prompt_token_ids) - 1) // 4 * 4
    assert c.outputs[0].token_ids == a.outputs[0].token_ids
    assert_blocks_returned(llm)
    return [a, b, c]


def chunked_runs(
    model_dir,
    prompt: str,
    images: list,
    chunk: int,
    preempt_blocks: int | None,
    count_preemptions,
    max_tokens: int,
    kind: str = "image",
) -> list:
    """Greedy outputs (with logprobs) of ``prompt`` with each of ``images`` (``kind``:
    ``"video"`` for videos), run together in prefill chunks of ``chunk`` tokens over 8-token
    blocks: ``preempt_blocks`` of them, few enough that requests are preempted and recomputed
    (None: 64, enough that none is), checked after the run; every block is back in the pool
    after."""
    from spyglass.core.engine.sampling_params import SamplingParams
    from spyglass.core.llm import LLM

    blocks = preempt_blocks or 64
    options = dict(max_num_batched_tokens=chunk, block_size=8, num_kv_blocks=blocks)
    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", **options)
    preemptions = count_preemptions(llm.engine)
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=0)
    prompts = [{"prompt": prompt, "multi_modal_data": {kind: image}} for image in images]
    outputs = llm.generate(prompts, greedy)
    assert_blocks_returned(llm)
    assert bool(preemptions.req_ids) == (preempt_blocks is not None)
    return outputs


def renamed_copy(model_dir, target, renames) -> Path:
    """A copy of ``model_dir`` at ``target`` whose parameter names have each ``(old, new)``
    prefix of ``renames`` replaced, in order (another spelling of the same checkpoint)."""
    import shutil

    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(model_dir, target)
    for shard in copy.glob("*.safetensors"):
        tensors = load_file(shard)
        for old, new in renames:
            tensors = {
                (new + name[len(old) :] if name.startswith(old) else name): t
                for name, t in tensors.items()
            }
        save_file(tensors, shard, metadata={"format": "pt"})
    return copy


def assert_loads_alike(first, second) -> None:
    """The two directories load to the same architecture and the same weights."""
    from spyglass.core.loaders.hf_loader import load_hf_dir

    ours, theirs = (load_hf_dir(path, torch.float32) for path in (first, second))
    assert ours.arch == theirs.arch
    assert ours.weights.keys() == theirs.weights.keys()
    for name, tensor in ours.weights.items():
        assert torch.equal(tensor, theirs.weights[name]), name


def assert_misplaced_images_refused(engine, token_ids: list[int], wrong: list) -> None:
    """Each of ``wrong`` (an `ImageInput` placed by hand, but not as its size lays it out), added
    to ``engine`` with ``token_ids``, is an `InvalidRequestError` naming ``multi_modal_data``,
    and none of them is left in the engine."""
    import pytest

    from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams

    for index, bad in enumerate(wrong):
        with pytest.raises(InvalidRequestError, match="placeholder tokens") as error:
            engine.add_request(f"bad-{index}", token_ids, SamplingParams(), images=(bad,))
        assert error.value.param == "multi_modal_data"
    assert not engine.has_unfinished_requests
