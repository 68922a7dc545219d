#!/usr/bin/env bash
# The container test (CI runs it after deploy/test.sh): builds the CPU image from the project's
# Dockerfile with podman on a Debian base made by debootstrap, runs it, solves through it from
# the host, stops it and checks the graceful exit; then runs the compose file's CPU service and
# example job with podman-compose. Needs root (or sudo) on Debian 12 with the Debian mirror
# reachable; no registry, no Docker engine.
#   bash deploy/container-test.sh [CLI]
# CLI: the host's trisolve client (default ${BUILD_DIR:-<repo>/build}/client/trisolve; env
# TRISOLVE_CLI). Other settings (env):
#   TRISOLVE_CONTAINER_CACHE  kept between runs (default /var/cache/trisolve-container): the
#                             base image's tarball (remade after 7 days), ccache's cache and
#                             apt's downloaded packages for the image build; "" keeps nothing.
#   TRISOLVE_CONTEXT          the build context (default: the repository)
#   TRISOLVE_CONTAINER_LOGS   a folder to keep the run's logs in (build, server, compose)
#   TMPDIR                    where the run's storage, configuration and logs go (removed at the end)
# podman is called directly: the Docker API socket (podman system service) hung here.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cli=${1:-${TRISOLVE_CLI:-${BUILD_DIR:-$top/build}/client/trisolve}}
cache=${TRISOLVE_CONTAINER_CACHE-/var/cache/trisolve-container}
context=${TRISOLVE_CONTEXT:-$top}
compose_file=$top/deploy/docker-compose.yml
swc=$top/tests/data/neuron_10-2012-02-09-001.CNG.swc
t0=$SECONDS
step() { printf '\n=== [%4ds] %s\n' $((SECONDS - t0)) "$*"; }
fail() { echo "container-test: FAIL: $*" >&2; exit 1; }

[ -x "$cli" ] || fail "no host CLI at $cli (build first: deploy/build.sh, or pass its path)"
if [ "$(id -u)" != 0 ]; then  # apt-get, debootstrap and rootful podman: as root, under sudo
  command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
    fail "needs root or password-less sudo (apt-get, debootstrap, rootful podman)"
  exec sudo -n --preserve-env bash "$0" "$cli"
fi

step "packages: podman, runc, debootstrap, podman-compose from Debian"
# runc, not crun: crun 1.8 refuses this kind of machine's hybrid cgroup layout. netavark and
# aardvark-dns: the compose network, with service names resolved.
pkgs=(podman runc debootstrap podman-compose netavark aardvark-dns iptables conmon
      debian-archive-keyring)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } ||
    fail "cannot install ${missing[*]} from Debian: the container test did not run"
fi
podman --version || fail "podman does not run here: the container test did not run"
podman-compose version 2>/dev/null | grep -i 'podman-compose version' || true

# Everything this run creates: names with its own suffix, storage and configuration in $work.
run_id=ct$$
name=trisolve-$run_id
project=trisolve$run_id
image=localhost/trisolve-cpu:$run_id
base=localhost/trisolve-debian-base:$run_id
work=$(mktemp -d "${TMPDIR:-/var/tmp}/trisolve-container-test.XXXXXX")
compose_up=0
# What rootful podman 4.3 and netavark change on the host whatever the configuration says:
# netavark's run folder, the blob-info cache, netavark's iptables chains, IPv4 forwarding. Put
# back at the end as found (what was there before this run is left alone).
made_paths=()
for d in /run/containers/networks /run/containers /var/lib/containers/cache /var/lib/containers; do
  [ -e "$d" ] || made_paths+=("$d")
