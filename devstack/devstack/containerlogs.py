"""Container logs as the kubelet keeps them and `kubectl logs` reads them.

The kubelet appends every run of a container (its first start and each restart) to one file,
`<kubelet root>/<pod key>/<container>.log`, and before each run appends the byte offset where
that run's output starts to `<container>.log.runs`. The API server reads a run back from these
for pods/log (the current run, or with `previous` the one before it), as a real API server
proxies the request to the kubelet that keeps the pod's logs.
"""

import re
from dataclasses import dataclass
from pathlib import Path

RUNS_SUFFIX = ".runs"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def pod_directory(kubelet_root: Path, pod_key: str) -> Path:
    """A pod's directory under the kubelet's root (`pod_key`: podspec.pod_key)."""
    return kubelet_root / _SAFE_NAME.sub("_", pod_key)


def container_log(kubelet_root: Path, pod_key: str, container: str) -> Path:
    """Where the kubelet writes a container's output."""
    return pod_directory(kubelet_root, pod_key) / f"{container}.log"


def start_run(log: Path) -> None:
    """Mark where the output of the run about to start begins (the kubelet, before a spawn)."""
    offset = log.stat().st_size if log.exists() else 0
    with log.with_name(log.name + RUNS_SUFFIX).open("a") as runs:
        runs.write(f"{offset}\n")


@dataclass(frozen=True)
class Run:
    """One run's bytes in the log: from `start` up to `end` (None: the run still writes)."""

    start: int
    end: int | None


def runs(log: Path) -> list[Run]:
    """Every run of the container whose log this is, oldest first."""
    marks = log.with_name(log.name + RUNS_SUFFIX)
    if not marks.exists():
        return []
    starts = [int(line) for line in marks.read_text().split()]
    ends: list[int | None] = [*starts[1:], None]
    return [Run(start, end) for start, end in zip(starts, ends, strict=True)]


def read_run(log: Path, run: Run, offset: int = 0) -> bytes:
    """The run's bytes from `offset` (counted from its start) to its end or the file's."""
    with log.open("rb") as file:
        file.seek(run.start + offset)
        if run.end is None:
            return file.read()
        return file.read(max(run.end - run.start - offset, 0))
