"""Embeddings of prompts with images (as e5-v and VLM2Vec embed them): the final norm's output at
the last token, checked against transformers' ``last_hidden_state`` for LLaVA, LLaVA-NeXT,
Idefics3 and Qwen2.5-VL (GME's base), and the same through chunked prefill."""

import pytest
import torch

from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.llm import LLM
from tests.core.vision_reference import noise_image

PROMPTS = {
    "llava": "USER: <image>\nSummarize the picture in one word: ASSISTANT:",
    "idefics3": "<|im_start|>User:<image>Summarize the picture in one word:<end_of_utterance>\n",
    "qwen": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Summarize the picture "
    "in one word:<|im_end|>\n",
}


def hf_embedding(model_dir, architecture: str, output, images) -> torch.Tensor:
    """transformers' last hidden state at the prompt's last token for the same ids and pixels."""
    import transformers

    model = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32)
    processor = transformers.AutoImageProcessor.from_pretrained(model_dir)
    # Idefics3's processor takes a list of images per prompt.
    tiled = architecture.startswith("Idefics3")
    pixels = processor(images=[images] if tiled else images, return_tensors="pt")
    input_ids = torch.tensor([output.prompt_token_ids])
    inputs = {"input_ids": input_ids, **pixels}
    if architecture.startswith("Qwen"):  # M-RoPE needs to know which tokens are the image's
        inputs["mm_token_type_ids"] = (input_ids == model.config.image_token_id).int()
    with torch.no_grad():
        hidden = model.eval().model(**inputs).last_hidden_state[0, -1]
    return hidden


@pytest.mark.parametrize(
    "checkpoint, architecture, prompt",
    [
        ("tiny_llava_dir", "LlavaForConditionalGeneration", "llava"),
        ("tiny_llava_next_dir", "LlavaNextForConditionalGeneration", "llava"),
        ("tiny_idefics3_dir", "Idefics3ForConditionalGeneration", "idefics3"),
        ("tiny_qwen2_5_vl_dir", "Qwen2_5_VLForConditionalGeneration", "qwen"),
    ],
)
def test_embeddings_of_prompts_with_images_match_transformers(
    request, checkpoint, architecture, prompt
):
    model_dir = request.getfixturevalue(checkpoint)
    images = [noise_image(7, (50, 40))]
    # Chunks of 8 tokens split the images' runs of tokens.
    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", max_num_batched_tokens=8)
    [raw] = llm.embed(
        {"prompt": PROMPTS[prompt], "multi_modal_data": {"image": images}},
        PoolingParams(normalize=False),
    )
    [unit] = llm.embed({"prompt": PROMPTS[prompt], "multi_modal_data": {"image": images}})
    expected = hf_embedding(model_dir, architecture, raw, images)
    torch.testing.assert_close(torch.tensor(raw.outputs.embedding), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        torch.tensor(unit.outputs.embedding), expected / expected.norm(), atol=1e-5, rtol=1e-4
    )
    other = llm.embed({"prompt": PROMPTS[prompt], "multi_modal_data": {"image": noise_image(8)}})
    assert other[0].outputs.embedding != unit.outputs.embedding  # the image, not the text, differs
    pool = llm.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
