"""The kubelet's process side: containers as local processes, without any API server."""

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devstack.probes import ExecAction, HttpGetAction, Probe
from devstack.processes import (
    Backoff,
    ContainerPhase,
    ContainerSnapshot,
    ContainerSpec,
    PodProcessSpec,
    ProcessRunner,
    RestartPolicy,
    process_environment,
)
from devstack.stack import free_port

FAST_BACKOFF = Backoff(initial_seconds=0.05, cap_seconds=0.2, reset_after_seconds=10)


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def wait_until(condition: Callable[[], bool], timeout: float = 10, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ProcessRunner]:
    process_runner = ProcessRunner(tmp_path / "kubelet", backoff=FAST_BACKOFF)
    yield process_runner
    process_runner.stop_all(max_grace_seconds=1)


def one_container(
    runner: ProcessRunner,
    argv: tuple[str, ...],
    *,
    policy: RestartPolicy = RestartPolicy.ALWAYS,
    grace: float = 5,
    env: dict[str, str] | None = None,
    readiness: Probe | None = None,
    liveness: Probe | None = None,
    startup: Probe | None = None,
) -> Callable[[], ContainerSnapshot]:
    runner.start(
        PodProcessSpec(
            key="default_app-0",
            containers=(
                ContainerSpec(
                    "main",
                    argv,
                    process_environment(env or {}),
                    readiness_probe=readiness,
                    liveness_probe=liveness,
                    startup_probe=startup,
                ),
            ),
            restart_policy=policy,
            termination_grace_seconds=grace,
        )
    )
    return lambda: runner.snapshot("default_app-0")[0]


def test_a_container_runs_its_command_with_its_env_in_its_own_directory(
    runner: ProcessRunner,
) -> None:
    state = one_container(
        runner,
        python("import os; print(os.environ['POD_NAME'], os.getcwd())"),
        policy=RestartPolicy.NEVER,
        env={"POD_NAME": "app-0"},
    )
    wait_until(lambda: state().final, what="the container to finish")
    assert state().termination is not None
    assert state().termination.exit_code == 0  # type: ignore[union-attr]
    assert state().termination.reason == "Completed"  # type: ignore[union-attr]
    pod_name, cwd = runner.log_path("default_app-0", "main").read_text().split()
    assert pod_name == "app-0"
    assert Path(cwd) == runner.pod_directory("default_app-0") / "main"


def test_the_kubelets_python_comes_first_on_path() -> None:
    env = process_environment({"EXTRA": "1"}, base={"PATH": "/usr/bin", "HOME": "/home/x"})
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]
    assert env["HOME"] == "/home/x"
    assert env["EXTRA"] == "1"


def test_restart_policy_always_restarts_a_crashing_container_and_counts(
    runner: ProcessRunner,
) -> None:
    state = one_container(runner, python("raise SystemExit(3)"))
    wait_until(lambda: state().restart_count >= 3, what="three restarts")
    snapshot = state()
    assert not snapshot.final
    assert snapshot.last_termination is not None
    assert snapshot.last_termination.exit_code == 3
    assert snapshot.last_termination.reason == "Error"


def test_a_failed_run_leaves_the_end_of_its_log_as_its_message_when_asked(
    runner: ProcessRunner,
) -> None:
    """terminationMessagePolicy FallbackToLogsOnError, as a kubelet does it: at most 80 lines
    and 2 KiB of the end of the log, and only for a run that failed."""
    code = "print('\\n'.join(f'line {i}' for i in range(200))); raise SystemExit('it broke')"
    runner.start(
        PodProcessSpec(
            key="default_app-0",
            containers=(
                ContainerSpec("main", python(code), process_environment({}), message_from_log=True),
            ),
            restart_policy=RestartPolicy.NEVER,
        )
    )
    wait_until(lambda: runner.snapshot("default_app-0")[0].final, what="the failed run")
    termination = runner.snapshot("default_app-0")[0].termination
    assert termination is not None
    assert termination.message is not None
    lines = termination.message.splitlines()
    assert lines[-1] == "it broke"
    assert len(lines) == 80
    assert lines[0] == "line 121"


