"""The scaling demo: `kubectl scale` on a stateful PySpark app, through the operator.

It runs the whole product on the local control plane (`smoothscale dev up`: an in-memory API
server, a kubelet that runs pods as local processes, and the embedded Kafka behind its
protocol front): the operator, installed as users install it (`helm install
charts/smoothscale` with the real helm; its pod runs with the chart's ServiceAccount and RBAC),
a StreamingApp applied with the real kubectl, its instance pods (each a real `smoothscale
worker`: a Spark driver running the running-count example pipeline), and input produced at a
steady rate.

The story it prints, from the StreamingApp's status and Events:
1. `kubectl apply`: the operator creates the app's topics and its pod; the pod processes a
   backlog, then steady input.
2. `kubectl scale --replicas 2`: the new pod warms up the tasks it will own while the first
   keeps processing them; each task moves once its warm-up is caught up, in a hand-over that
   stops it for about one micro-batch.
3. `kubectl scale --replicas 1`: the leaving pod's tasks warm up on the one that stays, move
   back, and only then is the leaving pod deleted.
4. The input stops; the final counts are checked against a reference computed from the input.
"""

import io
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic

from devstack.apiserver.faults import PATH as API_FAULTS_PATH
from devstack.demo.outputs import OutputCheck, check_outputs
from devstack.demo.timeline import (
    TaskTimeline,
    read_committed,
    read_timelines,
    write_timelines,
)
from devstack.kafka.control import KafkaControl
from devstack.protocolworker import path_variable
from devstack.stack import LocalStack, StackInfo, free_ports
from smoothscale.kafka import names
from smoothscale.kafka.progress import InputPositionCommitter

NAMESPACE = "demo"
NAMESPACE_MANIFEST = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
APP_NAME = "counts"
APP_ID = names.default_application_id(NAMESPACE, APP_NAME)
INPUT_TOPIC = "demo-clicks"
OUTPUT_TOPIC = "demo-click-counts"
STORE = "counts"
CHANGELOG_TOPIC = names.changelog_topic(APP_ID, STORE)
PIPELINE = "examples.pipelines.running_count:pipeline"
QUIET = {"log.connection.close": "false"}
"""The embedded broker goes away with the demo: its clients need not log that it did."""


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    tasks: int = 6
    keys: int = 6_000
    backlog: int = 60_000
    """Records produced before the first instance starts: the state to restore later."""
    rate: int = 400
    """Records per second produced during the demo. With `keys` and `tasks` it sets how fast
    each changelog partition grows (about min(rate, keys) / tasks records a second): the
    embedded broker keeps only the last 5 MB of a partition (about 30,000 changelog records),
    so the defaults keep every changelog under that for the whole demo."""
    steady_keys: int | None = None
    """Users the steady input cycles over after the backlog (None: all `keys`): the backlog
    builds the state, and few steady users keep the changelog from growing fast when each
    state is large (one changelog record per user changed per batch)."""
    trigger_interval: float = 1.0
    poll_interval: float = 1.0
    """The operator's lag poll interval (spec.scaling.lagPollInterval), and how often the demo
    prints and measures."""
    strategy: str = "WarmUp"
    """spec.scaling.strategy: WarmUp (smoothscale), or a baseline: Cooperative, Restart."""
    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    drain_timeout: float = 300.0
    """spec.scaling.drainTimeout in seconds."""
    hold: float = 15.0
    """Seconds each replica count runs in steady state before the next change."""
    phase_timeout: float = 600.0
    examples_root: Path = field(default_factory=Path.cwd)
    """The directory that holds examples/ (the pipeline's package)."""
    spark: bool = True
    """Whether the pods run `smoothscale worker` (a Spark driver each), or the protocol worker
    (devstack.protocolworker: the same worker with its micro-batches computed without Spark),
    for scenarios whose subject is the hand-over protocol, not the runtime."""
    nodes: int = 1
    """Nodes of the local control plane ("local", "local-2", ...), each with its kubelet."""
    pipeline: str = PIPELINE
    """spec.pipeline.ref: a running count (the reference the outputs are checked against)."""
    stall_timeout: float = 120.0
    """spec.pipeline.stallTimeout in seconds."""
    env: tuple[dict[str, Any], ...] = ()
    """More spec.env of the app (Kubernetes EnvVars: a value, or valueFrom)."""
    termination_grace_seconds: int | None = None
    """spec.terminationGracePeriodSeconds (None: Kubernetes' default, 30 s)."""


