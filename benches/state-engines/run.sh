#!/usr/bin/env bash
# Runs every workload for the given engines, one process per workload, appending one JSON
# line per run to $OUT. Usage: ./run.sh [engine...]   (default: own fjall slatedb)
# Extra flags for all runs: FLAGS="--appends 2000000 ..." ./run.sh own
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/state-engines-target}
BIN=$CARGO_TARGET_DIR/release/state-engines
OUT=${OUT:-results.jsonl}
W1=${W1:-}; W2=${W2:-}; W3=${W3:-}; W5=${W5:-}
WORKLOADS=${WORKLOADS:-"w1 w4 w2 w3 w5"}
engines=("$@"); [ ${#engines[@]} -eq 0 ] && engines=(own fjall slatedb)
for e in "${engines[@]}"; do
  for w in $WORKLOADS; do
    case $w in
      w1) extra="$W1 --keep" ;;
      w2) extra="$W2" ;;
      w3) extra="$W3" ;;
      w4) extra=""
          # Restore from disk, not from the page cache (needs root; skipped otherwise).
          sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped)" ;;
      w5) extra="$W5" ;;
    esac
    echo "== $e $w $extra $(date -u +%H:%M:%S)"
    timeout 1800 "$BIN" "$e" "$w" --out "$OUT" $extra ${FLAGS:-} 2> "logs/$e-$w.err" | grep RESULT || echo "FAILED: see logs/$e-$w.err"
    if [ "$w" = w4 ]; then rm -rf "/tmp/state-engines/$e-w1"; fi
  done
done
