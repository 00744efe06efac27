"""The driver JVM starts on the environment's class-data archive (`smoothscale spark-classes`,
which scripts/bootstrap and the image's build run): Spark's classes come from the archive."""

import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from smoothscale.runtime.spark import class_archive

pytestmark = pytest.mark.spark


def test_a_driver_loads_sparks_classes_from_the_environments_class_archive(
    spark: SparkSession,
) -> None:
    archive = class_archive()
    assert archive.is_file(), f"{archive} is missing: scripts/bootstrap writes it"
    jvm = spark._jvm
    assert jvm is not None
    flags = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in flags
    # The driver's own java and class path, with the archive required (-Xshare:on: a JVM that
    # cannot use it refuses to start): where does a JVM take SparkContext's class from?
    java = Path(jvm.System.getProperty("java.home")) / "bin" / "java"
    class_path = jvm.System.getProperty("java.class.path")
    sharing = [f"-XX:SharedArchiveFile={archive}", "-Xshare:on", "-Xlog:class+load=info"]
    loaded = subprocess.run(
        [str(java), *sharing, "-cp", class_path, "org.apache.spark.SparkContext"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    line = next(line for line in loaded.splitlines() if "org.apache.spark.SparkContext " in line)
    assert "source: shared objects file (top)" in line, line
