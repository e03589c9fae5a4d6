from collections import Counter

import pytest

from draftzoo.train.data_order import data_passes, step_rows


@pytest.mark.parametrize("world_size", [1, 2])
def test_data_passes_counts_how_often_the_steps_see_each_row(world_size):
    num_rows, steps, micro, accum = 10, 5, 3, 2
    seen = Counter(
        row
        for step in range(steps)
        for rank in range(world_size)
        for batch in step_rows(num_rows, 0, step, micro, accum, rank, world_size)
        for row in batch
    )
    passes = data_passes(num_rows, steps, micro, accum, world_size)
    assert passes == 3 * world_size
    assert set(seen.values()) == {passes}
    assert data_passes(num_rows, 1, micro, 1, 1) == pytest.approx(0.3)
