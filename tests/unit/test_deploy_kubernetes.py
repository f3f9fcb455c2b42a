"""deploy/kubernetes, checked without a cluster: every object valid against the Kubernetes JSON schemas
that kubernetes-validate bundles (strict: no unknown field), and the rules that make it run: each
process has the settings it needs and names only settings it has; Secrets are referenced, never
contained, and every one is documented with the command that creates it; node agents run on GPU nodes
with the NVIDIA runtime, keep their state on a hostPath and get no database credentials; every pod runs
as non-root with requests, and probes where a process serves HTTP."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from gpusched_common.settings import Settings
from gpusched_core.quota.loader import load_tenancy
from tests.unit.test_deploy_support import (
    AGENT,
    CONTROL_PLANE,
    GATEWAY,
    KUBERNETES_DIR,
    ROOT,
    SETTINGS_BY_MODULE,
    compose,
    module_of,
    setting_names,
    yaml_documents,
)

KUBERNETES_VALIDATE_VERSION = "1.37.0"  # pinned in constraints.txt: its schemas are what we validate against
# the oldest Kubernetes we claim (every field used is GA there) and the newest the package has
VERSIONS = ("1.30.0", kv_utils.latest_version())
NAMESPACE = "gpusched"
README = (KUBERNETES_DIR / "README.md").read_text()
KUSTOMIZATION = yaml.safe_load((KUBERNETES_DIR / "kustomization.yaml").read_text())
FILES = sorted(p for p in KUBERNETES_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
OBJECTS: list[tuple[str, dict]] = [(p.name, doc) for p in FILES for doc in yaml_documents(p)]
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "Job")


def objects(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in OBJECTS if doc["kind"] == kind}


def workloads() -> list[dict]:
    return [doc for _, doc in OBJECTS if doc["kind"] in WORKLOAD_KINDS]


def pod(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def gpusched_containers() -> list[tuple[dict, dict]]:
    """(workload, container) for every container that runs the gpusched image."""
    return [(w, c) for w in workloads() for c in pod(w)["containers"] if c["image"] == "gpusched"]


def by_module(module: str) -> list[tuple[dict, dict]]:
    return [(w, c) for w, c in gpusched_containers() if module_of(c.get("command")) == module]


def one(module: str) -> tuple[dict, dict]:
    (found,) = by_module(module)
    return found


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def env_values(workload: dict, container: dict) -> dict[str, str]:
    """Every variable the container gets, with its value (a Secret's as `secret:NAME/KEY`), the
    ConfigMaps of envFrom included."""
    maps = objects("ConfigMap")
    out: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, "envFrom only from ConfigMaps of these manifests"
        out.update(maps[source["configMapRef"]["name"]]["data"])
    for name, entry in env_of(container).items():
        if "value" in entry:
            out[name] = entry["value"]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            out[name] = f"secret:{ref['name']}/{ref['key']}"
        else:
            out[name] = "field:" + entry["valueFrom"]["fieldRef"]["fieldPath"]
    return out


def volume_at(workload: dict, container: dict, path: str) -> tuple[dict, dict] | None:
    """(volume, mount) that holds ``path`` in the container."""
    volumes = {v["name"]: v for v in pod(workload).get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            return volumes[mount["name"]], mount
    return None


def referenced_secrets() -> dict[str, set[str]]:
    """Each Secret the manifests reference, with the keys they read (an empty set: the whole Secret)."""
    out: dict[str, set[str]] = {}
    for w in workloads():
        for c in pod(w)["containers"] + pod(w).get("initContainers", []):
            for entry in c.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    out.setdefault(ref["name"], set()).add(ref["key"])
        for v in pod(w).get("volumes", []):
            if "secret" in v:
                out.setdefault(v["secret"]["secretName"], set()).update(i["key"] for i in v["secret"].get("items", []))
    return out


def referenced_configmaps() -> set[str]:
    names = set()
    for w in workloads():
        for c in pod(w)["containers"]:
            names |= {s["configMapRef"]["name"] for s in c.get("envFrom", []) if "configMapRef" in s}
        names |= {v["configMap"]["name"] for v in pod(w).get("volumes", []) if "configMap" in v}
    return names


# -- the published schemas ----------------------------------------------------------------------------


def test_the_schemas_are_those_of_the_pinned_package():
    from kubernetes_validate.version import __version__

    assert __version__ == KUBERNETES_VALIDATE_VERSION
    assert f"kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}" in (ROOT / "constraints.txt").read_text()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("where,doc", OBJECTS, ids=[f"{w}:{d['kind']}/{d['metadata']['name']}" for w, d in OBJECTS])
def test_every_object_is_valid_against_the_kubernetes_schema(where, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validation_refuses_an_unknown_field_and_a_wrong_type():
    deployment = objects("Deployment")["gpusched-gateway"]
    unknown = yaml.safe_load(yaml.safe_dump(deployment))
    pod(unknown)["containers"][0]["imagePullPolicyy"] = "Always"
    mistyped = yaml.safe_load(yaml.safe_dump(deployment))
    mistyped["spec"]["replicas"] = "two"
    for broken in (unknown, mistyped):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomize_applies_every_file_in_the_namespace():
    assert sorted(KUSTOMIZATION["resources"]) == sorted(p.name for p in FILES)
    assert KUSTOMIZATION["namespace"] == NAMESPACE
    assert [i["name"] for i in KUSTOMIZATION["images"]] == ["gpusched"]
    for _, doc in OBJECTS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


def test_the_control_plane_the_gateway_the_agents_and_the_migrations_are_all_there():
    modules = {module_of(c.get("command")) for _, c in gpusched_containers()}
    assert set(SETTINGS_BY_MODULE) <= modules
    assert {module_of(c["command"]) for w, c in gpusched_containers() if w["kind"] == "Deployment"} == {
        *CONTROL_PLANE, GATEWAY}
    assert [module_of(c["command"]) for w, c in gpusched_containers() if w["kind"] == "DaemonSet"] == [AGENT]
    (job,) = objects("Job").values()
    assert pod(job)["containers"][0]["command"][-1] == "gpusched migrate && gpusched create-topics"
    assert set(objects("Service")) >= {"gpusched-gateway", "gpusched-metrics"}


# -- settings -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [*SETTINGS_BY_MODULE, None])
def test_every_environment_variable_is_a_setting_of_that_process(module):
    found = by_module(module) if module else [(w, c) for w, c in gpusched_containers() if w["kind"] == "Job"]
    assert found
    cls = SETTINGS_BY_MODULE.get(module, Settings)
    for workload, container in found:
        names = set(env_values(workload, container))
        gpusched = {n for n in names if n.startswith("GPUSCHED_")}
        assert gpusched - setting_names(cls) == set(), workload["metadata"]["name"]
        assert names - gpusched <= {"POD_IP", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}


@pytest.mark.parametrize("workload,container", gpusched_containers(),
                         ids=[w["metadata"]["name"] for w, _ in gpusched_containers()])
def test_every_process_reaches_kafka_and_the_collector(workload, container):
    env = env_values(workload, container)
    assert env["GPUSCHED_KAFKA_BOOTSTRAP"] and env["GPUSCHED_KAFKA_IDEMPOTENCE"] == "true"
    endpoint = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)/v1/traces", env["GPUSCHED_OTLP_ENDPOINT"])
    assert endpoint and env["GPUSCHED_TRACE_EXPORTER"] == "otlp"
    service = objects("Service")[endpoint.group(1)]
    assert endpoint.group(2) == NAMESPACE and int(endpoint.group(3)) in [p["port"] for p in service["spec"]["ports"]]


@pytest.mark.parametrize("module", [*CONTROL_PLANE, None])
def test_the_control_plane_and_the_migrations_get_the_operators_database_url_from_a_secret(module):
    found = by_module(module) if module else [(w, c) for w, c in gpusched_containers() if w["kind"] == "Job"]
    for workload, container in found:
        assert env_values(workload, container)["GPUSCHED_DATABASE_URL"] == "secret:gpusched-database/url"


def test_the_gateway_reads_as_its_own_role_with_its_key_and_is_probed():
    workload, container = one(GATEWAY)
    env = env_values(workload, container)
    assert env["GPUSCHED_GATEWAY_DATABASE_URL"] == env["GPUSCHED_DATABASE_URL"] == "secret:gpusched-gateway-database/url"
    assert env["GPUSCHED_GATEWAY_HOST"] == "0.0.0.0"
    port = int(env["GPUSCHED_GATEWAY_PORT"])
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert env["GPUSCHED_GATEWAY_PRODUCER_KEY_FILE"].endswith("/gateway-producer.key")


def test_metrics_serve_on_a_probed_port_behind_a_service():
    workload, container = one("services.metrics")
    env = env_values(workload, container)
    assert env["GPUSCHED_METRICS_HOST"] == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [int(env["GPUSCHED_METRICS_PORT"])]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("service", ["gpusched-gateway", "gpusched-metrics"])
def test_each_service_selects_its_deployments_pods_on_a_named_port(service):
    spec = objects("Service")[service]["spec"]
    (deployment,) = [d for d in objects("Deployment").values()
                     if spec["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]
    names = {p["name"] for c in pod(deployment)["containers"] for p in c.get("ports", [])}
    assert {p["targetPort"] for p in spec["ports"]} <= names


def test_admission_requires_credentials_and_quota_starts_from_a_valid_tenancy():
    workload, container = one("services.admission")
    assert env_values(workload, container)["GPUSCHED_ADMISSION_REQUIRE_CREDENTIALS"] == "true"
    workload, container = one("services.quota")
    path = env_values(workload, container)["GPUSCHED_TENANTS_FILE"]
    volume, _ = volume_at(workload, container, path)
    data = objects("ConfigMap")[volume["configMap"]["name"]]["data"]
    tenancy = load_tenancy(data[PurePosixPath(path).name])
    assert tenancy.revision >= 1 and tenancy.leaves()


@pytest.mark.parametrize("workload,container", gpusched_containers(),
                         ids=[w["metadata"]["name"] for w, _ in gpusched_containers()])
def test_every_file_a_process_is_told_of_is_mounted_with_that_name(workload, container):
    secrets = referenced_secrets()
    for key, value in env_values(workload, container).items():
        if not (key.startswith("GPUSCHED_") and key.endswith(("_FILE", "_DIR"))):
            continue
        assert value.startswith("/"), f"{key}={value}"
        held = volume_at(workload, container, value)
        assert held is not None, f"{workload['metadata']['name']}: {key}={value} is on nothing mounted"
        volume, mount = held
        if key.endswith("_FILE"):
            name = PurePosixPath(value).name
            if "secret" in volume:
                items = secrets[volume["secret"]["secretName"]]
                assert not items or name in items, (key, items)
                assert f"`{name}`" in README, f"{name}: the README names no such key"
            elif "configMap" in volume:
                cm = volume["configMap"]["name"]
                assert name in objects("ConfigMap").get(cm, {}).get("data", {}) or f"`{name}`" in README


@pytest.mark.parametrize("module,key", [("services.placement", "placement"), ("services.preemption", "preemption"),
                                        ("services.metrics", "metrics")])
def test_each_signing_service_mounts_only_its_own_key(module, key):
    workload, container = one(module)
    path = env_values(workload, container)["GPUSCHED_SERVICE_KEY_FILE"]
    volume, _ = volume_at(workload, container, path)
    assert volume["secret"]["secretName"] == "gpusched-service-keys"
    assert [i["key"] for i in volume["secret"]["items"]] == [f"{key}.key"] == [PurePosixPath(path).name]


# -- node agents --------------------------------------------------------------------------------------


def test_agents_run_on_gpu_nodes_with_the_nvidia_runtime():
    workload, container = one(AGENT)
    assert workload["kind"] == "DaemonSet"
    spec = pod(workload)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    env = env_values(workload, container)
    assert env["GPUSCHED_NVML_BACKEND"] == "real"
    assert env["GPUSCHED_NODE_ID"] == "field:spec.nodeName"


def test_agents_get_no_database_credentials():
    workload, container = one(AGENT)
    env = env_values(workload, container)
    assert [k for k in env if "DATABASE" in k or k.startswith("PG")] == []
    assert not any("postgres" in str(v) or "gpusched-database" in str(v) for v in env.values())
    secrets = {v["secret"]["secretName"] for v in pod(workload)["volumes"] if "secret" in v}
    assert secrets == {"gpusched-join-token"}
    assert not any("DATABASE" in key for cm in objects("ConfigMap").values() for key in cm.get("data", {}))


def test_agents_keep_their_state_on_a_writable_hostpath_their_user_owns():
    workload, container = one(AGENT)
    work_dir = env_values(workload, container)["GPUSCHED_AGENT_WORK_DIR"]
    assert work_dir.startswith("/")
    volume, mount = volume_at(workload, container, work_dir)
    assert mount["mountPath"] == work_dir and not mount.get("readOnly", False)
    assert volume["hostPath"]["path"].startswith("/") and volume["hostPath"]["type"] == "DirectoryOrCreate"
    (init,) = pod(workload)["initContainers"]
    assert f"chown 10001:10001 {work_dir}" in init["command"][-1]
    assert [m["mountPath"] for m in init["volumeMounts"] if m["name"] == volume["name"]] == [work_dir]


def test_agents_serve_logs_on_their_pod_address():
    workload, container = one(AGENT)
    env = env_values(workload, container)
    assert env["POD_IP"] == "field:status.podIP"
    assert env["GPUSCHED_AGENT_LOG_HOST"] == "0.0.0.0"
    assert env["GPUSCHED_AGENT_LOG_URL"] == f"http://$(POD_IP):{env['GPUSCHED_AGENT_LOG_PORT']}"
    names = list(env_of(container))
    assert names.index("POD_IP") < names.index("GPUSCHED_AGENT_LOG_URL")  # $(VAR) expands only earlier ones


# -- security, resources, secrets ---------------------------------------------------------------------


@pytest.mark.parametrize("workload", workloads(), ids=[w["metadata"]["name"] for w in workloads()])
def test_every_pod_runs_as_non_root_with_no_privilege_and_requests(workload):
    spec = pod(workload)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert objects("ServiceAccount")[spec["serviceAccountName"]]["automountServiceAccountToken"] is False
    assert spec.get("automountServiceAccountToken", False) is False
    for container in spec["containers"] + spec.get("initContainers", []):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        if container in spec["containers"]:
            assert "runAsUser" not in security and "privileged" not in security
        else:  # the one root step: the agents' state directory made theirs
            assert workload["kind"] == "DaemonSet" and security["capabilities"]["add"] == ["CHOWN", "FOWNER"]


def test_no_secret_is_contained_and_every_one_referenced_is_documented():
    assert objects("Secret") == {}
    for name, keys in referenced_secrets().items():
        assert f"create secret generic {name} " in README, f"{name}: no `kubectl create secret` in README.md"
        for key in keys:
            assert f"`{key}`" in README, f"{name}: key {key} undocumented"
    for name in referenced_configmaps() - set(objects("ConfigMap")):
        assert f"create configmap {name} " in README, f"{name}: not in the manifests, no `kubectl create configmap`"


def test_no_value_in_the_manifests_looks_like_a_credential():
    text = "\n".join(p.read_text() for p in FILES)
    assert not re.search(r"postgres(ql)?://[^\s'\"]*:[^\s'\"@]+@", text)
    assert not re.search(r"\bgs[kt]_[A-Za-z0-9]", text)  # producer/service keys, API tokens


def test_the_collector_is_configured_as_the_compose_one():
    data = objects("ConfigMap")["otel-collector-config"]["data"]["config.yaml"]
    assert yaml.safe_load(data) == yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    (collector,) = pod(objects("Deployment")["otel-collector"])["containers"]
    assert collector["image"] == compose()["services"]["otel-collector"]["image"]
