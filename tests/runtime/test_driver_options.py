"""The driver JVM's flags: the instance's own, and the class-data archive when there is one."""

from pathlib import Path

import pytest

from smoothscale.runtime.spark import (
    CLASS_ARCHIVE_ENV,
    DRIVER_JAVA_OPTIONS,
    DRIVER_JAVA_OPTIONS_ENV,
    driver_java_options,
)


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "classes dir" / "spark-classes.jsa"
    monkeypatch.setenv(CLASS_ARCHIVE_ENV, str(path))
    monkeypatch.delenv(DRIVER_JAVA_OPTIONS_ENV, raising=False)
    return path


def test_without_an_archive_the_driver_runs_on_the_instance_flags(archive: Path) -> None:
    assert driver_java_options() == DRIVER_JAVA_OPTIONS


def test_an_archive_is_added_to_the_flags_quoted_for_spaces_in_its_path(archive: Path) -> None:
    archive.parent.mkdir()
    archive.write_bytes(b"archive")
    assert driver_java_options() == f'{DRIVER_JAVA_OPTIONS} "-XX:SharedArchiveFile={archive}"'


def test_flags_of_ones_own_replace_the_instance_flags_and_keep_the_archive(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive.parent.mkdir()
    archive.write_bytes(b"archive")
    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, "-Xss4m")
    assert driver_java_options() == f'-Xss4m "-XX:SharedArchiveFile={archive}"'


@pytest.mark.parametrize("own", ["-XX:SharedArchiveFile=/x.jsa", "-XX:ArchiveClassesAtExit=/y"])
def test_flags_that_name_an_archive_of_their_own_get_no_other(
    archive: Path, monkeypatch: pytest.MonkeyPatch, own: str
) -> None:
    archive.parent.mkdir()
    archive.write_bytes(b"archive")
    monkeypatch.setenv(DRIVER_JAVA_OPTIONS_ENV, own)
    assert driver_java_options() == own