class DemoError(RuntimeError):
    """The demo could not go on; the message says why and where to look."""


class InputFeed:
    """Steady input: `rate` records per second, cycling over `keys` users (the backlog) or the
    first `steady_keys` of them (from `start` on), user i to input partition i mod
    `partitions`. Each user's records stay in one partition, as a keyed producer's do; after
    `grow`, the users added go to the partitions added, the others stay where they were (a key
    moved to another partition would move its state to another task), and every user cycles."""

    def __init__(
        self,
        bootstrap_servers: str,
        keys: int,
        rate: int,
        partitions: int,
        steady_keys: int | None = None,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._producer = self._new_producer()
        self._keys = keys
        self._steady_keys = keys if steady_keys is None else steady_keys
        self._spreads = [_Spread(0, keys, 0, partitions)]
        self._grown: list[_Spread] = []
        self._rate = rate
        self._sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="input-feed", daemon=True)

    def _new_producer(self) -> Producer:
        return Producer({"bootstrap.servers": self._bootstrap_servers, "linger.ms": 20, **QUIET})

    def backlog(self, records: int) -> None:
        for _ in range(records):
            self._send()
        self._producer.flush(60)

    def start(self) -> None:
        with self._lock:
            self._keys = self._steady_keys
        self._thread.start()

    def grow(self, partitions: int, keys: int) -> None:
        """The input topic has `partitions` now: `keys` new users go to the partitions added
        (from the next record on)."""
        with self._lock:
            last = (self._grown or self._spreads)[-1]
            first_partition = last.first_partition + last.partitions
            first_user = last.first_user + last.users
            self._grown.append(
                _Spread(first_user, keys, first_partition, partitions - first_partition)
            )

    def stop(self) -> int:
        """Stop producing; how many records were sent in all."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._producer.flush(60)
        return self._sent

    def _send(self) -> None:
        with self._lock:
            if self._grown:
                # A producer that knows the topic keeps its partition count for minutes
                # (topic.metadata.refresh.interval.ms): a new one sees the partitions added.
                self._producer.flush(60)
                self._producer = self._new_producer()
                self._spreads += self._grown
                self._keys = sum(spread.users for spread in self._spreads)
                self._grown = []
        index = self._sent % self._keys
        spread = next(s for s in self._spreads if index < s.first_user + s.users)
        user = f"user-{index}"
        partition = spread.first_partition + (index - spread.first_user) % spread.partitions
        while True:
            try:
                self._producer.produce(
                    INPUT_TOPIC, key=user, value=json.dumps({"user": user}), partition=partition
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._sent += 1

    def _run(self) -> None:
        tick = 0.05
        per_tick = max(1, round(self._rate * tick))
        while not self._stop.wait(tick):
            for _ in range(per_tick):
                self._send()
            self._producer.poll(0)


@dataclass(frozen=True)
class _Spread:
    """Users [first_user, first_user + users) go round-robin to the partitions
    [first_partition, first_partition + partitions)."""

    first_user: int
    users: int
    first_partition: int
    partitions: int


def read_inputs_and_outputs(
    bootstrap_servers: str,
    tasks: int,
    input_topic: str = INPUT_TOPIC,
    output_topic: str = OUTPUT_TOPIC,
    output_partitions: int | None = None,
) -> tuple[dict[str, int], dict[str, list[int]]]:
    """(reference counts from the running count's input, every total it emitted per user, in
    order), both read to the end. The output topic has `output_partitions` (default: as many
    as the input, `tasks`)."""
    reference: dict[str, int] = {}
    for _key, value in _read_all(bootstrap_servers, input_topic, tasks):
        user = json.loads(value)["user"]
        reference[user] = reference.get(user, 0) + 1
    emitted: dict[str, list[int]] = {}
    outputs = tasks if output_partitions is None else output_partitions
    for key, value in _read_all(bootstrap_servers, output_topic, outputs):
        emitted.setdefault(key.decode(), []).append(json.loads(value))
    return reference, emitted


def _read_all(bootstrap_servers: str, topic: str, partitions: int) -> Iterable[tuple[bytes, bytes]]:
    """Every committed record of `topic` as (key, value), each partition in offset order."""
    for message in read_committed(bootstrap_servers, topic, partitions, QUIET):
        key, value = message.key(), message.value()
        if key is not None and value is not None:
            yield key, value


class Kubectl:
    """The real kubectl on the local control plane; every command is printed as it runs."""

    def __init__(self, binary: str, kubeconfig: Path, say: Callable[[str], None]) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.say = say

    def __call__(self, *arguments: str, stdin: str | None = None, quiet: bool = False) -> str:
        if not quiet:
            self.say("$ kubectl " + " ".join(arguments))
        done = subprocess.run(
            [self.binary, *arguments],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if done.returncode != 0:
            raise DemoError(f"kubectl {' '.join(arguments)} failed: {done.stderr.strip()}")
        return done.stdout


def tool_binary(root: Path, name: str) -> str:
    """kubectl or helm: from PATH, else the checkout's .tools/bin."""
    found = shutil.which(name) or str(root / ".tools" / "bin" / name)
    if not Path(found).exists():
        raise DemoError(f"{name} is missing: run scripts/install-tools (make demo does)")
    return found


