"""The Kubernetes manifests (deploy/kubernetes/, docs/kubernetes.md), checked without a cluster.

Every overlay is rendered with `kubectl kustomize` (skipped, saying so, where kubectl is absent) and
each object validated against the Kubernetes API's own schemas (the `kubernetes-validate` package:
its schemas ship inside it, so this runs offline), strictly: an unknown field fails. KEDA's
ScaledObject has no schema there; its fields are checked here one by one, its HPA behaviour against
the HPA's schema. Then what the schemas cannot know: each container's command is parsed by Shoal's
own parser for that service, each SHOAL_* variable is a setting of that service (or one Shoal reads
by name), the credentials each service is given are mounted where it is told to look, the probes
ask a port the service serves, the grace periods cover what the services take to stop, every
budget and autoscaler names a Deployment that exists, and the queries ask metrics the gateway renders.
Not marked `deploy`: it runs in the normal suite, in a few seconds.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.process import settings as s
from shoal.cli import SERVICES

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ["cpu", "cpu-hpa", "gpu"]
# the oldest Kubernetes still commonly run, and the newest the validator knows
VERSIONS = ["1.30.0"]
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: the manifests cannot be rendered")
validator = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install 'shoal[test]')"
)
VERSIONS.append(validator.latest_version())

# ScaledObject's spec fields (KEDA 2.x, keda.sh/v1alpha1), and the trigger fields used here
SCALED_OBJECT_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics"}
PROMETHEUS_METADATA = {
    "serverAddress",
    "query",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
}


def render(overlay: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(KUBE / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.fixture(scope="module", params=OVERLAYS)
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the manifests cannot be rendered")
    return render(request.param)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def shoal_containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for deployment in of_kind(objects, "Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            if container["image"].split(":")[0].rsplit("/", 1)[-1] == "shoal":
                yield deployment, container


def parse(container: dict[str, Any], environ: dict[str, str]) -> tuple[str, Any]:
    """The container's command through `shoal <service>`'s own parser and settings (shoal/cli.py),
    with its environment: what the service would run with, or the error it would stop with."""
    service, argv = container["args"][0], container["args"][1:]
    assert service in SERVICES, f"{container['name']}: `shoal {service}` is not a service"
    parser = argparse.ArgumentParser(prog=f"shoal {service}", exit_on_error=False)
    s.add_arguments(parser, SERVICES[service])
    namespace = parser.parse_args(argv)
    saved = dict(os.environ)
    try:
        os.environ.update(environ)
        return service, s.from_namespace(SERVICES[service], namespace)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def variables_read_by_name() -> set[str]:
    """SHOAL_* variables Shoal's code reads itself, outside the settings classes."""
    found: set[str] = set()
    for folder in ("shared", "services", "shoal", "inference"):
        for path in (ROOT / folder).rglob("*.py"):
            found |= set(re.findall(r"environ(?:\.get\(|\[)\s*\"(SHOAL_[A-Z0-9_]+)\"", path.read_text()))
    return found


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str) -> None:
    checked = 0
    for obj in render(overlay):
        if obj["apiVersion"].startswith("keda.sh/"):
            continue  # no schema in kubernetes-validate: test_scaled_objects checks it
        for version in VERSIONS:
            validator.validate(obj, version, strict=True)
        checked += 1
    assert checked >= 10


