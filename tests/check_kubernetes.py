#!/usr/bin/env python3
"""Checks deploy/kubernetes/: every manifest parses (PyYAML, Debian's python3-yaml), has the
apiVersion and kind Kubernetes serves for it, and says what docs/deployment.md says: a
Deployment requesting nvidia.com/gpu, gRPC readiness and liveness probes on grpc.health.v1 that
cannot kill a draining replica, each replica advertising its pod address; a headless Service for
client-side balancing; a PodDisruptionBudget; a HorizontalPodAutoscaler on trisolve_jobs_queued,
a metric the server exports; all selecting the same pods. Exit 77 (ctest: skipped) without
PyYAML. No cluster is needed (none runs in CI)."""
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIPPED: PyYAML (python3-yaml) is not installed")
    sys.exit(77)

folder, metrics_source = sys.argv[1], sys.argv[2]
errors = []


def check(cond, what):
    if not cond:
        errors.append(what)
    return cond


docs = {}
for name in sorted(os.listdir(folder)):
    if not name.endswith(".yaml") or name == "kustomization.yaml":
        continue
    with open(os.path.join(folder, name)) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            kind = doc.get("kind")
            check(kind not in docs, f"{name}: a second {kind}")
            docs[kind] = doc

with open(os.path.join(folder, "kustomization.yaml")) as f:
    kustomization = yaml.safe_load(f)
listed = set(kustomization.get("resources", []))
on_disk = {n for n in os.listdir(folder) if n.endswith(".yaml") and n != "kustomization.yaml"}
check(listed == on_disk, f"kustomization.yaml lists {sorted(listed)}, the folder holds {sorted(on_disk)}")

API = {"Deployment": "apps/v1", "Service": "v1", "PodDisruptionBudget": "policy/v1",
       "HorizontalPodAutoscaler": "autoscaling/v2"}
for kind, api in API.items():
    if check(kind in docs, f"no {kind}"):
        check(docs[kind].get("apiVersion") == api,
              f"{kind}: apiVersion {docs[kind].get('apiVersion')}, expected {api}")
        check(docs[kind].get("metadata", {}).get("name") == "trisolved", f"{kind}: not named trisolved")
if errors:
    sys.exit("\n".join(errors))

dep, svc, pdb, hpa = (docs[k] for k in API)
labels = dep["spec"]["selector"]["matchLabels"]
pod = dep["spec"]["template"]
check(all(pod["metadata"]["labels"].get(k) == v for k, v in labels.items()),
      "Deployment: the pod template lacks the selector's labels")
check(svc["spec"]["selector"] == labels, "Service: selects other pods than the Deployment")
check(pdb["spec"]["selector"]["matchLabels"] == labels, "PDB: selects other pods than the Deployment")

# The Deployment's container.
containers = pod["spec"]["containers"]
check(len(containers) == 1, "Deployment: one container expected")
c = containers[0]
check(str(c["resources"]["limits"].get("nvidia.com/gpu")) == "1", "container: no nvidia.com/gpu limit of 1")
env = {e["name"]: e for e in c.get("env", [])}
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
check(ports.get("grpc") == 50051, "container: no grpc port 50051")
listen = env.get("TRISOLVE_LISTEN", {}).get("value", "")
check(listen.endswith(":50051") and listen.split(":")[0] in ("0.0.0.0", "[::]"),
      f"TRISOLVE_LISTEN {listen!r}: must listen on every address of the pod, port 50051")
check(env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP",
      "POD_IP: not from the downward API's status.podIP")
check(env.get("TRISOLVE_ADVERTISE_ADDRESS", {}).get("value") == "$(POD_IP):50051",
      "TRISOLVE_ADVERTISE_ADDRESS: handles must name the pod's address and port")
check(env.get("TRISOLVE_BACKEND", {}).get("value") == "cuda", "TRISOLVE_BACKEND: not cuda")
grace = float(env.get("TRISOLVE_GRACE", {}).get("value", "30"))
termination = pod["spec"].get("terminationGracePeriodSeconds", 30)
check(termination > grace, f"terminationGracePeriodSeconds {termination} not above the drain's {grace} s")
check(pod["spec"].get("securityContext", {}).get("runAsNonRoot") is True, "pod: not runAsNonRoot")

for probe in ("readinessProbe", "livenessProbe"):
    p = c.get(probe)
    if check(p is not None and "grpc" in p, f"{probe}: not a gRPC probe (grpc.health.v1)"):
        check(p["grpc"].get("port") == 50051, f"{probe}: not on port 50051")
ready, live = c.get("readinessProbe", {}), c.get("livenessProbe", {})
check(ready.get("grpc", {}).get("service") == "trisolve.v1.Solver",
      "readinessProbe: must ask for trisolve.v1.Solver (NOT_SERVING once a drain begins)")
# A draining server answers NOT_SERVING for every service: liveness must not fail it within
# the grace period, or the kubelet kills running jobs.
live_window = live.get("periodSeconds", 10) * live.get("failureThreshold", 3)
check(live_window > termination,
      f"livenessProbe fails after {live_window} s, within terminationGracePeriodSeconds {termination}")

# Every TRISOLVE_ variable is a server flag's environment name.
main_cc = open(os.path.join(os.path.dirname(metrics_source), "main.cc")).read()
for name in env:
    if name.startswith("TRISOLVE_"):
        check(f'envname("{name}")' in main_cc, f"{name}: trisolved has no such setting")

# The headless Service.
check(svc["spec"].get("clusterIP") == "None", "Service: not headless (clusterIP: None)")
check(not svc["spec"].get("publishNotReadyAddresses", False),
      "Service: publishes replicas that are not ready")
svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
check(svc_ports.get("grpc", {}).get("port") == 50051, "Service: no grpc port 50051")

# The disruption budget keeps replicas serving.
spec = pdb["spec"]
check(("maxUnavailable" in spec) != ("minAvailable" in spec), "PDB: one of maxUnavailable, minAvailable")
if "maxUnavailable" in spec:
    check(spec["maxUnavailable"] == 1, "PDB: maxUnavailable should be 1")

# The autoscaler, on a metric the server exports as a gauge.
ref = hpa["spec"]["scaleTargetRef"]
check(ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "trisolved"},
      f"HPA: scales {ref}")
check(1 <= hpa["spec"].get("minReplicas", 1) <= hpa["spec"]["maxReplicas"], "HPA: replica bounds")
check(hpa["spec"].get("minReplicas", 1) >= 2, "HPA: fewer than 2 replicas leaves no one to fail over to")
metrics = hpa["spec"]["metrics"]
names = [m.get("pods", {}).get("metric", {}).get("name") for m in metrics if m.get("type") == "Pods"]
check("trisolve_jobs_queued" in names, f"HPA: not on trisolve_jobs_queued ({names})")
source = open(metrics_source).read() + open(os.path.join(os.path.dirname(metrics_source), "service.cc")).read()
for n in names:
    n = re.escape(n or "")
    check(re.search(r'Header\(out, "%s", "gauge"|# TYPE %s gauge' % (n, n), source) is not None,
          f"HPA: {n} is not a gauge the server exports")

if errors:
    sys.exit("\n".join(errors))
print(f"{len(docs)} manifests checked: {', '.join(sorted(docs))}")
