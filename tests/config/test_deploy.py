"""The container and Kubernetes artefacts agree with each other and with the configs they embed.
No container engine runs here, so the Dockerfile's invariants are checked by reading it; CI
installs the package exactly as the image does (.ci/container-smoke runs docker/install.sh)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from signing_proxy.config import load_config, parse_config, parse_host_port
from signing_proxy.storage.keystore import KeyStore

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_on_an_official_slim_python() -> None:
    froms = [args for op, args in dockerfile() if op == "FROM"]
    assert len(froms) >= 2
    assert all(re.match(r"python:3\.1[1-9][\w.-]*-slim", f) for f in froms)


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [args for op, args in dockerfile() if op == "USER"]
    assert users, "no USER instruction"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit()  # numeric, so runAsNonRoot can check it


def test_dockerfile_entrypoint_and_cmd_are_exec_form() -> None:
    ops = dict(dockerfile())
    assert json.loads(ops["ENTRYPOINT"]) == ["signing-proxy"]  # exec form: SIGTERM reaches the process
    cmd = json.loads(ops["CMD"])
    assert cmd[:2] == ["run", "--config"]
    assert cmd[2] == "/etc/signing-proxy/config.yaml"


def test_dockerfile_healthcheck_hits_healthz_and_data_is_a_volume() -> None:
    ops = dockerfile()
    health = [args for op, args in ops if op == "HEALTHCHECK"]
    assert health
    assert "/healthz" in health[0]
    assert "CMD [" in health[0]  # exec form, no shell needed
    volumes = [json.loads(args) for op, args in ops if op == "VOLUME"]
    assert ["/var/lib/signing-proxy"] in volumes


def test_dockerfile_copies_no_secret_and_installs_with_the_shared_script() -> None:
    ops = dockerfile()
    copies = " ".join(args for op, args in ops if op in ("COPY", "ADD"))
    assert not re.search(r"\.pem|\.key|secret|\.env\b|token", copies, re.I)
    runs = " ".join(args for op, args in ops if op == "RUN")
    assert "install-signing-proxy" in runs
    assert "docker/install.sh" in copies
    script = (ROOT / "docker/install.sh").read_text()
    assert "[fast]" in script
    assert "[test]" not in script.replace("never [test]", "")
    assert "docker/install.sh" in (ROOT / ".ci/container-smoke").read_text()
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore
    assert "**/*.pem" in ignore


def test_dockerfile_default_config_is_the_sidecar_example() -> None:
    copies = [args for op, args in dockerfile() if op == "COPY"]
    assert "config/sidecar.yaml /etc/signing-proxy/config.yaml" in copies


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes" / name).read_text()) if d]


def kind(docs: list[dict[str, Any]], k: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == k)


def embedded_config(docs: list[dict[str, Any]]) -> Any:
    return parse_config(yaml.safe_load(kind(docs, "ConfigMap")["data"]["config.yaml"]))


def container(pod: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    return next(c for c in pod["initContainers" if init else "containers"] if c["name"] == name)


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


@pytest.mark.parametrize(
    ("manifest", "example"), [("sidecar.yaml", "sidecar.yaml"), ("relay.yaml", "relay.yaml")]
)
def test_configmap_is_the_example_config(manifest: str, example: str) -> None:
    assert embedded_config(documents(manifest)) == load_config(ROOT / "config" / example)


@pytest.mark.parametrize("manifest", ["sidecar.yaml", "relay.yaml"])
def test_probes_hit_the_admin_port_and_mounts_match_the_config(manifest: str) -> None:
    docs = documents(manifest)
    config = embedded_config(docs)
    pod = kind(docs, "Deployment")["spec"]["template"]["spec"]
    proxy = container(pod, "signing-proxy")
    admin_port = parse_host_port(config.admin.listen, "admin.listen")[1]
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": admin_port}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": admin_port}
    assert proxy["args"] == ["run", "--config", "/etc/signing-proxy/config.yaml"]
    m = mounts(proxy)
    assert m["/etc/signing-proxy"]["readOnly"] is True
    assert config.data_dir in m
    assert not m[config.data_dir].get("readOnly")
    if config.signing.key:
        key_dir = os.path.dirname(config.signing.key)
        assert m[key_dir]["readOnly"] is True
        # Under fsGroup a Secret's files are root-owned and group-readable (0440): the proxy refuses
        # such a key. It reaches the proxy through memory, copied owner-only by an init container.
        volume = next(v for v in pod["volumes"] if v["name"] == m[key_dir]["name"])
        assert volume == {"name": m[key_dir]["name"], "emptyDir": {"medium": "Memory"}}
        (copier,) = [c for c in pod["initContainers"] if key_dir in mounts(c)]
        script = " ".join(copier["args"])
        assert "install -m 0600 " in script
        assert script.split("install -m 0600 ", 1)[1].split()[1] == config.signing.key
        source = script.split("install -m 0600 ", 1)[1].split()[0]
        secret_mount = mounts(copier)[os.path.dirname(source)]
        secret = next(v for v in pod["volumes"] if v["name"] == secret_mount["name"])
        assert secret["secret"]["secretName"]
        assert all(
            secret_mount["name"] not in {x["name"] for x in c.get("volumeMounts", [])}
            for c in pod["containers"]
        )  # the Secret itself is mounted in no long-lived container
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(dict(dockerfile())["USER"].split(":")[0])


def test_sidecar_agent_is_wired_to_the_proxy_and_trusts_its_ca() -> None:
    docs = documents("sidecar.yaml")
    config = embedded_config(docs)
    pod = kind(docs, "Deployment")["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in container(pod, "agent")["env"]}
    _host, port = parse_host_port(config.listen, "listen")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == f"http://127.0.0.1:{port}"
    assert env["NODE_USE_ENV_PROXY"] == "1"
    init = container(pod, "signing-proxy-ca", init=True)
    script = " ".join(init["args"])
    agent_mounts = mounts(container(pod, "agent"))
    for variable in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        path = env[variable]
        directory = os.path.dirname(path)
        assert path in script, f"{variable}={path} is not written by the init container"
        assert agent_mounts[directory]["readOnly"] is True
        assert directory in mounts(init)
    assert config.data_dir not in agent_mounts  # the CA private key never reaches the agent
    route = config.routes[0]
    assert env["EXCHANGE_BASE_URL"] == f"http://127.0.0.1:{port}{route.prefix}"


def test_relay_service_exposes_the_proxy_and_publish_ports() -> None:
    docs = documents("relay.yaml")
    config = embedded_config(docs)
    ports = {p["name"]: p["targetPort"] for p in kind(docs, "Service")["spec"]["ports"]}
    assert ports["proxy"] == parse_host_port(config.listen, "listen")[1]
    assert config.publish.listen is not None
    assert ports["publish"] == parse_host_port(config.publish.listen, "publish.listen")[1]
    assert config.mode == "relay"


def test_fleet_runs_three_replicas_a_budget_and_probes_on_the_admin_port() -> None:
    docs = documents("fleet.yaml")
    config = embedded_config(docs)
    deployment = kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    budget = kind(docs, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert 1 <= budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    assert kind(docs, "Service")["spec"]["selector"] == labels
    pod = deployment["spec"]["template"]["spec"]
    proxy = container(pod, "signing-proxy")
    admin_port = parse_host_port(config.admin.listen, "admin.listen")[1]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": admin_port}
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": admin_port}
    assert config.signing.key is None  # the key store signs: rotation, publication
    assert config.publish.listen is not None
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(dict(dockerfile())["USER"].split(":")[0])


def test_fleet_delivers_the_store_as_a_secret_to_the_key_sync_only() -> None:
    docs = documents("fleet.yaml")
    config = embedded_config(docs)
    pod = kind(docs, "Deployment")["spec"]["template"]["spec"]
    secret_name = kind(docs, "Secret")["metadata"]["name"]
    volume = next(v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret_name)
    assert volume["secret"]["defaultMode"] == 0o440  # what the kubelet makes of 0400 under fsGroup
    store = f"{config.data_dir}/keys/{config.signing.agent}"
    script = kind(docs, "ConfigMap")["data"]["key-sync.sh"]
    assert f'dst="${{KEY_SYNC_TO:-{store}}}"' in script
    for sync in (container(pod, "key-sync-first", init=True), container(pod, "key-sync")):
        m = mounts(sync)
        secret_mount = next(path for path, mount in m.items() if mount["name"] == volume["name"])
        assert m[secret_mount]["readOnly"] is True
        assert f'src="${{KEY_SYNC_FROM:-{secret_mount}}}"' in script
        assert config.data_dir in m
    assert volume["name"] not in {m["name"] for m in container(pod, "signing-proxy")["volumeMounts"]}
    assert "--watch" in container(pod, "key-sync")["command"]
    assert "--watch" not in container(pod, "key-sync-first", init=True)["command"]


def test_fleet_key_sync_copies_a_rotated_store_that_the_proxy_accepts(tmp_path: Path) -> None:
    """The ConfigMap's key-sync.sh, run with sh on a store laid out as the Secret mounts it (files
    0440), gives a store the key store loads; after a rotation and a prune it follows, index last."""
    script = tmp_path / "key-sync.sh"
    script.write_text(kind(documents("fleet.yaml"), "ConfigMap")["data"]["key-sync.sh"])
    master = KeyStore(tmp_path / "master")
    master.create(T0, lifetime_s=86_400)
    secret = tmp_path / "secret"
    replica = KeyStore(tmp_path / "replica")
    env = {**os.environ, "KEY_SYNC_FROM": str(secret), "KEY_SYNC_TO": str(replica.path)}

    def deliver_and_sync() -> None:
        shutil.rmtree(secret, ignore_errors=True)
        secret.mkdir()
        for path in master.path.iterdir():
            if path.name != ".lock":
                shutil.copyfile(path, secret / path.name)
                (secret / path.name).chmod(0o440)
        done = subprocess.run(
            ["sh", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr

    deliver_and_sync()
    first = master.load(private=False).records[0].thumbprint
    assert replica.index_path.read_bytes() == master.index_path.read_bytes()
    assert replica.key_path(first).read_bytes() == master.key_path(first).read_bytes()
    assert set(replica.load(private=True).private) == {first}
    for path in replica.path.iterdir():
        assert path.stat().st_mode & 0o077 == 0, path
    old = first
    master.rotate(T0 + 10, activate_in_s=0, grace_s=3600, lifetime_s=86_400)
    master.prune(T0 + 10 + 3600 + 1)
    deliver_and_sync()
    state = replica.load(private=True)
    assert [r.thumbprint for r in state.records] == [r.thumbprint for r in master.load(private=False).records]
    assert old not in state.private
    assert not replica.key_path(old).exists()  # a pruned key's private file is gone from the replica


def test_gateway_manifest_two_replicas_sharing_the_redis_service() -> None:
    docs = documents("gateway.yaml")
    config = embedded_config(docs)
    assert config == load_config(ROOT / "config" / "gateway.yaml")
    assert config.mode == "gateway"
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    gateway = deployments["signing-proxy-gateway"]
    assert gateway["spec"]["replicas"] == 2
    pod = gateway["spec"]["template"]["spec"]
    proxy = container(pod, "signing-proxy")
    assert proxy["args"] == ["gateway", "--config", "/etc/signing-proxy/config.yaml"]
    admin_port = parse_host_port(config.admin.listen, "admin.listen")[1]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": admin_port}
    assert config.data_dir in mounts(proxy)
    assert pod["securityContext"]["runAsUser"] == int(dict(dockerfile())["USER"].split(":")[0])
    ports = {p["name"]: p["targetPort"] for p in services["signing-proxy-gateway"]["spec"]["ports"]}
    assert ports["gateway"] == parse_host_port(config.listen, "listen")[1]
    # the store URL names the Redis Service and its port; that Service selects the Redis pods
    store = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", config.gateway.store)
    assert store is not None
    redis = services[store.group(1)]
    assert {p["port"] for p in redis["spec"]["ports"]} == {int(store.group(2))}
    selected = redis["spec"]["selector"]
    redis_pod = next(
        d for d in deployments.values() if d["spec"]["template"]["metadata"]["labels"] == selected
    )
    assert redis_pod["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == int(
        store.group(2)
    )
