"""The demo's pause meter: how long each partition went without progress while input waited."""

from smoothscale.demo.scenario import PauseMeter


def test_a_partition_with_input_waiting_and_no_progress_is_stalled_until_it_moves() -> None:
    meter = PauseMeter()
    meter.observe(0.0, committed={0: 10}, ends={0: 20})
    meter.observe(3.0, committed={0: 10}, ends={0: 25})
    meter.observe(4.0, committed={0: 18}, ends={0: 25})
    meter.observe(5.0, committed={0: 19}, ends={0: 25})
    assert meter.longest[0] == 3.0


def test_a_caught_up_partition_is_not_stalled() -> None:
    meter = PauseMeter()
    meter.observe(0.0, committed={0: 20}, ends={0: 20})
    meter.observe(9.0, committed={0: 20}, ends={0: 20})
    assert meter.longest[0] == 0.0


def test_after_a_reset_a_stall_counts_only_from_the_reset() -> None:
    meter = PauseMeter()
    meter.observe(0.0, committed={0: 10}, ends={0: 20})
    meter.observe(8.0, committed={0: 10}, ends={0: 20})
    meter.reset(8.0)
    meter.observe(10.0, committed={0: 10}, ends={0: 20})
    assert meter.longest[0] == 2.0
