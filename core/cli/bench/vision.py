"""``spyglass bench vision``: prompts with images, Spyglass's continuous batching against HF
transformers' ``generate`` (``LlavaForConditionalGeneration``, ``Idefics3ForConditionalGeneration``,
``Qwen2_5_VLForConditionalGeneration``, ...) in static batches.

Each prompt is seeded random text around one random image (the same length for every prompt, so
HF's batches need no padding); both sides get the same preprocessed pixels and generate
``--max-tokens`` tokens greedily, EOS ignored, in float32. Each side runs ``--repeats`` times,
alternating which goes first; the medians are compared. Without ``--model`` a random model is
built before SmolLM2-135M's language model (`random_vlm`): with ``--arch llava`` a CLIP tower of
the given shape (``llava-next``: on a 2 x 2 grid of tiles and the base image); with ``--arch
smolvlm`` SmolVLM's layout, a SigLIP tower on tiles of ``--image-size`` pixels, images of
``--grid`` x ``--grid`` tiles plus the global one; with ``--arch qwen2.5-vl`` Qwen2.5-VL's, a
windowed tower on 14-pixel patches of ``--image-size`` square images, merged 2 x 2; with
``--arch llava-onevision`` OneVision's, a SigLIP tower on LLaVA-NeXT's grid. With
``--video-frames N`` (qwen2.5-vl, qwen3-vl, llava-onevision) a video of N random frames of that
size instead of each image, at 8 frames a second (Qwen3-VL's steps timed by text in the prompt
both sides read).
The vision share is the tower's and projector's time over the model time of Spyglass's steps.
"""

import gc
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from spyglass.core.cli.bench.random_vlm import (
    TowerShape,
    write_random_gemma3,
    write_random_llava,
    write_random_mistral3,
    write_random_onevision,
    write_random_qwen2_5_vl,
    write_random_qwen3_vl,
    write_random_smolvlm,
)
from spyglass.core.cli.bench.results import RunResult
from spyglass.core.cli.bench.workloads import FIRST_ORDINARY_TOKEN
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.video_decode import VideoFrames
from spyglass.core.models import qwen_grid
from spyglass.core.models.vision_config import VisionConfig

# transformers' model types of Qwen2-VL, Qwen2.5-VL and Qwen3-VL.
_QWEN_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# The rate of the bench's videos: a step of two frames takes a quarter second, one time position
# of a random Qwen2.5-VL's (its tokens_per_second is 4), where transformers 5 counts positions as
# Qwen does; Qwen3-VL's steps are timed by the text of their times (the frames' at this rate).
_VIDEO_FPS = 8.0


def add_parser(subparsers, argv) -> None:
    """Register ``bench vision``."""
    parser = subparsers.add_parser(
        "vision", help="prompts with images: throughput against HF transformers' LLaVA or Idefics3"
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--text-tokens", type=int, default=24, help="text tokens per prompt")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side; medians compared")
    parser.add_argument("--hf-batch-size", type=int, default=8, help="prompts per HF batch")
    shape = TowerShape()
    parser.add_argument(
        "--arch",
        choices=[
            "llava",
            "llava-next",
            "llava-onevision",
            "smolvlm",
            "qwen2.5-vl",
            "qwen3-vl",
            "mistral3",
            "gemma3",
        ],
        default="llava",
        help="the random model's layout",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="the tower's input (224; smolvlm: 256-pixel tiles; qwen2.5-vl, qwen3-vl, mistral3 "
        "and gemma3: 448-pixel images)",
    )
    parser.add_argument("--grid", type=int, default=2, help="smolvlm: tiles a side of each image")
    parser.add_argument(
        "--video-frames",
        type=int,
        default=0,
        help="qwen2.5-vl, qwen3-vl and llava-onevision: each prompt holds a video of this many "
        "frames instead of an image",
    )
    parser.add_argument("--patch-size", type=int, default=shape.patch_size)
    parser.add_argument("--vision-layers", type=int, default=shape.num_layers)
    parser.add_argument(
        "--text-layers", type=int, default=None, help="cut the random model's language model"
    )
    add_engine_arguments(parser)
    parser.set_defaults(dtype="float32", run=run)


