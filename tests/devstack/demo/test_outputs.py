"""The one output checker: every record, not only each user's last."""

from devstack.demo.outputs import check_outputs


def test_strictly_rising_totals_ending_at_the_reference_are_exact() -> None:
    check = check_outputs({"ann": 5, "bob": 2}, {"ann": [1, 3, 5], "bob": [2]})
    assert check.exact
    assert (check.users, check.records) == (2, 7)


def test_a_repeated_total_is_caught_although_the_last_one_is_right() -> None:
    check = check_outputs({"ann": 5}, {"ann": [1, 3, 3, 5]})
    assert not check.exact
    assert check.disordered == 1
    assert check.examples == ("ann: total 3 emitted after 3",)


def test_a_total_that_goes_back_is_caught() -> None:
    check = check_outputs({"ann": 5}, {"ann": [1, 4, 3, 5]})
    assert (check.exact, check.disordered) == (False, 1)


def test_lost_and_doubled_updates_and_unknown_users_are_counted() -> None:
    check = check_outputs({"ann": 5, "bob": 2, "cid": 1}, {"ann": [4], "bob": [3], "eve": [1]})
    assert (check.lost, check.doubled, check.unknown) == (1 + 1, 1, ("eve",))
    assert not check.exact
