"""The process side of the kubelet: containers as local processes, with no Kubernetes API.

Each container is one process in its own process group (so a signal reaches everything it
started), with its own working directory and a log file for its stdout and stderr. A supervisor
thread per container restarts it per the restart policy with a short, capped back-off; probe
threads run its startup, readiness and liveness probes, as a kubelet does: until the startup
probe passes, the other two wait (a failing startup probe restarts the container); once it
passes, readiness is probed at once. Stopping a pod sends SIGTERM to every
container's process group, waits up to the grace period, then sends SIGKILL.
"""

import contextlib
import enum
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devstack.containerlogs import container_log, pod_directory, start_run
from devstack.probes import Probe, ProbeVerdict, run_probe


class RestartPolicy(enum.Enum):
    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"

    def restarts(self, exit_code: int) -> bool:
        if self is RestartPolicy.ALWAYS:
            return True
        return self is RestartPolicy.ON_FAILURE and exit_code != 0


@dataclass(frozen=True)
class Backoff:
    """Delay before restart n (n = 1, 2, ...): initial * 2**(n-1), at most `cap`; the count
    starts over once a run has lasted `reset_after` seconds. Kubernetes uses 10 s, 300 s and
    10 min; the local kubelet keeps it short so a crash loop is visible within seconds."""

    initial_seconds: float = 0.5
    cap_seconds: float = 5.0
    reset_after_seconds: float = 10.0

    def delay(self, consecutive_restarts: int) -> float:
        exponent = max(consecutive_restarts - 1, 0)
        return float(min(self.initial_seconds * 2**exponent, self.cap_seconds))


@dataclass(frozen=True)
class ContainerSpec:
    """One container: `argv` runs with exactly `env` (see `process_environment`)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    readiness_probe: Probe | None = None
    liveness_probe: Probe | None = None
    startup_probe: Probe | None = None
    message_from_log: bool = False
    """terminationMessagePolicy FallbackToLogsOnError: a failed run's termination message is
    the tail of its log (the process kubelet has no termination-log file)."""


TERMINATION_MESSAGE_BYTES = 2048
"""Kubernetes keeps at most this much of a log as a termination message (and 80 lines)."""
TERMINATION_MESSAGE_LINES = 80


@dataclass(frozen=True)
class PodProcessSpec:
    """What to run for one pod. `key` names it in the runner and its directory."""

    key: str
    containers: tuple[ContainerSpec, ...]
    restart_policy: RestartPolicy = RestartPolicy.ALWAYS
    termination_grace_seconds: float = 30.0


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str
    started_at: datetime
    finished_at: datetime
    signal: int | None = None
    message: str | None = None


class ProbeKind(enum.Enum):
    STARTUP = "startup"
    READINESS = "readiness"
    LIVENESS = "liveness"


class ContainerPhase(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    TERMINATED = "terminated"


@dataclass(frozen=True)
class ContainerSnapshot:
    """A container's state at one moment, in the terms of a Kubernetes container status."""

    name: str
    phase: ContainerPhase
    waiting_reason: str | None = None
    started_at: datetime | None = None
    termination: Termination | None = None
    last_termination: Termination | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    """Running, and its startup probe (if any) has passed."""
    pid: int | None = None
    final: bool = False
    """Terminated and will not be restarted."""


def process_environment(
    container_env: Mapping[str, str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a container process gets: the kubelet's own (so Java, HOME and the like
    are found) but never its KUBECONFIG (a pod reaches the API with its own ServiceAccount's
    token or not at all), with the kubelet's Python environment first on PATH (so `smoothscale`
    and `python` resolve to it), overlaid with the container's env."""
    environment = dict(os.environ if base is None else base)
    environment.pop("KUBECONFIG", None)
    python_bin = os.path.dirname(sys.executable)
    path = environment.get("PATH", "")
    environment["PATH"] = f"{python_bin}{os.pathsep}{path}" if path else python_bin
    environment.update(container_env)
    return environment


def _now() -> datetime:
    return datetime.now(UTC)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _termination_of(exit_status: int, started_at: datetime, by_kubelet: bool) -> Termination:
    """Popen's return code -> a Kubernetes-style termination: a process killed by signal N
    exits with 128+N, as a shell or a container runtime reports it."""
    finished_at = _now()
    if exit_status < 0:
        signum = -exit_status
        reason = "Killed" if by_kubelet and signum == signal.SIGKILL else "Error"
        return Termination(128 + signum, reason, started_at, finished_at, signal=signum)
    reason = "Completed" if exit_status == 0 else "Error"
    return Termination(exit_status, reason, started_at, finished_at)


