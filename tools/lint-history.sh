#!/usr/bin/env bash
# lint-history: the repository is a reference, not a diary. Fails, naming file, line and rule, when
# a tracked text file (docs, Go, C, Python, shell, Makefile, tests) speaks of the work that made it:
#
#   issue-ref        a tracker issue: the word "issue" followed by a number or "#" and a number, lists
#                    of such numbers, "the issue's ...", "the issue asks / says / reported ..."
#   work-period      the word "session" after this / next / previous, or before a number; "a work
#                    session"; "left for the next one"; "for the next engineer"; "kept for the record"
#   dated-heading    a Markdown heading (or a paragraph opening with a bold title) that carries a date,
#                    a clock time, "UTC" or a part of the day; a comment line that opens with a date
#
# What it must not flag, and does not: "issue" as a verb ("issue a read", "the backends issue
# vectored requests") or as I/O's noun ("the issue of a write", "the issue order"); "session" in an
# API's sense (an HTTP or requests session, a session id, a tmux session); dates inside prose, as
# in a figures table's "measured on DATE with COMMAND" line.
#
# Usage: tools/lint-history.sh [FILE...]   (default: every file `git ls-files` lists)
#        tools/lint-history.sh --self-test (plants lines in a temporary directory and checks that
#                                           each rule fires on them and stays quiet on legitimate ones)
#
# Skipped: binary files, Go fuzz corpora (testdata/fuzz/), go.sum, and this script (its pattern
# list and self-test lines would match themselves).
set -Eeuo pipefail

# Each rule: name, the files it applies to (an ERE on the path), a PCRE matched case-insensitively.
rules=(
  'issue-ref' '.' '\bissue\s?#?[0-9]+\b(?!\s*[A-Za-zµ%])|\bissues?\s+#?[0-9]+\s*(,|and|or)\s*#?[0-9]+\b|\b(in|per|see|from|by|under|for|fixes|fixed|closes|closed)\s+issues?\s+#?[0-9]+\b|\bissue\s?#?[0-9]+\s+(asks|says|item|point)\b|#[0-9]+\s*\(issue|\bissue'"'"'s\b|\b(the|this|that|our|their)\s+([a-z-]+\s+)?issue\s+(asks|asked|says|said|reported|names|named|wants|wanted|requires|required|lists|listed|will|text|body|number|tracker)\b|\b(in|per|see|from|by|of|under)\s+(the|this|that)\s+issue\b(?!\s+(of|and|order|path|queue|rate|depth|latency|time|side|to|point)\b)'
  'work-period' '.' '\b(this|next|previous|last|earlier|later|prior)\s+(work(ing)?\s+)?sessions?\b(?!\s+(id|ids|key|keys|cookie|cookies|token|tokens|object|objects|state|store|handle|timeout|manager|factory|class|type)\b|\.\w|\(|\s*=)|\bsessions?\s+#?[0-9]+\b|\bwork(ing)?\s+sessions?\b|\b(left|kept|notes?|saved|written)\s+for\s+the\s+next\s+(one|engineer|helper|person)\b|\bfor\s+the\s+next\s+(engineer|helper|person)\b|\bkept\s+for\s+the\s+record\b'
  'dated-heading' '\.(md|markdown|txt)$' '^\s{0,3}#{1,6}\s.*(\b20[0-9]{2}-[0-9]{2}(-[0-9]{2})?\b|\b[0-9]{1,2}:[0-9]{2}\b|\bUTC\b|\b(morning|evening|night|tonight|today|yesterday)\b)|^\s*\*\*[^*]*\b20[0-9]{2}-[0-9]{2}-[0-9]{2}\b[^*]*\*\*'
  'dated-heading' '.' '^\s*(#+|//+|/?\*+|--|;+)\s*[(\[]?20[0-9]{2}-[0-9]{2}-[0-9]{2}\b'
)

self=tools/lint-history.sh

