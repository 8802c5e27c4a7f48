#!/bin/bash
# How long a cluster takes to notice a lost worker and to run again, against a solo
# restore. A 2-worker cluster (loopback, scratch directories under the current one)
# checkpoints a rate-limited NEXMark tumbling count into a shared directory store; the
# joiner is SIGKILLed at its 50th checkpoint write (a failpoint) and restarted at once
# with the same command. Printed: from the kill to the leader's "was lost", and from the
# kill to the leader running again (the cluster re-formed and restored); then the same
# kill and restart of one worker alone, from the kill to it running again.
# Use a release build: S=target/release/sluice (cargo build --release).
set -u
S=${S:-$(pwd)/target/release/sluice}
dir=$(pwd)/rejoin-bench
rm -rf "$dir"; mkdir -p "$dir/a" "$dir/b" "$dir/solo"
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
# Waits until file $1 has a line matching $2 (at most 120 s).
await() { timeout 120 sh -c "until grep -q \"$2\" \"$1\" 2>/dev/null; do sleep 0.01; done"; }
cat > "$dir/p.toml" <<TOML
[pipeline]
name = "rejoin-bench"
threads = 1
[checkpoint]
interval = "200ms"
store = "file://$dir/state"
[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
rate = 200000
[[view]]
name = "q"
sql = "SELECT auction, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) GROUP BY auction, window_start, window_end"
[[sink]]
name = "out"
from = "q"
connector = "blackhole"
TOML
cp "$dir/p.toml" "$dir/a/p.toml"; cp "$dir/p.toml" "$dir/b/p.toml"
(cd "$dir/a" && exec "$S" run p.toml --workers 2 --control-bind 127.0.0.1:7498 > leader.log 2>&1) &
leader=$!
(cd "$dir/b" && SLUICE_FAILPOINTS='checkpoint.after_state_written=49*off->return(kill)' "$S" run p.toml --join 127.0.0.1:7498 > joiner.log 2>&1)
killed=$(now)
(cd "$dir/b" && exec "$S" run p.toml --join 127.0.0.1:7498 > rejoined.log 2>&1) &
joiner=$!
await "$dir/a/leader.log" "was lost"; detected=$(since "$killed")
await "$dir/b/rejoined.log" "running pipeline"; resumed=$(since "$killed")
kill -INT $leader; wait $leader $joiner 2>/dev/null
cp "$dir/p.toml" "$dir/solo/p.toml"; sed -i "s#$dir/state#$dir/solo-state#" "$dir/solo/p.toml"
(cd "$dir/solo" && SLUICE_FAILPOINTS='checkpoint.after_state_written=49*off->return(kill)' "$S" run p.toml > first.log 2>&1)
killed=$(now)
(cd "$dir/solo" && exec "$S" run p.toml > again.log 2>&1) &
solo=$!
await "$dir/solo/again.log" "running pipeline"; restored=$(since "$killed")
kill -INT $solo; wait $solo 2>/dev/null
printf 'lost worker noticed after %.2f s; cluster running again after %.2f s; solo restore %.2f s\n' \
  "$detected" "$resumed" "$restored"
