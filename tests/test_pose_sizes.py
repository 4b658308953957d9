"""pose_position_ids refuses a batch size it cannot draw (issue 52, mutation round 4)."""

import pytest
import torch

from yarnlib.pose import pose_position_ids


@pytest.mark.parametrize("batch_size", [0, -2])
def test_a_batch_of_no_rows_is_refused_by_name(batch_size):
    with pytest.raises(ValueError, match=f"^batch_size must be >= 1, got {batch_size}$"):
        pose_position_ids(batch_size, 16, 64, 2, generator=torch.Generator())
