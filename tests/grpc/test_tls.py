"""TLS and mutual TLS on every gRPC service: with ``[security] ca/cert/key`` set,
the registry, a Pump and a writer's TxnStatus service speak TLS, the whole
write/read path works through ``binlake.rpc``'s servers and channels, and a
client without a certificate, or with one from another CA, is refused."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterator

import grpc
import pytest
from pumpkit import PumpFactory, commit, prewrite, start_registry, wait_until
from tlskit import CA, Leaf

from binlake import cli, config, errors, net, rpc
from binlake.client import txn_status as status_client
from binlake.client.pump_client import PumpClient
from binlake.client.reader import pull_window
from binlake.proto import registry_pb2, registry_pb2_grpc
from binlake.registry.client import RegistryClient
from binlake.writer import txn_status


@pytest.fixture
def pki(tmp_path: pathlib.Path) -> tuple[CA, Leaf, CA]:
    ca = CA(tmp_path / "ca")
    return ca, ca.issue("node"), CA(tmp_path / "other", "another CA")


@pytest.fixture
def mutual_tls(pki: tuple[CA, Leaf, CA]) -> Iterator[net.TLSFiles]:
    ca, leaf, _ = pki
    files = net.TLSFiles(str(ca.pem), str(leaf.cert), str(leaf.key))
    rpc.configure_tls(files)
    yield files
    rpc.configure_tls(None)


def get_cluster_info(ch: grpc.Channel) -> registry_pb2.GetClusterInfoResp:
    return registry_pb2_grpc.RegistryStub(ch).GetClusterInfo(registry_pb2.GetClusterInfoReq(), timeout=3)


def test_tls_cluster_path_and_refused_clients(
    mutual_tls: net.TLSFiles, pki: tuple[CA, Leaf, CA], tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture,
) -> None:
    ca, _, other = pki
    caplog.set_level(logging.DEBUG)
    registry = start_registry(tmp_path / "registry")
    pumps = PumpFactory(registry.addr, tmp_path / "pumps")
    provider = txn_status.MemoryStatusProvider()
    provider.set_committed(12345, 12346)
    status_server = txn_status.TxnStatusServer(provider).start()
    try:
        node = pumps.start("p1", fake_binlog_interval_s=0.3)
        with RegistryClient(registry.addr) as reg, PumpClient(registry.addr) as client:
            start = reg.get_ts()
            node_id = client.write_prewrite(prewrite(start))
            commit_ts = reg.get_ts()
            client.write_commit(commit(start, commit_ts), node_id)
            wait_until(lambda: node.storage.safe_ts > commit_ts, 10, what="safe ts past the transaction")
            assert [b.start_ts for b in pull_window({"p1": node.addr}, start, commit_ts + 1)] == [start]
        # The writer's status service, as a Pump asks it about a missing commit.
        assert status_client.query_status(status_server.addr, 12345) == (status_client.COMMITTED, 12346)

        # Plaintext, no client certificate, or one from another CA: refused.
        with grpc.insecure_channel(registry.addr) as ch, pytest.raises(grpc.RpcError) as plain:
            get_cluster_info(ch)
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
        no_cert = grpc.ssl_channel_credentials(root_certificates=ca.pem.read_bytes())
        strange = other.issue("intruder")
        foreign = grpc.ssl_channel_credentials(
            root_certificates=ca.pem.read_bytes(), private_key=strange.key.read_bytes(),
            certificate_chain=strange.cert.read_bytes())
        for creds in (no_cert, foreign):
            for addr in (registry.addr, node.addr, status_server.addr):
                with grpc.secure_channel(addr, creds) as ch, pytest.raises(grpc.RpcError) as refused:
                    get_cluster_info(ch)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, addr
        # A certificate from the right CA gets in.
        good = ca.issue("operator")
        creds = grpc.ssl_channel_credentials(ca.pem.read_bytes(), good.key.read_bytes(), good.cert.read_bytes())
        with grpc.secure_channel(registry.addr, creds) as ch:
            assert get_cluster_info(ch).cluster_id > 0
    finally:
        status_server.stop(0.2)
        pumps.stop_all()
        registry.stop(0.5)
    key_text = pathlib.Path(mutual_tls.key or "").read_text().splitlines()[1]
    assert all(key_text not in r.getMessage() for r in caplog.records)


def test_security_settings_from_flags_env_and_file(
    pki: tuple[CA, Leaf, CA], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ca, leaf, _ = pki
    try:
        # Environment.
        monkeypatch.setenv("BINLAKE_SECURITY_CA", str(ca.pem))
        monkeypatch.setenv("BINLAKE_SECURITY_CERT", str(leaf.cert))
        monkeypatch.setenv("BINLAKE_SECURITY_KEY", str(leaf.key))
        rpc.configure_tls(None)
        assert rpc.tls() == net.TLSFiles(str(ca.pem), str(leaf.cert), str(leaf.key))
        for name in ("CA", "CERT", "KEY"):
            monkeypatch.delenv(f"BINLAKE_SECURITY_{name}")
        # The config file's [security] table.
        toml = tmp_path / "b.toml"
        toml.write_text(f'[security]\nca = "{ca.pem}"\ncert = "{leaf.cert}"\nkey = "{leaf.key}"\n')
        assert config.load(config.SecuritySettings, toml).files().cert == str(leaf.cert)
        # Flags: a key without a cert, or a file that is not there, is one clear line.
        assert cli.main(["--key", str(leaf.key), "ctl", "ts", "--registry", "127.0.0.1:1"]) == 2
        assert "cert and key go together" in capsys.readouterr().err
        assert cli.main(["--ca", str(tmp_path / "nope.pem"), "ctl", "ts", "--registry", "127.0.0.1:1"]) == 2
        err = capsys.readouterr().err
        assert "nope.pem" in err and "readable PEM" in err and "Traceback" not in err
        with pytest.raises(errors.InvalidArgument, match="not a PEM file"):
            rpc.configure_tls(net.TLSFiles(ca=str(toml)))
    finally:
        rpc.configure_tls(None)
    # --help shows no key material and no defaults taken from the environment.
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    assert "--cert" in help_text and "BEGIN" not in help_text and str(leaf.key) not in help_text
