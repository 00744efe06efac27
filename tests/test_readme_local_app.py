"""The README's own-app steps, exactly as written, on a loaded machine (a busy process per core
beside them): the local stack, the chart with examples/local/values.yaml, the example manifest,
input, `kubectl scale` from 1 to 3. The app ends exact (every output record against the
input), and the ordinary scale-out raised no Warning and never made the app Degraded."""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.demo.outputs import check_outputs
from devstack.demo.scenario import read_inputs_and_outputs

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.cluster]


def readme_steps() -> list[str]:
    """The shell lines of the README's own-app section (continuations joined)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Your own app on the local stack", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the own-app section has no bash block"
    return block.group(1).replace("\\\n", " ").strip().splitlines()


@pytest.fixture
def hog() -> Iterator[None]:
    """One busy process per core, for the whole test."""
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for process in busy:
            process.kill()
            process.wait()


@pytest.mark.timeout(1800)
def test_the_readme_runs_ones_own_app_and_scales_it_without_a_false_alarm(
    tmp_path: Path, hog: None
) -> None:
    steps = readme_steps()
    assert steps[0].startswith("export PATH=")
    assert steps[-1] == "smoothscale dev down"
    # A checkout of its own for the stack's state (.smoothscale/dev), the rest the real one.
    for part in (".venv", ".tools", "charts", "examples"):
        (tmp_path / part).symlink_to(ROOT / part)
    environment = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm" / "config"),
        "HELM_DATA_HOME": str(tmp_path / "helm" / "data"),
    }
    environment.pop("KUBECONFIG", None)
    environment.pop("SMOOTHSCALE_DEV_DIR", None)

    def shell(lines: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        script = "set -euo pipefail\n" + "\n".join(lines)
        return subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    kubeconfig = tmp_path / ".smoothscale" / "dev" / "kubeconfig"

    def kubectl(*arguments: str) -> str:
        done = subprocess.run(
            [str(ROOT / ".tools" / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig), *arguments],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return done.stdout

    try:
        ran = shell(steps[:-1], timeout=1500)
        assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}"
        app = json.loads(kubectl("get", "streamingapp", "counts", "-n", "apps", "-o", "json"))
        deadline = time.monotonic() + 120  # the operator posts its Events after the status
        while True:
            events = json.loads(kubectl("get", "events", "-n", "apps", "-o", "json"))["items"]
            if any(e["reason"] == "Scaled" for e in events) or time.monotonic() > deadline:
                break
            time.sleep(2)
        bootstrap = "127.0.0.1:9092"
        deadline = time.monotonic() + 300
        while True:
            check = check_outputs(*read_inputs_and_outputs(bootstrap, 4, "clicks", "click-counts"))
            if check.exact or time.monotonic() > deadline:
                break
            time.sleep(2)
    finally:
        down = shell([steps[0], steps[-1]], timeout=120)  # with the PATH the steps set first
        assert down.returncode == 0, down.stderr

    reasons = [(e["type"], e["reason"], e["message"]) for e in events]
    assert check.exact, check.summary()
    assert check.records == 4000
    warnings = [event for event in reasons if event[0] != "Normal"]
    assert not warnings, f"an ordinary scale-out warns of nothing: {warnings}"
    conditions = {c["type"]: c["status"] for c in app["status"]["conditions"]}
    assert conditions["Degraded"] == "False", app["status"]["conditions"]
    assert app["status"]["readyReplicas"] == 3
    assert any(reason == "Scaled" for _type, reason, _message in reasons), reasons
    assert "counts-2" in ran.stdout, "the steps show the new pods (get -o wide, logs)"
