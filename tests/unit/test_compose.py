"""docker-compose.yaml stays consistent: references resolve, Pumps are distinct, volumes declared.

The structural checks run everywhere (PyYAML only); the full validation by
``docker compose config`` runs where the docker CLI has the compose plugin.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # safe_load resolves anchors and `<<` merge keys, as compose itself does.
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def _depends_on(service: dict[str, Any]) -> list[str]:
    deps = service.get("depends_on") or []
    return list(deps) if isinstance(deps, dict | list) else []


def _named_volumes(service: dict[str, Any]) -> Iterator[str]:
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            if entry.get("type", "volume") == "volume" and entry.get("source"):
                yield entry["source"]
            continue
        source = str(entry).split(":", 1)[0]
        # A source without ':' is an anonymous volume; paths are bind mounts.
        if ":" in str(entry) and not source.startswith((".", "/", "~", "$")):
            yield source


def _flag(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def _pumps(compose: dict[str, Any]) -> dict[str, list[str]]:
    pumps = {}
    for name, service in compose["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command[:2] == ["binlake", "pump"]:
            pumps[name] = [str(part) for part in command]
    return pumps


def test_depends_on_targets_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    missing = {
        (name, dep)
        for name, service in services.items()
        for dep in _depends_on(service)
        if dep not in services
    }
    assert not missing, f"depends_on names unknown services: {sorted(missing)}"


def test_healthy_conditions_have_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        deps = service.get("depends_on")
        if not isinstance(deps, dict):
            continue
        for dep, spec in deps.items():
            if (spec or {}).get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], (
                    f"{name} waits for {dep} to be healthy, which has no healthcheck"
                )


def test_three_distinct_pumps(compose: dict[str, Any]) -> None:
    pumps = _pumps(compose)
    assert len(pumps) == 3, sorted(pumps)
    node_ids = {_flag(cmd, "--node-id") for cmd in pumps.values()}
    advertised = {_flag(cmd, "--advertise-addr") for cmd in pumps.values()}
    assert len(node_ids) == 3, node_ids
    assert len(advertised) == 3, advertised
    # Clients dial the advertised address, so its host must be a service on the network.
    for addr in advertised:
        assert addr.rsplit(":", 1)[0] in compose["services"], addr
    # Two Pumps sharing a data dir would corrupt each other's value log.
    data_volumes = [tuple(_named_volumes(compose["services"][name])) for name in pumps]
    assert len(set(data_volumes)) == 3 and all(data_volumes), data_volumes


def test_every_registry_client_names_the_whole_group(compose: dict[str, Any]) -> None:
    """Every service that names the registry (a ``--registry`` flag, BINLAKE_REGISTRY,
    BINLAKE_CLIENT_REGISTRY) gives every member of the group, so it can follow the
    leader wherever it moves."""
    members = {_flag([str(p) for p in service["command"]], "--addr")
               for service in compose["services"].values()
               if isinstance(service.get("command"), list) and service["command"][:2] == ["binlake", "registry"]}
    assert len(members) >= 2, members
    named = {}
    for name, service in compose["services"].items():
        command = [str(p) for p in service.get("command") or []] if isinstance(service.get("command"), list) else []
        if "--registry" in command:
            named[f"{name} --registry"] = _flag(command, "--registry")
        env = service.get("environment") or {}
        for key in ("BINLAKE_REGISTRY", "BINLAKE_CLIENT_REGISTRY"):
            if isinstance(env, dict) and key in env:
                named[f"{name} {key}"] = str(env[key])
    assert len(named) >= 3, named
    partial = {k: v for k, v in named.items() if set(v.split(",")) != members}
    assert not partial, f"not the whole registry group {sorted(members)}: {partial}"


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used = {(name, vol) for name, service in compose["services"].items() for vol in _named_volumes(service)}
    undeclared = sorted((name, vol) for name, vol in used if vol not in declared)
    assert not undeclared, f"volumes used but not declared: {undeclared}"


def test_the_lake_is_in_the_bucket_and_no_service_shares_a_volume(compose: dict[str, Any]) -> None:
    from binlake.lake.store import location

    services = compose["services"]
    store = services["seaweedfs"]
    lake_users = {name: s["environment"] for name, s in services.items()
                  if isinstance(s.get("environment"), dict) and "BINLAKE_LAKE_DIR" in s["environment"]}
    # Every Airflow component and the Spark side (Connect server, workers) reach the lake.
    assert {"airflow-scheduler", "airflow-triggerer", "spark-connect", "spark-worker1", "spark-worker2"} <= set(lake_users)
    for name, env in lake_users.items():
        where = location.parse(env["BINLAKE_LAKE_DIR"])
        assert where.is_s3 and where.bucket == "lake", name
        assert env["AWS_ENDPOINT_URL"] == "http://seaweedfs:8333", name
        assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"], name
        if name not in ("seaweedfs", "airflow-init"):  # the store itself; the one-shot schema migration
            assert "seaweedfs" in _depends_on(services[name]), f"{name} must wait for the lake's store"
    assert "-bucket=lake" in store["command"][-1]
    # Each named volume belongs to one service: the lake's hosts share nothing but the
    # bucket (the Airflow components' task logs stay one volume, as on one Airflow host).
    owners: dict[str, list[str]] = {}
    for name, service in services.items():
        for volume in _named_volumes(service):
            owners.setdefault(volume, []).append(name)
    shared = {v: names for v, names in owners.items() if len(names) > 1 and v != "airflow-logs"}
    assert not shared, shared


def test_build_reference_is_real(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (REPO_ROOT / context / dockerfile).is_file(), f"{name}: no {dockerfile} in {context}"


def test_docker_compose_config() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI on this machine")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip("the docker CLI has no compose plugin (`docker compose version` failed)")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_spark_master_and_two_workers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    master = services["spark-master"]
    assert master["command"][:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    url = f"spark://spark-master:{_flag(master['command'], '--port')}"
    workers = {name: s for name, s in services.items()
               if (s.get("command") or [None, None])[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]}
    assert sorted(workers) == ["spark-worker1", "spark-worker2"]
    for name, worker in workers.items():
        # Each registers with that master once it is healthy.
        assert worker["command"][2] == url, name
        assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy", name
    # The DAGs' Spark jobs (and the Connect server) run on that cluster.
    env = services["airflow-scheduler"]["environment"]
    assert env["BINLAKE_SPARK_MASTER"] == url
    assert _flag(services["spark-connect"]["command"], "--master") == url


def _default(value: object) -> str:
    """The default of a ``${NAME:-default}`` value (the value itself when it is none)."""
    import re

    match = re.fullmatch(r"\$\{(\w+):-([^}]*)\}", str(value))
    return match.group(2) if match else str(value)


def _bytes(amount: str) -> int:
    return int(amount[:-1]) << (30 if amount[-1].lower() == "g" else 20)


def test_spark_services_get_the_memory_settings(compose: dict[str, Any]) -> None:
    """The services that run or drive Spark jobs have every [memory] setting, each
    overridable from the environment, with defaults binlake accepts; the executors'
    heap fits in what a worker offers."""
    from binlake import config

    services = compose["services"]
    names = list(config.MemorySettings.model_fields)
    spark_jobs = ["spark-connect", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                  "airflow-apiserver"]
    for name in spark_jobs:
        env = services[name]["environment"]
        for field in names:
            var = config.env_names(config.MemorySettings, field)[0]
            assert str(env.get(var, "")).startswith(f"${{{var}:-"), (name, var, env.get(var))
        defaults = {field: _default(env[config.env_names(config.MemorySettings, field)[0]]) for field in names}
        settings = config.MemorySettings(**defaults)  # type: ignore[arg-type]  # strings, as from the environment
        worker = _flag([str(p) for p in services["spark-worker1"]["command"]], "--memory")
        assert _bytes(settings.executor) <= _bytes(_default(worker)), (settings.executor, worker)
        # Two workers and the Connect server's driver on one 24 GiB host, with room for the rest.
        assert 2 * _bytes(_default(worker)) + _bytes(settings.driver) <= 12 << 30


def test_every_registry_member_creates_the_cluster_with_the_same_replication(compose: dict[str, Any]) -> None:
    """``--replicas`` applies from ts 0 only when the store is created, and whichever
    member starts first creates it: every member must give the same value."""
    values = {name: _flag([str(p) for p in service["command"]], "--replicas")
              for name, service in compose["services"].items()
              if isinstance(service.get("command"), list) and service["command"][:2] == ["binlake", "registry"]}
    assert len(values) >= 2 and len(set(values.values())) == 1, values
