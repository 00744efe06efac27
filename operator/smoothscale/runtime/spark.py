"""The instance's Spark session: local mode inside the pod, sized for a small share of a node.

Every instance is one Spark driver (a JVM) running `local[2]`; several of them share a node, so
the session turns off what an unattended driver does not need (the web UI) and keeps memory and
shuffle parallelism small. The session registers the smoothscale Kafka source, so a caller can
`spark.readStream.format("smoothscale-kafka")` at once.
"""

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_CORES = 2
"""Tasks the instance's Spark runs at once (`local[SPARK_CORES]`): one per input partition read,
each in a Python worker of its own."""
SOURCE_POLL_SECONDS = 0.2
"""How often a query with nothing new to read asks its source again (Spark's polling delay)."""
DRIVER_MEMORY = "512m"
"""Heap of the instance's driver JVM; its state lives in the embedded store, off the JVM heap."""
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM flags of the instance's driver: the client compiler only, and the serial collector for
its small heap. A micro-batch of a few hundred records costs Spark mostly planning, scheduling
and task serialisation, code the optimising compiler keeps recompiling for little gain: measured
on 2 cores at 200 records/s and one batch a second, a driver used 0.85 of a core with the JVM's
defaults and 0.55 with these, started on 13 CPU-seconds instead of 19 to 25, and ran the
throughput benchmark's larger batches faster too (docs/runtime.md, The driver JVM).
SMOOTHSCALE_DRIVER_JAVA_OPTIONS, when set (in spec.env), replaces them."""
DRIVER_JAVA_OPTIONS_ENV = "SMOOTHSCALE_DRIVER_JAVA_OPTIONS"


def local_session(app_name: str, *, shuffle_partitions: int = 2) -> "SparkSession":
    """A local[2] Spark session named `app_name` with the smoothscale Kafka source registered.

    The UI is off, the driver heap is small and its JVM tuned for short batches, Arrow carries
    data between the JVM and Python, and Spark logs only warnings and errors. Calling it again in
    the same process returns the running session (Spark allows one per process).
    """
    from pyspark.sql import SparkSession

    from smoothscale.runtime.source import register_source

    # A session's JVM inherits these; PySpark itself reads them before it starts the gateway.
    os.environ.setdefault("PYSPARK_PYTHON", _python_executable())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", _python_executable())
    spark = (
        SparkSession.builder.master(f"local[{SPARK_CORES}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # no progress bars in pod logs
        .config("spark.driver.memory", DRIVER_MEMORY)
        .config(
            "spark.driver.extraJavaOptions",
            os.environ.get(DRIVER_JAVA_OPTIONS_ENV, DRIVER_JAVA_OPTIONS),
        )
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        # How soon a query with a 0 s trigger asks its source again after finding nothing new:
        # the instance's source paces its own batches, this is how often it is asked.
        .config("spark.sql.streaming.pollingDelay", f"{round(SOURCE_POLL_SECONDS * 1000)}ms")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register_source(spark)
    return spark


def _python_executable() -> str:
    """The interpreter running this process, so Spark's Python workers see the same packages."""
    import sys

    return sys.executable
