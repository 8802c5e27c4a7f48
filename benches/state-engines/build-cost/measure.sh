#!/usr/bin/env bash
# Clean release build of a tiny binary depending only on one candidate, in a fresh target dir.
# Usage: build-cost/measure.sh <fjall|slatedb|rocksdb> [timeout-seconds]
# Prints wall time, CPU time, crate count and binary size; appends to build-cost/results.txt.
set -uo pipefail
cd "$(dirname "$0")/$1"
T=$(mktemp -d /tmp/cost-$1-XXXX)
start=$(date +%s.%N)
/usr/bin/time -f "%e s wall, %U s user, %S s sys, %M KiB max RSS" -o "$T.time" \
  timeout "${2:-3600}" nice -n 10 cargo build --release --target-dir "$T" > "$T.log" 2>&1
rc=$?
crates_all=$(cargo tree -e normal,build --prefix none 2>/dev/null | sed 's/ (\*)//' | sort -u | wc -l)
crates_normal=$(cargo tree -e normal --prefix none 2>/dev/null | sed 's/ (\*)//' | sort -u | wc -l)
units=$(grep -c "Compiling" "$T.log")
bin=$(stat -c %s "$T/release/cost-$1" 2>/dev/null || echo missing)
line="$1 rc=$rc $(cat $T.time | tail -1) | compiled units: $units | cargo tree -e normal: $crates_normal crates, -e normal,build: $crates_all | binary: $bin bytes | load: $(cut -d' ' -f1-3 /proc/loadavg) | $(date -u +%FT%TZ)"
echo "$line" | tee -a ../results.txt
rm -rf "$T"
