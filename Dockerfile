# One image for the smoothscale operator (`smoothscale operator`) and the instances it runs
# (`smoothscale worker`): Python 3.11, a Java 17 runtime for PySpark, the pinned runtime
# dependencies and the package. docs/install.md builds it and loads it into kind.
#
#   docker build -t smoothscale:0.1.0 .

# An exact Python patch release on Debian 12 (bookworm), whose archive ships OpenJDK 17.
# Upgrade deliberately: change the tag here, rebuild, rerun the end-to-end tests.
FROM python:3.11.14-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore


# Builds every wheel the image installs: the exact runtime dependencies (the runtime subset
# of requirements/dev.lock, same pins) and the package. Some dependencies (PySpark) ship only
# source distributions; --no-build-isolation builds them with the pinned setuptools below
# instead of whatever build backend version a build would otherwise download.
FROM base AS build

# A C compiler for the package's C module (smoothscale/runtime/_changelog.c: Python's API, and
# at import the librdkafka that confluent-kafka ships: no headers); the image that runs gets
# the wheel, not the compiler.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN pip install setuptools==84.2.1
COPY requirements/runtime.lock ./requirements/runtime.lock
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .


FROM base

# The Java 17 runtime that PySpark's JVM needs, and procps (`ps`, used by Spark's launch
# scripts). Package versions are pinned by major version only (openjdk-17), not by Debian
# revision: Debian's archive keeps only the latest security update of a stable release, so an
# exact revision pin would break the build at the next JDK security release. The base image
# tag fixes the Debian release; rebuilding picks up its security fixes.
# /usr/share/man/man1 is absent from slim images, and the JRE's post-install script
# registers its man pages there.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17
ENV JAVA_HOME=/usr/lib/jvm/java-17

# Only the wheels built above (--no-index), none of their dependencies (--no-deps): the lock
# is complete, and pip check proves it.
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-index --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && pip check \
    && smoothscale --version

# The Spark driver's class-data archive (/usr/local/share/smoothscale/spark-classes.jsa, about
# 160 MB): a short Spark workload's JVM writes the classes it loaded, and every instance's
# driver starts on them, on about half the CPU (docs/runtime.md, The driver JVM).
RUN smoothscale spark-classes

# Pipelines are Python modules imported by `module:callable` (StreamingApp spec.pipeline.ref)
# from /app: an app's image is this one plus its pipeline package copied there. The examples'
# pipelines come with it, so examples/streamingapp.yaml runs on this image as it is.
ENV PYTHONPATH=/app
COPY examples/pipelines /app/examples/pipelines

# A non-root user with a numeric id (so Kubernetes can verify runAsNonRoot) and a writable
# home, which is also the working directory (Spark writes scratch files there).
RUN groupadd --gid 10001 smoothscale \
    && useradd --uid 10001 --gid 10001 --home-dir /home/smoothscale --create-home \
        --shell /usr/sbin/nologin smoothscale
ENV HOME=/home/smoothscale
WORKDIR /home/smoothscale
USER 10001:10001

LABEL org.opencontainers.image.title="smoothscale" \
      org.opencontainers.image.description="Operator and instances: scale stateful PySpark streaming apps without stopping them" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# 8080: the operator's liveness endpoint; 9090: Prometheus metrics.
EXPOSE 8080 9090

ENTRYPOINT ["smoothscale"]
CMD ["--help"]