@dataclass(frozen=True, slots=True)
class VisionComparison:
    """Each side's median run, the vision share of Spyglass's model time, and how many prompts
    both sides answered with the same tokens."""

    spyglass: RunResult
    hf: RunResult
    vision_share: float
    num_identical: int
    num_prompts: int
    tokens_per_image: int
    tiles_per_image: int

    @property
    def speedup(self) -> float:
        """Spyglass's throughput over HF's."""
        return self.hf.seconds / self.spyglass.seconds


class _VisionTime:
    """A plugin adding up the steps' vision and model seconds."""

    def __init__(self):
        self.vision = self.model = 0.0

    @hookimpl
    def spyglass_step_finished(self, stats):
        """Add the step's vision and model seconds."""
        self.vision += stats.vision_time
        self.model += stats.model_time


def vision_prompts(
    engine: LLMEngine, num_prompts: int, text_tokens: int, seed: int, video_frames: int = 0
) -> list[tuple[list[int], tuple[ImageInput, ...]]]:
    """Seeded prompts of ``text_tokens`` random tokens with one random image two thirds in,
    placed for ``engine``'s model: a square image of the tower's size, or of the longest edge a
    tiling model resizes images to (``video_frames``: a video of that many such frames)."""
    vision = engine.arch.vision
    side = vision.image_size
    if vision.tiles is not None:
        side = vision.tiles.longest_edge
    elif vision.temporal_patch_size:  # Qwen2-VL: the largest square it reads whole
        side = int(vision.max_pixels**0.5)
    elif vision.grid_pinpoints:
        side = max(min(pinpoint) for pinpoint in vision.grid_pinpoints)
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(num_prompts):
        # The image tokens are the tokenizer's last: text is drawn below them.
        first_image_token = min(vision.image_token_id, vision.placeholder_id)
        text = rng.integers(FIRST_ORDINARY_TOKEN, first_image_token, text_tokens).tolist()
        cut = 2 * text_tokens // 3
        pixels = rng.integers(0, 256, (max(video_frames, 1), side, side, 3), dtype=np.uint8)
        images = [Image.fromarray(frame) for frame in pixels]
        marker = vision.video_token_id if video_frames else vision.placeholder_id
        token_ids = [*text[:cut], marker, *text[cut:]]
        times = tuple(index / _VIDEO_FPS for index in range(video_frames))
        video = VideoFrames(tuple(images), _VIDEO_FPS, times)
        media = ([], [video]) if video_frames else (images, [])
        prompts.append(
            images_in_prompt(token_ids, media[0], vision, engine.max_model_len, "bench", media[1])
        )
    return prompts


def _spyglass_run(config: EngineConfig, prompts, max_tokens: int):
    """One pass on a fresh engine: its result, each prompt's tokens, and the vision share."""
    gc.collect()
    engine = LLMEngine(config)
    timer = _VisionTime()
    engine.plugin_manager.register(timer)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    try:
        start = time.perf_counter()
        for index, (token_ids, images) in enumerate(prompts):
            engine.add_request(str(index), token_ids, params, images=images)
        while engine.has_unfinished_requests:
            for output in engine.step():
                if output.finished:
                    tokens[output.request_id] = list(output.outputs[0].token_ids)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()
    ordered = [tokens[str(index)] for index in range(len(prompts))]
    return seconds, ordered, timer.vision / max(timer.model, 1e-9)


