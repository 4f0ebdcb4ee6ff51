"""The lake's S3 settings: which are in force, and how each engine is given them.

Credentials and endpoint come from, in this order: the ``AWS_*`` environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``), then
``BINLAKE_LAKE_S3_*``, then the ``[lake.s3]`` table of the config file. They are
never taken from a command line and never logged (``S3Settings.__repr__`` hides
the secret; Spark redacts ``fs.s3a.*key`` confs).

Past reading the settings, translations without I/O: the Hadoop ``fs.s3a.*`` confs for Spark
(``hadoop_conf``, ``spark_conf``), the ``AWS_*`` environment of a child process
(``aws_env``) and the ``storage_options`` of delta-rs. Below both the Spark
sessions (``binlake.lake.sparkenv``) and the store (``binlake.lake.store``),
which each hand these to their engine.
"""

from __future__ import annotations

from binlake import config
from binlake.config import S3Settings


def s3_settings() -> S3Settings:
    """The S3 settings in force: AWS_* > BINLAKE_LAKE_S3_* > [lake.s3] of the command's
    --config > defaults (``binlake.config.S3Settings``; in the DAGs' tasks the
    ``binlake_lake_s3`` Connection comes first)."""
    return config.load(S3Settings)


def hadoop_conf(settings: S3Settings | None = None) -> dict[str, str]:
    """The ``fs.s3a.*`` Hadoop confs for Spark. Static credentials when given (the
    keys Spark's redaction hides), else the SDK's default chain (env, profile, IMDS)."""
    s = settings or s3_settings()
    conf = {
        "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.path.style.access": "true" if s.path_style else "false",
        "fs.s3a.endpoint.region": s.region,
        # Fail a dead endpoint in seconds rather than after the SDK's long default retries.
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.retry.limit": "3",
        "fs.s3a.connection.establish.timeout": "5s",
        "fs.s3a.connection.timeout": "60s",
    }
    if s.endpoint_url:
        conf["fs.s3a.endpoint"] = s.endpoint_url
        conf["fs.s3a.connection.ssl.enabled"] = "false" if s.allow_http else "true"
    if s.access_key_id and s.secret_access_key:
        conf["fs.s3a.access.key"] = s.access_key_id
        conf["fs.s3a.secret.key"] = s.secret_access_key
        if s.session_token:
            conf["fs.s3a.session.token"] = s.session_token
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf


# Confs that carry a secret: never given at a session start, because pyspark puts
# start confs on the JVM's command line (visible to every user of the host).
_SECRET_CONFS = ("fs.s3a.access.key", "fs.s3a.secret.key", "fs.s3a.session.token", "fs.s3a.aws.credentials.provider")


def spark_conf(settings: S3Settings | None = None) -> dict[str, str]:
    """``hadoop_conf`` without its secrets as Spark session confs (``spark.hadoop.``
    prefix), for a session or server start. The keys reach that JVM through its
    environment (``aws_env``; s3a's default credential chain reads AWS_*), or
    ``configure_spark`` over py4j once it runs."""
    return {f"spark.hadoop.{k}": v for k, v in hadoop_conf(settings).items() if k not in _SECRET_CONFS}


def aws_env(settings: S3Settings | None = None) -> dict[str, str]:
    """The AWS_* variables for a child process (a Spark server, spark-submit) that must
    reach the lake with the settings in force here, wherever they came from."""
    s = settings or s3_settings()
    env = {"AWS_REGION": s.region}
    if s.endpoint_url:
        env["AWS_ENDPOINT_URL"] = s.endpoint_url
    if s.access_key_id and s.secret_access_key:
        env["AWS_ACCESS_KEY_ID"] = s.access_key_id
        env["AWS_SECRET_ACCESS_KEY"] = s.secret_access_key
        if s.session_token:
            env["AWS_SESSION_TOKEN"] = s.session_token
    return env


def storage_options(settings: S3Settings | None = None) -> dict[str, str]:
    """delta-rs ``storage_options`` for an S3 lake (reads only: no locking provider)."""
    s = settings or s3_settings()
    # The region, endpoint and keys a child process gets, under the same names, plus
    # what only delta-rs's object store reads.
    opts = {**aws_env(s), "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if s.path_style else "true"}
    if s.endpoint_url and s.allow_http:
        opts["AWS_ALLOW_HTTP"] = "true"
    return opts