def _log_tail(path: Path) -> str:
    """The end of a container's log, as Kubernetes takes it for a termination message."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - TERMINATION_MESSAGE_BYTES))
            tail = log.read()
    except OSError:
        return ""
    lines = tail.decode("utf-8", "replace").splitlines()[-TERMINATION_MESSAGE_LINES:]
    return "\n".join(lines)


class _Container:
    """One container's life: spawn, wait, restart per policy, probe, stop."""

    def __init__(
        self,
        spec: ContainerSpec,
        pod: PodProcessSpec,
        directory: Path,
        log_path: Path,
        *,
        backoff: Backoff,
        on_change: Callable[[], None],
    ) -> None:
        self.spec = spec
        self._pod = pod
        self.working_directory = directory / spec.name
        self.log_path = log_path
        self._backoff = backoff
        self._on_change = on_change
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._run_number = 0
        self._killed_by_kubelet = False
        self._snapshot = ContainerSnapshot(
            spec.name, ContainerPhase.WAITING, waiting_reason="ContainerCreating"
        )
        self._threads = [threading.Thread(target=self._supervise, daemon=True)]
        probes = (
            (spec.startup_probe, ProbeKind.STARTUP),
            (spec.readiness_probe, ProbeKind.READINESS),
            (spec.liveness_probe, ProbeKind.LIVENESS),
        )
        for probe, kind in probes:
            if probe is not None:
                self._threads.append(
                    threading.Thread(target=self._probe_loop, args=(probe, kind), daemon=True)
                )

    def start(self) -> None:
        self.working_directory.mkdir(parents=True, exist_ok=True)
        for thread in self._threads:
            thread.start()

    def snapshot(self) -> ContainerSnapshot:
        with self._lock:
            return self._snapshot

    def _update(self, **changes: Any) -> None:
        with self._lock:
            self._snapshot = replace(self._snapshot, **changes)
        self._on_change()

    # The supervisor thread.

    def _supervise(self) -> None:
        consecutive_restarts = 0
        while True:
            started = self._spawn()
            if started is None:
                return
            process, started_at = started
            exit_status = process.wait()
            _signal_group(process.pid, signal.SIGKILL)  # whatever it left behind
            with self._lock:
                killed_by_kubelet = self._killed_by_kubelet
                self._killed_by_kubelet = False
            termination = _termination_of(exit_status, started_at, killed_by_kubelet)
            if self.spec.message_from_log and termination.exit_code != 0:
                termination = replace(termination, message=_log_tail(self.log_path))
            stopping = self._stopping.is_set()
            final = stopping or not self._pod.restart_policy.restarts(termination.exit_code)
            ran_for = (termination.finished_at - started_at).total_seconds()
            if ran_for >= self._backoff.reset_after_seconds:
                consecutive_restarts = 0
            self._update(
                phase=ContainerPhase.TERMINATED,
                termination=termination,
                ready=False,
                pid=None,
                final=final,
            )
            if final:
                return
            consecutive_restarts += 1
            if self._stopping.wait(self._backoff.delay(consecutive_restarts)):
                self._update(final=True)
                return

    def _spawn(self) -> tuple[subprocess.Popen[bytes], datetime] | None:
        """Start a run; None when stopping or when the command cannot start at all (then the
        container is terminated for good with reason StartError, whatever the policy)."""
        with self._lock:
            if self._stopping.is_set():
                return None
            previous = self._snapshot
            start_run(self.log_path)
            try:
                with self.log_path.open("ab") as log:
                    process = subprocess.Popen(
                        self.spec.argv,
                        cwd=self.working_directory,
                        env=dict(self.spec.env),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            except OSError as error:
                with self.log_path.open("a") as log_text:
                    log_text.write(f"cannot start {self.spec.argv[0]!r}: {error}\n")
                failed = _termination_of(127, _now(), by_kubelet=False)
                self._snapshot = replace(
                    previous,
                    phase=ContainerPhase.TERMINATED,
                    termination=replace(failed, reason="StartError"),
                    final=True,
                )
                started = None
            else:
                self._process = process
                started_at = _now()
                self._snapshot = ContainerSnapshot(
                    self.spec.name,
                    ContainerPhase.RUNNING,
                    started_at=started_at,
                    last_termination=previous.termination,
                    restart_count=previous.restart_count + (1 if self._run_number > 0 else 0),
                    ready=self.spec.readiness_probe is None and self.spec.startup_probe is None,
                    started=self.spec.startup_probe is None,
                    pid=process.pid,
                )
                self._run_number += 1
                started = (process, started_at)
        self._on_change()
        return started

    # Probes.

    def _probe_loop(self, probe: Probe, kind: "ProbeKind") -> None:
        """Probe the current run every period from its initial delay. Readiness and liveness
        wait for the run to have started (its startup probe passed), and readiness is probed at
        once when it has, as a kubelet does; startup stops probing once it passed."""
        liveness = kind is ProbeKind.LIVENESS
        run_seen = 0
        verdict = ProbeVerdict(probe, initially=liveness)
        next_at = first_at = 0.0
        was_started = False
        while not self._stopping.is_set():
            with self._lock:
                run_number = self._run_number
                running = self._snapshot.phase is ContainerPhase.RUNNING
                started = self._snapshot.started
            if run_number != run_seen and running:
                run_seen = run_number
                verdict = ProbeVerdict(probe, initially=liveness)
                next_at = first_at = time.monotonic() + probe.initial_delay_seconds
                was_started = False
            waiting = started if kind is ProbeKind.STARTUP else not started
            if not running or waiting:
                self._stopping.wait(0.05)
                continue
            if kind is ProbeKind.READINESS and not was_started:
                was_started = True
                if self.spec.startup_probe is not None:
                    next_at = max(first_at, time.monotonic())
            wait = next_at - time.monotonic()
            if wait > 0:
                self._stopping.wait(min(wait, 0.05))
                continue
            next_at = time.monotonic() + probe.period_seconds
            success = run_probe(probe, self.spec.env, self.working_directory)
            with self._lock:
                current_run = self._run_number == run_seen
            if not current_run or self._stopping.is_set():
                continue
            passing = verdict.record(success)
            if kind is ProbeKind.STARTUP:
                if passing:  # without a readiness probe, started is ready
                    self._update(started=True, ready=self.spec.readiness_probe is None)
                elif verdict.failed:
                    self._restart_for_liveness()
            elif liveness:
                if not passing:
                    self._restart_for_liveness()
            elif self.snapshot().ready != passing:
                self._update(ready=passing)

    def _restart_for_liveness(self) -> None:
        """The liveness probe failed, or the startup probe did: stop this run gracefully; the
        supervisor decides per the restart policy whether it starts again."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                return
        self.terminate()
        self.wait_or_kill(time.monotonic() + self._pod.termination_grace_seconds)

    # Stopping.

    def begin_stop(self) -> None:
        """No more restarts; SIGTERM the running process."""
        self._stopping.set()
        self.terminate()

    def terminate(self) -> None:
        """SIGTERM the container's main process only, as a container runtime does: its
        children (a worker's Spark JVM) are its to stop; whatever is left when it exits, or
        when the grace period ends, gets SIGKILL with the whole group."""
        with self._lock:
            process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the process until `deadline` (time.monotonic()), then SIGKILL its group."""
        with self._lock:
            process = self._process
        if process is None:
            return
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            with self._lock:
                self._killed_by_kubelet = True
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()

    def join(self) -> None:
        for thread in self._threads:
            thread.join()


class ProcessRunner:
    """Runs pods as groups of local processes under `root`, one directory per pod."""

    def __init__(
        self,
        root: Path,
        backoff: Backoff | None = None,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self.root = root
        self._backoff = backoff or Backoff()
        self._on_change = on_change or (lambda _key: None)
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[PodProcessSpec, list[_Container]]] = {}

    def pod_directory(self, key: str) -> Path:
        return pod_directory(self.root, key)

    def start(self, pod: PodProcessSpec) -> None:
        """Start the pod's containers; a pod already running under this key is left alone."""
        if not pod.containers:
            raise ValueError(f"pod {pod.key!r} has no containers to run")
        directory = self.pod_directory(pod.key)
        with self._lock:
            if pod.key in self._pods:
                return
            containers = [
                _Container(
                    spec,
                    pod,
                    directory,
                    self.log_path(pod.key, spec.name),
                    backoff=self._backoff,
                    on_change=lambda: self._on_change(pod.key),
                )
                for spec in pod.containers
            ]
            self._pods[pod.key] = (pod, containers)
        for container in containers:
            container.start()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._pods

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._pods)

    def snapshot(self, key: str) -> list[ContainerSnapshot]:
        """Every container's state, in the pod's order; KeyError if the pod is not here."""
        with self._lock:
            _, containers = self._pods[key]
        return [container.snapshot() for container in containers]

    def log_path(self, key: str, container_name: str) -> Path:
        return container_log(self.root, key, container_name)

    def stop(self, key: str, grace_seconds: float | None = None) -> None:
        """SIGTERM every container of the pod, SIGKILL what still runs after the grace period
        (the pod's own unless given), wait for the supervisors and forget the pod. Blocks."""
        with self._lock:
            entry = self._pods.get(key)
        if entry is None:
            return
        pod, containers = entry
        grace = pod.termination_grace_seconds if grace_seconds is None else grace_seconds
        deadline = time.monotonic() + grace
        for container in containers:
            container.begin_stop()
        for container in containers:
            container.wait_or_kill(deadline)
        for container in containers:
            container.join()
        with self._lock:
            self._pods.pop(key, None)

    def stop_all(self, max_grace_seconds: float | None = None) -> None:
        """Stop every pod at once, each within its own grace period, or `max_grace_seconds`
        if that is shorter."""
        threads = []
        for key in self.keys():
            with self._lock:
                entry = self._pods.get(key)
            if entry is None:
                continue
            grace = entry[0].termination_grace_seconds
            if max_grace_seconds is not None:
                grace = min(grace, max_grace_seconds)
            threads.append(threading.Thread(target=self.stop, args=(key, grace)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
