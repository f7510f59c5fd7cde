"""Rotary tables against transformers' own rope initialisation, for every scaling type we read."""

import pytest
import torch

from spyglass.core.models.rope import RotaryEmbedding, rotation_angles

HEAD_DIM, THETA, MAX_POSITIONS = 64, 10000.0, 512


def _transformers_frequencies(
    rope_parameters: dict, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_theta": THETA, **rope_parameters},
    )
    return ROPE_INIT_FUNCTIONS[rope_parameters["rope_type"]](config, "cpu", seq_len=seq_len)


SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "yarn untruncated, betas": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "truncate": False,
        "beta_fast": 16,
        "beta_slow": 2,
    },
    "yarn mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
}


@pytest.mark.parametrize("name", SCALINGS)
def test_scaled_frequencies_match_transformers(name):
    inv_freq, factor = _transformers_frequencies(SCALINGS[name])
    angles, our_factor = rotation_angles(HEAD_DIM, MAX_POSITIONS, THETA, SCALINGS[name])
    torch.testing.assert_close(angles[1], inv_freq.float(), rtol=1e-6, atol=0)
    assert our_factor == pytest.approx(factor)


def test_longrope_switches_from_short_to_long_factors_at_the_original_length():
    scaling = {
        "rope_type": "longrope",
        "original_max_position_embeddings": 128,
        "short_factor": [1.0 + i / 32 for i in range(HEAD_DIM // 2)],
        "long_factor": [1.5 + i / 4 for i in range(HEAD_DIM // 2)],
    }
    short, factor = _transformers_frequencies(scaling)
    long, _ = _transformers_frequencies(scaling, seq_len=129)
    angles, our_factor = rotation_angles(HEAD_DIM, MAX_POSITIONS, THETA, scaling)
    positions = torch.arange(MAX_POSITIONS, dtype=torch.float32).unsqueeze(1)
    torch.testing.assert_close(angles[:128], positions[:128] * short, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(angles[128:], positions[128:] * long, rtol=1e-5, atol=1e-4)
    assert our_factor == pytest.approx(factor) and factor > 1.0
    table = RotaryEmbedding(HEAD_DIM, MAX_POSITIONS, THETA, scaling, torch.float32, "cpu")
    assert table.cos[0, 0] == pytest.approx(factor)


def test_unknown_scaling_is_refused():
    with pytest.raises(ValueError, match="unsupported rope scaling 'dynamic'"):
        rotation_angles(HEAD_DIM, MAX_POSITIONS, THETA, {"rope_type": "dynamic", "factor": 2.0})
