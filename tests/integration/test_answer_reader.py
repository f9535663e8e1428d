"""The satisfaction model's reader (the base model's features of an answer) keeps what it read:
a night that rereads its window, a canary look that rereads its day, costs no forward pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eval.satisfaction_model import AnswerReader

pytestmark = [pytest.mark.integration]

ASKED = [{"role": "user", "content": "Where is my parcel?"}]
REFUND = [{"role": "user", "content": "Can I get a refund?"}]


def test_features_read_once_are_the_same_from_the_cache(base_model_dir: Path) -> None:
    late = (ASKED, "Sorry for the wait: open Orders to see where it is.")
    vague = (ASKED, "Things happen.")
    refund = (REFUND, "Yes: open Orders, choose Return, and we refund you once it arrives.")
    reader = AnswerReader(base_model_dir, batch_size=2, cache_rows=2)

    first = reader.features([late, vague])
    assert first.shape[0] == 2
    assert reader.forward_rows == 2
    heard: list[int] = []
    again = reader.features([vague, late, late], on_batch=heard.append)
    assert reader.forward_rows == 2  # all three from the cache
    assert heard == [3]
    np.testing.assert_array_equal(again, first[[1, 0, 0]])

    # The same answer to another question is another row; the oldest row goes at the bound.
    third = reader.features([refund, (REFUND, late[1])])
    assert reader.forward_rows == 4
    assert not np.allclose(third[1], first[0])
    reader.features([late])
    assert reader.forward_rows == 5

    # What the cache gives is what a fresh read gives (up to the batch's float noise).
    fresh = AnswerReader(base_model_dir, cache_rows=0).features([late, vague, refund])
    np.testing.assert_allclose(fresh, np.vstack([first, third[:1]]), rtol=1e-4, atol=1e-5)
    assert reader.features([]).shape == (0, 0)
