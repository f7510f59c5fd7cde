"""The CLIP and SigLIP vision towers and projector against transformers' LLaVA on a tiny random checkpoint: the
parameter names, and the image features for every feature layer and selection, in float32 and bfloat16."""

import pytest
import torch

from spyglass.core.models.clip_vision import ClipVisionEncoder, vision_weight_names
from spyglass.core.models.vision_config import VisionConfig
from tests.conftest import TINY_TOWER


def tiny_llava(hidden_act="quick_gelu", projector_act="gelu", projector_bias=True, tower="clip"):
    """A random float32 ``LlavaForConditionalGeneration``: a 3-layer CLIP (or SigLIP) tower on
    32-pixel images of 8-pixel patches, a one-layer Llama. Weights are drawn wider than
    transformers' init (std 0.1, norms around 1), so every layer moves the features."""
    import transformers
    from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    tower_config = {"clip": "CLIPVisionConfig", "siglip": "SiglipVisionConfig"}[tower]
    config = LlavaConfig(
        vision_config=getattr(transformers, tower_config)(**TINY_TOWER, hidden_act=hidden_act),
        text_config=LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
        ),
        image_token_id=127,
        projector_hidden_act=projector_act,
        multimodal_projector_bias=projector_bias,
    )
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(mean=1.0 if "norm" in name else 0.0, std=0.1)
    return model


def vision_config(model, **overrides) -> VisionConfig:
    """Our `VisionConfig` for a transformers LLaVA ``model``, with ``overrides``."""
    config, tower = model.config, model.config.vision_config
    fields = dict(
        hidden_size=tower.hidden_size,
        intermediate_size=tower.intermediate_size,
        num_hidden_layers=tower.num_hidden_layers,
        num_attention_heads=tower.num_attention_heads,
        image_size=tower.image_size,
        patch_size=tower.patch_size,
        image_token_id=config.image_token_id,
        tower=tower.model_type.removesuffix("_vision_model"),
        use_head=tower.model_type == "siglip_vision_model",
        num_channels=tower.num_channels,
        layer_norm_eps=tower.layer_norm_eps,
        hidden_act=tower.hidden_act,
        feature_layer=config.vision_feature_layer,
        feature_select=config.vision_feature_select_strategy,
        projector_act=config.projector_hidden_act,
        projector_bias=config.multimodal_projector_bias,
    )
    return VisionConfig(**(fields | overrides))


def canonical_weights(model) -> dict[str, torch.Tensor]:
    """``model``'s whole state dict under the canonical names: its in-memory ``model.vision_tower.*``
    and ``model.multi_modal_projector.*`` lose the ``model.``; the language model's keys come along."""
    return {name.removeprefix("model."): t for name, t in model.state_dict().items()}


def transformers_features(model, pixels, vision: VisionConfig) -> torch.Tensor:
    """transformers' projected image features ``[images, tokens, text_hidden]`` for ``pixels``.

    ``output_hidden_states=True``: without it, transformers asks the tower for only the selected
    hidden state and reads ``output_hidden_states=0`` (feature layer 0) as "none", then fails."""
    with torch.no_grad():
        out = model.model.get_image_features(
            pixel_values=pixels,
            vision_feature_layer=vision.feature_layer,
            vision_feature_select_strategy=vision.feature_select,
            output_hidden_states=True,
        )
    return torch.stack(out.pooler_output)  # a list of per-image [tokens, text_hidden] tensors


@pytest.fixture(scope="module", params=["clip", "siglip"])
def llava(request):
    """The default tiny LLaVA (quick_gelu tower, gelu projector with biases), with each tower."""
    return tiny_llava(tower=request.param)


@pytest.fixture(scope="module")
def pixels() -> torch.Tensor:
    """A batch of two random normalized 32x32 images."""
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tower", ["clip", "siglip"])
@pytest.mark.parametrize("projector_bias", [True, False])
def test_weight_names_are_the_checkpoints(projector_bias, tower):
    model = tiny_llava(projector_bias=projector_bias, tower=tower)
    vision = vision_config(model)
    image_side = {
        n for n in canonical_weights(model) if not n.startswith(("language_model.", "lm_head."))
    }
    assert vision_weight_names(vision) == image_side


@pytest.mark.parametrize("feature_layer", [-2, -1, 0, 1, -4])
@pytest.mark.parametrize("feature_select", ["default", "full"])
def test_matches_transformers_in_float32(llava, pixels, feature_layer, feature_select):
    vision = vision_config(llava, feature_layer=feature_layer, feature_select=feature_select)
    ours = ClipVisionEncoder(vision, canonical_weights(llava), "cpu", torch.float32)(pixels)
    expected = transformers_features(llava, pixels, vision)
    assert ours.shape == (2, vision.tokens_per_tile, llava.config.text_config.hidden_size)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_runs_only_the_layers_the_feature_layer_needs(llava):
    weights = canonical_weights(llava)
    for feature_layer, num_layers in [(-2, 2), (-1, 3), (0, 0), (1, 1), (-4, 0)]:
        vision = vision_config(llava, feature_layer=feature_layer)
        assert len(ClipVisionEncoder(vision, weights, "cpu", torch.float32).layers) == num_layers


@pytest.mark.parametrize(
    ("hidden_act", "projector_act"),
    [("gelu", "gelu_pytorch_tanh"), ("gelu_new", "relu"), ("silu", "quick_gelu")],
)
def test_activations_match_transformers(pixels, hidden_act, projector_act):
    model = tiny_llava(hidden_act=hidden_act, projector_act=projector_act, projector_bias=False)
    vision = vision_config(model)
    ours = ClipVisionEncoder(vision, canonical_weights(model), "cpu", torch.float32)(pixels)
    torch.testing.assert_close(
        ours, transformers_features(model, pixels, vision), atol=1e-5, rtol=0
    )


def test_bfloat16_is_close_to_float32_transformers(llava, pixels):
    vision = vision_config(llava)
    ours = ClipVisionEncoder(vision, canonical_weights(llava), "cpu", torch.bfloat16)(pixels)
    expected = transformers_features(llava, pixels, vision)
    assert ours.dtype == torch.bfloat16
    # bfloat16 keeps 8 bits of mantissa; through 2 layers and the projector a few percent of the
    # features' range is the expected error.
    error = (ours.float() - expected).abs().max()
    assert error <= 0.05 * expected.abs().max()


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("hidden_act", "swish2", "unsupported vision activation 'swish2'"),
        ("projector_act", "tanh", "unsupported vision activation 'tanh'"),
        ("feature_layer", 4, "feature_layer 4 is outside"),
        ("feature_layer", -5, "feature_layer -5 is outside"),
        ("feature_select", "cls", "unknown feature_select 'cls'"),
    ],
)
def test_bad_config_raises_at_construction(llava, field, value, match):
    vision = vision_config(llava, **{field: value})
    with pytest.raises(ValueError, match=match):
        ClipVisionEncoder(vision, canonical_weights(llava), "cpu", torch.float32)
