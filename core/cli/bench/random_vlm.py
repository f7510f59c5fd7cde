"""Random vision-language checkpoints before the default model's language model shape
(SmolLM2-135M's), with the default model's tokenizer plus the image tokens: a LLaVA (a CLIP
tower), a LLaVA-NeXT (the same tower on a grid of tiles), an Idefics3 shaped as SmolVLM (a
pixel-shuffled SigLIP tower on tiles), a Qwen2.5-VL (a windowed tower on merged patches, its
language model rotating by M-RoPE), a Qwen3-VL (learned position embeddings, DeepStack,
interleaved M-RoPE), a Mistral 3 (Pixtral's tower, images at their own size) and a Gemma 3 (a
SigLIP tower pooled 2 x 2, its image tokens seeing their whole image, the language model as
Gemma 3 of the same shape). What ``bench vision`` runs when no vision model is at hand (speed
does not depend on the values)."""

from dataclasses import dataclass
from pathlib import Path

import torch

from spyglass.core.loaders.default_model import ensure_default_model
from spyglass.core.loaders.gguf_loader import load_gguf

IMAGE_TOKEN = "<image>"
VIDEO_TOKEN = "<video>"
# Qwen2-VL's image placeholder and the tokens around it.
QWEN_IMAGE_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
# Mistral 3's image token, row break and image end.
PIXTRAL_IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Gemma 3's image start, end and soft tokens.
GEMMA3_IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
# Idefics3's prompt tokens around tiles, and SmolVLM's end of turn.
TILE_TOKENS = [
    "<fake_token_around_image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
]


@dataclass(frozen=True, slots=True)
class TowerShape:
    """A vision tower's shape (the defaults: ViT-B/16 at 224 pixels, 196 patches)."""

    image_size: int = 224
    patch_size: int = 16
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12


def _text_model(extra_tokens: list[str], text_layers: int | None):
    """The default model's tokenizer with ``extra_tokens`` added (special), and a LlamaConfig of
    its language model's shape (``text_layers`` deep when given) for that vocabulary."""
    from transformers import AutoTokenizer, LlamaConfig

    source = ensure_default_model()
    arch = load_gguf(source, torch.float32).arch
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.add_tokens(extra_tokens, special_tokens=True)
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=text_layers or arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        rms_norm_eps=arch.rms_norm_eps,
        rope_theta=arch.rope_theta,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        bos_token_id=arch.bos_token_id,
        eos_token_id=list(arch.eos_token_ids),
    )
    return tokenizer, text


def _text_fields(text) -> dict:
    """The shape and special tokens of `_text_model`'s config, as a text_config's keys."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    keys += ("num_attention_heads", "num_key_value_heads", "rms_norm_eps", "bos_token_id")
    return {key: getattr(text, key) for key in (*keys, "eos_token_id")}


def _qwen_vision_tokens(tokenizer) -> dict:
    """A Qwen-VL config's image, video and vision start and end token ids."""
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids("<|image_pad|>"),
        "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"),
        "vision_end_token_id": ids("<|vision_end|>"),
    }


def _tower_fields(tower: TowerShape) -> dict:
    return dict(
        hidden_size=tower.hidden_size,
        intermediate_size=4 * tower.hidden_size,
        num_hidden_layers=tower.num_layers,
        num_attention_heads=tower.num_heads,
        image_size=tower.image_size,
        patch_size=tower.patch_size,
    )


def write_random_llava(
    path: Path, tower: TowerShape, text_layers: int | None, seed: int, next_: bool = False
) -> Path:
    """Save a random ``LlavaForConditionalGeneration`` (float32) and its tokenizer at ``path``;
    ``text_layers`` cuts the language model's depth (None: the default model's). With ``next_``
    a ``LlavaNextForConditionalGeneration`` whose grid resolutions are llava-v1.6's in tiles of
    the tower's size (1 x 2, 2 x 1, 2 x 2, 3 x 1, 1 x 3)."""
    import transformers

    tokenizer, text = _text_model([IMAGE_TOKEN], text_layers)
    size = tower.image_size
    pinpoints = [
        [size * rows, size * cols] for rows, cols in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))
    ]
    config = (transformers.LlavaNextConfig if next_ else transformers.LlavaConfig)(
        vision_config=transformers.CLIPVisionConfig(**_tower_fields(tower)),
        text_config=text,
        image_token_index=len(tokenizer) - 1,
        image_seq_length=(size // tower.patch_size) ** 2,
        **({"image_grid_pinpoints": pinpoints} if next_ else {}),
    )
    model_class = "LlavaNextForConditionalGeneration" if next_ else "LlavaForConditionalGeneration"
    torch.manual_seed(seed)
    getattr(transformers, model_class)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    if next_:
        processor = transformers.LlavaNextImageProcessorPil(
            size={"shortest_edge": size}, crop_size=size, image_grid_pinpoints=pinpoints
        )
    else:
        processor = transformers.CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size=size)
    processor.save_pretrained(path)
    return path


