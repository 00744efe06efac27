"""The instance's Spark session: local mode inside the pod, sized for a small share of a node.

Every instance is one Spark driver (a JVM) running `local[2]`; several of them share a node, so
the session turns off what an unattended driver does not need (the web UI) and keeps memory and
shuffle parallelism small. The session registers the smoothscale Kafka source, so a caller can
`spark.readStream.format("smoothscale-kafka")` at once.

A driver starts on the classes of a class-data archive (`class_archive`) when the environment has
one: `smoothscale spark-classes` writes it (the image's build and `scripts/bootstrap` run it).
"""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

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
CLASS_ARCHIVE_ENV = "SMOOTHSCALE_SPARK_CLASS_ARCHIVE"
"""Where the environment's class-data archive is, if not in the default place (`class_archive`)."""
_ARCHIVE_FLAGS = ("-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit")


class ClassArchiveError(RuntimeError):
    """`write_class_archive` could not write the archive."""


def class_archive() -> Path:
    """The Spark driver's class-data archive of this Python environment:
    $SMOOTHSCALE_SPARK_CLASS_ARCHIVE, or share/smoothscale/spark-classes.jsa under the
    environment's prefix (a virtualenv's directory, the image's /usr/local).

    A JVM's CDS archive (JDK 17's dynamic AppCDS): the Spark, Scala and Hadoop classes a driver
    loads, already parsed and verified, mapped from the file by every driver that starts on
    it. A driver then starts on about half the CPU (docs/runtime.md, The driver JVM). It holds
    the class path it was written with: a driver whose class path differs (PySpark upgraded
    since) warns once and loads its classes as without it."""
    configured = os.environ.get(CLASS_ARCHIVE_ENV)
    if configured:
        return Path(configured)
    return Path(sys.prefix) / "share" / "smoothscale" / "spark-classes.jsa"


def driver_java_options() -> str:
    """The driver JVM's flags: DRIVER_JAVA_OPTIONS (or $SMOOTHSCALE_DRIVER_JAVA_OPTIONS), and the
    class archive when the environment has one and the flags name none of their own."""
    options = os.environ.get(DRIVER_JAVA_OPTIONS_ENV, DRIVER_JAVA_OPTIONS)
    archive = class_archive()
    if any(flag in options for flag in _ARCHIVE_FLAGS) or not archive.is_file():
        return options
    return f'{options} "-XX:SharedArchiveFile={archive}"'


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
        .config("spark.driver.extraJavaOptions", driver_java_options())
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


QUERY_START_ATTEMPTS = 3
"""How many times a streaming query is started when it stops before its first micro-batch
because a Python process of Spark's connected back too late (see `started_too_late`)."""
_CONNECTED_BACK_TOO_LATE = "Python worker failed to connect back"
"""Spark's error when a Python process it started did not connect back within 10 s."""


def started_too_late(query: "StreamingQuery") -> bool:
    """Whether `query` stopped before its first micro-batch because a Python process Spark
    started for it (the one that runs a Python source's reader) did not connect back in time.

    Spark waits a fixed 10 s (not configurable) for that process; on a starved node it starts
    later (seen at a test gate's start: two cores, load above 10). Nothing has run then, so
    starting the query again, on a fresh checkpoint, loses nothing."""
    return (
        not query.isActive
        and query.lastProgress is None
        and _CONNECTED_BACK_TOO_LATE in str(query.exception())
    )


def write_class_archive(path: Path, timeout: float = 900) -> None:
    """Write the driver's class-data archive to `path` (replaced atomically: drivers starting
    meanwhile map the old one or none).

    A driver with the instance's flags runs what an instance's driver runs first (a session,
    a DataFrame from pandas through Arrow, an aggregation, a streaming query with foreachBatch
    for a few micro-batches) in a process of its own, and its JVM writes the classes it loaded
    when it exits (-XX:ArchiveClassesAtExit). Classes an instance loads later, outside the
    archive, load as they would without it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    flags = os.environ.get(DRIVER_JAVA_OPTIONS_ENV, DRIVER_JAVA_OPTIONS)
    environment = {
        **os.environ,
        # Its warnings name every class it cannot archive (signed jars, old class files).
        DRIVER_JAVA_OPTIONS_ENV: f'{flags} "-XX:ArchiveClassesAtExit={partial}" -Xlog:cds=off',
    }
    command = [sys.executable, "-c", f"import {__name__} as spark; spark._exercise()"]
    try:
        done = subprocess.run(
            command, check=False, env=environment, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as error:
        partial.unlink(missing_ok=True)
        raise ClassArchiveError(f"the Spark driver did not finish within {timeout} s") from error
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        output = (done.stdout + done.stderr).strip().splitlines()[-20:]
        raise ClassArchiveError(
            f"the Spark driver exited with {done.returncode} without writing {partial.name}; "
            "its last lines:\n" + "\n".join(output)
        )
    partial.replace(path)


_EXERCISE_BATCHES = 3


def _exercise() -> None:
    """What `write_class_archive`'s driver runs (see there), then the JVM's orderly exit, which
    writes the archive: the gateway JVM exits when its stdin closes."""
    import pandas

    spark = local_session("smoothscale-spark-classes")
    gateway = spark.sparkContext._gateway
    assert gateway is not None, "a started session has its gateway"
    frame = spark.createDataFrame(pandas.DataFrame({"user": ["a", "b", "a"], "n": [1, 2, 3]}))
    frame.groupBy("user").count().toPandas()

    def each(batch: "DataFrame", _batch_id: int) -> None:
        batch.groupBy((batch.value % 7).alias("key")).count().collect()

    stream = spark.readStream.format("rate").option("rowsPerSecond", "100").load()
    query = stream.writeStream.foreachBatch(each).trigger(processingTime="200 milliseconds")
    running = query.start()
    while len(running.recentProgress) < _EXERCISE_BATCHES and running.isActive:
        time.sleep(0.1)
    running.stop()
    spark.stop()
    process = gateway.proc
    process.stdin.close()
    process.wait()


def _python_executable() -> str:
    """The interpreter running this process, so Spark's Python workers see the same packages."""
    return sys.executable