def streaming_app(options: DemoOptions, bootstrap_servers: str) -> dict[str, Any]:
    """The demo's StreamingApp, as a user would write it."""
    seconds = f"{round(options.poll_interval * 1000)}ms"
    env = [{"name": "PYTHONPATH", "value": str(options.examples_root.resolve())}]
    if not options.spark:
        env.append(path_variable(options.workdir))
    env += options.env
    app: dict[str, Any] = {
        "apiVersion": "smoothscale.io/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": APP_NAME, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "image": "ghcr.io/smoothscale/smoothscale:0.1.0",
            "env": env,
            "pipeline": {
                "ref": options.pipeline,
                "triggerInterval": f"{round(options.trigger_interval * 1000)}ms",
                "stallTimeout": f"{round(options.stall_timeout * 1000)}ms",
            },
            "kafka": {
                "bootstrapServers": bootstrap_servers,
                "inputTopics": [INPUT_TOPIC],
                "outputTopic": OUTPUT_TOPIC,
                "stateStores": [{"name": STORE}],
            },
            "scaling": {
                "strategy": options.strategy,
                "acceptableRecoveryLag": options.acceptable_recovery_lag,
                "maxWarmupReplicas": options.max_warmup_replicas,
                "lagPollInterval": seconds,
                "probingInterval": "10s",
                "drainTimeout": f"{round(options.drain_timeout * 1000)}ms",
            },
        },
    }
    if options.termination_grace_seconds is not None:
        app["spec"]["terminationGracePeriodSeconds"] = options.termination_grace_seconds
    return app


OPERATOR_NAMESPACE = "smoothscale-system"
"""Where the demo installs the operator's Helm release."""
PEERING = "smoothscale"
"""The KopfPeering object (in NAMESPACE) that peered releases share."""


class Helm:
    """The real helm on the local control plane, with a home of its own; every command is
    printed as it runs."""

    def __init__(self, binary: str, kubeconfig: Path, home: Path, say: Callable[[str], None]):
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.home = home
        self.say = say

    def __call__(self, *arguments: str) -> str:
        self.say("$ helm " + " ".join(arguments))
        environment = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        done = subprocess.run(
            [self.binary, *arguments], capture_output=True, text=True, env=environment, check=False
        )
        if done.returncode != 0:
            raise DemoError(f"helm {' '.join(arguments)} failed: {done.stderr.strip()}")
        return done.stdout


