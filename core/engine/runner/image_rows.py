"""A vision model's step: the embeddings of the image tokens its prompt chunks compute, each image
encoded once per request (`Request.image_embeds` keeps it while its tokens are still to compute)."""

from dataclasses import dataclass

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.image_cache import EncodedImageCache
from spyglass.core.engine.sched.scheduler import ScheduledRequest
from spyglass.core.models.image_rows import ImageRows


@dataclass(frozen=True, slots=True)
class _ImageSpan:
    """Embeddings ``[first, first + count)`` of image ``index`` of ``request`` go in the step's
    rows from ``row`` on; their run of image tokens ends before prompt position ``run_end``."""

    request: Request
    index: int
    row: int
    first: int
    count: int
    run_end: int


def step_image_rows(
    scheduled: list[ScheduledRequest], encode_images, cache: EncodedImageCache
) -> tuple[ImageRows | None, int, int]:
    """The step's image-token rows and their embeddings (None when it computes no image token),
    how many images it encoded, and how many of its requests' images it read without running the
    tower (from ``cache``, or encoded for another request of the step).

    ``encode_images`` maps images' tiles to their embeddings (`VisionLanguageModel`); the images
    neither kept by a request nor in ``cache`` are encoded together, in one call, each distinct
    image once, and kept in ``cache``. An image whose last image token this step computes is let
    go by its request (one recomputed after a preemption finds it in ``cache`` or encodes it
    again)."""
    spans, row = [], 0
    for item in scheduled:
        request = item.request
        start = request.num_launched_tokens
        end = start + item.num_new_tokens
        for index, image in enumerate(request.images):
            if image.offset >= end or image.end <= start:
                continue
            for run_start, run_end, embed in image.embedding_runs():
                first, last = max(start, run_start), min(end, run_end)
                if first < last:
                    spans.append(
                        _ImageSpan(
                            request,
                            index,
                            row + first - start,
                            embed + first - run_start,
                            last - first,
                            run_end,
                        )
                    )
        row += item.num_new_tokens
    if not spans:
        return None, 0, 0
    missing = list(
        dict.fromkeys((s.request, s.index) for s in spans if s.index not in s.request.image_embeds)
    )
    keys, images = {}, {}
    for request, index in missing:
        image = request.images[index]
        keys[request, index] = key = (image.digest, image.size, image.clip)
        images.setdefault(key, image)
    kept = {key: cache.get(key) for key in images}
    new = [key for key, embeds in kept.items() if embeds is None]
    if new:
        encoded = encode_images(
            [images[key].pixel_values for key in new],
            [images[key].size for key in new],
            [images[key].clip.frames if images[key].clip else 0 for key in new],
        )
        for key, image_embeds in zip(new, encoded):
            kept[key] = image_embeds
            cache.put(key, image_embeds)
    for (request, index), key in keys.items():
        request.image_embeds[index] = kept[key]
    rows = [torch.arange(s.row, s.row + s.count) for s in spans]
    embeds = torch.cat(
        [s.request.image_embeds[s.index][s.first : s.first + s.count] for s in spans]
    )
    for s in spans:
        if s.first + s.count == len(s.request.image_embeds.get(s.index, ())):
            s.request.image_embeds.pop(s.index)
    run_ends = torch.tensor([s.run_end for s in spans]).repeat_interleave(
        torch.tensor([s.count for s in spans])
    )
    return (
        ImageRows(torch.cat(rows).to(embeds.device), embeds, run_ends.to(embeds.device)),
        len(new),
        len(keys) - len(new),
    )
