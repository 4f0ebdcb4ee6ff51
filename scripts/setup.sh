#!/usr/bin/env bash
# Installs everything binlake needs on a fresh machine, into .venv and jars/lib.
# Idempotent: a second run finds everything in place and returns quickly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade "pip>=24" wheel

echo "[setup] installing Python packages (pinned by constraints.txt)"
.venv/bin/pip install -q -c constraints.txt -e ".[dev]"
# The Airflow Spark provider depends on pyspark-client, which ships a subset of
# pyspark's own files under the same package name; reinstall pyspark last so
# its full tree wins (both are pinned to the same version).
want=$(grep -E '^pyspark==' constraints.txt | cut -d= -f3)
have=$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || true)
if [ "$have" != "$want" ] || ! .venv/bin/python -c 'from pyspark.core.status import SparkExecutorInfo' 2>/dev/null; then
  .venv/bin/pip install -q --force-reinstall --no-deps "pyspark==$want"
fi

# etcd: the store of a registry group across hosts, and what its tests start
# (binlake.testing.etcdcluster). Debian's etcd-server (3.4); only when missing.
if ! command -v etcd >/dev/null && [ ! -x /usr/bin/etcd ]; then
  echo "[setup] installing etcd-server"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends etcd-server
fi

if ! ls jars/lib/delta-spark_*.jar >/dev/null 2>&1 || ! ls jars/lib/hadoop-aws-*.jar >/dev/null 2>&1; then
  echo "[setup] fetching the Delta Lake and S3 (hadoop-aws, AWS SDK v2) jars with Maven into jars/lib"
  command -v mvn >/dev/null || { apt-get update -qq && apt-get install -y -qq maven; }
  # Spark ships scala-library, antlr4-runtime, netty, slf4j, commons-codec/logging and httpclient 4 itself: take only
  # the jars it lacks (two copies of netty on one classpath break Spark's own RPC).
  (cd jars && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime \
      -DexcludeGroupIds=org.scala-lang,org.antlr,io.netty,org.slf4j,commons-codec,commons-logging,org.apache.httpcomponents,org.apache.httpcomponents.client5,org.apache.httpcomponents.core5 \
      -DexcludeArtifactIds=apache5-client -DoutputDirectory=lib)
fi
# Chromium and its driver, for the browser test of the restore trigger form (skipped without them).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "[setup] installing chromium and chromium-driver (the trigger-form test)"
  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver \
    || echo "[setup] could not install chromium; the browser test will be skipped"
fi
echo "[setup] done: $(ls jars/lib | tr '\n' ' ')"