done
had_netavark_chains=$(iptables-save 2>/dev/null | grep -c NETAVARK || true)
ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)
undo_host() {
  local d t c r
  for d in "${made_paths[@]}"; do
    case $d in */networks | */cache) rm -rf "$d" ;; *) [ -d "$d" ] && rmdir "$d" ;; esac
  done
  if [ "$had_netavark_chains" = 0 ] && command -v iptables >/dev/null; then
    for t in nat filter; do
      iptables -t $t -S | grep -E '^-A [A-Z]+ .*-j NETAVARK' | sed 's/^-A /-D /' |
        while read -r r; do eval "iptables -t $t $r"; done
      for c in $(iptables -t $t -S | awk '$1 == "-N" && $2 ~ /^NETAVARK/ {print $2}'); do
        iptables -t $t -F "$c"
      done
      for c in $(iptables -t $t -S | awk '$1 == "-N" && $2 ~ /^NETAVARK/ {print $2}'); do
        iptables -t $t -X "$c"
      done
    done
  fi
  echo "$ip_forward" | tee /proc/sys/net/ipv4/ip_forward >/dev/null
}
cleanup() {
  local rc=$?
  set +e
  trap - EXIT
  if command -v podman >/dev/null && [ -f "$work/conf/containers.conf" ]; then
    if ((compose_up)); then
      podman-compose -p "$project" -f "$compose_file" down -t 40 >>"$work/compose-down.log" 2>&1
    fi
    for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null); do
      case $c in "$name" | "$project"_*) podman rm -f -t 5 "$c" >/dev/null 2>&1 ;; esac
    done
    podman network rm -f "${project}_default" >/dev/null 2>&1
    podman rmi -f "$image" "$base" >/dev/null 2>&1
    podman system reset --force >/dev/null 2>&1
  fi
  if [ -n "${TRISOLVE_CONTAINER_LOGS:-}" ]; then  # the run's logs kept (e.g. CI artifacts)
    mkdir -p "$TRISOLVE_CONTAINER_LOGS" && cp "$work"/*.log "$work"/*.out "$TRISOLVE_CONTAINER_LOGS"/ 2>/dev/null
  fi
  # The overlay driver mounts its home on itself; anything left mounted under $work goes first.
  awk -v w="$work" '$5 == w || index($5, w "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m"; done
  rm -rf "$work"
  undo_host 2>/dev/null
  if ((rc)); then echo "container-test: FAILED after $((SECONDS - t0)) s" >&2
  else echo "container-test: passed in $((SECONDS - t0)) s"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "containers configuration in $work/conf (not /etc)"
mkdir -p "$work/conf" "$work/tmp"
cat >"$work/conf/containers.conf" <<EOF
[containers]
# root here lacks CAP_SYS_RESOURCE and podman's default limits are above the hard limits.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
# No systemd or journald on these machines.
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$work/libpod"
volume_path = "$work/storage/volumes"

[network]
network_backend = "netavark"
network_config_dir = "$work/networks"
EOF
cat >"$work/conf/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
export CONTAINERS_CONF=$work/conf/containers.conf
export CONTAINERS_STORAGE_CONF=$work/conf/storage.conf
export TMPDIR=$work/tmp
if ! podman info >"$work/podman-info.log" 2>&1; then
  cat "$work/podman-info.log" >&2
  fail "podman cannot run on this machine (podman info failed above); the container test did not run"
fi
echo "podman: $(podman info --format '{{.Store.GraphDriverName}} storage, {{.Host.OCIRuntime.Name}}, cgroups {{.Host.CgroupsVersion}}')"

# The answer of `trisolve solve --json` (its last line): every system solved, the backward
# error small.
cat >"$work/check.py" <<'EOF'
import json, math, sys
kind, path = sys.argv[1], sys.argv[2]
lines = [l for l in open(path).read().splitlines() if l.startswith("{")]
if not lines:
    sys.exit(f"{kind}: no JSON answer in {path}")
r = json.loads(lines[-1])
res, st = r.get("residual"), r.get("status", {})
ok = (res is not None and math.isfinite(res) and res < 1e-6 and st.get("ok") == r.get("systems")
      and not st.get("singular") and not st.get("not_converged") and not st.get("diverged"))
print(f"{kind:18s} {r.get('systems')} system(s) ok {st.get('ok')}, {r.get('backend')} "
      f"{r.get('method')}, backward error {res} -> {'ok' if ok else 'WRONG'}")
if not ok:
    sys.exit(json.dumps(r))
EOF

step "base image: debootstrap --variant=minbase from the machine's Debian mirror"
# shellcheck disable=SC1091
suite=${TRISOLVE_DEBIAN_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
[ -n "$suite" ] || fail "cannot tell the Debian suite (set TRISOLVE_DEBIAN_SUITE)"
site_of() { apt-get indextargets --format '$(SITE) $(RELEASE)' 2>/dev/null | awk -v r="$1" '$2 == r {print $1; exit}'; }
mirror=${TRISOLVE_DEBIAN_MIRROR:-$(site_of "$suite")}
[ -n "$mirror" ] || fail "no apt source for $suite found (set TRISOLVE_DEBIAN_MIRROR)"
security=$(site_of "$suite-security")
updates=$(site_of "$suite-updates")
key=$(printf '%s %s %s %s' "$suite" "$mirror" "$security" "$updates" | sha256sum | cut -c1-12)
tarball=${cache:+$cache/base-$suite-minbase-$key.tar}
if [ -n "$tarball" ] && [ -s "$tarball" ] && [ -z "$(find "$tarball" -mtime +7)" ]; then
  echo "from the cache: $tarball ($(du -h "$tarball" | cut -f1), $(date -r "$tarball" +%F))"
else
  rootfs=$work/rootfs
  debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; fail "debootstrap $suite from $mirror failed"; }
  # The same suites as the host (point releases and security fixes): the image's packages are
  # the versions CI built and tested with.
  {
    echo "deb $mirror $suite main"
    [ -n "$updates" ] && echo "deb $updates $suite-updates main"
    [ -n "$security" ] && echo "deb $security $suite-security main"
  } | tee "$rootfs/etc/apt/sources.list" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tarball=${tarball:-$work/base.tar}
  mkdir -p "$(dirname "$tarball")"
  tar -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
  rm -rf "$rootfs"
  # Older bases of other keys go.
  [ -n "$cache" ] && find "$cache" -maxdepth 1 -name 'base-*.tar' ! -path "$tarball" -delete
fi
podman import --quiet "$tarball" "$base" >/dev/null
echo "$base: $suite from $mirror${updates:+, updates}${security:+, security}"
podman run --rm --network none "$base" /bin/true 2>"$work/probe.log" ||
  { cat "$work/probe.log" >&2; fail "podman cannot start a container on this machine (above)"; }

step "image: the project's Dockerfile, CPU build on $base"
build_volumes=()
if [ -n "$cache" ]; then
  mkdir -p "$cache/ccache" "$cache/apt-archives/partial"
  # ccache's cache and apt's downloads kept between runs: a second build recompiles nothing
  # that did not change and downloads no package again.
  build_volumes=(--volume "$cache/ccache:/root/.cache/ccache"
                 --volume "$cache/apt-archives:/var/cache/apt/archives")
fi
tb=$SECONDS
# --format docker: the OCI format has no HEALTHCHECK and podman would drop it.
if ! podman build --format docker --pull=never --network host "${build_volumes[@]}" \
     --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" \
     --build-arg TRISOLVE_CUDA=OFF -t "$image" -f "$top/Dockerfile" "$context" 2>&1 |
     while IFS= read -r line; do printf '[%4ds] %s\n' $((SECONDS - tb)) "$line"; done >"$work/build.log"; then
  tail -40 "$work/build.log" >&2
  fail "podman build of the CPU image failed"
fi
build_s=$((SECONDS - tb))
grep -E '^\[ *[0-9]+s\] (\[[0-9]/[0-9]\] )?(STEP [0-9]+/[0-9]+: (FROM|RUN|COPY)|COMMIT)' "$work/build.log" | cut -c1-110 || true
echo "built $image in $build_s s: $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
podman image inspect "$image" >"$work/image.json"
python3 - "$work/image.json" <<'EOF' || fail "the image is not what the Dockerfile says (above)"
import json, sys
img = json.load(open(sys.argv[1]))[0]
hc, user = img.get("Healthcheck") or {}, (img.get("Config") or {}).get("User")
print(f"HEALTHCHECK {hc.get('Test')}; user {user}")
assert hc.get("Test", [])[1:3] == ["trisolve", "--timeout"] and "health" in hc["Test"], \
    "the image lost its HEALTHCHECK (built without --format docker?)"
assert user == "trisolve", f"the image runs as {user!r}, not the unprivileged user trisolve"
EOF

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_healthy() {  # container, seconds: the image's own HEALTHCHECK, run until it says healthy
  local i
  for ((i = 0; i < $2; i++)); do
    if podman healthcheck run "$1" >/dev/null 2>&1; then
      echo "$1: healthy after ~${i} s ($(podman inspect --format '{{.State.Health.Status}}' "$1"))"
      return 0
    fi
    [ "$(podman inspect --format '{{.State.Running}}' "$1")" = true ] ||
      { podman logs "$1" >&2; fail "$1 exited before it was healthy"; }
    sleep 1
  done
  podman logs "$1" >&2
  fail "$1 not healthy after $2 s"
}
check_published_loopback() {  # container: every published port is on 127.0.0.1
  local ports
  ports=$(podman port "$1")
  echo "$ports" | sed "s/^/$1 publishes /"
  [ -n "$ports" ] || fail "$1 publishes no port"
  if echo "$ports" | grep -v -- '-> 127\.0\.0\.1:'; then fail "$1 publishes beyond loopback"; fi
}

step "run: $name, port on 127.0.0.1, waiting for the image's HEALTHCHECK"
port=$(free_port)
# No systemd here to time the periodic check (--health-interval disable keeps podman from
# asking); the image's HEALTHCHECK command is run on demand below.
# (podman 4.3 still logs that it found no systemd: kept in run.log.)
podman run -d --name "$name" --health-interval disable -p "127.0.0.1:$port:50051" -e TRISOLVE_BACKEND=cpu \
  -e TRISOLVE_LOG_LEVEL=info "$image" >/dev/null 2>"$work/run.log" ||
  { cat "$work/run.log" >&2; fail "podman run of the image failed"; }
wait_healthy "$name" 60
check_published_loopback "$name"
"$cli" --server "127.0.0.1:$port" --timeout 10 info

step "solve one example of each family from the host through the container"
ex=$work/examples
for kind in tridiagonal tree block-tridiagonal dense; do
  extra=()
  [ "$kind" = tree ] && extra=(--swc "$swc")
  cmd=$("$cli" make-example "$kind" "$ex/$kind" "${extra[@]}")
  read -r -a words <<<"$cmd"
  out=$ex/$kind.json
  if ! "$cli" --server "127.0.0.1:$port" --timeout 120 "${words[@]:1}" --json >"$out" 2>"$ex/$kind.err"; then
    cat "$ex/$kind.err" "$out" >&2
    fail "$kind: the solve failed (exit non-zero): ${words[*]:1}"
  fi
  python3 "$work/check.py" "$kind" "$out" || fail "$kind: the answer does not check (above)"
done

step "SIGTERM (podman stop): graceful exit"
podman stop -t 40 "$name" >/dev/null 2>>"$work/run.log" || { cat "$work/run.log" >&2; fail "podman stop failed"; }
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
podman logs "$name" >"$work/server.log" 2>&1
grep -E 'draining|exiting' "$work/server.log" || true
[ "$code" = 0 ] || { cat "$work/server.log" >&2; fail "exit code $code after SIGTERM, expected 0"; }
grep -q 'signal SIGTERM: draining' "$work/server.log" || fail "no drain line in the log"
grep -q 'all jobs finished; exiting' "$work/server.log" || fail "no clean exit line in the log"
podman rm "$name" >/dev/null 2>>"$work/run.log"
echo "exit code 0, drained"

step "compose: the CPU profile with podman-compose ($(podman-compose version 2>/dev/null | awk '/podman-composer? version/ {print $NF; exit}'))"
# podman-compose 1.0.3 knows no profiles and no depends_on conditions: the services are named,
# the health is waited for here, and the example runs with --no-deps.
export TRISOLVE_CPU_IMAGE=$image TRISOLVE_CPU_PORT=$(free_port) TRISOLVE_CPU_METRICS_PORT=$(free_port)
unset TRISOLVE_PUBLISH_ADDR
pc() { podman-compose -p "$project" -f "$compose_file" "$@"; }
compose_up=1
pc up -d --no-build trisolved-cpu >"$work/compose-up.log" 2>&1 ||
  { cat "$work/compose-up.log" >&2; fail "podman-compose up failed"; }
svc=$(podman ps --filter "label=io.podman.compose.project=$project" --format '{{.Names}}' | head -1)
[ -n "$svc" ] || { cat "$work/compose-up.log" >&2; fail "podman-compose started no container"; }
wait_healthy "$svc" 60
check_published_loopback "$svc"
"$cli" --server "127.0.0.1:$TRISOLVE_CPU_PORT" --timeout 10 health
python3 - "$TRISOLVE_CPU_METRICS_PORT" <<'EOF' || fail "no /metrics on 127.0.0.1"
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
assert "trisolve_requests_total" in text or "trisolve_jobs_in_flight" in text, text[:500]
print(f"/metrics on 127.0.0.1:{sys.argv[1]}: {len(text.splitlines())} lines")
EOF
# podman-compose run does not pass the job's exit code on: a named container, inspected.
pc run --name "${project}_example" --no-deps -T example-cpu >"$work/example.log" 2>&1 || true
code=$(podman inspect --format '{{.State.ExitCode}}' "${project}_example" 2>/dev/null || echo none)
podman logs "${project}_example" >"$work/example.out" 2>&1 || true
podman rm -f "${project}_example" >/dev/null 2>&1 || true
[ "$code" = 0 ] || { cat "$work/example.log" "$work/example.out" >&2; fail "the example job exited $code"; }
python3 "$work/check.py" example-cpu "$work/example.out" ||
  { cat "$work/example.out" >&2; fail "the example job's answer does not check"; }
pc down -t 40 >"$work/compose-down.log" 2>&1 || { cat "$work/compose-down.log" >&2; fail "podman-compose down failed"; }
compose_up=0
left=$(podman ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}')
[ -z "$left" ] || fail "podman-compose down left $left"
echo "compose: up, healthy, example solved, down"

step "summary"
echo "image build $build_s s; the whole test $((SECONDS - t0)) s (cache: ${cache:-none})"
