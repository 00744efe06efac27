"""The whole local control plane: API server, scheduler, controllers, a process kubelet per
node and embedded Kafka, each in its own process (`smoothscale dev
apiserver|scheduler|controllers|kubelet|kafka`), as `smoothscale dev up` starts them.

Everything lives in a state directory: each part's log, `state.json` (pids and addresses, what
`dev down` reads), the kubeconfig, the API server's audit log (what ServiceAccounts asked for)
and the kubelets' pod directories (one directory for all nodes: a pod's is named by its uid).
LocalStack is a context manager for tests; `up` leaves the processes running and `down` stops
them, from any process.
"""

import contextlib
import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import yaml

from devstack.containerlogs import container_log
from devstack.kafka.control import TopicSpec
from devstack.podspec import pod_key
from smoothscale.api.crd import custom_resource_definition
from smoothscale.kubeapi import KubeApi, KubeApiError

T = TypeVar("T")

STATE_FILE = "state.json"
AUDIT_LOG = "audit.log"
KUBELET_ROOT = "kubelet"
KUBELET = "kubelet"
"""The first node's kubelet part; the others' are "kubelet-NODE"."""
STOP_ORDER = ("controllers", "scheduler", KUBELET, "kafka", "apiserver")
"""Every kind of part, in the order `down` stops them (every kubelet at once): the API server
last, so the others can still reach it."""


def node_names(first: str, nodes: int) -> list[str]:
    """The nodes' names, as kind names its workers: "local", "local-2", "local-3", ..."""
    return [first] + [f"{first}-{number}" for number in range(2, nodes + 1)]


def kubelet_part(node: str, first: str) -> str:
    """The name of the node's kubelet part (and of its log): "kubelet", "kubelet-local-2", ..."""
    return KUBELET if node == first else f"{KUBELET}-{node}"


class StackError(RuntimeError):
    """A part of the local control plane did not start; the message names its log."""


@dataclass(frozen=True)
class StackInfo:
    """Where the running control plane is."""

    state_dir: Path
    kubeconfig: Path
    api_url: str
    kafka_bootstrap: str
    kafka_control: str
    """URL of the embedded Kafka's controls (devstack.kafka.control.KafkaControl)."""
    nodes: tuple[str, ...] = ("local",)
    """The Nodes, each served by a process kubelet of its own (all on this machine)."""

    @property
    def audit_log(self) -> Path:
        """The API server's audit Events of ServiceAccounts' requests (see apiserver/auth.py)."""
        return self.state_dir / AUDIT_LOG

    @property
    def kubelet_root(self) -> Path:
        """The process kubelet's pod directories."""
        return self.state_dir / KUBELET_ROOT

    def container_log(self, pod: dict[str, Any], container: str) -> Path:
        """Where the kubelet writes a container's output (`kubectl logs` reads it too)."""
        return container_log(self.kubelet_root, pod_key(pod), container)

    def exports(self) -> str:
        return f"export KUBECONFIG={self.kubeconfig}\nexport KAFKA_BOOTSTRAP={self.kafka_bootstrap}"


def default_state_dir() -> Path:
    return Path(os.environ.get("SMOOTHSCALE_DEV_DIR", ".smoothscale/dev"))


