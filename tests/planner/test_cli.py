"""`smoothscale plan STATE.json`: the dry run users read, and the errors they can cause."""

import json
from pathlib import Path

import pytest

from smoothscale.cli import main

EXAMPLES = Path(__file__).parents[2] / "examples" / "plan"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_scale_out_example_prints_the_first_two_warm_ups_as_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, str(EXAMPLES / "scale-out.json"))
    assert code == 0
    printed = json.loads(out)
    assert printed["converged"] is False
    assert [(m["kind"], m["task"], m["from"], m["to"]) for m in printed["moves"]] == [
        ("start-warmup", 3, None, "wordcount-2"),
        ("start-warmup", 9, None, "wordcount-3"),
    ]
    assert printed["assignment"]["wordcount-2"] == {"active": [], "standby": [], "warmup": [3]}
    assert printed["target"]["wordcount-3"] == [9, 10, 11]
    assert printed["unassigned"] == []


def test_the_strategy_in_the_state_file_plans_as_the_operator_would(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Cooperative moves nothing to a pod still starting and, once it is ready, hands its
    tasks over at once, without warm-ups (WarmUp starts warm-ups on it while it starts); a bad
    name says which names there are."""
    state = json.loads((EXAMPLES / "scale-out.json").read_text())
    state["config"]["strategy"] = "Cooperative"
    path = tmp_path / "cooperative.json"
    path.write_text(json.dumps(state))
    code, out, _ = run(capsys, str(path))
    assert code == 0
    assert json.loads(out)["moves"] == [], "nothing moves to a pod still starting"

    for instance in state["instances"]:
        instance["ready"] = True
    path.write_text(json.dumps(state))
    code, out, _ = run(capsys, str(path))
    assert code == 0
    moves = json.loads(out)["moves"]
    assert {m["kind"] for m in moves} == {"hand-over"}
    assert {m["to"] for m in moves} == {"wordcount-2", "wordcount-3"}

    state["config"]["strategy"] = "Eventually"
    path.write_text(json.dumps(state))
    code, _, err = run(capsys, str(path))
    assert code == 2
    assert "WarmUp" in err
    assert "Cooperative" in err


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_every_example_plans_and_prints_a_table(
    capsys: pytest.CaptureFixture[str], example: str
) -> None:
    code, out, err = run(capsys, str(EXAMPLES / example), "--format", "table")
    assert (code, err) == (0, "")
    assert "Next assignment:" in out
    assert "INSTANCE" in out
    assert "TARGET" in out


def test_the_table_shows_moves_with_reasons_and_tasks_as_ranges(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, out, _ = run(capsys, str(EXAMPLES / "scale-out-warming.json"), "--format", "table")
    assert "hand-over" in out
    assert "lag 812 <= 10000" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("wordcount-0"))
    assert row[:3] == ["wordcount-0", "kept", "0-2,4-5"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "state.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("{", "not valid JSON (line 1, column 2"),
        ('{"instances": []}', "taskCount: Field required"),
        (
            '{"taskCount": 2, "instances": [{"id": "a", "tasks": {"0": {"role": "warmup", '
            '"lag": -5}}}]}',
            "instances[0].tasks.0.lag: Input should be greater than or equal to 0",
        ),
        (
            '{"taskCount": 2, "instances": [{"id": "a", "tasks": {"7": {"role": "active"}}}]}',
            "holds task 7, but the app has tasks 0..1 (taskCount 2)",
        ),
        (
            '{"taskCount": 1, "instances": [{"id": "a", "tasks": {"0": {"role": "active"}}},'
            ' {"id": "b", "tasks": {"0": {"role": "active"}}}]}',
            "task 0 is active on both 'a' and 'b'",
        ),
        (
            '{"taskCount": 1, "instances": [{"id": "a", "tasks": {"0": {"role": "owner"}}}]}',
            "instances[0].tasks.0.role: Input should be 'active', 'standby' or 'warmup'",
        ),
        ('{"taskCount": 1, "instances": [{"id": "a", "forceRelease": true}]}', "not draining"),
        ('{"taskCount": 1, "config": {"maxWarmupReplicas": 0}}', "config.maxWarmupReplicas"),
        ('{"taskCount": 1, "replicas": 3}', "replicas: Extra inputs are not permitted"),
    ],
    ids=[
        "bad-json",
        "no-task-count",
        "negative-lag",
        "unknown-task",
        "two-actives",
        "unknown-role",
        "force-not-draining",
        "no-warm-ups",
        "unknown-field",
    ],
)
def test_bad_input_exits_2_saying_what_is_wrong(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, complaint: str
) -> None:
    code, out, err = run(capsys, write(tmp_path, content))
    assert (code, out) == (2, "")
    assert complaint in err
    assert err.startswith("smoothscale plan: ")


def test_a_missing_file_exits_2_and_points_at_an_example(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, str(tmp_path / "nowhere.json"))
    assert code == 2
    assert "no such file" in err
    assert "examples/plan/scale-out.json" in err
