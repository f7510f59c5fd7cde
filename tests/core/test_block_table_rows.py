"""The runner's block-table rows give, at every step, exactly the padded array a fresh build of the
step's tables gives, however the tables grow, get released out of a window, and come and go."""

import random

import numpy as np

from spyglass.core.engine.runner.block_table_rows import BlockTableRows


def _fresh(tables: list[list[int]]) -> np.ndarray:
    """The step's tables as rows padded with 0, built from nothing."""
    width = max(map(len, tables))
    array = np.zeros((len(tables), width), dtype=np.int32)
    for index, table in enumerate(tables):
        array[index, : len(table)] = table
    return array


def test_every_step_gathers_what_a_fresh_build_gives():
    rng = random.Random(0)
    rows = BlockTableRows()
    tables: dict[str, list[int]] = {}
    next_id = 0
    for _ in range(400):
        # Requests arrive (some with long tables: the array widens), finish, grow by a block (a new
        # list, as the KV manager makes one), or have leading blocks released (a new list too).
        for _ in range(rng.randint(0, 3)):
            tables[f"r{next_id}"] = [rng.randrange(1000) for _ in range(rng.choice((1, 3, 40)))]
            next_id += 1
        for req_id in list(tables):
            change = rng.random()
            if change < 0.1:
                del tables[req_id]
            elif change < 0.4:
                tables[req_id] = tables[req_id] + [rng.randrange(1000)]
            elif change < 0.5:
                released = rng.randint(0, len(tables[req_id]))
                tables[req_id] = [999] * released + tables[req_id][released:]
        if not tables:
            continue
        # A step carries some of the requests (one sitting out gives its row up), in any order.
        step = rng.sample(sorted(tables), rng.randint(1, len(tables)))
        gathered = rows.gather(step, tables)
        assert gathered.dtype == np.int32
        assert np.array_equal(gathered, _fresh([tables[r] for r in step]))
    assert rows.array.shape[0] >= 8 and rows.array.shape[1] >= 41


def test_a_row_given_up_is_zeroed_for_its_next_owner():
    rows = BlockTableRows()
    long, short = {"a": [5] * 30}, {"b": [7, 8]}
    rows.gather(["a"], long)
    # "a" is absent from this step: "b" takes its row, and reads no entry of "a"'s past its own end.
    assert np.array_equal(rows.gather(["b"], short), [[7, 8]])
    assert not rows.array[:, 2:].any()
