#!/bin/bash
# samples the host agent's and readers' RSS every 0.5 s
out=/tmp/agent-rss.tsv; : > $out
while true; do
  for p in $(pgrep -f "^/?[^ ]*resourcewatch-agent run" ) $(pgrep -f "resourcewatch-agent reader"); do
    kind=agent; grep -q reader /proc/$p/cmdline 2>/dev/null && kind=reader
    echo -e "$(date +%T.%N | cut -c1-10)\t$kind\t$p\t$(awk '/VmRSS|VmHWM/{printf "%s ", $2}' /proc/$p/status 2>/dev/null)" >> $out
  done
  sleep 0.5
done
