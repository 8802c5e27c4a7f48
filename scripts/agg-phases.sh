#!/bin/bash
# Window aggregates in one phase against two (`[pipeline] local_aggregation`): each query
# from the NEXMark generator into a blackhole, the two settings interleaved, RUNS times.
# Prints the run's time from its exit report, the process's CPU seconds (user + system:
# less sensitive than wall time to other work on the machine) and its peak RSS.
# Needs a release build: cargo build --release -p sluice-cli.
set -u
S=${S:-$(pwd)/target/release/sluice}
EVENTS=${EVENTS:-10000000}
RUNS=${RUNS:-3}
THREADS=${THREADS:-1}
QUERIES=${QUERIES:-"tumble bidder q5"}
sql_of() {
  case $1 in
    tumble) echo "SELECT auction, COUNT(*) AS n, window_start, window_end FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end" ;;
    bidder) echo "SELECT bidder, COUNT(*) AS n, MAX(price) AS top, window_start, window_end FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end" ;;
    *) $S nexmark sql "$1" ;;
  esac
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for run in $(seq "$RUNS"); do
  for q in $QUERIES; do
    for local in false true; do
      cat > "$work/p.toml" <<TOML
[pipeline]
name = "phases"
threads = $THREADS
local_aggregation = $local
[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = $EVENTS
[[view]]
name = "q"
sql = """
$(sql_of "$q")
"""
[[sink]]
name = "out"
from = "q"
connector = "blackhole"
TOML
      (cd "$work" && /usr/bin/time -f "cpu %U %S rss_kb %M" "$S" run p.toml > out.log 2>&1)
      secs=$(grep -o "completed (end of input) in [0-9.]*s" "$work/out.log" | grep -o "[0-9.]*s")
      read -r cpu rss < <(grep -o "cpu [0-9.]* [0-9.]* rss_kb [0-9]*" "$work/out.log" | awk '{print $2 + $3, $5}')
      printf '%s threads=%s local_aggregation=%-5s run %s: %s, %s CPU s, %d MB\n' \
        "$q" "$THREADS" "$local" "$run" "$secs" "$cpu" $((rss / 1024))
    done
  done
done