def write_random_onevision(
    path: Path, tower: TowerShape, text_layers: int | None, seed: int
) -> Path:
    """Save a random ``LlavaOnevisionForConditionalGeneration`` (float32): a SigLIP tower of
    ``tower``'s shape, every patch kept, llava-v1.6's grid resolutions in tiles of its size, a
    ``<video>`` token; with its tokenizer and image processor config."""
    import transformers

    tokenizer, text = _text_model([IMAGE_TOKEN, VIDEO_TOKEN], text_layers)
    size = tower.image_size
    pinpoints = [
        [size * rows, size * cols] for rows, cols in ((1, 2), (2, 1), (2, 2), (3, 1), (1, 3))
    ]
    config = transformers.LlavaOnevisionConfig(
        vision_config=transformers.SiglipVisionConfig(**_tower_fields(tower)),
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        video_token_index=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN),
        image_grid_pinpoints=pinpoints,
    )
    torch.manual_seed(seed)
    transformers.LlavaOnevisionForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    transformers.LlavaOnevisionImageProcessorPil(
        size={"height": size, "width": size}, image_grid_pinpoints=pinpoints
    ).save_pretrained(path)
    return path


def write_random_smolvlm(
    path: Path, tower: TowerShape, grid: int, text_layers: int | None, seed: int
) -> Path:
    """Save a random ``Idefics3ForConditionalGeneration`` (float32) as SmolVLM's are made: a SigLIP
    tower on ``tower.image_size`` tiles, patches shuffled 4 x 4 into a token, images resized to
    ``grid`` tiles on their longest edge; with its tokenizer and image processor config."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3VisionConfig,
    )

    tokenizer, text = _text_model([IMAGE_TOKEN, *TILE_TOKENS], text_layers)
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(**_tower_fields(tower)),
        text_config=text,
        scale_factor=4,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    Idefics3ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    Idefics3ImageProcessorPil(
        size={"longest_edge": grid * tower.image_size},
        max_image_size={"longest_edge": tower.image_size},
    ).save_pretrained(path)
    return path


def write_random_qwen2_5_vl(
    path: Path, tower: TowerShape, text_layers: int | None, seed: int
) -> Path:
    """Save a random ``Qwen2_5_VLForConditionalGeneration`` (float32): a tower of ``tower``'s
    width and depth on 14-pixel patches merged 2 x 2, attending within 112-pixel windows but in
    every fourth layer, before the default model's language model shape as a Qwen2 rotating by
    M-RoPE (Qwen's sections, 1/4, 3/8 and 3/8 of the frequencies); images are resized to at most
    ``tower.image_size`` squared pixels. With its tokenizer and image processor config."""
    import transformers

    tokenizer, text = _text_model(QWEN_IMAGE_TOKENS, text_layers)
    half = text.hidden_size // text.num_attention_heads // 2
    sections = [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]
    text_config = _text_fields(text)
    text_config["rope_parameters"] = {
        "rope_type": "default",
        "mrope_section": sections,
        "rope_theta": text.rope_parameters["rope_theta"],
    }
    config = transformers.Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=dict(
            depth=tower.num_layers,
            hidden_size=tower.hidden_size,
            intermediate_size=4 * tower.hidden_size,
            num_heads=tower.num_heads,
            out_hidden_size=text.hidden_size,
            fullatt_block_indexes=list(range(3, tower.num_layers, 4)),
        ),
        **_qwen_vision_tokens(tokenizer),
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    transformers.Qwen2VLImageProcessorPil(max_pixels=tower.image_size**2).save_pretrained(path)
    return path


def write_random_qwen3_vl(
    path: Path, tower: TowerShape, text_layers: int | None, seed: int
) -> Path:
    """Save a random ``Qwen3VLForConditionalGeneration`` (float32): a tower of ``tower``'s width,
    depth and patches merged 2 x 2, learned position embeddings on a 48 x 48 grid, DeepStack
    after a quarter, a half and three quarters of its layers, before the default model's
    language model shape as a Qwen3 rotating by interleaved M-RoPE (Qwen3-VL's sections, 3/8,
    5/16 and 5/16 of the frequencies); images are resized to at most ``tower.image_size``
    squared pixels. With its tokenizer and image processor config, and its video processor's:
    frames read as images are, a video's frames together allowed the pixels of 768 frames of
    ``tower.image_size`` squared (its most frames, each at full size, as Qwen3-VL's own config
    allows), so that the bench's frames of that size are read at that size."""
    import transformers

    # The module's class: transformers' top-level one wants torchvision.
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer, text = _text_model(QWEN_IMAGE_TOKENS, text_layers)
    head_dim = text.hidden_size // text.num_attention_heads
    half = head_dim // 2
    sections = [half - 2 * (5 * half // 16), 5 * half // 16, 5 * half // 16]
    text_config = _text_fields(text)
    text_config["head_dim"] = head_dim
    text_config["rope_parameters"] = {
        "rope_type": "default",
        "mrope_section": sections,
        "mrope_interleaved": True,
        "rope_theta": text.rope_parameters["rope_theta"],
    }
    layers = tower.num_layers
    config = transformers.Qwen3VLConfig(
        text_config=text_config,
        vision_config=dict(
            depth=layers,
            hidden_size=tower.hidden_size,
            intermediate_size=4 * tower.hidden_size,
            num_heads=tower.num_heads,
            patch_size=tower.patch_size,
            out_hidden_size=text.hidden_size,
            deepstack_visual_indexes=sorted({layers // 4, layers // 2, 3 * layers // 4}),
        ),
        **_qwen_vision_tokens(tokenizer),
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    transformers.Qwen3VLForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    transformers.Qwen2VLImageProcessorPil(
        max_pixels=tower.image_size**2,
        patch_size=tower.patch_size,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    ).save_pretrained(path)
    factor = 2 * tower.patch_size
    Qwen3VLVideoProcessor(
        size={"shortest_edge": 4 * factor**2, "longest_edge": 768 * tower.image_size**2},
        patch_size=tower.patch_size,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    ).save_pretrained(path)
    return path


def write_random_mistral3(
    path: Path, tower: TowerShape, text_layers: int | None, seed: int
) -> Path:
    """Save a random ``Mistral3ForConditionalGeneration`` (float32): a Pixtral tower of
    ``tower``'s shape (SiLU-gated MLPs) whose patches are merged 2 x 2, before the default
    model's language model shape as a Mistral; images are scaled to at most ``tower.image_size``
    pixels a side. With its tokenizer and image processor config."""
    import transformers

    tokenizer, text = _text_model(PIXTRAL_IMAGE_TOKENS, text_layers)
    text_config = _text_fields(text)
    text_config.update(
        model_type="mistral",
        head_dim=text.hidden_size // text.num_attention_heads,
        sliding_window=None,
    )
    config = transformers.Mistral3Config(
        text_config=text_config,
        vision_config=dict(model_type="pixtral", **_tower_fields(tower), hidden_act="silu"),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    transformers.Mistral3ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    merged = 2 * tower.patch_size
    transformers.PixtralImageProcessorPil(
        size={"longest_edge": tower.image_size}, patch_size={"height": merged, "width": merged}
    ).save_pretrained(path)
    return path


def write_random_gemma3(path: Path, tower: TowerShape, text_layers: int | None, seed: int) -> Path:
    """Save a random ``Gemma3ForConditionalGeneration`` (float32): a SigLIP tower of ``tower``'s
    shape whose patches are pooled 2 x 2 into image tokens, before the default model's language
    model shape as Gemma 3 (every sixth layer global, the others sliding over 512 positions).
    With its tokenizer and image processor config."""
    import transformers

    tokenizer, text = _text_model(GEMMA3_IMAGE_TOKENS, text_layers)
    head_dim = text.hidden_size // text.num_attention_heads
    text_config = _text_fields(text)
    text_config.update(
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        sliding_window=512,
    )
    side = tower.image_size // tower.patch_size
    ids = tokenizer.convert_tokens_to_ids
    config = transformers.Gemma3Config(
        text_config=text_config,
        vision_config=dict(**_tower_fields(tower), vision_use_head=False),
        mm_tokens_per_image=(side // 2) ** 2,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    transformers.Gemma3ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    size = {"height": tower.image_size, "width": tower.image_size}
    transformers.Gemma3ImageProcessorPil(size=size).save_pretrained(path)
    return path
