"""A vision model's step: the embeddings of the image tokens its prompt chunks compute, each image
encoded once per request (`Request.image_embeds` keeps it while its tokens are still to compute)."""

from dataclasses import dataclass

import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.sched.scheduler import ScheduledRequest
from spyglass.core.models.image_rows import ImageRows


@dataclass(frozen=True, slots=True)
class _ImageSpan:
    """Embeddings ``[first, first + count)`` of image ``index`` of ``request`` go in the step's
    rows from ``row`` on."""

    request: Request
    index: int
    row: int
    first: int
    count: int


def step_image_rows(
    scheduled: list[ScheduledRequest], encode_images
) -> tuple[ImageRows | None, int]:
    """The step's image-token rows and their embeddings (None when it computes no image token),
    and how many images it encoded.

    ``encode_images`` maps images' tiles to their embeddings (`VisionLanguageModel`); the images
    not encoded yet are encoded together, in one call. An image whose last image
    token this step computes is let go (a request recomputed after a preemption encodes it
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
                        )
                    )
        row += item.num_new_tokens
    if not spans:
        return None, 0
    missing = list(
        dict.fromkeys((s.request, s.index) for s in spans if s.index not in s.request.image_embeds)
    )
    if missing:
        images = [request.images[index] for request, index in missing]
        encoded = encode_images(
            [image.pixel_values for image in images], [image.size for image in images]
        )
        for (request, index), image_embeds in zip(missing, encoded):
            request.image_embeds[index] = image_embeds
    rows = [torch.arange(s.row, s.row + s.count) for s in spans]
    embeds = torch.cat(
        [s.request.image_embeds[s.index][s.first : s.first + s.count] for s in spans]
    )
    for s in spans:
        if s.first + s.count == len(s.request.image_embeds.get(s.index, ())):
            s.request.image_embeds.pop(s.index)
    return ImageRows(torch.cat(rows).to(embeds.device), embeds), len(missing)
