"""What the operator reads from an instance pod's status."""

from typing import Any

from smoothscale.operator.observe import PodView


def pod(container_status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "counts-1", "uid": "u1"},
        "status": {"containerStatuses": [{"name": "worker", **container_status}]},
    }


def test_a_pod_waiting_to_restart_after_a_crash_says_why_from_its_termination_message() -> None:
    crashed = PodView.of(
        pod(
            {
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": "Traceback (most recent call last):\n  ...\n"
                        "ModuleNotFoundError: No module named 'shop'\n\n",
                    }
                },
            }
        )
    )
    assert crashed.crash == (
        "its container worker exited with code 1: ModuleNotFoundError: No module named 'shop'"
    )
    assert crashed.restarts == 3


def test_a_running_pod_that_restarted_once_is_not_crashing() -> None:
    running = PodView.of(
        pod(
            {
                "restartCount": 1,
                "state": {"running": {"startedAt": "2026-11-24T00:00:00Z"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        )
    )
    assert running.crash is None
