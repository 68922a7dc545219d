#!/usr/bin/env bash
# Installs what deploy/packages.txt lists and this machine lacks (apt-get; root or sudo).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# A line is a package, optionally followed by a tag; TRISOLVE_DEPS_SKIP=TAG leaves that tag's
# packages out (the image's build stage: fuzz).
mapfile -t pkgs < <(sed 's/#.*//' "$here/packages.txt" |
  awk -v skip="${TRISOLVE_DEPS_SKIP:-}" 'NF && !(skip != "" && $2 == skip) {print $1}')
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
