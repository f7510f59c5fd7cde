"""The architecture description every loader produces and every model consumes."""

from dataclasses import dataclass, field

from spyglass.core.models.vision_config import VisionConfig

POOLING_TYPES = ("last", "mean", "cls")
"""How an embedding pools its prompt's final hidden states: the last token's (what decoder
embedding models are trained for), their mean, or the first token's."""

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True, slots=True)
class ModelArchConfig:
    """Shape and numerics of a decoder-only transformer.

    ``architecture`` names the family (`core.models.registry` maps it to a model class): ``"llama"``,
    ``"qwen2"`` (biases on q/k/v), ``"qwen3"`` (per-head q/k RMSNorm), ``"mistral"``, ``"phi3"``,
    ``"gemma2"``, ``"gemma3"``, ``"mixtral"``, ``"qwen2_moe"``, ``"qwen3_moe"``.
    ``rope_scaling`` is the HF dict (``{"rope_type": "llama3" | "yarn" | "linear" | "longrope", ...}``) or None.

    Attention: ``layer_types`` says per layer whether it is ``"sliding_attention"`` (sees its last
    ``sliding_window`` positions) or ``"full_attention"``; ``query_pre_attn_scalar`` replaces head_dim in
    the softmax scale and ``attn_logit_softcapping`` caps scores (Gemma); ``local_rope_theta`` is the
    rope base of sliding layers where it differs (Gemma 3). Mixture of experts: ``num_experts`` > 0 makes
    the layers listed in ``moe_layers`` route each token to ``num_experts_per_tok`` experts of width
    ``moe_intermediate_size``, plus a gated shared expert when ``shared_expert_intermediate_size`` > 0.
    ``has_lm_head`` is False for a base-model checkpoint (``LlamaModel``, ``Qwen2Model``,
    ``MistralModel``, ... as embedding models ship) and for a classifier: neither generates.
    ``num_labels`` > 0 gives a sequence classifier's head (``...ForSequenceClassification``:
    reward models, moderation classifiers), ``labels`` its classes' names in order.
    ``pooling_type`` is how the checkpoint says its embeddings pool the prompt (a
    sentence-transformers Pooling module, a GGUF file's ``pooling_type``): ``last``, ``mean`` or
    ``cls`` (`POOLING_TYPES`); another name is a mode that does not run here.
    ``matryoshka_dimensions`` are the lengths an embedding may be cut to (the model was trained
    Matryoshka style: its config says ``is_matryoshka`` or lists ``matryoshka_dimensions``); empty
    when only the hidden size is meaningful, ``(0,)`` for any length up to it.
    ``vision`` is the image encoder of a LLaVA-style model (images in the prompt), else None.
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
    hidden_act: str = "silu"
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    local_rope_theta: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()
    has_lm_head: bool = True
    num_labels: int = 0
    labels: tuple[str, ...] = ()
    pooling_type: str = "last"
    matryoshka_dimensions: tuple[int, ...] = ()
    vision: VisionConfig | None = None

    @property
    def uses_mrope(self) -> bool:
        """Whether rope rotates by M-RoPE's three positions a token (Qwen2-VL)."""
        return (self.rope_scaling or {}).get("rope_type") == "mrope"

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``, or None when it attends to its whole context."""
        sliding = self.layer_types[layer] == SLIDING if self.layer_types else True
        return self.sliding_window if sliding else None

    def kv_window(self) -> int | None:
        """The widest window when every layer slides (Mistral), else None (a full-attention layer sees all).

        KV older than this many positions before a request's next token is dead for every layer, so
        the KV cache may give its blocks back (see `KVCacheManager`).
        """
        windows = [self.window(layer) for layer in range(self.num_hidden_layers)]
        return None if not windows or None in windows else max(windows)
