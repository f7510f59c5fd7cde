"""The image side of a vision-language model (LLaVA, Idefics3): its vision tower, the projector
into the language model, the image token, and how an image becomes the tower's pixels."""

from dataclasses import dataclass

from spyglass.core.models.image_tiles import ImageTiles
from spyglass.core.models.timed_frames import TimedFrames

VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "image_newline")
"""The parameter names of the vision tower, the projector and LLaVA-NeXT's row end start with
these."""

FEATURE_SELECTS = ("default", "full")
"""Which of the tower's positions become image tokens: all but the first (CLIP's class token),
or all."""

TOWERS = ("clip", "siglip", "idefics3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "pixtral")
"""The vision towers that run: CLIP's (a class token, a LayerNorm before the layers), SigLIP's
(patches only, a bias on the patch embedding, an attention-pooling head LLaVA ignores) and
Idefics3's (SigLIP's layers, all of them, then its final LayerNorm, a pixel shuffle merging
``scale_factor`` x ``scale_factor`` patches into one token, and one linear projection). Qwen2-VL's
(``qwen2_vl``: patches of two frames, 2D rope, LayerNorm and GELU layers; ``qwen2_5_vl``: RMSNorm
and gated SiLU layers, attention within windows but in ``full_attention_layers``) reads an image
at (about) its own size and merges ``scale_factor`` x ``scale_factor`` patches into one token;
Qwen3-VL's (``qwen3_vl``) adds learned position embeddings resampled to each image's grid, and
its DeepStack mergers give the language model's first layers more of each image. Gemma 3's
(``gemma3``) is SigLIP's, every layer and its final LayerNorm, then each ``scale_factor`` x
``scale_factor`` square of patches averaged into one token, RMS-normalized and projected.
Mistral 3's Pixtral (``pixtral``) reads an image at (about) its own size, its longer side at most
``image_size``: RMSNorm layers with 2D rope and gated MLPs, then a norm, a learned merge of
``scale_factor`` x ``scale_factor`` patches and a two-layer MLP."""


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """A CLIP or SigLIP vision tower (``tower``; ``vision_config`` of a
    ``LlavaForConditionalGeneration`` config.json; ``use_head``: a SigLIP checkpoint holds its
    pooling head) whose ``feature_layer`` output (``-2``: the second to last layer's) passes a two-layer MLP
    projector (``projector_act`` between, biases when ``projector_bias``) into the language
    model's embedding space, where it replaces the prompt's ``image_token_id`` placeholders,
    `tokens_per_tile` of them per image. Or Idefics3's tower (``idefics3``), whose images are
    cut into ``tiles`` (`ImageTiles`), each of them `tokens_per_tile` placeholders. With
    ``grid_pinpoints`` (LLaVA-NeXT's ``image_grid_pinpoints``, ``(height, width)`` each), an image
    is also fitted into the best of those resolutions and cut into tower-sized tiles whose
    features, unpadded and each row ended by the learned ``image_newline``, follow the whole
    image's (`anyres`). LLaVA-OneVision's ``max_grid_tiles`` (its ``anyres_max_N``) also shrinks
    those features to about N tiles' worth, and reads an image that shares its prompt with
    others as the whole image alone, padded square. Qwen2-VL's towers (`qwen_grid`) resize an
    image to between ``min_pixels`` and ``max_pixels``, in multiples of ``patch_size`` times
    ``scale_factor``, each patch repeated over ``temporal_patch_size`` frames; ``hidden_size``
    is the tower's width, ``projector_size`` the language model's; Qwen2.5-VL attends within
    windows of ``window_size`` pixels. Qwen3-VL's learned position embeddings are a
    ``position_grid`` x ``position_grid`` table; the outputs of its ``deepstack_layers``, each
    merged by a merger of its own, are added to the image tokens' hidden states after the
    language model's first layers, one a layer. Pixtral rotates by ``rope_theta`` and its
    projector normalizes with ``projector_norm_eps``; a row of its image's tokens ends with
    ``row_break_token_id``, the last with ``image_end_token_id``.

    Videos (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision): a ``video_token_id`` (None: the model reads
    no videos) marks where each goes and becomes its tokens. Qwen2-VL's frames are resized within
    ``video_min_pixels`` and ``video_max_pixels``, every ``temporal_patch_size`` of them one step
    of tokens, and Qwen2.5-VL's steps sit ``tokens_per_second`` time positions a second apart
    (0: one position a step, Qwen2-VL's). Qwen3-VL's (``timed_frames``, `TimedFrames`) are
    sampled at a rate of the video's time, sized with one pixel budget for all of them, and each
    step's tokens follow the text of its time. LLaVA-OneVision's frames are each a tower-sized square
    whose features are pooled 2 x 2 (`video_tokens_per_frame`), the video's ended by
    ``image_newline``.

    The prompt: a ``placeholder_token_id`` (None: ``image_token_id``) marks where each image goes
    and becomes its tokens (`image_layout`), between ``image_prefix_ids`` and
    ``image_suffix_ids`` where the model has them (Gemma 3: ``"\n\n<start_of_image>"`` and
    ``"<end_of_image>\n\n"``); ``token_merges`` ``(a, b, ab)`` join a token of the prompt
    with the one of the image's it meets into the one the tokenizer would have read (Gemma 3's
    newlines). With ``bidirectional``, an image's tokens attend to every token of their image,
    later ones too (Gemma 3), so a prompt chunk never ends inside an image.

    Preprocessing (``preprocessor_config.json``, a ``CLIPImageProcessor``): RGB, padded to a
    square of the mean colour when ``pad_to_square`` (``LlavaImageProcessor``'s ``do_pad``),
    resized so the shortest edge is ``resize_shortest_edge`` (PIL ``resample``: 3 is bicubic),
    cut to the centre ``image_size`` square when ``center_crop``, scaled by ``rescale_factor``
    and normalized by ``image_mean`` and ``image_std`` per channel.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    image_token_id: int
    tower: str = "clip"
    use_head: bool = False
    num_channels: int = 3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"
    feature_layer: int = -2
    feature_select: str = "default"
    projector_act: str = "gelu"
    projector_bias: bool = True
    resize_shortest_edge: int = 0
    center_crop: bool = True
    pad_to_square: bool = False
    resample: int = 3
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)
    scale_factor: int = 1
    tiles: ImageTiles | None = None
    grid_pinpoints: tuple[tuple[int, int], ...] = ()
    max_grid_tiles: int = 0
    temporal_patch_size: int = 0
    min_pixels: int = 0
    max_pixels: int = 0
    projector_size: int = 0
    window_size: int = 0
    full_attention_layers: tuple[int, ...] = ()
    position_grid: int = 0
    deepstack_layers: tuple[int, ...] = ()
    rope_theta: float = 10000.0
    projector_norm_eps: float = 1e-5
    row_break_token_id: int | None = None
    image_end_token_id: int | None = None
    placeholder_token_id: int | None = None
    image_prefix_ids: tuple[int, ...] = ()
    image_suffix_ids: tuple[int, ...] = ()
    token_merges: tuple[tuple[int, int, int], ...] = ()
    bidirectional: bool = False
    video_token_id: int | None = None
    video_min_pixels: int = 0
    video_max_pixels: int = 0
    tokens_per_second: float = 0.0
    timed_frames: TimedFrames | None = None

    @property
    def placeholder_id(self) -> int:
        """The token that marks where an image goes in a prompt."""
        return (
            self.image_token_id if self.placeholder_token_id is None else self.placeholder_token_id
        )

    @property
    def patch_pixels(self) -> int:
        """The values of one patch as Qwen2-VL's tower reads it (channels x frames x side x side)."""
        return self.num_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def video_tokens_per_frame(self) -> int:
        """LLaVA-OneVision's tokens a video frame: its grid of features pooled 2 x 2 (bilinear,
        rounded up)."""
        side = self.image_size // self.patch_size
        return (-(-side // 2)) ** 2

    @property
    def num_patches(self) -> int:
        """Patches the tower cuts an image into."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_positions(self) -> int:
        """The tower's positions: a patch each, after CLIP's class token."""
        return self.num_patches + (self.tower == "clip")

    @property
    def tokens_per_tile(self) -> int:
        """Prompt positions one tile (the tower's input; LLaVA's whole image) fills: the tower's
        positions, less the first with ``default``, merged ``scale_factor`` squared into one."""
        kept = self.num_positions - (self.feature_select == "default")
        return kept // self.scale_factor**2