def test_restart_policy_never_leaves_a_failed_container_terminated(
    runner: ProcessRunner,
) -> None:
    state = one_container(runner, python("raise SystemExit(3)"), policy=RestartPolicy.NEVER)
    wait_until(lambda: state().final, what="the container to terminate")
    time.sleep(0.3)  # several back-off periods: nothing restarts it
    snapshot = state()
    assert snapshot.phase is ContainerPhase.TERMINATED
    assert snapshot.restart_count == 0
    assert snapshot.termination is not None
    assert snapshot.termination.exit_code == 3


def test_restart_policy_on_failure_restarts_until_the_container_succeeds(
    runner: ProcessRunner,
) -> None:
    # Fails on its first two runs, succeeds on the third (counting runs in a file in its cwd).
    code = (
        "import pathlib; p = pathlib.Path('runs'); n = int(p.read_text()) if p.exists() else 0; "
        "p.write_text(str(n + 1)); raise SystemExit(0 if n >= 2 else 1)"
    )
    state = one_container(runner, python(code), policy=RestartPolicy.ON_FAILURE)
    wait_until(lambda: state().final, what="the container to succeed")
    assert state().restart_count == 2
    assert state().termination.exit_code == 0  # type: ignore[union-attr]


def test_a_command_that_cannot_start_is_a_start_error(runner: ProcessRunner) -> None:
    state = one_container(runner, ("/no/such/program",))
    wait_until(lambda: state().final, what="the start error")
    assert state().termination.reason == "StartError"  # type: ignore[union-attr]
    assert "/no/such/program" in runner.log_path("default_app-0", "main").read_text()


