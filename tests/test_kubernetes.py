"""deploy/kubernetes: every overlay renders with kubectl's kustomize, its built-in objects pass the Kubernetes
schemas (kubernetes-validate, pinned in the test extra, strict: an unknown field fails), the custom resources
(ServiceMonitor, KEDA ScaledObject) and Prometheus Adapter's rules pass the structural schemas below, and the
objects agree with each other and with the server (probes on its routes, the termination grace its shutdown
grace, the autoscalers' metric one it exports).

The kustomize is KUSTOMIZE_KUBECTL, else the Debian kubernetes-client that .ci/run unpacks, else a kubectl on
PATH; without one the tests skip, except under CI (CI=true), where they fail.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from service.metrics import Metrics
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "cpu-keda")
# the oldest release with every API used (autoscaling/v2: 1.23; policy/v1: 1.21) that the validator has, and its newest
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CUSTOM = {"ServiceMonitor", "ScaledObject"}
STATE = Path(os.environ.get("DOCKER_LOCAL_STATE", "/var/tmp/docker-local"))


def kubectl() -> str:
    candidates = [os.environ.get("KUSTOMIZE_KUBECTL", "")]
    candidates += [str(path) for path in sorted(STATE.glob("kubernetes-client-*/usr/bin/kubectl"))]
    candidates += [shutil.which("kubectl") or ""]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    message = "no kubectl to render kustomize with (.ci/run unpacks Debian's kubernetes-client)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def render(folder: Path) -> list[dict[str, Any]]:
    result = subprocess.run([kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize {folder}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(KUBERNETES / "overlays" / request.param)


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [doc["kind"] for doc in docs]
    assert len(kinds) == len(set(kinds)), f"one object of each kind expected: {kinds}"
    return {doc["kind"]: doc for doc in docs}


# -- structural schemas of the custom resources: the fields used here, each as the CRDs spell it ---------------

STRING = {"type": "string"}
SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "properties": {"matchLabels": {"type": "object", "additionalProperties": STRING, "minProperties": 1}},
    "additionalProperties": False,
}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": STRING,
        "namespace": STRING,
        "labels": {"type": "object"},
        "annotations": {"type": "object"},
    },
}
DURATION = {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"}
SERVICE_MONITOR = {  # monitoring.coreos.com/v1 (prometheus-operator)
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": {"type": "object"},
                "jobLabel": STRING,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": STRING,
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": DURATION,
                            "scrapeTimeout": DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}
POLICY = {
    "type": "object",
    "required": ["type", "value", "periodSeconds"],
    "additionalProperties": False,
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
    },
}
RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": POLICY},
    },
}
NUMBER_STRING = {"type": "string", "pattern": r"^\d+(\.\d+)?$"}
SCALED_OBJECT = {  # keda.sh/v1alpha1
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {"apiVersion": STRING, "kind": STRING, "name": STRING},
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": STRING,
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": RULES, "scaleDown": RULES},
                                },
                            },
                        },
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"const": "prometheus"},
                            "name": STRING,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": {  # the prometheus scaler's parameters, all strings
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold"],
                                "additionalProperties": False,
                                "properties": {
                                    "serverAddress": {"type": "string", "pattern": "^https?://"},
                                    "query": STRING,
                                    "threshold": NUMBER_STRING,
                                    "activationThreshold": NUMBER_STRING,
                                    "namespace": STRING,
                                    "ignoreNullValues": {"enum": ["true", "false"]},
                                    "unsafeSsl": {"enum": ["true", "false"]},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
ADAPTER_RULES = {  # prometheus-adapter's config file
    "type": "object",
    "required": ["rules"],
    "additionalProperties": False,
    "properties": {
        "rules": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["seriesQuery", "resources", "name", "metricsQuery"],
                "additionalProperties": False,
                "properties": {
                    "seriesQuery": STRING,
                    "seriesFilters": {"type": "array"},
                    "resources": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "overrides": {
                                "type": "object",
                                "additionalProperties": {
                                    "type": "object",
                                    "required": ["resource"],
                                    "additionalProperties": False,
                                    "properties": {"group": STRING, "resource": STRING},
                                },
                            },
                            "template": STRING,
                        },
                    },
                    "name": {
                        "type": "object",
                        "required": ["matches"],
                        "additionalProperties": False,
                        "properties": {"matches": STRING, "as": STRING},
                    },
                    "metricsQuery": {"type": "string", "pattern": r"<<\.Series>>.*<<\.LabelMatchers>>.*<<\.GroupBy>>"},
                },
            },
        }
    },
}
SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "ScaledObject": SCALED_OBJECT}


def check(doc: dict[str, Any]) -> None:
    """Raises when the object does not pass its schema: Kubernetes' for built-in kinds, the one above for CRDs."""
    if doc["kind"] in CUSTOM:
        jsonschema.validate(doc, SCHEMAS[doc["kind"]])
    else:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def exported_metrics() -> set[str]:
    return {metric.name for metric in Metrics().registry.collect()}


