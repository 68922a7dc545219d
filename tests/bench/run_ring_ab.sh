#!/usr/bin/env bash
# Builds (or server flags) side by side on the request ring (issue 31: throughput that does not
# fall from 16 to 256 clients): run_ring.sh once a configuration a round, the configurations
# interleaved round by round (so a drift of the machine's load falls on all of them alike), ring
# transport, unary and by handle, at 1 / 16 / 64 / 256 clients; at the end the medians over the
# rounds, and each configuration's 256 clients against its 16. Every answer is checked.
# CONFIGS: one configuration a line, "label|where|server flags": where is a RUN wrapper (the
# GPU bundle's .gpu/run) or a build directory holding server/trisolved and client/trisolve.
#   here:      CONFIGS=$'main|/path/to/main/build|\nnew|build|' bash tests/bench/run_ring_ab.sh
#   lent GPU:  BACKEND=cuda CONFIGS=$'main|.gpu-main/run|\nnew|.gpu/run|' \
#                bash tests/bench/run_ring_ab.sh
# ROUNDS (3), SCALE (requests a client times this; 10), MODES ("unary handle"), CLIENTS as
# run_ring.sh takes them; logs under $OUT/<label>/r<round>/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/trisolve-ring-ab}
mkdir -p "$out"
configs=${CONFIGS:?CONFIGS: one "label|RUN or build directory|server flags" a line}
for round in $(seq "${ROUNDS:-3}"); do
  while IFS='|' read -r label where flags; do
    [ -z "$label" ] && continue
    echo "=== round $round: $label ($where${flags:+, $flags})"
    mkdir -p "$out/$label"
    if [ -d "$where" ]; then
      run_env=(RUN= BIN="$where")
    else
      run_env=(RUN="$where")
    fi
    env "${run_env[@]}" SERVER_ARGS="$flags" TRANSPORTS=ring MODES="${MODES:-unary handle}" \
      ROUNDS=1 SCALE="${SCALE:-10}" OUT="$out/$label/r$round" bash "$here/run_ring.sh" \
      </dev/null >"$out/$label/r$round.txt" 2>&1
    sed -n '/^mode /,$p' "$out/$label/r$round.txt"
  done <<<"$configs"
done
python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "*", "r*", "ring.jsonl"))):
    label = path.split(os.sep)[-3]
    for line in open(path):
        j = json.loads(line)
        rows.setdefault((label, j["mode"], j["clients"]), []).append(j)
print(f"\n{'config':14} {'mode':7} {'clients':>7} {'runs':>4} {'req/s (median)':>15} "
      f"{'p50 us':>7} {'p99 us':>7} {'wrong+errors':>12}")
med = {}
for key in sorted(rows, key=lambda k: (k[1], k[0], k[2])):
    rs = rows[key]
    m = lambda f: statistics.median(r[f] for r in rs)
    med[key] = m("requests_per_s")
    bad = sum(r.get("wrong", 0) + r.get("errors", 0) for r in rs)
    print(f"{key[0]:14} {key[1]:7} {key[2]:>7} {len(rs):>4} {med[key]:>15,.0f} "
          f"{m('p50_ms') * 1e3:>7.0f} {m('p99_ms') * 1e3:>7.0f} {bad:>12}")
print("\n256 clients' requests/s over 16 clients' (medians):")
for (label, mode, c), v in sorted(med.items()):
    if c == 256 and (label, mode, 16) in med:
        print(f"  {label:14} {mode:7} {v / med[(label, mode, 16)]:.3f}")
PY