def test_a_wrong_field_is_caught(objects: list[dict[str, Any]]) -> None:
    """The validation is strict: a misspelt field fails it (it would be dropped silently by kubectl)."""
    deployment = copy.deepcopy(of_kind(objects, "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(validator.ValidationError):
        validator.validate(deployment, VERSIONS[0], strict=True)


def test_every_container_runs_a_command_and_environment_shoal_accepts(objects: list[dict[str, Any]]) -> None:
    by_name = variables_read_by_name()
    assert {"SHOAL_KV_REPLICAS", "SHOAL_LOG_JSON"} <= by_name
    services = set()
    for deployment, container in shoal_containers(objects):
        environ = {e["name"]: e["value"] for e in container.get("env", [])}
        service, settings = parse(container, environ)
        services.add(service)
        prefix = SERVICES[service].model_config["env_prefix"]
        for name in environ:
            assert name.startswith("SHOAL_"), name
            if name in by_name:
                continue
            assert name.startswith(prefix), (
                f"{deployment['metadata']['name']}: {name} is not a `shoal {service}` setting"
            )
            field = name.removeprefix(prefix).lower()
            assert field in SERVICES[service].model_fields, f"{name}: no setting '{field}' in {prefix}*"
        assert int(environ.get("SHOAL_KV_REPLICAS", "3")) == 3  # the chart's three nodes
        assert settings.nats_url == "nats://nats:4222"  # the Helm release `nats`'s client Service
    assert services == {"repository", "scheduler", "gateway", "worker"}


def test_a_bad_flag_or_value_is_caught(objects: list[dict[str, Any]]) -> None:
    _, container = next(shoal_containers(objects))
    wrong = {**container, "args": [container["args"][0], "--no-such-flag", "1"]}
    with pytest.raises((SystemExit, argparse.ArgumentError)):
        parse(wrong, {})
    scheduler = {"name": "s", "args": ["scheduler"]}
    with pytest.raises(ValueError):  # pydantic's ValidationError: an int setting given a word
        parse(scheduler, {"SHOAL_SCHEDULER_HEALTH_PORT": "eighty"})


def test_each_service_finds_its_credentials_and_the_ca_where_it_is_told(objects: list[dict[str, Any]]) -> None:
    for deployment, container in shoal_containers(objects):
        service, settings = parse(container, {e["name"]: e["value"] for e in container.get("env", [])})
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        mounted: dict[str, str] = {}  # file path in the container -> Secret key
        for mount in container["volumeMounts"]:
            secret = volumes[mount["name"]].get("secret")
            if secret:
                assert secret["secretName"] == "shoal-credentials"
                assert mount.get("readOnly") is True
                for item in secret["items"]:
                    mounted[f"{mount['mountPath']}/{item['path']}"] = item["key"]
        files = [settings.nats_credentials] + ([settings.instance_credentials] if service == "worker" else [])
        for file in files:
            assert file in mounted, f"{deployment['metadata']['name']}: {file} is not mounted"
            # the CA is looked for beside the identity (shared/bus/connection.py)
            assert mounted.get(str(Path(file).parent / "ca.pem")) == "ca.pem"
        kinds = {key.removesuffix(".nk") for key in mounted.values() if key.endswith(".nk")}
        assert kinds == ({"worker", "instance"} if service == "worker" else {service}), "only its own identity"


def test_probes_ask_triton_health_paths_on_a_port_the_service_serves(objects: list[dict[str, Any]]) -> None:
    for deployment, container in shoal_containers(objects):
        service, settings = parse(container, {e["name"]: e["value"] for e in container.get("env", [])})
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        served = settings.http_port if service == "gateway" else settings.health_port
        assert served, f"{service} serves no health endpoint"
        for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
            get = container[probe]["httpGet"]
            assert get["path"] == path
            assert ports[get["port"]] == served, f"{deployment['metadata']['name']} {probe} asks a port not served"
        assert container["startupProbe"]["httpGet"]["path"].startswith("/v2/health/")


def test_grace_periods_cover_what_each_service_takes_to_stop(objects: list[dict[str, Any]]) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    scheduler_grace = int(compose["services"]["scheduler"]["stop_grace_period"].removesuffix("s"))
    for deployment, container in shoal_containers(objects):
        service, settings = parse(container, {e["name"]: e["value"] for e in container.get("env", [])})
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        if service == "gateway":
            pause = container["lifecycle"]["preStop"]["exec"]["command"]
            assert pause[0] == "sleep"
            assert grace >= settings.exit_timeout_s + int(pause[1]) + 5
        elif service == "scheduler":
            assert grace >= scheduler_grace
        else:
            assert grace >= 30


def test_the_gateway_service_publishes_http_grpc_and_metrics(objects: list[dict[str, Any]]) -> None:
    (service,) = of_kind(objects, "Service")
    gateway = next(c for d, c in shoal_containers(objects) if c["args"][0] == "gateway")
    _, settings = parse(gateway, {})
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    published = {p["port"]: ports[p["targetPort"]] for p in service["spec"]["ports"]}
    assert published == {8000: settings.http_port, 8001: settings.grpc_port, 8002: settings.metrics_port}
    assert published == {8000: 8000, 8001: 8001, 8002: 8002}
    pods = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "shoal-gateway")
    assert service["spec"]["selector"].items() <= pods["spec"]["template"]["metadata"]["labels"].items()


def test_budgets_and_autoscalers_name_what_exists(objects: list[dict[str, Any]]) -> None:
    deployments = {d["metadata"]["name"]: d for d in of_kind(objects, "Deployment")}
    budgeted = set()
    for budget in of_kind(objects, "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"].items()
        matched = [n for n, d in deployments.items() if selector <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, f"{budget['metadata']['name']} selects {matched}"
        budgeted.add(matched[0])
    # everything but the one repository (its PDB would block every drain) has a budget
    assert budgeted == set(deployments) - {"shoal-repository"}
    scaled = []
    for scaler in of_kind(objects, "HorizontalPodAutoscaler") + of_kind(objects, "ScaledObject"):
        target = scaler["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        scaled.append(target["name"])
    assert len(scaled) == len(set(scaled)), "two autoscalers on one Deployment fight"
    assert "shoal-worker" in scaled and "shoal-gateway" in scaled
    gpu = [c for _, c in shoal_containers(objects) if "nvidia.com/gpu" in c["resources"].get("limits", {})]
    for container in gpu:
        assert container["image"].endswith(":gpu")


def test_scaled_objects(objects: list[dict[str, Any]]) -> None:
    """KEDA's ScaledObject, field by field (kubernetes-validate has no schema for it, and its CRD is
    KEDA's: a cluster with KEDA checks it at `kubectl apply --dry-run=server`)."""
    rendered = (ROOT / "services" / "gateway" / "metrics" / "endpoint.py").read_text()
    for scaled in of_kind(objects, "ScaledObject"):
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        spec = scaled["spec"]
        assert set(spec) <= SCALED_OBJECT_SPEC
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        # the HPA KEDA makes takes this behaviour as it is: the HPA's own schema checks it
        hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "check"},
            "spec": {
                "scaleTargetRef": spec["scaleTargetRef"],
                "maxReplicas": spec["maxReplicaCount"],
                "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            },
        }
        validator.validate(hpa, VERSIONS[0], strict=True)
        for trigger in spec["triggers"]:
            assert set(trigger) <= TRIGGER_FIELDS
            assert trigger["type"] == "prometheus"
            assert trigger.get("metricType", "AverageValue") in ("AverageValue", "Value", "Utilization")
            metadata = trigger["metadata"]
            assert set(metadata) <= PROMETHEUS_METADATA
            assert all(isinstance(v, str) for v in metadata.values()), "KEDA's metadata values are strings"
            float(metadata["threshold"])
            metrics = re.findall(r"\b(nv_[a-z_]+)\{", metadata["query"])
            assert metrics, metadata["query"]
            for metric in metrics:
                assert f'"{metric}"' in rendered, f"the gateway renders no {metric}"


def test_the_nats_chart_values() -> None:
    values = yaml.safe_load((KUBE / "nats" / "values.yaml").read_text())
    config = values["config"]
    assert config["jetstream"]["enabled"] is True
    assert config["cluster"]["enabled"] is True and config["cluster"]["replicas"] == 3
    assert config["nats"]["tls"]["enabled"] is True and config["cluster"]["tls"]["enabled"] is True
    assert config["cluster"]["tls"]["merge"]["verify"] is True
    secret = config["nats"]["tls"]["secretName"]
    assert secret == config["cluster"]["tls"]["secretName"] == values["tlsCA"]["secretName"] == "shoal-nats-tls"
    assert values["tlsCA"]["key"] == "ca.crt"
    assert config["merge"]["00$include"] == "auth.conf"
    assert values["fullnameOverride"] == "nats"  # the services' nats://nats:4222


@needs_kubectl
def test_credentials_script_makes_the_secrets_the_pods_mount(tmp_path: Path) -> None:
    """deploy/kubernetes/credentials.sh: `shoal credentials` and `kubectl create secret --dry-run`,
    both offline; the Secrets hold every key a pod mounts, the server's certificate names the chart's."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "shoal").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shoal.cli "$@"\n')
    (shim / "shoal").chmod(0o755)
    environ = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["sh", str(KUBE / "credentials.sh"), str(tmp_path / "creds")],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    secrets = {o["metadata"]["name"]: o for o in yaml.safe_load_all(done.stdout) if o}
    assert set(secrets) == {"shoal-credentials", "shoal-nats-tls"}
    assert all(o["metadata"]["namespace"] == "shoal" for o in secrets.values())
    assert set(secrets["shoal-nats-tls"]["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert "ca-key.pem" not in secrets["shoal-credentials"]["data"]
    mounted = set()
    for overlay in OVERLAYS:
        for deployment, _ in shoal_containers(render(overlay)):
            for volume in deployment["spec"]["template"]["spec"]["volumes"]:
                mounted |= {i["key"] for i in volume.get("secret", {}).get("items", [])}
    assert mounted <= set(secrets["shoal-credentials"]["data"])
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate((tmp_path / "creds" / "server.pem").read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    assert {"nats", "nats-0.nats-headless", "nats-1.nats-headless", "nats-2.nats-headless"} <= dns
