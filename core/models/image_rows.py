"""Which rows of a step's flattened batch are image tokens, and what goes in them."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ImageRows:
    """The step's rows ``rows`` (of the flattened batch) hold image tokens: their input embeddings
    are ``embeds`` (one row each, in the activations' dtype), not the placeholder token's;
    ``run_ends`` is the prompt position after the run of image tokens each row is in (where a
    model's image tokens see their whole image, the keys each row sees end there)."""

    rows: torch.Tensor
    embeds: torch.Tensor
    run_ends: torch.Tensor

    def visible_ends(self, positions: torch.Tensor) -> torch.Tensor:
        """``[tokens]`` int32 for the step's ``positions``: the position before which each row
        sees keys when image tokens see their whole run (``AttentionMetadata.visible_ends``)."""
        ends = (positions + 1).to(torch.int32)
        ends[self.rows] = self.run_ends.to(ends.device, torch.int32)
        return ends
