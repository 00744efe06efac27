"""The image's lock file: the pins of requirements/dev.lock that the package needs at run time.

The image installs requirements/runtime.lock with `pip install --no-deps`, so the lock must
hold the whole dependency closure of the package's runtime requirements, and nothing of the
development tools. This module computes that closure from the installed distributions'
metadata (the development venv has exactly the dev.lock pins) and prints the lock:

    .venv/bin/python -m tests.chart.runtime_lock > requirements/runtime.lock
"""

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEV_LOCK = ROOT / "requirements" / "dev.lock"
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"

HEADER = """\
# The image's Python dependencies: the runtime subset of dev.lock, with the same pins.
# The Dockerfile installs this with --no-deps, so it must be closed under dependencies.
# Regenerate with: .venv/bin/python -m tests.chart.runtime_lock > requirements/runtime.lock
"""


def read_pins(lock: Path) -> dict[str, str]:
    """Canonical distribution name -> the `name==version` line of a pip lock file."""
    pins: dict[str, str] = {}
    for raw in lock.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        pins[canonicalize_name(requirement.name)] = line
    return pins


def runtime_closure() -> set[str]:
    """Canonical names of every distribution the package needs at run time.

    The package's own requirements come from pyproject.toml (the installed metadata of an
    editable install can be older); theirs from the installed distributions.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed: set[str] = set()
    pending: list[list[str]] = [project["dependencies"]]
    while pending:
        for text in pending.pop():
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(requirement.name)
            if name not in needed:
                needed.add(name)
                pending.append(metadata.requires(name) or [])
    return needed


def render_runtime_lock() -> str:
    dev_pins = read_pins(DEV_LOCK)
    missing = sorted(runtime_closure() - dev_pins.keys())
    if missing:
        raise SystemExit(
            f"requirements/dev.lock pins none of {missing}, which the package needs at run "
            "time: install them in .venv and regenerate dev.lock first."
        )
    lines = [dev_pins[name] for name in sorted(runtime_closure())]
    return HEADER + "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_runtime_lock())