def _hf_run(model, prompts, max_tokens: int, batch_size: int, vision: VisionConfig):
    """One pass of HF's generate over static batches: the seconds and each prompt's tokens."""
    outputs = []
    start = time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first : first + batch_size]
        input_ids = torch.tensor([token_ids for token_ids, _ in batch])
        # LLaVA, Qwen2-VL, Gemma 3 and Mistral 3 take [images, ...] (Qwen2-VL's patches, with
        # each image's grid and which tokens are images'; Gemma 3 which tokens are images';
        # Mistral 3 each image's processed (height, width)); LLaVA-NeXT, OneVision and Idefics3
        # [prompts, tiles, ...] (LLaVA-NeXT and OneVision with each image's (height, width));
        # videos: Qwen2-VL's patches with their grids (Qwen2.5-VL's with each step's seconds;
        # Qwen3-VL's times are text in the prompt), OneVision's [prompts, frames, ...].
        model_type = model.config.model_type
        flat = ("llava", "gemma3", "mistral3", *_QWEN_TYPES)
        join = torch.cat if model_type in flat else torch.stack
        pixels = join([images[0].pixel_values for _, images in batch])
        extra = {"pixel_values": pixels}
        clip = batch[0][1][0].clip
        if model_type in ("llava_next", "llava_onevision") and clip is None:
            sizes = [images[0].size[::-1] for _, images in batch]
            extra["image_sizes"] = torch.tensor(sizes)
        if model_type == "llava_onevision" and clip is not None:  # [prompts, frames, ...]
            extra = {"pixel_values_videos": pixels}
        elif model_type in _QWEN_TYPES and clip is not None:  # videos
            grid = qwen_grid.patch_grid(*batch[0][1][0].size, vision, clip.frames)
            extra = {
                "pixel_values_videos": pixels,
                "video_grid_thw": torch.tensor([[clip.steps, *grid]] * len(batch)),
                "mm_token_type_ids": 2 * (input_ids == vision.video_token_id).int(),
            }
            if model_type != "qwen3_vl":
                extra["second_per_grid_ts"] = torch.tensor([clip.step_seconds] * len(batch))
        elif model_type in _QWEN_TYPES:
            grids = [qwen_grid.patch_grid(*images[0].size, vision) for _, images in batch]
            extra["image_grid_thw"] = torch.tensor([[1, *grid] for grid in grids])
            extra["mm_token_type_ids"] = (input_ids == vision.image_token_id).int()
        if model_type == "mistral3":
            sizes = [images[0].pixel_values.shape[-2:] for _, images in batch]
            extra["image_sizes"] = torch.tensor([list(size) for size in sizes])
        if model_type == "gemma3":
            extra["token_type_ids"] = (input_ids == vision.image_token_id).long()
        with torch.inference_mode():
            generated = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),  # equal lengths: no padding
                **extra,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
            )
        outputs += generated[:, input_ids.shape[1] :].tolist()
    return time.perf_counter() - start, outputs