def translator(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def env(container: dict[str, Any]) -> dict[str, str]:
    values = [(item["name"], item["value"]) for item in container["env"]]
    assert len(values) == len(dict(values)), f"a variable set twice: {values}"
    return dict(values)


# -- tests --------------------------------------------------------------------------------------------------


def test_every_rendered_object_passes_its_schema(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    kinds = {doc["kind"] for doc in docs}
    autoscaler = "ScaledObject" if name.endswith("keda") else "HorizontalPodAutoscaler"
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor", autoscaler}, kinds
    for doc in docs:
        try:
            check(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {error}")


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ["spec", "replicas"], "two"),
        ("Deployment", ["spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet", "pathh"], "/ready"),
        ("HorizontalPodAutoscaler", ["spec", "maxReplicas"], "ten"),
        ("ServiceMonitor", ["spec", "endpoints", 0, "intervall"], "10s"),
        ("ScaledObject", ["spec", "triggers", 0, "metadata", "threshold"], "four"),
    ],
    ids=["replicas-type", "unknown-field", "hpa-max-type", "servicemonitor-field", "keda-threshold"],
)
def test_a_broken_object_fails_the_check(kind: str, path: list[str | int], value: object) -> None:
    overlay = "cpu-keda" if kind == "ScaledObject" else "cpu"
    doc = copy.deepcopy(by_kind(render(KUBERNETES / "overlays" / overlay))[kind])
    check(doc)
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        check(doc)


def test_a_broken_kustomization_fails_to_render(tmp_path: Path) -> None:
    shutil.copytree(KUBERNETES, tmp_path / "kubernetes")
    patch = tmp_path / "kubernetes" / "overlays" / "gpu" / "gpu.yaml"
    patch.write_text(patch.read_text().replace("name: transformer-mt\n", "name: no-such-deployment\n", 1))
    result = subprocess.run(
        [kubectl(), "kustomize", str(patch.parent)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0, "a patch of a Deployment that is not there rendered"


def test_the_deployment_drains_probes_and_sizes_as_the_server_does(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    objects = by_kind(docs)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    container = translator(objects)
    variables = env(container)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] in ("/health", "/ready")
    assert ports == {"http": 8000} and "--port" in container["args"] and "8000" in container["args"]
    # preStop, then the server's own grace, then uvicorn's 5 s to close (docker-compose.yml's stop_grace_period)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = float(variables.get("MT_SHUTDOWN_GRACE_SECONDS", Settings.model_fields["shutdown_grace_seconds"].default))
    assert pod["terminationGracePeriodSeconds"] == int(pre_stop[1]) + grace + 5
    # Guaranteed QoS; threads from the CPU quota (0) or set, never more than the CPUs given
    resources = container["resources"]
    assert resources["requests"] == resources["limits"], resources
    cpus = float(resources["limits"]["cpu"])
    threads = int(variables.get("MT_INTRA_OP_THREADS", "0"))
    assert cpus == int(cpus) and 0 <= threads <= cpus, (cpus, threads)
    if name == "gpu":
        assert resources["limits"]["nvidia.com/gpu"] == 1
        assert variables["MT_PROVIDERS"].split(",")[0] == "cuda"
        assert container["image"].endswith(":cuda")
    else:
        assert "nvidia.com/gpu" not in resources["limits"]
    # every setting the manifests give is one the server knows
    known = {Settings.variable(field) for field in Settings.model_fields}
    assert set(variables) <= known, set(variables) - known
    # non-root on a read-only root, /tmp the only writable path
    security, context = pod["securityContext"], container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 10001
    assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert context["capabilities"]["drop"] == ["ALL"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_the_objects_select_each_other(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay
    objects = by_kind(docs)
    deployment = objects["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in selector.items())

    assert selects(deployment["spec"]["selector"]["matchLabels"])
    service = objects["Service"]
    assert selects(service["spec"]["selector"])
    assert selects(objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"])
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= {"http"}
    monitor = objects["ServiceMonitor"]["spec"]
    assert all(service["metadata"]["labels"].get(k) == v for k, v in monitor["selector"]["matchLabels"].items())
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["endpoints"]} <= service_ports
    autoscaler = objects.get("HorizontalPodAutoscaler") or objects["ScaledObject"]
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def adapter_rules() -> dict[str, Any]:
    config = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "rules.yaml").read_text(encoding="utf-8"))
    jsonschema.validate(config, ADAPTER_RULES)
    return config


def test_the_autoscalers_scale_on_an_exported_metric_at_one_threshold() -> None:
    exported = exported_metrics()
    rules = adapter_rules()["rules"]
    served = {}
    for rule in rules:
        series = re.match(r"^([a-z_:]+)\{", rule["seriesQuery"])
        assert series and series.group(1) in exported, f"{rule['seriesQuery']}: not a metric the server exports"
        assert re.fullmatch(rule["name"]["matches"].strip("^$"), series.group(1))
        assert {"namespace", "pod"} <= set(rule["resources"]["overrides"])
        served[rule["name"].get("as", series.group(1))] = series.group(1)
    hpa = by_kind(render(KUBERNETES / "overlays" / "cpu"))["HorizontalPodAutoscaler"]["spec"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in served
    keda = by_kind(render(KUBERNETES / "overlays" / "cpu-keda"))["ScaledObject"]["spec"]
    (trigger,) = keda["triggers"]
    assert set(re.findall(r"\bmt_[a-z_]+", trigger["metadata"]["query"])) == {served[metric["pods"]["metric"]["name"]]}
    assert trigger["metricType"] == "AverageValue"
    assert float(trigger["metadata"]["threshold"]) == float(metric["pods"]["target"]["averageValue"])
    assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    # the threshold is the one docs/scaling.md derives from the measured figures
    docs = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    assert f'averageValue: "{metric["pods"]["target"]["averageValue"]}"' in docs