def test_stop_sends_sigterm_and_a_process_that_traps_it_exits_at_once(
    runner: ProcessRunner, tmp_path: Path
) -> None:
    marker = tmp_path / "got-sigterm"
    code = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('bye'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    one_container(runner, python(code), grace=10)
    log = runner.log_path("default_app-0", "main")
    wait_until(lambda: log.exists() and "up" in log.read_text(), what="the handler")
    started = time.monotonic()
    runner.stop("default_app-0")
    assert time.monotonic() - started < 4  # well under the 10 s grace period
    assert marker.read_text() == "bye"
    assert "default_app-0" not in runner


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(
    runner: ProcessRunner,
) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    state = one_container(runner, python(code), grace=0.5)
    log = runner.log_path("default_app-0", "main")
    wait_until(lambda: log.exists() and "up" in log.read_text(), what="the process to start")
    pid = state().pid
    assert pid is not None
    started = time.monotonic()
    runner.stop("default_app-0")
    took = time.monotonic() - started
    assert 0.5 <= took < 4
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_stopping_reaches_the_whole_process_group(runner: ProcessRunner, tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time, pathlib\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"pathlib.Path({str(child_pid_file)!r}).write_text(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    one_container(runner, python(code), grace=1)
    wait_until(lambda: child_pid_file.exists() and child_pid_file.read_text() != "", what="child")
    child_pid = int(child_pid_file.read_text())
    runner.stop("default_app-0")

    def child_gone() -> bool:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return True
        # A zombie waiting for init to reap it counts as gone.
        return Path(f"/proc/{child_pid}/stat").read_text().split()[2] == "Z"

    wait_until(child_gone, timeout=3, what="the child to die")


def test_sigterm_goes_to_the_main_process_only_as_in_a_container(
    runner: ProcessRunner, tmp_path: Path
) -> None:
    child_marker = tmp_path / "child-got-sigterm"
    child = (
        "import signal, sys, time, pathlib\n"
        "def bye(*_):\n"
        f"    pathlib.Path({str(child_marker)!r}).write_text('sigterm'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "time.sleep(60)\n"
    )
    main = (
        "import signal, subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "def bye(*_):\n"
        "    time.sleep(0.3); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    one_container(runner, python(main), grace=5)
    log = runner.log_path("default_app-0", "main")
    wait_until(lambda: log.exists() and "up" in log.read_text(), what="the main process")
    time.sleep(0.3)  # the child has installed its handler
    runner.stop("default_app-0")
    assert not child_marker.exists(), "the child got SIGTERM; only the main process should"


def test_exec_readiness_probe_flips_ready_both_ways(runner: ProcessRunner) -> None:
    readiness = Probe(
        ExecAction(("test", "-f", "ready")),
        period_seconds=0.05,
        success_threshold=1,
        failure_threshold=2,
    )
    state = one_container(runner, python("import time; time.sleep(60)"), readiness=readiness)
    wait_until(lambda: state().phase is ContainerPhase.RUNNING, what="running")
    time.sleep(0.2)
    assert not state().ready
    ready_file = runner.pod_directory("default_app-0") / "main" / "ready"
    ready_file.write_text("")
    wait_until(lambda: state().ready, what="ready")
    ready_file.unlink()
    wait_until(lambda: not state().ready, what="not ready")


def test_http_readiness_probe_is_ready_once_the_server_answers(runner: ProcessRunner) -> None:
    port = free_port()
    readiness = Probe(HttpGetAction(port=port, path="/"), period_seconds=0.05)
    code = (
        "import time, http.server\n"
        "time.sleep(0.3)\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    state = one_container(runner, python(code), readiness=readiness)
    wait_until(lambda: state().phase is ContainerPhase.RUNNING, what="running")
    assert not state().ready
    wait_until(lambda: state().ready, what="the HTTP probe to pass")


def test_a_container_without_readiness_probe_is_ready_while_running(
    runner: ProcessRunner,
) -> None:
    state = one_container(runner, python("import time; time.sleep(60)"))
    wait_until(lambda: state().phase is ContainerPhase.RUNNING, what="running")
    assert state().ready


def test_a_failing_liveness_probe_restarts_the_container(runner: ProcessRunner) -> None:
    liveness = Probe(ExecAction(("false",)), period_seconds=0.05, failure_threshold=2)
    state = one_container(
        runner, python("import time; time.sleep(60)"), liveness=liveness, grace=0.5
    )
    wait_until(lambda: state().restart_count >= 1, what="a liveness restart")
    assert state().last_termination is not None
    assert state().last_termination.signal == signal.SIGTERM  # type: ignore[union-attr]


def test_readiness_and_liveness_wait_for_the_startup_probe_then_readiness_is_probed_at_once(
    runner: ProcessRunner,
) -> None:
    startup = Probe(
        ExecAction(("test", "-f", "started")), period_seconds=0.05, failure_threshold=1000
    )
    readiness = Probe(ExecAction(("true",)), period_seconds=60)
    liveness = Probe(ExecAction(("false",)), period_seconds=0.05, failure_threshold=1)
    state = one_container(
        runner,
        python("import time; time.sleep(60)"),
        startup=startup,
        readiness=readiness,
        liveness=liveness,
    )
    wait_until(lambda: state().phase is ContainerPhase.RUNNING, what="running")
    time.sleep(0.5)
    assert (state().started, state().ready, state().restart_count) == (False, False, 0)
    (runner.pod_directory("default_app-0") / "main" / "started").write_text("")
    # Readiness is probed as soon as the container has started, not a period (60 s) later
    # (20 s: a loaded machine can be slow to run the probes' processes; still far below 60).
    wait_until(lambda: state().started and state().ready, timeout=20, what="started, then ready")


def test_without_a_readiness_probe_a_container_is_ready_once_started(
    runner: ProcessRunner,
) -> None:
    startup = Probe(
        ExecAction(("test", "-f", "started")), period_seconds=0.05, failure_threshold=1000
    )
    state = one_container(runner, python("import time; time.sleep(60)"), startup=startup)
    wait_until(lambda: state().phase is ContainerPhase.RUNNING, what="running")
    time.sleep(0.2)
    assert not state().ready
    (runner.pod_directory("default_app-0") / "main" / "started").write_text("")
    wait_until(lambda: state().ready, what="ready once started")


def test_a_startup_probe_that_keeps_failing_restarts_the_container(runner: ProcessRunner) -> None:
    startup = Probe(ExecAction(("false",)), period_seconds=0.05, failure_threshold=3)
    state = one_container(runner, python("import time; time.sleep(60)"), startup=startup, grace=0.5)
    wait_until(lambda: state().restart_count >= 1, what="a restart for the startup probe")
    assert not state().started


def test_back_off_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial_seconds=0.5, cap_seconds=5)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1, 2, 4, 5, 5]
