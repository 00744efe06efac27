"""What the kubelet reports: container snapshots -> a Pod's status, as a real kubelet writes it."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from devstack.podspec import NODE_IP, pod_ip
from devstack.processes import ContainerPhase, ContainerSnapshot, Termination

JsonObject = dict[str, Any]


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_phase(snapshots: Sequence[ContainerSnapshot]) -> str:
    """Pending until every container has started once; Succeeded or Failed once every
    container has terminated for good (Failed if any failed); Running in between."""
    if all(snapshot.final for snapshot in snapshots):
        failed = any(s.termination is None or s.termination.exit_code != 0 for s in snapshots)
        return "Failed" if failed else "Succeeded"
    if any(snapshot.phase is ContainerPhase.WAITING for snapshot in snapshots):
        return "Pending"
    return "Running"


def _terminated(termination: Termination) -> JsonObject:
    state: JsonObject = {
        "exitCode": termination.exit_code,
        "reason": termination.reason,
        "startedAt": timestamp(termination.started_at),
        "finishedAt": timestamp(termination.finished_at),
    }
    if termination.signal is not None:
        state["signal"] = termination.signal
    if termination.message:
        state["message"] = termination.message
    return {"terminated": state}


def container_status(spec: JsonObject, snapshot: ContainerSnapshot) -> JsonObject:
    """One entry of status.containerStatuses. A terminated container that will restart shows
    as waiting in CrashLoopBackOff, with the run that ended as its lastState."""
    last_state: JsonObject = {}
    if snapshot.phase is ContainerPhase.RUNNING:
        assert snapshot.started_at is not None
        state: JsonObject = {"running": {"startedAt": timestamp(snapshot.started_at)}}
        if snapshot.last_termination is not None:
            last_state = _terminated(snapshot.last_termination)
    elif snapshot.phase is ContainerPhase.TERMINATED and snapshot.termination is not None:
        if snapshot.final:
            state = _terminated(snapshot.termination)
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff"}}
            last_state = _terminated(snapshot.termination)
    else:
        state = {"waiting": {"reason": snapshot.waiting_reason or "ContainerCreating"}}
    running = snapshot.phase is ContainerPhase.RUNNING
    return {
        "name": snapshot.name,
        "image": spec.get("image", ""),
        "imageID": "",
        "containerID": f"process://{snapshot.pid}" if snapshot.pid is not None else "",
        "state": state,
        "lastState": last_state,
        "ready": snapshot.ready and running,
        "started": snapshot.started and running,
        "restartCount": snapshot.restart_count,
    }


def waiting_status(spec: JsonObject, reason: str, message: str) -> JsonObject:
    """A container that could not be started (e.g. CreateContainerConfigError)."""
    return {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "state": {"waiting": {"reason": reason, "message": message}},
        "lastState": {},
        "ready": False,
        "started": False,
        "restartCount": 0,
    }


_KUBELET_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def _conditions(
    previous: Sequence[JsonObject], values: dict[str, bool], now: str
) -> list[JsonObject]:
    """The kubelet's conditions in the usual order, then those others wrote (DisruptionTarget
    from an eviction, say), kept as they are; lastTransitionTime moves only when the status
    flips."""
    before = {condition.get("type"): condition for condition in previous}
    conditions = []
    for kind in _KUBELET_CONDITIONS:
        status = "True" if values[kind] else "False"
        old = before.get(kind) or {}
        unchanged = old.get("status") == status
        conditions.append(
            {
                "type": kind,
                "status": status,
                "lastProbeTime": None,
                "lastTransitionTime": old.get("lastTransitionTime", now) if unchanged else now,
            }
        )
    conditions += [c for c in previous if c.get("type") not in _KUBELET_CONDITIONS]
    return conditions


def pod_status(
    pod: JsonObject,
    container_statuses: Sequence[JsonObject],
    phase: str,
    *,
    start_time: datetime,
    now: datetime,
    message: str | None = None,
) -> JsonObject:
    """The whole status the kubelet writes for `pod`."""
    all_ready = bool(container_statuses) and all(c["ready"] for c in container_statuses)
    previous = (pod.get("status") or {}).get("conditions") or []
    status: JsonObject = {
        "phase": phase,
        "conditions": _conditions(
            previous,
            {
                "PodScheduled": True,
                "Initialized": True,
                "ContainersReady": all_ready,
                "Ready": all_ready,
            },
            timestamp(now),
        ),
        "hostIP": NODE_IP,
        "hostIPs": [{"ip": NODE_IP}],
        "podIP": pod_ip(pod),
        "podIPs": [{"ip": pod_ip(pod)}],
        "startTime": timestamp(start_time),
        "containerStatuses": list(container_statuses),
        "qosClass": "BestEffort",
        "message": message,
    }
    return status
