#!/bin/bash
# Runs a command and samples its memory from /proc every 20 ms: prints the largest
# anonymous memory (RssAnon: what the program allocated) and file pages (RssFile: mostly
# the executable's own code that the run touched) seen, and the peak RSS (VmHWM) last
# seen. A peak RSS that moves between builds of the same code while RssAnon stays put is
# the executable's layout, not the engine's memory (BENCHMARKS.md).
#   scripts/rss.sh sluice --quiet nexmark query q5 --events 20000000 --threads 2
set -u
if [ $# -eq 0 ]; then
  echo "usage: $0 COMMAND [ARG ...]" >&2
  exit 2
fi
"$@" > /dev/null 2>&1 &
pid=$!
anon=0; file=0; hwm=0
while kill -0 "$pid" 2>/dev/null; do
  read -r a f h < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} /^VmHWM/{h=$2} END{print a+0, f+0, h+0}' "/proc/$pid/status" 2>/dev/null)
  [ "${a:-0}" -gt "$anon" ] && anon=$a
  [ "${f:-0}" -gt "$file" ] && file=$f
  [ "${h:-0}" -gt "$hwm" ] && hwm=$h
  sleep 0.02
done
wait "$pid"
status=$?
echo "RssAnon max ${anon} kB, RssFile max ${file} kB, VmHWM last seen ${hwm} kB (exit ${status})"
