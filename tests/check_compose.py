#!/usr/bin/env python3
"""Checks deploy/docker-compose.yml: `docker compose config` where the plugin exists, and in
any case its structure (GPU reserved the compose way, health checks, CPU profile, example job).
Exit 77 (ctest: skipped) only when neither docker compose nor PyYAML is available."""
import shutil
import subprocess
import sys

path = sys.argv[1]
checked = False
if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                             capture_output=True).returncode == 0:
    r = subprocess.run(["docker", "compose", "-f", path, "config", "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"docker compose config failed:\n{r.stderr}")
    checked = True
try:
    import yaml
except ImportError:
    if checked:
        sys.exit(0)
    print("SKIPPED: neither `docker compose` nor PyYAML is available")
    sys.exit(77)

doc = yaml.safe_load(open(path))
svc = doc["services"]
gpu = svc["trisolved"]["deploy"]["resources"]["reservations"]["devices"][0]
assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"], gpu
for name in ("trisolved", "trisolved-cpu"):
    s = svc[name]
    assert s["healthcheck"]["test"][1:3] == ["trisolve", "--timeout"], s["healthcheck"]
    assert s["restart"] == "unless-stopped"
    assert s["ports"][0] == "50051:50051", s["ports"]
assert svc["trisolved"]["environment"]["TRISOLVE_BACKEND"] == "cuda"
assert svc["trisolved-cpu"]["environment"]["TRISOLVE_BACKEND"] == "cpu"
assert svc["trisolved-cpu"]["profiles"] == ["cpu"] and "deploy" not in svc["trisolved-cpu"]
assert svc["example"]["profiles"] == ["example"]
assert "trisolve solve tridiagonal" in svc["example"]["command"][0]
# The Dockerfile's health check and the compose one use the same CLI call.
dockerfile = open(path.replace("deploy/docker-compose.yml", "Dockerfile")).read()
assert 'CMD ["trisolve", "--timeout", "3", "health"]' in dockerfile
assert "deploy/install-deps.sh" in dockerfile and "deploy/build.sh" in dockerfile
print("docker-compose.yml: ok" + (" (docker compose config passed)" if checked else ""))
