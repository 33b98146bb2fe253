live() { for p in $(pgrep -g "$1" 2>/dev/null); do s=$(sed -E 's/^.*\) //' /proc/$p/stat 2>/dev/null | cut -c1); [ -n "$s" ] && [ "$s" != Z ] && echo "$p"; done; return 0; }
clock() { if [ -n "${EPOCHREALTIME:-}" ]; then T=${EPOCHREALTIME/[.,]/}; P=0; else T=$((SECONDS * 1000000)); P=1000000; fi; }
mine=''
for g in 4242:987654:4242 5000:11:5000; do
  pid=${g%%:*}; rest=${g#*:}; start=${rest%%:*}; pg=${rest#*:}
  now=$(sed -E 's/^.*\) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20)
  if [ -n "$now" ] && [ "$now" != "$start" ]; then echo "$pg reused"; continue; fi
  if [ -z "$(live "$pg")" ]; then echo "$pg gone"; continue; fi
  kill -TERM -- "-$pg" 2>/dev/null || true; mine="$mine $pg"
done
clock; end=$((T + P + 7500000))
while clock; [ "$T" -lt "$end" ]; do any=""; for pg in $mine; do [ -n "$(live "$pg")" ] && any=1; done
  [ -z "$any" ] && break; sleep 0.1; done
for pg in $mine; do if [ -n "$(live "$pg")" ]; then kill -KILL -- "-$pg" 2>/dev/null || true; echo "$pg forced"; else echo "$pg graceful"; fi; done
end=$((SECONDS + 5))
while [ "$SECONDS" -lt "$end" ]; do any=""; for pg in $mine; do [ -n "$(live "$pg")" ] && any=1; done
  [ -z "$any" ] && break; sleep 0.1; done
for pg in $mine; do left=$(live "$pg" | tr "\n" " "); [ -n "$left" ] && echo "$pg left $left"; done
exit 0
