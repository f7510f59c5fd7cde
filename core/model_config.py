"""The architecture description every loader produces and every model consumes."""

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelArchConfig:
    """Shape and numerics of a decoder-only transformer (Llama family).

    ``architecture`` is ``"llama"`` or ``"qwen2"`` (Qwen2 adds biases on q/k/v).
    ``rope_scaling`` is the HF dict (``{"rope_type": "llama3", "factor": ..., ...}``) or None.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: dict | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
