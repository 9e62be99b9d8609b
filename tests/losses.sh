# Loss comparisons shared by the shell tests, on metrics JSONL files (runtime/train/metrics.h).
# Source it; every function prints what differs and returns 1 on a mismatch.

# losses FILE [LAST_N]: the step losses in the order logged (the last N when given).
losses() { grep -o '"loss":[-0-9.e+]*' "$1" | cut -d: -f2 | tail -n "${2:-+1}"; }

# same_losses A B [LAST_N]: equal to 1e-6 relative, at least 2 of them (the sums of other
# world sizes and layouts run in other orders).
same_losses() {
  paste <(losses "$1" "${3:-+1}") <(losses "$2" "${3:-+1}") | awk -v a="$1" -v b="$2" '
    { n++; d = $1 - $2; if (d < 0) d = -d; if ($2 == "" || d > 1e-6 * ($1 < 0 ? -$1 : $1)) { bad = 1; print "  step " n ": " $1 " vs " $2 } }
    END { if (n < 2 || bad) { print "losses differ: " a " vs " b; exit 1 } }'
}

# last_losses FILE: "STEP LOSS" per step, the last logged for each (a restarted run logs the
# steps after its checkpoint again).
last_losses() {
  grep -o '"loss":[^,]*,.*"step":[0-9]*' "$1" | sed -E 's/"loss":([^,]*),.*"step":([0-9]*)/\2 \1/' |
    awk '{ l[$1] = $2 } END { for (s in l) print s, l[s] }' | sort -n
}

# same_step_losses A B STEPS [TOL]: both have STEPS steps and, step by step, the same last
# loss: to the digit without TOL, else within TOL relative.
same_step_losses() {
  paste <(last_losses "$1") <(last_losses "$2") | awk -v a="$1" -v b="$2" -v steps="$3" -v tol="${4:-}" '
    { n++; d = $2 - $4; if (d < 0) d = -d
      if ($1 != $3 || (tol == "" ? $2 != $4 : d > tol * ($2 < 0 ? -$2 : $2))) { bad = 1; print "  step " $1 ": " $2 " vs " $4 } }
    END { if (bad || n != steps) { print "losses differ: " a " vs " b " (" n " steps, " steps " expected)"; exit 1 } }'
}
