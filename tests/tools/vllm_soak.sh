#!/usr/bin/env bash
# Attach/detach soak on the real vLLM engine under load (BENCHMARKS.md, Reliability): N runs of
# `stallscope probe` (the Python plane attached with the vLLM profile, 0.5 s, detached; the
# kernel plane loaded and unloaded) while `xtask vllm load` keeps the engine serving. Then the
# engine must be alive, vLLM must have logged iterations throughout, and no ring of stallscope's
# may be left in /dev/shm or mapped in the engine.
# Usage (as root, after `cargo xtask vllm up > vllm.json`): tests/tools/vllm_soak.sh vllm.json [N]
set -euo pipefail
json=$1
cycles=${2:-100}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$json" "$1"; }
engine=$(field engine_pid)
port=$(field port)
log=$(field log)
bin=${STALLSCOPE_BIN:-target/release/stallscope}
out=$(mktemp -d)
target/release/xtask vllm load --duration 100000 --concurrency 8 --port "$port" > "$out/load.json" &
load=$!
trap 'kill $load 2>/dev/null || true' EXIT
sleep 5
before=$(grep -c "iteration elapsed" "$log")
failed=0
for i in $(seq "$cycles"); do
  if "$bin" probe --pid "$engine" --duration 0.5s --json > "$out/$i.json" 2> "$out/$i.err"; then
    python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('max_pause_us', ''))" "$out/$i.json" >> "$out/pauses"
  else
    failed=$((failed + 1))
    echo "cycle $i failed: $(tail -1 "$out/$i.err")"
  fi
  kill -0 "$engine" || { echo "the engine died at cycle $i"; exit 1; }
done
sleep 3
after=$(grep -c "iteration elapsed" "$log")
rings=$(ls /dev/shm | grep -c "^stallscope-ring-$engine-" || true)
mapped=$(grep -c "stallscope-ring" "/proc/$engine/maps" || true)
pauses=$(sort -n "$out/pauses" | awk '{a[NR]=$1} END {print "p50 " a[int(NR/2)] " us, p99 " a[int(NR*0.99)] " us, max " a[NR] " us"}')
echo "cycles $cycles, failed $failed, vLLM iterations meanwhile $((after - before)), rings left $rings, rings mapped $mapped, attach pause $pauses"
[ "$failed" -eq 0 ] && [ "$rings" -eq 0 ] && [ "$mapped" -eq 0 ] && [ $((after - before)) -gt 0 ]
