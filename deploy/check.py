"""Renders the Helm chart with Helm's own template engine (helm-python-sdk, Helm v4's library) for
its defaults and every documented toggle, lints it strictly, checks its values schema, and
validates every rendered Kubernetes object strictly against the Kubernetes schemas
(kubernetes-validate). No cluster is contacted.

Also validates the plain manifests of examples/.

Usage: python check.py OUT_DIR
Writes each case's rendered daemon configuration to OUT_DIR/<case>.toml and prints one JSON
object: the cases, the objects validated, the metric names the Grafana dashboard queries.
Exits non-zero on the first problem, naming it.
"""
import json
import os
import re
import sys

import helm_python
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "helm", "stallscope")
# Plain manifests, validated like the chart's objects; each case is `example-<file name>`.
EXAMPLES = ["sidecar.yaml"]
KUBERNETES = "1.33.0"

# Each documented toggle, alone, on top of the defaults.
CASES = {
    "defaults": {},
    "privileged": {"privileged": True},
    "prometheus-operator-and-grafana": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboard": {"enabled": True},
    },
    "token-from-new-secret": {"apiToken": {"create": True, "value": "s3cret"}},
    "token-from-existing-secret": {"apiToken": {"existingSecret": "stallscope-api"}},
    "no-rbac-no-service-account": {"rbac": {"create": False}, "serviceAccount": {"create": False}},
    "ids-only": {"kubeletReadOnlyPort": 0, "config": {"pods": {"names": "none"}}},
    "otlp-to-a-node-agent": {
        "config": {"otlp": {"endpoint": "http://otel-agent.monitoring:4318", "metrics_interval": "30s"}},
    },
    "serving-group-with-a-store": {
        "config": {
            "fleet": {"group": "llama-70b-tp8", "lead": "5s"},
            "store": {"endpoint": "https://s3.us-east-1.amazonaws.com", "bucket": "deep-dives", "region": "us-east-1"},
        },
        "storeCredentials": {"existingSecret": "stallscope-s3"},
    },
    "gpu-nodes": {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "priorityClassName": "",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
        "config": {"http": {"listen": "0.0.0.0:9500"}, "state": {"dir": "/data/stallscope"}},
        "service": {"port": 9500},
        "stateHostPath": "/data/stallscope",
    },
}

# Values the schema must refuse.
BAD_VALUES = {
    "privileged as a string": {"privileged": "yes"},
    "an unknown top-level key": {"replicas": 3},
    "a relative state path": {"stateHostPath": "var/lib/stallscope"},
    "an unknown pod-name source": {"config": {"pods": {"names": "cri"}}},
    "an https OTLP endpoint (plain HTTP only)": {"config": {"otlp": {"endpoint": "https://c:4318"}}},
    "store credentials in the ConfigMap": {"config": {"store": {"secret_access_key": "k"}}},
    "a store endpoint without a scheme": {"config": {"store": {"endpoint": "s3.local:9000"}}},
}

# Custom resources: no Kubernetes schema covers them; their content is checked here and by
# promtool (the rules).
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


def fail(why):
    print(f"deploy check: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    chart = helm_python.Chart.load(CHART)
    lint = helm_python.lint(CHART, strict=True, kube_version=KUBERNETES)
    if lint["errors"]:
        fail(f"helm lint: {lint['errors']}")
    for what, values in BAD_VALUES.items():
        try:
            chart.validate_schema(values)
        except helm_python.HelmError:
            continue
        fail(f"the values schema accepts {what}: {values}")
    rules = yaml.safe_load(open(os.path.join(CHART, "files", "rules.yaml")))
    objects = 0
    kinds = set()
    cases = {}
    for case, values in CASES.items():
        chart.validate_schema(values)
        cases[case] = chart.render(values, name="stallscope", namespace="monitoring", is_install=True)
    for example in EXAMPLES:
        path = os.path.join(HERE, "examples", example)
        cases["example-" + example.removesuffix(".yaml")] = {path: open(path).read()}
    for case, rendered in cases.items():
        for path, text in sorted(rendered.items()):
            if not path.endswith(".yaml"):
                continue
            for doc in yaml.safe_load_all(text):
                if not doc:
                    continue
                objects += 1
                kinds.add(doc["kind"])
                where = f"{case}: {path}: {doc['kind']}"
                if (doc["apiVersion"], doc["kind"]) in CUSTOM:
                    if doc["kind"] == "PrometheusRule" and doc["spec"] != rules:
                        fail(f"{where}: its spec is not files/rules.yaml")
                    continue
                try:
                    kubernetes_validate.validate(doc, KUBERNETES, strict=True)
                except kubernetes_validate.ValidationError as e:
                    fail(f"{where}: {e.message} at {list(e.path)}")
                if doc["kind"] == "ConfigMap" and "config.toml" in doc["data"]:
                    with open(os.path.join(out, f"{case}.toml"), "w") as f:
                        f.write(doc["data"]["config.toml"])
                if doc["kind"] == "ConfigMap" and "stallscope.json" in doc["data"]:
                    json.loads(doc["data"]["stallscope.json"])
    dashboard = json.load(open(os.path.join(CHART, "files", "dashboard.json")))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    metrics = sorted({m for e in exprs for m in re.findall(r"\bstallscope_[a-z_]+", e)})
    print(json.dumps({"cases": list(cases), "objects": objects, "kinds": sorted(kinds),
                      "dashboard_metrics": metrics}))


if __name__ == "__main__":
    main()
