"""``spyglass generate "prompt"``: stream one chat answer to the terminal."""

import sys
from pathlib import Path

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.cli.startup import collector_paused


def add_parser(subparsers, argv) -> None:
    """Register the command."""
    parser = subparsers.add_parser("generate", help="stream a chat answer to one prompt")
    parser.add_argument("prompt")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--no-chat-template", action="store_true", help="send the prompt as raw text"
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image before the prompt (a vision model's; repeat for several; with "
        "--no-chat-template the prompt places each with <image>)",
    )
    parser.add_argument(
        "--video",
        action="append",
        default=[],
        metavar="FILE",
        help="a video file before the prompt, after the images (Qwen2-VL's, Qwen2.5-VL's, OneVision's; "
        "at most 32 frames read, evenly spaced, or --media-io-kwargs'; repeat for several)",
    )
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    """Load the engine and print tokens as they are generated."""
    # Imported here, not at the top, so ``spyglass generate --help`` does not load torch.
    with collector_paused():
        from spyglass.core.engine.engine import LLMEngine
        from spyglass.core.engine.sampling_params import (
            InvalidRequestError,
            RequestOutputKind,
            SamplingParams,
        )

        engine = LLMEngine(engine_config_from_args(args))
    params = SamplingParams(
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        seed=args.seed,
        output_kind=RequestOutputKind.DELTA,
    )
    try:
        prompt, token_ids, images = _prompt(engine, args)
        engine.add_request("cli", token_ids, params, prompt=prompt, images=images)
    # An unreadable image or video, a refused prompt.
    except (OSError, InvalidRequestError) as error:
        print(f"error: {error}", file=sys.stderr)
        engine.shutdown()
        return 2
    while engine.has_unfinished_requests:
        for output in engine.step():
            sys.stdout.write(output.outputs[0].text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    engine.shutdown()
    return 0


def _prompt(engine, args):
    """The prompt's text, token ids and placed images and videos: the chat template over one user
    message (its images and videos first, for a vision model) unless ``--no-chat-template``."""
    from spyglass.core.engine.chat_images import render_with_images
    from spyglass.core.engine.image_preprocess import decode_image
    from spyglass.core.engine.prompt_images import images_in_prompt
    from spyglass.core.engine.video_decode import video_from_bytes
    from spyglass.core.engine.video_sampling import model_sampling

    tokenizer, vision = engine.tokenizer, engine.arch.vision
    images = [decode_image(Path(path).read_bytes(), "--image") for path in args.image]
    sampling = model_sampling(engine.config.video_frames, vision)
    videos = [video_from_bytes(Path(path).read_bytes(), "--video", sampling) for path in args.video]
    prompt = args.prompt
    if not args.no_chat_template:
        if vision is None:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        else:
            media = [{"type": "image"}] * len(images) + [{"type": "video"}] * len(videos)
            parts = [*media, {"type": "text", "text": prompt}]
            image_text = tokenizer.decode([vision.placeholder_id], skip_special_tokens=False)
            prompt = render_with_images(tokenizer, [{"role": "user", "content": parts}], image_text)
    field = "--video" if videos else "--image"
    token_ids, placed = images_in_prompt(
        tokenizer.encode(prompt), images, vision, engine.max_model_len, field, videos
    )
    return prompt, token_ids, placed
