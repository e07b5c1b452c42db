# What scripts/device-check.sh and scripts/device-vs-torch.sh share, sourced by both: the time
# budget and the rows file. The sourcing script sets START (date +%s at its start), BUDGET_S, ROWS
# (the JSONL file), PY (a python3) and DEVICE_SCRIPT (its name, for the log lines).
# shellcheck shell=bash

elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET_S - $(elapsed))); }
say() { echo "[$DEVICE_SCRIPT $(elapsed)s] $*"; }
cap() { local l; l=$(left); echo $((l < $1 ? (l > 5 ? l : 5) : $1)); }  # timeout: at most $1 s

emit() {  # one finished JSON line (and the stage it is for): appended to the rows file at once, and logged
  local line=$1
  # A row that could not be made still counts, as a failure (a blank line would hide one).
  [ -n "$line" ] || line="{\"stage\": \"${2:-row}\", \"status\": \"failed\", \"note\": \"its row could not be written: see the log\"}"
  printf '%s\n' "$line" >> "$ROWS"
  say "row $line"
}

row() {  # row key=value ... key:=<json value>
  local a stage=row
  for a in "$@"; do case $a in stage=*) stage=${a#stage=} ;; esac; done
  emit "$("$PY" - "$(elapsed)" "$@" <<'PY'
import json, sys
out = {}
for a in sys.argv[2:]:
    # The key ends at the first "="; "key:=" marks a JSON value. Values are free text and may
    # hold ":=" themselves (Catch prints "B := 2"), so only the key decides.
    k, _, v = a.partition("=")
    if k.endswith(":"):
        out[k[:-1]] = json.loads(v)
    else:
        out[k] = v
out["t_s"] = int(sys.argv[1])
print(json.dumps(out))
PY
)" "$stage"
}
