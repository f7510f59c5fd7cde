"""Which rows of a step's flattened batch are image tokens, and what goes in them."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ImageRows:
    """The step's rows ``rows`` (of the flattened batch) hold image tokens: their input embeddings
    are ``embeds`` (one row each, in the activations' dtype), not the placeholder token's."""

    rows: torch.Tensor
    embeds: torch.Tensor
