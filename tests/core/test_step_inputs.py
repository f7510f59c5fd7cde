"""The runner's inputs: token slices across prompt, output and drafts."""

from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams


def test_token_ids_slice_matches_the_whole_sequence_sliced():
    request = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=8))
    request.output_token_ids += [5, 6, 7]
    request.spec_token_ids = [8, 9]
    whole = request.all_token_ids + request.spec_token_ids
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert request.token_ids_slice(start, end) == whole[start:end], (start, end)
