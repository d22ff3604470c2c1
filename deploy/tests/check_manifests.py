#!/usr/bin/env python3
"""Checks deploy/kubernetes offline (run by deploy/test.sh).

1. Every kustomization renders with `kubectl kustomize`.
2. Kubernetes' own kinds pass `kubernetes-validate --strict` for the oldest and newest
   Kubernetes versions supported (KUBERNETES_VERSIONS); the custom resources (cert-manager,
   Prometheus operator) pass the minimal schemas of deploy/tests/crd-schemas.yaml. Both
   validators are first shown a misspelled field, which they must refuse.
3. The overlays hold what the issue asks: probe services, security context, replica rule,
   mTLS from the Secret, the store of each overlay; the identities carry their SPIFFE URI SANs
   and the admin identity is kept apart.

Exit status 0 when all pass; 1 with every failure listed otherwise.
"""

import copy
import json
import os
import subprocess
import sys
import tempfile

import jsonschema
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import check, fail, failures  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(REPO, "deploy", "kubernetes")
# Oldest: gRPC probes are GA from 1.27. Newest: the newest schema kubernetes-validate ships.
KUBERNETES_VERSIONS = os.environ.get("TOPOLOGY_CLAIMS_KUBERNETES_VERSIONS", "1.27.0 1.37.0").split()
KUSTOMIZATIONS = ["overlays/postgres", "overlays/sqlite", "pki", "identities", "identities/admin",
                  "sidecars"]
READINESS_SERVICE = "topology.claims.v1.ClaimsService"
GRPC_PORT = 50051
# --health-listen: the kubelet's gRPC probes speak plaintext only, the main port is mTLS-only.
HEALTH_PORT = 50052
SERVER_TLS_SECRET = "topology-claims-server-tls"
TRUST_DOMAIN = "topology-claims"


def render(kustomization):
    result = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, kustomization)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"kubectl kustomize deploy/kubernetes/{kustomization}: {result.stderr.strip()}")
        return []
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def load_crd_schemas():
    with open(os.path.join(REPO, "deploy", "tests", "crd-schemas.yaml"), encoding="utf-8") as f:
        schemas = yaml.safe_load(f)
    out = {}
    for key, schema in schemas["kinds"].items():
        schema = dict(schema)
        schema["definitions"] = schemas["definitions"]
        jsonschema.Draft7Validator.check_schema(schema)
        out[key] = jsonschema.Draft7Validator(schema)
    return out


CRDS = load_crd_schemas()


def kind_key(doc):
    return f"{doc.get('apiVersion')}/{doc.get('kind')}"


def crd_errors(doc):
    validator = CRDS.get(kind_key(doc))
    if validator is None:
        return [f"no schema for custom resource {kind_key(doc)} in deploy/tests/crd-schemas.yaml"]
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in validator.iter_errors(doc)]


def is_builtin(doc):
    group = doc.get("apiVersion", "").rpartition("/")[0]
    return group == "" or group.endswith(".k8s.io") or group in ("apps", "batch", "policy",
                                                                 "autoscaling")