class Operator:
    """The operator as users install it: charts/smoothscale installed with the real helm as
    release `name` in OPERATOR_NAMESPACE, serving NAMESPACE with the chart's RBAC. The cluster
    runs its pod (the process kubelet: `smoothscale operator` with its ServiceAccount's token)."""

    def __init__(
        self,
        helm: Helm,
        kubectl: Kubectl,
        cluster: StackInfo,
        chart: Path,
        *,
        name: str = "smoothscale",
        priority: int | None = None,
    ) -> None:
        """`priority`: None for a standalone operator, else the kopf priority of one of
        several releases peered through PEERING (which the caller creates)."""
        self.helm, self.kubectl, self.cluster, self.name = helm, kubectl, cluster, name
        # Pods here share this machine's network: the operator's ports and its instances'
        # must be free (instance n listens on instancePort + n).
        base = free_ports(span=34)
        values = {
            "watch.namespaces": f"{{{NAMESPACE}}}",
            "ports.healthz": str(base),
            "ports.metrics": str(base + 1),
            "instancePort": str(base + 2),
            "peering.enabled": str(priority is not None).lower(),
            "peering.name": PEERING,
        }
        if priority is not None:
            values["peering.priority"] = str(priority)
        settings = [argument for item in values.items() for argument in ("--set", "=".join(item))]
        helm(
            "install", name, str(chart), "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
            *settings, "--wait", "--timeout", "300s",
        )  # fmt: skip
        self._selector = f"app.kubernetes.io/instance={name}"
        self._checked = time.monotonic()
        self._kills = 0

    def pod(self) -> dict[str, Any]:
        """The release's operator pod."""
        listed = self.kubectl(
            "get", "pods", "-n", OPERATOR_NAMESPACE, "-l", self._selector, "-o", "json", quiet=True
        )
        listing = json.loads(listed)
        pods = [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]
        if len(pods) != 1:
            names = [p["metadata"]["name"] for p in pods]
            raise DemoError(f"expected one pod of the operator release {self.name}: {names}")
        found: dict[str, Any] = pods[0]
        return found

    @property
    def log_path(self) -> Path:
        try:
            return self.cluster.container_log(self.pod(), "operator")
        except DemoError:
            return self.cluster.kubelet_root

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def check(self) -> None:
        """Fail if the operator's pod crash-loops (looked at every 15 s)."""
        if time.monotonic() - self._checked < CHECK_SECONDS:
            return
        self._checked = time.monotonic()
        pod = self.pod()
        for container in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            # A container killed on purpose waits out its back-off too: only more restarts
            # than kills are a crash loop.
            crashed = int(container.get("restartCount", 0)) > self._kills
            if waiting.get("reason") == "CrashLoopBackOff" and crashed:
                raise DemoError(
                    "the operator's pod is crash-looping; its log is "
                    f"{self.cluster.container_log(pod, 'operator')}"
                )

    def kill(self) -> None:
        """SIGKILL its container (no chance to clean up), as the OOM killer would: the kubelet
        starts it again in place."""
        signal_pod(self.pod(), signal.SIGKILL)
        self._kills += 1
        self.kubectl.say(f"SIGKILL to the container of operator release {self.name}")

    def lose(self) -> None:
        """SIGKILL its container and scale its Deployment to 0 so that nothing starts it again
        here: its node is lost (on a cluster the Deployment would start a pod elsewhere)."""
        signal_pod(self.pod(), signal.SIGKILL)
        self.kubectl(
            "scale", "-n", OPERATOR_NAMESPACE, "deployment", "-l", self._selector, "--replicas=0"
        )
        self.kubectl.say(f"operator release {self.name}: its pod SIGKILLed and not replaced")

    def resume(self, timeout: float = 120.0) -> None:
        """After `lose`: its Deployment scaled back to one, and wait for its new pod Ready."""
        self.kubectl(
            "scale", "-n", OPERATOR_NAMESPACE, "deployment", "-l", self._selector, "--replicas=1"
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                conditions = self.pod().get("status", {}).get("conditions") or []
            except DemoError:  # the lost pod not gone yet, or the new one not created yet
                conditions = []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise DemoError(f"operator release {self.name}: no pod Ready within {timeout} s")
            time.sleep(1)
        self._checked = time.monotonic()
        self.kubectl.say(f"operator release {self.name}: running again")

    def stop(self) -> None:
        self.helm("uninstall", self.name, "--namespace", OPERATOR_NAMESPACE, "--wait")


CHECK_SECONDS = 15.0


def signal_pod(pod: dict[str, Any], signum: signal.Signals) -> list[int]:
    """Signal every running container of a pod (the process kubelet runs each as a process
    group on this machine, its containerID `process://<pid>`); returns the groups signalled."""
    groups = sorted(
        int(status["containerID"].removeprefix("process://"))
        for status in pod.get("status", {}).get("containerStatuses") or []
        if str(status.get("containerID", "")).startswith("process://")
    )
    if not groups:
        raise DemoError(f"no container of pod {pod['metadata']['name']} runs on this machine")
    for group in groups:
        os.killpg(group, signum)
    return groups


class Watcher:
    """Reads the StreamingApp's status and Events (what `kubectl get ssa -w` and `kubectl
    describe` show) and the input positions."""

    def __init__(
        self,
        kubectl: Kubectl,
        operator: Operator,
        bootstrap_servers: str,
        options: DemoOptions,
        say: Callable[[str], None],
    ) -> None:
        self.kubectl = kubectl
        self.operator = operator
        self.options = options
        self.say = say
        self.inputs = InputPositionCommitter(bootstrap_servers, APP_ID, QUIET)
        self.tasks = options.tasks
        """The input's partitions (the app's tasks): raised by `Session.grow_input`."""
        self._bootstrap_servers = bootstrap_servers
        self._ends = self._ends_reader()
        self._seen_events: set[str] = set()
        self.status: dict[str, Any] = {}

    def close(self) -> None:
        self.inputs.close()
        self._ends.close()

    def poll(self) -> None:
        self.operator.check()
        app = json.loads(
            self.kubectl("get", "-n", NAMESPACE, "streamingapp", APP_NAME, "-o", "json", quiet=True)
        )
        self.status = app.get("status") or {}
        events = json.loads(
            self.kubectl("get", "-n", NAMESPACE, "events", "-o", "json", quiet=True)
        )
        for event in sorted(events.get("items") or [], key=_event_time):
            uid = event["metadata"].get("uid") or event["metadata"]["name"]
            if uid in self._seen_events:
                continue
            self._seen_events.add(uid)
            kind = "warning" if event.get("type") == "Warning" else "event"
            self.say(f"{kind} {event.get('reason')}: {event.get('message')}")

    def settled(self, replicas: int) -> bool:
        status = self.status
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        progressing = conditions.get("Progressing", {}).get("status")
        return (
            status.get("phase") == "Running"
            and progressing == "False"
            and status.get("replicas") == replicas
            and status.get("readyReplicas") == replicas
        )

    def _ends_reader(self) -> Consumer:
        return Consumer({"bootstrap.servers": self._bootstrap_servers, "group.id": APP_ID, **QUIET})

    def grown(self, partitions: int) -> None:
        """The input has `partitions` now: read their positions too (with a new reader: the
        one that knows the topic keeps its old partition count for minutes)."""
        self.tasks = partitions
        self._ends.close()
        self._ends = self._ends_reader()

    def input_lag(self) -> int | None:
        """The records of the input not yet committed by the app; None while the brokers cannot
        say. A reader that met a broker down may keep metadata without the partition after the
        broker is back ("Unknown partition"), so a failed read starts a fresh one for the next."""
        try:
            committed, ends = self._input_positions()
        except KafkaException as error:
            self.say(f"input lag unknown ({error.args[0].str()})")
            self._ends.close()
            self._ends = self._ends_reader()
            return None
        return sum(max(0, end - committed.get(p, 0)) for p, end in ends.items())

    def _input_positions(self) -> tuple[dict[int, int], dict[int, int]]:
        committed: dict[int, int] = {}
        ends: dict[int, int] = {}
        for partition in range(self.tasks):
            position = self.inputs.committed([INPUT_TOPIC], partition).get(INPUT_TOPIC)
            if position is not None:
                committed[partition] = position
            _low, ends[partition] = self._ends.get_watermark_offsets(
                TopicPartition(INPUT_TOPIC, partition), timeout=10
            )
        return committed, ends

    def describe(self) -> str:
        status = self.status
        holders: dict[str, dict[str, list[str]]] = {}
        for task in status.get("tasks") or []:
            for holder in task.get("holders") or []:
                roles = holders.setdefault(holder["instance"], {})
                text = str(task["task"])
                if holder.get("lag") is not None and holder["role"] != "active":
                    text += f" (lag {holder['lag']:,})"
                roles.setdefault(holder["role"], []).append(text)
        parts = [f"{status.get('phase', 'Pending')}"]
        for instance in status.get("instances") or []:
            roles = holders.get(instance["name"], {})
            text = f"{instance['name']}{'' if instance.get('ready') else ' (starting)'}:"
            text += f" active {', '.join(roles.get('active', [])) or '-'}"
            if roles.get("warmup"):
                text += f", warm-up {', '.join(roles['warmup'])}"
            if instance.get("draining"):
                text += ", draining"
            parts.append(text)
        lag = self.input_lag()
        return " | ".join(parts) + " | input lag " + ("unknown" if lag is None else f"{lag:,}")

    def run_until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.options.phase_timeout
        last_status = 0.0
        while True:
            self.poll()
            if done():
                return
            now = time.monotonic()
            if now - last_status >= 5:
                self.say(self.describe())
                last_status = now
            if now > deadline:
                self.say(f"{what}: not within {self.options.phase_timeout} s; the app's status:")
                self.say(json.dumps(self.status, indent=1, sort_keys=True))
                raise DemoError(
                    f"{what} did not happen within {self.options.phase_timeout} s; the operator's "
                    f"log is {self.operator.log_path}"
                )
            time.sleep(self.options.poll_interval)

    def hold(self) -> None:
        until = time.monotonic() + self.options.hold
        self.run_until(lambda: time.monotonic() >= until, "holding steady")


def _event_time(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event["metadata"].get("creationTimestamp")
        or ""
    )


@dataclass
class Session:
    """Everything a scaling story needs, running: the control plane, the operator, input and
    the watcher. The demo's story is one script over it; tests script others."""

    options: DemoOptions
    bootstrap: str
    kubectl: Kubectl
    operator: Operator
    watcher: Watcher
    feed: InputFeed
    say: Callable[[str], None]
    kafka: KafkaControl
    """The embedded Kafka's controls (faults, compaction)."""
    cluster: StackInfo
    """The local control plane (its API server's fault injection: `inject_api_faults`)."""
    helm: Helm
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    """Named parts of the story (wall-clock start and end) whose pauses `finish` measures."""
    longest_stops: dict[str, float] = field(default_factory=dict)
    """Per phase, the longest processing pause of any partition (set by `finish`)."""
    lost: int = 0
    """Updates of the reference missing from the output (set by `finish`)."""
    doubled: int = 0
    """Updates applied more than once (set by `finish`)."""
    outputs: OutputCheck | None = None
    """Every output record against the reference (set by `finish`)."""
    timelines: dict[int, TaskTimeline] = field(default_factory=dict)
    """The ownership timeline of every task, read back from the changelog (set by `finish`)."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a part of the story (under steady input) whose longest per-partition
        processing pause `finish` measures."""
        start = time.time()
        yield
        self.phases.append((name, start, time.time()))

    def apply(self, replicas: int = 1) -> None:
        """Apply the namespace and the app with `replicas` (kubectl apply)."""
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(NAMESPACE_MANIFEST))
        app = streaming_app(self.options, self.bootstrap)
        app["spec"]["replicas"] = replicas
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(app, sort_keys=False))

    def scale(self, replicas: int) -> None:
        self.kubectl(
            "scale", "-n", NAMESPACE, "streamingapp", APP_NAME, "--replicas", str(replicas)
        )
        self.watcher.run_until(
            lambda: self.watcher.status.get("desiredReplicas") == replicas,
            f"the operator seeing replicas {replicas}",
        )

    def grow_input(self, partitions: int, keys: int) -> None:
        """Add partitions to the input topic, as a person does with their Kafka tools
        (CreatePartitions), and send `keys` new users to them from now on."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **QUIET})
        for future in admin.create_partitions([NewPartitions(INPUT_TOPIC, partitions)]).values():
            future.result(30)
        self.feed.grow(partitions, keys)
        self.watcher.grown(partitions)
        self.say(f"input topic {INPUT_TOPIC} grown to {partitions} partitions; {keys} new users")

    def install_operator(self, name: str, priority: int | None = None) -> Operator:
        """Another release of the operator's chart (see Operator)."""
        chart = self.options.examples_root / "charts" / "smoothscale"
        return Operator(self.helm, self.kubectl, self.cluster, chart, name=name, priority=priority)

    def restart_operator(self) -> None:
        """SIGKILL the operator's container (no chance to clean up); the kubelet restarts it."""
        self.operator.kill()

    def inject_api_faults(self, *faults: dict[str, Any]) -> dict[str, Any]:
        """Have the local API server answer the next matching requests with errors (see
        devstack.apiserver.faults; no faults: just the report so far)."""
        method = "POST" if faults else "GET"
        body = json.dumps(list(faults)).encode() if faults else None
        request = urllib.request.Request(
            f"{self.cluster.api_url}{API_FAULTS_PATH}", data=body, method=method
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            report: dict[str, Any] = json.loads(answer.read())
        if faults:
            self.say(f"API faults injected: {json.dumps(list(faults))}")
        return report

    def signal_container(self, pod: str, signum: signal.Signals) -> None:
        """Signal every process of a pod's container: SIGKILL as the OOM killer does (the
        kubelet restarts it in place: same pod, same disk), SIGSTOP and SIGCONT to starve it
        of CPU and give it back. Local stack only: it signals the pod's processes directly."""
        listed = self.kubectl("get", "pod", "-n", NAMESPACE, pod, "-o", "json", quiet=True)
        groups = signal_pod(json.loads(listed), signum)
        self.say(f"{signum.name} to the container of {pod} (process groups {groups})")

    def finish(self) -> bool:
        """Stop the input, wait for the last records, check every output record against the
        reference (`outputs.check_outputs`), and the ownership timeline the instances wrote (the
        changelog, `timeline.json` in the workdir): whether every output is exact and no task
        was ever processed by two instances at once. Prints each phase's longest per-partition
        pause."""
        sent = self.feed.stop()
        self.say(f"input stopped after {sent:,} records; waiting for the last ones to be processed")
        self.watcher.run_until(lambda: self.watcher.input_lag() == 0, "processing the last records")
        reference, emitted = read_inputs_and_outputs(
            self.bootstrap, self.watcher.tasks, output_partitions=self.options.tasks
        )
        outputs = check_outputs(reference, emitted)
        self.outputs = outputs
        self.lost, self.doubled = outputs.lost, outputs.doubled
        self.say(f"every output record checked: {outputs.summary()}")
        for example in outputs.examples:
            self.say(f"  for instance {example}")
        timelines = read_timelines(self.bootstrap, CHANGELOG_TOPIC, self.watcher.tasks, QUIET)
        self.timelines = timelines
        path = self.options.workdir / "timeline.json"
        write_timelines(path, timelines)
        for name, start, end in self.phases:
            self.longest_stops[name] = max(t.longest_pause(start, end) for t in timelines.values())
        if self.longest_stops:
            stops = ", ".join(f"{name} {s:.1f} s" for name, s in self.longest_stops.items())
            options = self.options
            self.say(
                f"longest stop of any partition: {stops} (trigger interval "
                f"{options.trigger_interval} s, lag poll interval {options.poll_interval} s)"
            )
        overlaps = [overlap for timeline in timelines.values() for overlap in timeline.overlaps]
        for overlap in overlaps:
            self.say(
                f"TWO ACTIVE OWNERS of task {overlap.task}: {overlap.stale} committed a batch "
                f"after {overlap.newer} had taken it over"
            )
        self.say(
            f"tasks processed by two instances at once: {len({o.task for o in overlaps})} "
            f"(the ownership timeline is in {path})"
        )
        return outputs.exact and not overlaps


@contextmanager
def session(options: DemoOptions, out: TextIO) -> Iterator[Session]:
    """Start the control plane, create the input and output topics, produce the backlog and
    start the operator; stop everything afterwards."""
    started = time.monotonic()

    def say(text: str) -> None:
        out.write(f"[{time.monotonic() - started:6.1f}s] {text}\n")
        out.flush()

    if not (options.examples_root / "examples" / "pipelines").is_dir():
        raise DemoError(
            f"the example pipelines are not in {options.examples_root}/examples: run the demo "
            "from the root of a smoothscale checkout, or pass --examples-root"
        )
    kubectl_path = tool_binary(options.examples_root, "kubectl")
    say("starting the local control plane (API server, kubelet, embedded Kafka)")
    # Its pods are killed when it stops: the story is told and checked by then.
    stack = LocalStack(
        options.workdir / "cluster", brokers=1, nodes=options.nodes, shutdown_grace_period=0
    )
    with stack:
        assert stack.info is not None
        cluster: StackInfo = stack.info
        bootstrap = cluster.kafka_bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
        topics = [NewTopic(t, options.tasks) for t in (INPUT_TOPIC, OUTPUT_TOPIC)]
        for future in admin.create_topics(topics).values():
            future.result(30)
        say(f"Kafka at {bootstrap}: created the input and output topics ({options.tasks} tasks)")
        feed = InputFeed(bootstrap, options.keys, options.rate, options.tasks, options.steady_keys)
        feed.backlog(options.backlog)
        say(f"produced a backlog of {options.backlog:,} records over {options.keys:,} users")
        kubectl = Kubectl(kubectl_path, cluster.kubeconfig, say)
        helm = Helm(
            tool_binary(options.examples_root, "helm"),
            cluster.kubeconfig,
            options.workdir / "helm",
            say,
        )
        say("installing the operator with its Helm chart, as users do")
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump(NAMESPACE_MANIFEST))  # for its Role
        chart = options.examples_root / "charts" / "smoothscale"
        operator = Operator(helm, kubectl, cluster, chart)
        watcher = Watcher(kubectl, operator, bootstrap, options, say)
        control = KafkaControl(cluster.kafka_control)
        running = Session(
            options, bootstrap, kubectl, operator, watcher, feed, say, control, cluster, helm
        )
        try:
            yield running
        except DemoError as error:
            if isinstance(out, io.StringIO):  # a test's: the story goes with the error
                raise DemoError(f"{error}\n--- the story so far ---\n{out.getvalue()}") from error
            raise
        finally:
            feed.stop()
            try:
                kubectl("delete", "-n", NAMESPACE, "streamingapp", APP_NAME, "--wait=false")
            except DemoError as error:
                say(f"could not delete the app: {error}")
            try:
                running.operator.stop()
            except DemoError as error:  # the control plane stops next, and the pod with it
                say(f"could not uninstall the operator: {error}")
            watcher.close()


