"""The cache of encoded images: least recently used out first, within its token budget."""

import torch

from spyglass.core.engine.runner.image_cache import EncodedImageCache


def embeds(tokens: int) -> torch.Tensor:
    return torch.zeros(tokens, 4)


def test_the_least_recently_used_image_leaves_first_past_the_budget():
    cache = EncodedImageCache(10)
    a, b, c = ("a", (1, 1)), ("b", (1, 1)), ("c", (1, 1))
    cache.put(a, embeds(4))
    cache.put(b, embeds(4))
    assert cache.get(a) is not None  # a is now the most recently used
    cache.put(c, embeds(4))  # 12 tokens: b leaves
    assert cache.get(b) is None
    assert cache.get(a) is not None and cache.get(c) is not None
    assert cache.num_tokens == 8


def test_images_are_told_apart_by_size_and_oversized_ones_are_not_kept():
    cache = EncodedImageCache(10)
    cache.put(("same", (10, 20)), embeds(3))
    assert cache.get(("same", (20, 10))) is None
    cache.put(("big", (1, 1)), embeds(11))
    assert cache.get(("big", (1, 1))) is None
    assert cache.num_tokens == 3
    off = EncodedImageCache(0)
    off.put(("any", (1, 1)), embeds(1))
    assert off.get(("any", (1, 1))) is None and off.num_tokens == 0
