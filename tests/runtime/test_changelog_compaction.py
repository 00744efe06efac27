"""Property tests: on a compacted changelog, every restore gives the state of the owner that
counts, for histories with hand-overs, failovers, restarts in place, racing activations,
unfenced zombies, half-written batches, deletes and verified tombstones."""

import itertools
import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from smoothscale.runtime.changelog import Fold, Positioned, closer, data, marker, resume
from smoothscale.runtime.store import TaskState
from smoothscale.runtime.writer import Writer
from tests.runtime.changelog_model import KEYS, STORE, ProtocolModel, View, replay
from tests.runtime.compaction import as_log, as_records, compact
from tests.runtime.folding import feed, fold, taken

nonces = st.integers(0, 2**63 - 1)
EXAMPLES = int(os.environ.get("CHANGELOG_EXAMPLES", "300"))


@st.composite
def histories(draw: st.DrawFn) -> ProtocolModel:
    model = ProtocolModel()
    model.take_over("first", draw(nonces), old_keeps_running=False)
    for _ in range(draw(st.integers(1, 30))):
        action = draw(st.sampled_from(["commit"] * 6 + ["handover", "failover", "restart", "race"]))
        if action != "commit":
            keeps_running = action in ("failover", "race") and draw(st.booleans())
            model.take_over(action, draw(nonces), keeps_running)
            continue
        alive = [writer for writer in model.writers if writer.alive]
        if not alive:
            model.take_over("failover", draw(nonces), old_keeps_running=False)
            continue
        author = draw(st.sampled_from(alive))
        updates = draw(
            st.dictionaries(st.sampled_from(KEYS), st.none() | st.integers(0, 9), max_size=3)
        )
        accident = draw(st.sampled_from(["none"] * 8 + ["half-written", "take-over"]))
        cut = draw(st.integers(0, len(updates) + 3))
        model.commit(
            author,
            list(updates.items()),
            reclaim=draw(st.integers(0, 3)),
            reclaim_order=draw(st.integers(0, 1000)),
            half_written_at=cut if accident == "half-written" else None,
            take_over_at=cut if accident == "take-over" else None,
            nonce=draw(nonces),
        )
    return model


def same(left: View, right: View) -> bool:
    return (left.visible(), left.input) == (right.visible(), right.input)


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories())
def test_a_restore_gives_the_state_of_the_highest_writer(model: ProtocolModel) -> None:
    owner = model.owner()
    assert owner is not None
    assert same(replay(model.log), owner.view)


@settings(max_examples=EXAMPLES, deadline=None)
@given(histories(), st.data())
def test_any_compaction_of_any_prefix_restores_the_same_state(
    model: ProtocolModel, choices: st.DataObject
) -> None:
    end = choices.draw(st.integers(0, len(model.log)), label="prefix")
    prefix = model.log[:end]
    cleaning_point = choices.draw(st.integers(0, model.next_offset), label="cleaning point")
    remove_tombstones = choices.draw(st.booleans(), label="tombstones removed")
    compacted = as_records(compact(as_log(prefix), cleaning_point, remove_tombstones))
    assert same(replay(compacted), replay(prefix))


