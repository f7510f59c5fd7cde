"""Recently encoded images' embeddings, so that the same image in another request (``n`` choices
of one chat call, a conversation sending its image again) runs the vision tower once."""

from collections import OrderedDict

import torch

ImageKey = tuple[str, tuple[int, int]]
"""An image's pixel digest and its size (LLaVA-NeXT packs equal tiles by the size)."""


class EncodedImageCache:
    """Embeddings by `ImageKey`, the least recently used evicted once they hold more than
    ``max_tokens`` embeddings in all (0: nothing is kept); one larger than that is not kept."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[ImageKey, torch.Tensor] = OrderedDict()
        self._tokens = 0

    def get(self, key: ImageKey) -> torch.Tensor | None:
        """The embeddings kept for ``key`` (now the most recently used), or None."""
        embeds = self._entries.get(key)
        if embeds is not None:
            self._entries.move_to_end(key)
        return embeds

    def put(self, key: ImageKey, embeds: torch.Tensor) -> None:
        """Keep ``embeds`` for ``key``, evicting the least recently used past the budget."""
        if len(embeds) > self.max_tokens or key in self._entries:
            return
        self._entries[key] = embeds
        self._tokens += len(embeds)
        while self._tokens > self.max_tokens:
            _, evicted = self._entries.popitem(last=False)
            self._tokens -= len(evicted)

    @property
    def num_tokens(self) -> int:
        """The embeddings kept, in all."""
        return self._tokens