def compare(args, model_dir: Path) -> VisionComparison:
    """Time both sides ``args.repeats`` times, alternating which goes first."""
    import transformers

    config = engine_config_from_args(args, model=str(model_dir))
    probe = LLMEngine(config)
    print(
        f"model {probe.model_name} dtype {probe.info.dtype} device {probe.info.device} "
        f"threads {torch.get_num_threads()} max_num_batched_tokens {config.max_num_batched_tokens}"
    )
    if args.video_frames and probe.arch.vision.video_token_id is None:
        raise SystemExit(
            f"--video-frames: {probe.model_name} reads no videos (qwen2.5-vl, qwen3-vl and "
            "llava-onevision do)"
        )
    prompts = vision_prompts(
        probe, args.num_prompts, args.text_tokens, args.seed, args.video_frames
    )
    image, vision = prompts[0][1][0], probe.arch.vision
    probe.shutdown()
    del probe
    hf_class = getattr(
        transformers, json.loads((model_dir / "config.json").read_text())["architectures"][0]
    )
    hf_model = hf_class.from_pretrained(model_dir, dtype=config.torch_dtype())
    hf_model.eval()
    num_prompt_tokens = sum(len(token_ids) for token_ids, _ in prompts)
    num_output_tokens = args.num_prompts * args.max_tokens
    runs: dict[str, list[float]] = {"spyglass": [], "hf": []}
    shares = []
    for repeat in range(args.repeats):
        for side in ("spyglass", "hf") if repeat % 2 == 0 else ("hf", "spyglass"):
            if side == "hf":
                seconds, hf_tokens = _hf_run(
                    hf_model, prompts, args.max_tokens, args.hf_batch_size, vision
                )
            else:
                seconds, ours, share = _spyglass_run(config, prompts, args.max_tokens)
                shares.append(share)
            runs[side].append(seconds)
    median = lambda values: sorted(values)[len(values) // 2]
    result = lambda side: RunResult(median(runs[side]), num_prompt_tokens, num_output_tokens)
    identical = sum(a == b for a, b in zip(ours, hf_tokens))
    return VisionComparison(
        result("spyglass"),
        result("hf"),
        median(shares),
        identical,
        args.num_prompts,
        image.length,
        # Qwen2-VL's are patches; a video's, frames.
        1 if vision.temporal_patch_size or image.clip else len(image.pixel_values),
    )


def run(args) -> int:
    """Compare both sides (on a random model unless ``--model`` names one) and print the table."""
    if args.model is not None:
        report(args, compare(args, Path(args.model)))
        return 0
    sizes = {"smolvlm": 256, "qwen2.5-vl": 448, "qwen3-vl": 448, "mistral3": 448, "gemma3": 448}
    default_size = sizes.get(args.arch, 224)
    tower = TowerShape(
        args.image_size or default_size, args.patch_size, num_layers=args.vision_layers
    )
    with tempfile.TemporaryDirectory(prefix=f"spyglass-{args.arch}-") as scratch:
        if args.arch == "smolvlm":
            model_dir = write_random_smolvlm(
                Path(scratch), tower, args.grid, args.text_layers, args.seed
            )
        elif args.arch == "llava-onevision":
            model_dir = write_random_onevision(Path(scratch), tower, args.text_layers, args.seed)
        elif args.arch == "qwen2.5-vl":
            model_dir = write_random_qwen2_5_vl(Path(scratch), tower, args.text_layers, args.seed)
        elif args.arch == "qwen3-vl":
            model_dir = write_random_qwen3_vl(Path(scratch), tower, args.text_layers, args.seed)
        elif args.arch == "mistral3":
            model_dir = write_random_mistral3(Path(scratch), tower, args.text_layers, args.seed)
        elif args.arch == "gemma3":
            model_dir = write_random_gemma3(Path(scratch), tower, args.text_layers, args.seed)
        else:
            model_dir = write_random_llava(
                Path(scratch), tower, args.text_layers, args.seed, args.arch == "llava-next"
            )
        report(args, compare(args, model_dir))
    return 0


def report(args, result: VisionComparison) -> None:
    """Print ``result``: a row per side, the ratio, the vision share and the agreement."""
    tiles = f"{result.tiles_per_image} tiles, " if result.tiles_per_image > 1 else ""
    item = f"video of {args.video_frames} frames" if args.video_frames else "image"
    print(
        f"\nvision: {result.num_prompts} prompts of {args.text_tokens} text tokens and one {item} "
        f"({tiles}{result.tokens_per_image} tokens), {args.max_tokens} tokens generated each "
        f"(median of {args.repeats} runs)"
    )
    rate = "videos/s" if args.video_frames else "images/s"
    print(f"{'engine':<26}{'seconds':>9}{rate:>10}{'output tok/s':>14}{'total tok/s':>13}")
    for label, side in (
        ("spyglass", result.spyglass),
        (f"hf (batches of {args.hf_batch_size})", result.hf),
    ):
        print(
            f"{label:<26}{side.seconds:>9.2f}{result.num_prompts / side.seconds:>10.2f}"
            f"{side.output_tokens_per_s:>14.1f}{side.total_tokens_per_s:>13.1f}"
        )
    print(f"spyglass / hf throughput: {result.speedup:.2f}x")
    print(f"spyglass vision tower and projector: {result.vision_share:.1%} of model time")
    print(
        f"agreement: {result.num_identical} of {result.num_prompts} prompts gave identical "
        "greedy tokens"
    )