lint() { # lint FILE... ; prints offences, returns 1 if any
  local bad=0 i name where re out
  for ((i = 0; i < ${#rules[@]}; i += 3)); do
    name=${rules[i]} where=${rules[i + 1]} re=${rules[i + 2]}
    local files=()
    for f in "$@"; do [[ $f =~ $where ]] && files+=("$f"); done
    ((${#files[@]})) || continue
    # -I: skip binary files; -H -n: name file and line.
    if out=$(grep -IHniP -e "$re" -- "${files[@]}" 2>/dev/null); then
      bad=1
      while IFS= read -r line; do printf 'lint-history: %s: %s\n' "$name" "$line"; done <<<"$out"
    fi
  done
  return $bad
}

tracked() {
  git ls-files -z | while IFS= read -r -d '' f; do
    case $f in
      "$self" | go.sum | */testdata/fuzz/* | testdata/fuzz/*) continue ;;
    esac
    [[ -f $f ]] && printf '%s\n' "$f"
  done
}

self_test() {
  local d fail=0
  d=$(mktemp -d)
  trap 'rm -rf "$d"' RETURN
  # One offence per line: every line must be reported. The offending words are assembled from
  # pieces (I, S), so that this file does not speak of what it forbids.
  local I=iss S=sess
  I+=ue S+=ion
  cat >"$d/bad.md" <<EOF
## Results (2026-11-24, this VM)
### Where the gap was (2026-11-27)
## The morning's runs
**2026-11-27, 09:00–09:10 UTC** (nothing else running)
This fixes $I 17.
See $I #4 for the background.
Done in this $S, more in the next $S.
As the $I's latency target names it.
The reliability $I will publish the figures.
Left for the next one.
Kept for the record.
EOF
  cat >"$d/bad.go" <<EOF
// 2026-11-27: the committer no longer waits.
// $I 9: split the function.
package x // the next $S should look at this
// More in the next $S.
EOF
  cat >"$d/bad.py" <<EOF
# 2026-11-25 run, for the next engineer
x = 1  # work $S 3
EOF
  # Legitimate uses: nothing may be reported (the same pieces, for the same reason).
  cat >"$d/good.md" <<'EOF'
## Performance
### A device that holds still
Measured on 2026-11-27 with `ucm-lab bench --fio`.
The backends issue vectored requests; issue a read per shard; the issue order is kept.
Between the issue of a write and its completion the device holds it.
A requests session keeps the connection; the session id is logged; one session object per thread.
The writer issues 8 flights; a task issues 32 blocks.
EOF
  cat >"$d/good.go" <<EOF
// $I places recs at the end of seg, starts their writes and hands them to the publisher.
func (w *Writer) $I(seg *Segment) error { return nil } // $I 4 KiB reads when unaligned
// See http.Client: each session cookie is kept.
// Wait for this flight, then for the next one.
EOF
  cat >"$d/good.py" <<EOF
$S = requests.Session()  # a $S per worker
prev = last_$S.get()  # the previous $S.close() ran; this ${S}_id is new
# Issue the loads of every layer at once.
EOF
  local want got
  want=$(cat "$d/bad.md" "$d/bad.go" "$d/bad.py" | wc -l)
  # Lines reported (a line two rules flag counts once): "lint-history: RULE: FILE:LINE:TEXT".
  got=$(lint "$d/bad.md" "$d/bad.go" "$d/bad.py" | awk -F': ' '{split($3, a, ":"); print a[1] ":" a[2]}' | sort -u | wc -l) || true
  if ((got != want)); then
    echo "lint-history self-test: $got of the $want planted lines reported:" >&2
    lint "$d/bad.md" "$d/bad.go" "$d/bad.py" >&2 || true
    fail=1
  fi
  if ! lint "$d/good.md" "$d/good.go" "$d/good.py" >&2; then
    echo "lint-history self-test: legitimate lines reported (above)" >&2
    fail=1
  fi
  return $fail
}

if [[ ${1-} == --self-test ]]; then
  self_test && echo "lint-history: self-test ok"
  exit
fi
cd "$(git rev-parse --show-toplevel)"
if (($#)); then files=("$@"); else mapfile -t files < <(tracked); fi
if ! lint "${files[@]}"; then
  echo "lint-history: the repository is a reference (what it is, how to run it, decisions and why): no issue numbers, work periods or dated diary headings" >&2
  exit 1
fi