@settings(max_examples=EXAMPLES // 3, deadline=None)
@given(histories(), st.data())
def test_an_incremental_restore_with_compaction_in_between_is_exact(
    model: ProtocolModel, choices: st.DataObject
) -> None:
    first = choices.draw(st.integers(0, len(model.log)), label="first run")
    cleaning_point = choices.draw(st.integers(0, model.next_offset), label="cleaning point")
    remove_tombstones = choices.draw(st.booleans(), label="tombstones removed")
    restarted = choices.draw(st.booleans(), label="restarted between runs")
    with tempfile.TemporaryDirectory() as directory:
        state = TaskState(Path(directory), 0, [STORE])
        try:
            head = model.log[:first]
            position = head[-1][0] + 1 if head else 0
            outcome = fold(STORE, head, Fold(), position)
            state.apply(outcome.changes)
            resume_at = state.position(STORE)
            if not restarted:
                resume_at = position
            # Tombstones the reader has not read yet are still there: it resumes within the
            # topic's delete.retention.ms.
            log = as_log(model.log)
            compacted = as_records(compact(log, cleaning_point, remove_tombstones, resume_at))
            rest: list[Positioned] = [(o, r) for o, r in compacted if o >= resume_at]
            cursor = resume(state, STORE) if restarted else outcome.cursor
            state.apply(fold(STORE, rest, cursor, model.next_offset).changes)
            expected = replay(model.log)
            assert state.snapshot(STORE) == expected.visible()
            assert state.input_positions() == expected.input
        finally:
            state.close()


def stored(state: TaskState) -> dict[str, object]:
    """Everything a restore writes to a task's store."""
    keys = [key.encode() for key in KEYS]
    return {
        "values": dict(state.items(STORE)),
        "record keys": state.record_keys(STORE, keys),
        "garbage": state.garbage(STORE, limit=10**6),
        "position": state.position(STORE),
        "verified": state.verified(STORE),
        "writer": state.writer(STORE),
        "closed": state.closed_batch(STORE),
        "input": state.input_positions(),
    }


@settings(max_examples=EXAMPLES // 3, deadline=None)
@given(histories(), st.data())
def test_changes_folded_in_chunks_and_written_later_store_what_each_chunk_would(
    model: ProtocolModel, choices: st.DataObject
) -> None:
    """The restore loop folds chunk after chunk into one set of changes and writes them when
    it has read all it was given or they grow large: the store must end as if each chunk's
    changes had been written at once (on a compacted log too: its tombstones reclaim records
    that changes not yet written supersede)."""
    cleaning_point = choices.draw(st.integers(0, model.next_offset), label="cleaning point")
    remove_tombstones = choices.draw(st.booleans(), label="tombstones removed")
    log = as_records(compact(as_log(model.log), cleaning_point, remove_tombstones))
    cuts = sorted(choices.draw(st.lists(st.integers(0, len(log)), max_size=6), label="cuts"))
    bounds = [0, *cuts, len(log)]
    chunks = [log[start:end] for start, end in itertools.pairwise(bounds)]
    writes = choices.draw(st.lists(st.booleans(), min_size=len(chunks), max_size=len(chunks)))
    with tempfile.TemporaryDirectory() as directory:
        each, late = TaskState(Path(directory), 0, [STORE]), TaskState(Path(directory), 1, [STORE])
        try:
            each_cursor, late_cursor = Fold(), Fold()
            position = 0
            for chunk, write in zip(chunks, writes, strict=True):
                position = chunk[-1][0] + 1 if chunk else position
                outcome = fold(STORE, chunk, each_cursor, position)
                each.apply(outcome.changes)
                each_cursor = outcome.cursor
                feed(late_cursor, chunk, position)
                if write:
                    late.apply(taken(late_cursor, STORE))
            late.apply(taken(late_cursor, STORE))
            assert stored(late) == stored(each)
            assert late.snapshot(STORE) == replay(log).visible()
        finally:
            each.close()
            late.close()


def test_the_old_format_with_fixed_keys_loses_state_under_compaction() -> None:
    """Fixed closer keys and state keys as record keys (the previous format): compaction removes
    the closers of older batches and a zombie's record overwrites a legitimate one."""
    old, new = Writer(1, 0, 0), Writer(2, 1, 0)

    def fixed(record: Positioned) -> Positioned:
        offset, changelog_record = record
        key = changelog_record.key
        key = key[: key.rindex(b"@") + 1] if key.startswith(b"d:") else key[:2]
        return offset, changelog_record._replace(key=key)

    log: list[Positioned] = list(
        enumerate(
            [
                marker(old, "pod-a"),
                data(old, 1, "alice", 1, None),
                closer(old, 1, {"clicks": 1}, None),
                marker(new, "pod-b"),
                data(new, 1, "bob", 1, None),
                closer(new, 1, {"clicks": 2}, None),
                data(old, 2, "alice", 99, None),
                closer(old, 2, {"clicks": 50}, None),
            ]
        )
    )
    for records, loses in ((log, False), ([fixed(r) for r in log], True)):
        full = replay(records)
        # The records that survive, by offset: the fixed keys name no writer, so the old
        # format's records cannot be read back from their keys.
        by_offset = dict(records)
        kept = compact(as_log(records), len(records), True)
        compacted = replay([(r.offset, by_offset[r.offset]) for r in kept])
        assert full.visible() == {"alice": 1, "bob": 1}
        assert (compacted.visible() != full.visible()) is loses
