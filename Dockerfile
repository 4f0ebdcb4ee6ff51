# One image for every binlake role in docker-compose.yaml: registry, Pumps,
# Airflow components and the Spark master/worker (Spark comes from the pinned
# pyspark wheel, so drivers and executors share one Spark and one Python).
#
# The build stage runs the same scripts/setup.sh as a developer machine; only
# its results (.venv and jars/lib) reach the runtime stage, not Maven's cache.

FROM python:3.11-slim-bookworm AS base
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1
# Spark needs a JVM at run time; procps gives Spark's scripts `ps`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

# gcc builds binlake's C extensions (binlake.lake.decoding._imagec, binlake.source.mysql._rowsc and _framec,
# binlake.source.postgres._pgoutc) during setup.
FROM base AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/binlake
COPY . .
# A checkout's own .venv and jars/lib were made for its host: rebuild both here.
# psycopg2: the Airflow metadata database in docker-compose.yaml is PostgreSQL.
RUN rm -rf .venv jars/lib .git \
 && PY=python3 bash scripts/setup.sh \
 && .venv/bin/pip install -q "psycopg2-binary>=2.9.10,<3"

FROM base
COPY --from=build /opt/binlake /opt/binlake
WORKDIR /opt/binlake
ENV PATH=/opt/binlake/.venv/bin:$PATH \
    BINLAKE_JARS_DIR=/opt/binlake/jars/lib \
    AIRFLOW_HOME=/opt/airflow
CMD ["binlake", "--help"]
