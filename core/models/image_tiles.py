"""How Idefics3 (SmolVLM) cuts an image into tiles, and the tokens around each tile's in the prompt."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ImageTiles:
    """Idefics3's image splitting (``Idefics3ImageProcessor``): the image is resized so its
    longest edge is ``longest_edge``, then up to multiples of ``tile_size`` (the tower's image
    size), and cut into ``tile_size`` squares, row by row, followed by the whole image resized to
    one tile (the global image); without ``split`` the global image alone.

    In the prompt (``Idefics3Processor``) each tile's image tokens follow ``fake_token_id`` and
    its ``<row_R_col_C>`` token (``row_col_token_ids[R - 1][C - 1]``); ``newline_ids`` end each
    row but the last, ``last_row_end_ids`` (``"\\n\\n"``, one token in most vocabularies) the
    last; the global image's tokens sit between ``fake_token_id`` and ``global_token_id`` and a
    closing ``fake_token_id``."""

    longest_edge: int
    tile_size: int
    split: bool
    fake_token_id: int
    global_token_id: int
    row_col_token_ids: tuple[tuple[int, ...], ...]
    newline_ids: tuple[int, ...]
    last_row_end_ids: tuple[int, ...]
