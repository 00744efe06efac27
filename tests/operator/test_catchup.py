"""A warm-up that does not get closer to caught up is named, and only such a one."""

from datetime import UTC, datetime, timedelta

from smoothscale.kafka.progress import ReportedRole, TaskProgress, TaskReport
from smoothscale.operator.catchup import CatchUpWatch, Heartbeats, Stalled

START = datetime(2026, 11, 24, tzinfo=UTC)
WINDOW = timedelta(seconds=60)
ACCEPTABLE = 1_000


def report(lag: int, role: ReportedRole = ReportedRole.WARMUP, task: int = 0) -> TaskProgress:
    return TaskProgress("counts-1", TaskReport(task, role, 1, 1, {"counts": 0}), lag)


def watch_lags(watch: CatchUpWatch, lags: list[int], every: int = 10) -> list[Stalled]:
    """Feed one warm-up's lag every `every` seconds; what the last poll named."""
    stalled: list[Stalled] = []
    for step, lag in enumerate(lags):
        now = START + timedelta(seconds=step * every)
        stalled = watch.observe({("counts-1", 0): report(lag)}, ACCEPTABLE, WINDOW, now)
    return stalled


def test_a_warmup_whose_lag_grows_over_a_whole_window_is_named() -> None:
    stalled = watch_lags(CatchUpWatch(), [5_000, 5_500, 6_000, 6_500, 7_000, 7_500, 8_000])
    assert stalled == [Stalled("counts-1", 0, 8_000, WINDOW)]


def test_a_warmup_that_gets_closer_even_slowly_is_not_named() -> None:
    assert watch_lags(CatchUpWatch(), [9_000, 9_500, 8_800, 9_400, 8_700, 9_300, 8_900]) == []


def test_nothing_is_judged_before_a_whole_window_has_passed() -> None:
    assert watch_lags(CatchUpWatch(), [5_000, 6_000, 7_000, 8_000, 9_000, 10_000]) == []


def test_a_warmup_within_the_acceptable_lag_is_caught_up_whatever_its_trend() -> None:
    assert watch_lags(CatchUpWatch(), [100, 200, 300, 400, 500, 600, 700, 800]) == []


def test_a_warmup_that_moved_on_starts_afresh_when_it_comes_back() -> None:
    watch = CatchUpWatch()
    watch_lags(watch, [5_000, 6_000, 7_000, 8_000, 9_000, 10_000, 11_000])
    later = START + timedelta(minutes=5)
    promoted = {("counts-1", 0): report(0, ReportedRole.ACTIVE)}
    assert watch.observe(promoted, ACCEPTABLE, WINDOW, later) == []
    again = {("counts-1", 0): report(20_000)}
    assert watch.observe(again, ACCEPTABLE, WINDOW, later + timedelta(seconds=1)) == []


def test_a_short_probing_interval_is_judged_over_at_least_thirty_seconds() -> None:
    watch = CatchUpWatch()
    for step, lag in enumerate([5_000, 6_000, 7_000]):
        now = START + timedelta(seconds=step * 10)
        named = watch.observe({("counts-1", 0): report(lag)}, ACCEPTABLE, timedelta(seconds=2), now)
        assert named == [], "20 s of rising lag is not yet a trend"


def beating(beat: int | None, instance: str = "counts-1", task: int = 0) -> TaskProgress:
    return TaskProgress(
        instance, TaskReport(task, ReportedRole.WARMUP, 1, 1, {"counts": 0}, beat=beat), 0
    )


SILENCE = timedelta(seconds=30)


def test_an_instance_whose_reports_stop_is_silent_once_a_whole_silence_has_passed() -> None:
    beats = Heartbeats()
    for second, beat in [(0, 1), (10, 2), (20, 3)]:
        now = START + timedelta(seconds=second)
        assert beats.silent(["counts-1"], {("counts-1", 0): beating(beat)}, SILENCE, now) == set()
    frozen = {("counts-1", 0): beating(3)}
    assert beats.silent(["counts-1"], frozen, SILENCE, START + timedelta(seconds=45)) == set()
    assert beats.silent(["counts-1"], frozen, SILENCE, START + timedelta(seconds=50)) == {
        "counts-1"
    }
    restarted = {("counts-1", 0): beating(1)}  # a restart in place counts again from 1
    assert beats.silent(["counts-1"], restarted, SILENCE, START + timedelta(seconds=51)) == set()


def test_an_instance_given_tasks_that_never_reports_is_silent_after_a_start_up_grace() -> None:
    beats = Heartbeats()
    assert beats.silent(["counts-1"], {}, SILENCE, START) == set()
    later = START + timedelta(seconds=31)
    assert beats.silent(["counts-1"], {}, SILENCE, later) == set(), "still starting, maybe"
    much_later = START + timedelta(minutes=2, seconds=1)
    assert beats.silent(["counts-1"], {}, SILENCE, much_later) == {"counts-1"}


def test_only_instances_that_hold_something_are_judged_and_older_reports_never() -> None:
    beats = Heartbeats()
    old_version = {("counts-2", 0): beating(None, "counts-2")}
    for second in (0, 60):
        now = START + timedelta(seconds=second)
        assert beats.silent(["counts-2"], old_version, SILENCE, now) == set()
        assert beats.silent([], {}, SILENCE, now) == set()
