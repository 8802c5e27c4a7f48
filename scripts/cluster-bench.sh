#!/bin/bash
# NEXMark q0 and the tumbling count into a blackhole: 1 worker x 1 thread against
# 2 workers x 1 thread on loopback (the leader and one joiner, in scratch directories
# under the current one). Needs a release build: cargo build --release.
# Prints each run's time as its exit report gives it (from the start of the run,
# after the rendezvous).
set -u
S=${S:-$(pwd)/target/release/sluice}
EVENTS=${EVENTS:-20000000}
# Window aggregates in two phases (the default) or one: LOCAL_AGGREGATION=false.
LOCAL_AGGREGATION=${LOCAL_AGGREGATION:-true}
QUERIES=${QUERIES:-"q0 tumble"}
q0="SELECT auction, bidder, price, dateTime, extra FROM bid"
tumble="SELECT auction, COUNT(*) AS n, window_start, window_end FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end"
pipeline() {
cat <<TOML
[pipeline]
name = "bench"
threads = 1
local_aggregation = $LOCAL_AGGREGATION
[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
events = $EVENTS
[[view]]
name = "q"
sql = "$1"
[[sink]]
name = "out"
from = "q"
connector = "blackhole"
TOML
}
for name in $QUERIES; do
  sql=${!name}
  rm -rf bench-a bench-b; mkdir -p bench-a bench-b
  pipeline "$sql" > bench-a/p.toml; cp bench-a/p.toml bench-b/p.toml
  solo=$( (cd bench-a && $S run p.toml 2>&1) | grep -o "completed (end of input) in [0-9.]*s" | grep -o "[0-9.]*s")
  (cd bench-a && exec $S run p.toml --workers 2 --control-bind 127.0.0.1:7499 > leader.log 2>&1) &
  leader=$!
  # The joiner retries until the leader listens.
  (cd bench-b && $S run p.toml --join 127.0.0.1:7499 > joiner.log 2>&1)
  wait $leader
  cluster=$(grep -o "completed (end of input) in [0-9.]*s" bench-a/leader.log | grep -o "[0-9.]*s")
  joiner=$(grep -o "completed (end of input) in [0-9.]*s" bench-b/joiner.log | grep -o "[0-9.]*s")
  echo "$name events=$EVENTS 1x1: $solo  2x1: leader $cluster joiner $joiner"
done
