#!/usr/bin/env python3
"""Checks deploy/docker-compose.yml: `docker compose config` (or `docker-compose config`) where
one exists, and in any case its structure and its safe defaults: GPU reserved the compose way,
health checks, CPU profile, example jobs that wait for a healthy server, every port published on
127.0.0.1 unless the operator sets TRISOLVE_PUBLISH_ADDR, /metrics on 127.0.0.1 always, and no
two services on one host port. Exit 77 (ctest: skipped) only when neither a compose tool nor
PyYAML is available. deploy/container-test.sh runs the file for real with podman-compose."""
import os
import re
import shutil
import subprocess
import sys

path = sys.argv[1]
checked = None
env = {k: v for k, v in os.environ.items() if not k.startswith("TRISOLVE_")}
for tool in (["docker", "compose"], ["docker-compose"]):
    if not shutil.which(tool[0]) or subprocess.run(tool + ["version"], capture_output=True,
                                                   env=env).returncode != 0:
        continue
    r = subprocess.run(tool + ["-f", path, "config", "--quiet"], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        sys.exit(f"{' '.join(tool)} config failed:\n{r.stderr}")
    checked = " ".join(tool)
    break
try:
    import yaml
except ImportError:
    if checked:
        sys.exit(0)
    print("SKIPPED: neither `docker compose`, `docker-compose` nor PyYAML is available")
    sys.exit(77)

VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value, values):
    """Compose's ${VAR:-default}: VAR from `values`, else the default."""
    return VAR.sub(lambda m: values.get(m.group(1), m.group(2) or ""), value)


def published(service, values):
    """(host address, host port, container port) of each published port, interpolated."""
    out = []
    for p in service.get("ports", []):
        parts = interpolate(p, values).split(":")
        assert len(parts) == 3, f"{p}: the host address must be explicit (HOST:PORT:PORT)"
        out.append((parts[0], parts[1], parts[2]))
    return out


doc = yaml.safe_load(open(path))
svc = doc["services"]
gpu = svc["trisolved"]["deploy"]["resources"]["reservations"]["devices"][0]
assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"], gpu
for name in ("trisolved", "trisolved-cpu"):
    s = svc[name]
    assert s["healthcheck"]["test"][1:3] == ["trisolve", "--timeout"], s["healthcheck"]
    assert s["restart"] == "unless-stopped"
    assert s["stop_signal"] == "SIGTERM"
    assert s["environment"]["TRISOLVE_GRACE"] == "30" and s["stop_grace_period"] == "40s"
    assert published(s, {})[0][2] == "50051", s["ports"]
assert svc["trisolved"]["environment"]["TRISOLVE_BACKEND"] == "cuda"
assert svc["trisolved-cpu"]["environment"]["TRISOLVE_BACKEND"] == "cpu"
assert svc["trisolved-cpu"]["profiles"] == ["cpu"] and "deploy" not in svc["trisolved-cpu"]
assert svc["trisolved-cpu"]["build"]["args"]["TRISOLVE_CUDA"] == "OFF"
assert svc["example"]["profiles"] == ["example"]

# Safe defaults (issue 35): loopback unless the operator opts in; /metrics on loopback always.
for name, s in svc.items():
    for addr, port, inner in published(s, {}):
        assert addr == "127.0.0.1", f"{name} publishes {port} on {addr!r} by default"
    for addr, port, inner in published(s, {"TRISOLVE_PUBLISH_ADDR": "0.0.0.0"}):
        if inner == "9464":
            assert addr == "127.0.0.1", f"{name}: /metrics follows TRISOLVE_PUBLISH_ADDR"
    metrics_listen = s.get("environment", {}).get("TRISOLVE_METRICS_LISTEN")
    if metrics_listen:
        assert metrics_listen.rsplit(":", 1)[1] in [p[2] for p in published(s, {})], name
assert ("0.0.0.0", "50051", "50051") in published(svc["trisolved"], {"TRISOLVE_PUBLISH_ADDR": "0.0.0.0"})

# The GPU and the CPU service can run side by side: no host port taken twice.
ports = [(p[0], p[1]) for s in svc.values() for p in published(s, {})]
assert len(ports) == len(set(ports)), f"host ports taken twice: {ports}"

# The example jobs wait for a healthy server (docker compose, docker-compose 1.27+).
for name, server in (("example", "trisolved"), ("example-cpu", "trisolved-cpu")):
    s = svc[name]
    assert s["depends_on"] == {server: {"condition": "service_healthy"}}, s.get("depends_on")
    assert "trisolve solve tridiagonal" in s["command"][0]
    assert s["image"] == svc[server]["image"], (s["image"], svc[server]["image"])
    assert s.get("profiles"), f"{name} must not start with a plain `up`"
assert svc["example-cpu"]["environment"]["TRISOLVE_SERVER"] == "trisolved-cpu:50051"

# The Dockerfile's health check and the compose one use the same CLI call; the image is built by
# the project's scripts, from bases given as build arguments.
dockerfile = open(path.replace("deploy/docker-compose.yml", "Dockerfile")).read()
assert 'CMD ["trisolve", "--timeout", "3", "health"]' in dockerfile
assert "deploy/install-deps.sh" in dockerfile and "deploy/build.sh" in dockerfile
assert "FROM ${BUILD_IMAGE} AS build" in dockerfile and "FROM ${RUNTIME_IMAGE}" in dockerfile
assert "-DTRISOLVE_CUDA=${TRISOLVE_CUDA}" in dockerfile
assert re.search(r"^USER trisolve$", dockerfile, re.M)
print("docker-compose.yml: ok" + (f" ({checked} config passed)" if checked else ""))