def run(options: DemoOptions, out: TextIO) -> int:
    """Run the demo, printing the story to `out`; 0 when the final state is exact."""
    with session(options, out) as running:
        return _story(running)


def _story(running: Session) -> int:
    options, watcher, say = running.options, running.watcher, running.say
    running.apply(replicas=1)
    watcher.run_until(lambda: watcher.settled(1), "the first instance running")
    watcher.run_until(
        lambda: (lag := watcher.input_lag()) is not None and lag < options.rate * 5,
        "catching up the backlog",
    )
    running.feed.start()
    say(f"steady input: {options.rate:,} records/s. {watcher.describe()}")
    watcher.hold()

    with running.phase("scale-out"):
        running.scale(2)
        watcher.run_until(lambda: watcher.settled(2), "scale-out to 2")
        say(f"scaled out. {watcher.describe()}")
        watcher.hold()  # the moved tasks' first batches on their new owner fall in this phase

    with running.phase("scale-in"):
        running.scale(1)
        watcher.run_until(lambda: watcher.settled(1), "scale-in to 1")
        say(f"scaled in. {watcher.describe()}")
        watcher.hold()
    running.kubectl("get", "-n", NAMESPACE, "streamingapps")
    say(running.kubectl("get", "-n", NAMESPACE, "streamingapps", quiet=True).rstrip())
    return 0 if running.finish() else 1
