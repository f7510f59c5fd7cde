"""`GrowingText` against a plain string under random appends, cuts and reads."""

import random

import pytest

from spyglass.core.engine.growing_text import _FOLD, GrowingText


@pytest.mark.parametrize("seed", range(6))
def test_it_reads_as_the_string_it_was_built_into(seed):
    rng = random.Random(seed)
    text, reference = GrowingText(), ""
    for _ in range(600):
        action = rng.random()
        if action < 0.8:
            piece = "".join(rng.choice("ab€😀 ") for _ in range(rng.choice((0, 1, 1, 2, 5))))
            text.append(piece)
            reference += piece
        elif action < 0.9:
            length = rng.randrange(len(reference) + 3)
            text.cut(length)
            reference = reference[:length]
        start = rng.randrange(-2, len(reference) + 3)
        assert text.since(start) == reference[max(start, 0) :]
        assert len(text) == text.length == len(reference)
    assert str(text) == reference


def test_its_pieces_are_folded_as_it_grows():
    text = GrowingText()
    for index in range(10 * _FOLD):
        text.append(str(index % 10))
    # Ten folds of _FOLD pieces each, and nothing since: not a string object per append.
    assert len(text._pieces) == 10
    assert str(text) == "0123456789" * _FOLD
    assert text.since(len(text) - 3) == "789"


def test_a_cut_inside_a_fold_keeps_its_head_and_grows_again():
    text = GrowingText()
    for _ in range(3 * _FOLD):
        text.append("xy")
    text.cut(_FOLD + 1)
    text.append("z")
    assert str(text) == ("xy" * _FOLD)[: _FOLD + 1] + "z"
    assert text.since(_FOLD) == ("xy" * _FOLD)[_FOLD : _FOLD + 1] + "z"