def kubernetes_validate(docs, version, label):
    """Returns the validator's complaint, or None when every document passed."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
        path = f.name
    try:
        result = subprocess.run(["kubernetes-validate", "--strict", "--quiet", "-k", version, path],
                                capture_output=True, text=True)
    finally:
        os.unlink(path)
    output = (result.stdout + result.stderr).strip()
    # A kind it has no schema for is only a warning to it; for Kubernetes' own kinds it is an error.
    if result.returncode != 0 or "Couldn't find schema" in output:
        return f"{label}: kubernetes-validate --strict -k {version}: {output}"
    return None


def validate_all(rendered):
    # The validators must be able to fail: a misspelled field in a Deployment and in a
    # Certificate is refused.
    bad_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typo"},
               "spec": {"containers": [{"name": "c", "image": "i", "readinessProbes": {}}]}}
    for version in KUBERNETES_VERSIONS:
        check(kubernetes_validate([bad_pod], version, "self-test") is not None,
              f"kubernetes-validate --strict -k {version} accepted a misspelled field "
              f"(readinessProbes): the validation cannot be trusted")
    certificate = next(d for docs in rendered.values() for d in docs if d["kind"] == "Certificate")
    bad_certificate = copy.deepcopy(certificate)
    bad_certificate["spec"]["uri"] = bad_certificate["spec"].pop("uris", [])
    check(crd_errors(bad_certificate),
          "the Certificate schema accepted a misspelled field (uri): it cannot be trusted")

    for name, docs in rendered.items():
        builtin = [d for d in docs if is_builtin(d)]
        for version in KUBERNETES_VERSIONS:
            complaint = kubernetes_validate(builtin, version, f"deploy/kubernetes/{name}")
            check(complaint is None, complaint)
        for doc in docs:
            if not is_builtin(doc):
                for error in crd_errors(doc):
                    fail(f"deploy/kubernetes/{name}: {doc['kind']}/{doc['metadata']['name']}: {error}")


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def check_server(name, docs, workload_kind):
    workloads = by_kind(docs, workload_kind)
    other = "StatefulSet" if workload_kind == "Deployment" else "Deployment"
    check(len(workloads) == 1, f"{name}: expected one {workload_kind}, found {len(workloads)}")
    check(not by_kind(docs, other), f"{name}: must not hold a {other}")
    if not workloads:
        return None
    workload = workloads[0]
    replicas = workload["spec"].get("replicas", 1)
    if workload_kind == "Deployment":
        check(replicas >= 2, f"{name}: the Deployment must run at least 2 replicas, has {replicas}")
    else:
        check(replicas == 1, f"{name}: the SQLite StatefulSet must run exactly 1 replica, has {replicas}")
    pod = workload["spec"]["template"]["spec"]
    pod_sc = pod.get("securityContext", {})
    check(pod_sc.get("runAsNonRoot") is True, f"{name}: pod securityContext.runAsNonRoot must be true")
    check(pod_sc.get("runAsUser", 0) != 0, f"{name}: pod securityContext.runAsUser must not be 0")
    servers = [c for c in pod["containers"] if c["name"] == "topology-claims"]
    if not check(len(servers) == 1, f"{name}: no container named topology-claims"):
        return workload
    c = servers[0]
    check(c["image"].startswith("localhost/topology-claims:") or "/topology-claims:" in c["image"],
          f"{name}: the server image is {c['image']!r}, not the topology-claims image")
    check(c.get("args", [None])[0] == "serve", f"{name}: the server container must run `serve`")
    check(f"--listen=0.0.0.0:{GRPC_PORT}" in c.get("args", []),
          f"{name}: the server must --listen=0.0.0.0:{GRPC_PORT}")
    check(not any("allow-plaintext" in a for a in c.get("args", []))
          and "TOPOLOGY_CLAIMS_ALLOW_PLAINTEXT" not in env_of(c),
          f"{name}: the server must not allow plaintext")
    env = env_of(c)
    for var, path in [("TOPOLOGY_CLAIMS_TLS_CERT", "tls.crt"), ("TOPOLOGY_CLAIMS_TLS_KEY", "tls.key"),
                      ("TOPOLOGY_CLAIMS_TLS_CLIENT_CA", "ca.crt")]:
        value = env.get(var, {}).get("value", "")
        check(value.endswith("/" + path), f"{name}: {var} must name the mounted {path}, is {value!r}")
    tls_mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/etc/topology-claims/tls"]
    tls_volumes = {v["name"]: v for v in pod.get("volumes", [])}
    check(len(tls_mounts) == 1 and tls_volumes.get(tls_mounts[0]["name"], {}).get("secret", {})
          .get("secretName") == SERVER_TLS_SECRET,
          f"{name}: /etc/topology-claims/tls must mount the Secret {SERVER_TLS_SECRET}")

    # Probes: readiness follows the store, liveness the process, and a startup probe.
    ready = c.get("readinessProbe", {}).get("grpc", {})
    check(ready.get("port") == HEALTH_PORT and ready.get("service") == READINESS_SERVICE,
          f"{name}: readinessProbe must be gRPC on {HEALTH_PORT} service {READINESS_SERVICE}, is {ready}")
    live = c.get("livenessProbe", {}).get("grpc")
    check(live is not None and live.get("port") == HEALTH_PORT and live.get("service", "") == "",
          f"{name}: livenessProbe must be gRPC on {HEALTH_PORT} service \"\", is {live}")
    start = c.get("startupProbe", {}).get("grpc")
    check(start is not None and start.get("port") == HEALTH_PORT and start.get("service", "") == "",
          f"{name}: startupProbe must be gRPC on {HEALTH_PORT} service \"\", is {start}")
    check(f"--health-listen=0.0.0.0:{HEALTH_PORT}" in c.get("args", []),
          f"{name}: the probes need --health-listen=0.0.0.0:{HEALTH_PORT}, args are {c.get('args')}")

    sc = c.get("securityContext", {})
    check(sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation must be false")
    check(sc.get("readOnlyRootFilesystem") is True, f"{name}: readOnlyRootFilesystem must be true")
    check(sc.get("privileged", False) is False, f"{name}: privileged must be false")
    check("ALL" in sc.get("capabilities", {}).get("drop", []), f"{name}: capabilities must drop ALL")
    resources = c.get("resources", {})
    check(resources.get("requests", {}).get("cpu") and resources.get("requests", {}).get("memory")
          and resources.get("limits", {}).get("memory"),
          f"{name}: the server needs cpu/memory requests and a memory limit, has {resources}")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(ports == {"grpc": GRPC_PORT, "health": HEALTH_PORT, "metrics": 9464},
          f"{name}: container ports are {ports}")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(grace > 30, f"{name}: terminationGracePeriodSeconds ({grace}) must exceed the 30s drain")

    store = env.get("TOPOLOGY_CLAIMS_STORE", {})
    if workload_kind == "Deployment":
        ref = store.get("valueFrom", {}).get("secretKeyRef", {})
        check(ref.get("name") == "topology-claims-postgres" and ref.get("key") == "url",
              f"{name}: TOPOLOGY_CLAIMS_STORE must come from the Secret topology-claims-postgres "
              f"(key url), is {store}")
    else:
        value = store.get("value", "")
        check(value.startswith("sqlite:///var/lib/topology-claims/"),
              f"{name}: TOPOLOGY_CLAIMS_STORE must be the SQLite file on the volume, is {value!r}")
        claims = [t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])]
        data = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/var/lib/topology-claims"]
        check(len(data) == 1 and data[0]["name"] in claims,
              f"{name}: /var/lib/topology-claims must be a PersistentVolumeClaim of the StatefulSet")

    # The objects around the workload.
    selector = workload["spec"]["selector"]["matchLabels"]
    for kind in ["Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor",
                 "PrometheusRule", "Certificate"]:
        check(by_kind(docs, kind), f"{name}: no {kind}")
    pdbs = by_kind(docs, "PodDisruptionBudget")
    check(all(p["spec"]["selector"]["matchLabels"] == selector for p in pdbs),
          f"{name}: the PodDisruptionBudget does not select the server pods")
    services = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "topology-claims"]
    check(services and services[0]["spec"]["selector"] == selector,
          f"{name}: the Service topology-claims does not select the server pods")
    for np in by_kind(docs, "NetworkPolicy"):
        allowed = {p["port"] for rule in np["spec"]["ingress"] for p in rule.get("ports", [])}
        check(allowed == {"grpc", "metrics"}, f"{name}: the NetworkPolicy opens {allowed}")
    server_certs = [x for x in by_kind(docs, "Certificate") if x["spec"]["secretName"] == SERVER_TLS_SECRET]
    check(len(server_certs) == 1 and "server auth" in server_certs[0]["spec"].get("usages", []),
          f"{name}: no server Certificate (server auth) for the Secret {SERVER_TLS_SECRET}")
    return workload


def check_identities(rendered):
    expected_roles = {"identities": {"cell", "router"}, "identities/admin": {"admin"}}
    for name, roles in expected_roles.items():
        seen = set()
        for cert in by_kind(rendered[name], "Certificate"):
            spec = cert["spec"]
            uris = spec.get("uris", [])
            if not check(len(uris) == 1, f"{name}: {cert['metadata']['name']} needs exactly one URI SAN"):
                continue
            prefix = f"spiffe://{TRUST_DOMAIN}/"
            role, _, ident = uris[0][len(prefix):].partition("/") if uris[0].startswith(prefix) else ("", "", "")
            check(role in roles and ident, f"{name}: {uris[0]} is not spiffe://{TRUST_DOMAIN}/ROLE/NAME "
                  f"with ROLE in {sorted(roles)}")
            check(spec.get("usages") and "client auth" in spec["usages"] and "server auth" not in spec["usages"],
                  f"{name}: {cert['metadata']['name']} must be a client certificate")
            seen.add(role)
        check(seen == roles, f"{name}: identities for roles {sorted(seen)}, expected {sorted(roles)}")


def check_sidecars(docs):
    deployments = by_kind(docs, "Deployment")
    if not check(len(deployments) == 1, "sidecars: expected the cell's Deployment"):
        return
    pod = deployments[0]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in pod.get("volumes", [])}
    for sidecar in ["reconcile", "verify"]:
        c = containers.get(sidecar)
        if not check(c is not None, f"sidecars: no {sidecar} container"):
            continue
        check(c["args"][0] == sidecar, f"sidecars: the {sidecar} container runs {c['args'][0]}")
        env = env_of(c)
        check(env.get("TOPOLOGY_CLAIMS_SERVER", {}).get("value", "").startswith("https://"),
              f"sidecars: {sidecar} must reach the server over https")
        for var in ["TOPOLOGY_CLAIMS_CLIENT_TLS_CA", "TOPOLOGY_CLAIMS_CLIENT_TLS_CERT", "TOPOLOGY_CLAIMS_CLIENT_TLS_KEY",
                    "TOPOLOGY_CLAIMS_CELL_ID", "TOPOLOGY_CLAIMS_LOCAL_DB"]:
            check(var in env, f"sidecars: {sidecar} lacks {var}")
        check(any(a.startswith("--metrics-listen=") for a in c["args"]),
              f"sidecars: {sidecar} must serve metrics (--metrics-listen)")
        tls = [secrets.get(m["name"]) for m in c.get("volumeMounts", [])
               if m["mountPath"] == "/etc/topology-claims/tls"]
        check(tls and tls[0] and "-cell-" in tls[0] and "admin" not in tls[0],
              f"sidecars: {sidecar} must mount a cell identity, mounts {tls}")
        sc = c.get("securityContext", {})
        check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False,
              f"sidecars: {sidecar} securityContext is {sc}")
    check(any("--every" in a for a in containers.get("verify", {}).get("args", [])),
          "sidecars: verify must run with --every to stay up and be scraped")
    check(by_kind(docs, "ServiceMonitor"), "sidecars: no ServiceMonitor for the sidecars' metrics")


def main():
    rendered = {k: render(k) for k in KUSTOMIZATIONS}
    if failures:
        return 1
    validate_all(rendered)
    postgres = check_server("overlays/postgres", rendered["overlays/postgres"], "Deployment")
    sqlite = check_server("overlays/sqlite", rendered["overlays/sqlite"], "StatefulSet")
    if postgres and sqlite:
        # One pod specification in spirit: the probes and security settings must not drift apart.
        def server(w):
            return next(c for c in w["spec"]["template"]["spec"]["containers"] if c["name"] == "topology-claims")
        for field in ["startupProbe", "livenessProbe", "readinessProbe", "securityContext", "resources", "ports"]:
            check(server(postgres).get(field) == server(sqlite).get(field),
                  f"the overlays' server containers differ in {field}")
        check(postgres["spec"]["template"]["spec"]["securityContext"]
              == sqlite["spec"]["template"]["spec"]["securityContext"],
              "the overlays' pod securityContexts differ")
    check_identities(rendered)
    check_sidecars(rendered["sidecars"])
    check(not any(d["kind"] == "Certificate" and "/admin/" in json.dumps(d)
                  for k in KUSTOMIZATIONS if k != "identities/admin" for d in rendered[k]),
          "an admin identity is issued outside deploy/kubernetes/identities/admin")
    if failures:
        print(f"manifests: {len(failures)} failure(s)", file=sys.stderr)
        return 1
    docs = sum(len(d) for d in rendered.values())
    print(f"manifests: {len(KUSTOMIZATIONS)} kustomizations, {docs} objects: rendered, validated "
          f"(Kubernetes {', '.join(KUBERNETES_VERSIONS)} strict; custom resources against "
          f"deploy/tests/crd-schemas.yaml) and checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