def free_ports(span: int) -> int:
    """The first of `span` TCP ports in a row free now on every address, below Linux's
    ephemeral ports (32768-60999): a port the OS picks for a bind to port 0 is also one it
    gives outgoing connections as their source port, so a process that binds it seconds later
    (a worker starting, with hundreds of Kafka connections opened meanwhile) may find it taken.
    The process kubelet runs every pod on this machine's network: two stacks side by side (a
    demo and a test run) must not both use 8080 + n, hence a random base."""
    for _attempt in range(100):
        base = random.randrange(10_000, 32_000 - span)
        try:
            with contextlib.ExitStack() as bound:
                for port in range(base, base + span):
                    probe = bound.enter_context(socket.socket())
                    probe.bind(("", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"found no {span} free ports in a row between 10000 and 32000")


def free_port() -> int:
    """A TCP port free right now (see `free_ports`)."""
    return free_ports(1)


def _log_tail(path: Path, lines: int = 20) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _is_our_process(pid: int) -> bool:
    """True when `pid` still runs a `smoothscale dev` part (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"smoothscale.cli" in cmdline and b"dev" in cmdline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not alive.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def read_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / STATE_FILE
    if not path.exists():
        return {}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    temporary = state_dir / f"{STATE_FILE}.tmp"
    temporary.write_text(json.dumps(state, indent=2, default=str))
    temporary.replace(state_dir / STATE_FILE)


def _parts(state: dict[str, Any]) -> list[str]:
    """The parts recorded in a state, in the order `down` stops them."""
    recorded = [part for part, entry in state.items() if isinstance(entry, dict) and "pid" in entry]
    return sorted(recorded, key=lambda part: STOP_ORDER.index(part.partition("-")[0]))


def down(state_dir: Path, timeout: float = 15.0) -> list[str]:
    """Stop every part recorded in `state_dir` (SIGTERM, then SIGKILL after `timeout`; the
    kubelets together); returns the parts that were running. Calling it when nothing runs does
    nothing."""
    state = read_state(state_dir)
    stopped: list[str] = []
    for group in STOP_ORDER:
        parts = [part for part in _parts(state) if part.partition("-")[0] == group]
        pids = {part: int(state[part]["pid"]) for part in parts}
        pids = {part: pid for part, pid in pids.items() if _is_our_process(pid)}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids.values():
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        stopped += pids
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped


class LocalStack:
    """Starts the parts as processes and stops them again (a context manager).

    It installs smoothscale's own CRD, generated from the models (so always current), or the
    CRDs in the YAML files of `crd_dir` instead. `nodes` Nodes ("local", "local-2", ...) each
    get a process kubelet; the scheduler places the pods on them. When it stops, each pod gets
    its own grace period but no more than `shutdown_grace_period` seconds (0: killed at once,
    for a throwaway stack whose pods have nothing left to say).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        crd_dir: Path | None = None,
        topics: Sequence[TopicSpec] = (),
        brokers: int = 3,
        api_port: int = 0,
        kafka_port: int = 0,
        node_name: str = "local",
        nodes: int = 1,
        shutdown_grace_period: float = 10.0,
        startup_timeout: float = 60.0,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.crd_dir = None if crd_dir is None else crd_dir.resolve()
        self.topics = list(topics)
        self.brokers = brokers
        self.api_port = api_port
        self.kafka_port = kafka_port
        self.node_name = node_name
        self.nodes = node_names(node_name, nodes)
        self.shutdown_grace_period = shutdown_grace_period
        self.startup_timeout = startup_timeout
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self.info: StackInfo | None = None

    def _spawn(
        self, part: str, arguments: Sequence[str], command: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `smoothscale dev COMMAND` (COMMAND: the part's name unless given) as `part`."""
        log = self.state_dir / f"{part}.log"
        with log.open("ab") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "smoothscale.cli", "dev", command or part, *arguments],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a Ctrl-C in the shell does not reach it
                cwd=self.state_dir,
            )
        self._processes[part] = process
        state = read_state(self.state_dir)
        state[part] = {"pid": process.pid, "log": str(log)}
        _write_state(self.state_dir, state)
        return process

    def _wait(self, part: str, ready: Callable[[], T | None], what: str) -> T:
        """Poll `ready()` until it returns something other than None."""
        process = self._processes[part]
        deadline = time.monotonic() + self.startup_timeout
        while True:
            result = ready()
            if result is not None:
                return result
            if process.poll() is not None:
                raise StackError(
                    f"smoothscale dev {part} exited with {process.returncode} before {what}; "
                    f"its log ({self.state_dir / (part + '.log')}) ends with:\n"
                    f"{_log_tail(self.state_dir / (part + '.log'))}"
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"smoothscale dev {part}: no {what} within {self.startup_timeout:.0f} s; see "
                    f"{self.state_dir / (part + '.log')}"
                )
            time.sleep(0.1)

    def start(self) -> StackInfo:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = read_state(self.state_dir)
        if any(_is_our_process(int(state[part]["pid"])) for part in _parts(state)):
            raise StackError(
                f"a local control plane already runs from {self.state_dir}: stop it with "
                f"`smoothscale dev down --state-dir {self.state_dir}` or use another --state-dir"
            )
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> StackInfo:
        from devstack.apiserver import write_kubeconfig

        port = self.api_port or free_port()
        api_url = f"http://127.0.0.1:{port}"
        self._spawn(
            "apiserver",
            [
                "--port",
                str(port),
                "--audit-log",
                str(self.state_dir / AUDIT_LOG),
                "--kubelet-root",
                str(self.state_dir / KUBELET_ROOT),
            ],
        )
        kafka_ready = self.state_dir / "kafka.json"
        kafka_ready.unlink(missing_ok=True)
        kafka_arguments = ["--brokers", str(self.brokers), "--ready-file", str(kafka_ready)]
        kafka_arguments += ["--port", str(self.kafka_port)]
        for topic in self.topics:
            kafka_arguments += ["--topic", f"{topic.name}:{topic.partitions}"]
        self._spawn("kafka", kafka_arguments)

        self._wait("apiserver", lambda: _answers(f"{api_url}/version"), "an answer on /version")
        kubeconfig = self.state_dir / "kubeconfig"
        write_kubeconfig(kubeconfig, api_url)
        api = KubeApi.from_kubeconfig(kubeconfig)
        try:
            if self.crd_dir is None:
                install_crds(api, [("smoothscale", custom_resource_definition())])
            else:
                install_crds(api, crd_documents(self.crd_dir))
            for node in self.nodes:
                self._spawn(
                    kubelet_part(node, self.node_name),
                    [
                        "--kubeconfig",
                        str(kubeconfig),
                        "--node-name",
                        node,
                        "--root",
                        str(self.state_dir / KUBELET_ROOT),
                        "--no-bind",
                        "--shutdown-grace-period",
                        str(self.shutdown_grace_period),
                    ],
                    command=KUBELET,
                )
            self._spawn("scheduler", ["--kubeconfig", str(kubeconfig)])
            self._spawn("controllers", ["--kubeconfig", str(kubeconfig)])
            for node in self.nodes:
                self._wait(
                    kubelet_part(node, self.node_name),
                    functools.partial(_node_ready, api, node),
                    f"Ready node {node}",
                )
        finally:
            api.close()
        kafka = self._wait("kafka", lambda: _kafka_ready(kafka_ready), "bootstrap servers")
        bootstrap, control = str(kafka["bootstrap_servers"]), str(kafka["control_url"])
        self.info = StackInfo(
            self.state_dir, kubeconfig, api_url, bootstrap, control, tuple(self.nodes)
        )
        state = read_state(self.state_dir)
        state["apiserver"]["url"] = api_url
        state["kafka"]["bootstrap_servers"] = bootstrap
        state["kafka"]["control_url"] = control
        state["kubeconfig"] = str(kubeconfig)
        state["nodes"] = self.nodes
        _write_state(self.state_dir, state)
        return self.info

    def stop(self) -> None:
        """Stop every part (idempotent)."""
        down(self.state_dir)
        for process in self._processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        self._processes.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _kafka_ready(ready_file: Path) -> dict[str, Any] | None:
    if not ready_file.exists():
        return None
    ready: dict[str, Any] = json.loads(ready_file.read_text())
    return ready


def _answers(url: str) -> bool | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return True if response.status == 200 else None
    except OSError:
        return None


def _node_ready(api: KubeApi, node_name: str) -> bool | None:
    try:
        node = api.request("GET", f"/api/v1/nodes/{node_name}")
    except KubeApiError:
        return None
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return True if ready else None


def crd_documents(crd_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every CustomResourceDefinition in the YAML files of `crd_dir`, with the file it is in."""
    files = sorted(crd_dir.glob("*.yaml")) + sorted(crd_dir.glob("*.yml"))
    if not files:
        raise StackError(f"no CRD YAML files in {crd_dir}: run `smoothscale crd` to write them")
    return [
        (str(file), document)
        for file in files
        for document in yaml.safe_load_all(file.read_text())
        if document and document.get("kind") == "CustomResourceDefinition"
    ]


def install_crds(api: KubeApi, documents: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Create (or replace) each CustomResourceDefinition (given with where it comes from), and
    wait until each is Established; returns their names."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names = []
    for source, document in documents:
        name = document["metadata"]["name"]
        try:
            api.request("POST", path, body=document)
        except KubeApiError as error:
            if error.status != 409:
                raise StackError(f"cannot install CRD {name} from {source}: {error}") from error
            current = api.request("GET", f"{path}/{name}")
            version = current["metadata"]["resourceVersion"]
            replacement = {
                **document,
                "metadata": {**document["metadata"], "resourceVersion": version},
            }
            api.request("PUT", f"{path}/{name}", body=replacement)
        names.append(name)
    deadline = time.monotonic() + 10
    for name in names:
        while not _established(api.request("GET", f"{path}/{name}")):
            if time.monotonic() > deadline:
                raise StackError(f"CRD {name} was installed but never became Established")
            time.sleep(0.05)
    return names


def _established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def up(state_dir: Path, **options: Any) -> StackInfo:
    """Start the control plane and leave it running (stop it with `down`)."""
    return LocalStack(state_dir, **options).start()


def info_of(state_dir: Path) -> StackInfo | None:
    """The running control plane recorded in `state_dir`, if it still runs."""
    state = read_state(state_dir)
    parts = _parts(state)
    if not set(STOP_ORDER) <= set(parts) or "kubeconfig" not in state:
        return None
    if not all(_is_our_process(int(state[part]["pid"])) for part in parts):
        return None
    return StackInfo(
        state_dir,
        Path(state["kubeconfig"]),
        state["apiserver"]["url"],
        state["kafka"]["bootstrap_servers"],
        state["kafka"]["control_url"],
        tuple(state.get("nodes") or ()),
    )
