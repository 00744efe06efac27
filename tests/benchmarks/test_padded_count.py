"""The padded running count: the running count's totals, with a state of the padding's size."""

import json

import pytest
from examples.pipelines import padded_count, running_count


@pytest.mark.parametrize("size", [0, 1, 64, 5_120])
def test_it_emits_the_running_counts_totals_with_states_padded_to_the_size(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setenv(padded_count.PADDING_VARIABLE, str(size))
    padded = padded_count.pipeline()
    plain = running_count.pipeline()
    assert padded.aggregate is running_count.count_per_user
    assert padded.store == plain.store
    state, plain_state = None, None
    for update in (3, 1, 7):
        state, outputs = padded.apply("user-7", state, update)
        plain_state, plain_outputs = plain.apply("user-7", plain_state, update)
        assert outputs == plain_outputs
        assert len(state["padding"]) == size
    assert state == {"count": 11, "padding": padded_count.padding("user-7", size)}
    assert len(json.dumps(state)) >= size


def test_the_padding_depends_on_the_user_alone() -> None:
    assert padded_count.padding("user-1", 300) == padded_count.padding("user-1", 300)
    assert padded_count.padding("user-1", 300) != padded_count.padding("user-2", 300)
