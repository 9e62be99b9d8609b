#!/usr/bin/env bash
# Every command a page shows is run by a test, or says why not. Each ```sh block of
# README.md and docs/**/*.md must be followed (next non-blank line) by one of
#   <!-- tested: TEST [TEST ...] -->          ctest names from tests/CMakeLists.txt
#   <!-- not run by the tests: REASON -->      a GPU, two machines, Slurm, 68 GB of disk, ...
# For a tested block, each TEST must be defined in tests/CMakeLists.txt (add_test, also
# inside a foreach, or ferry_test), and every command line of the block must find, in
# what those tests run (their CMake lines, the scripts and tests/*.cpp they name), the
# same `ferry` verb (with its sub-verb for bench, config, launch) and every repository
# file it names (examples/, tests/, scripts/, benchmarks/, by file name). That ties the
# page to the test without asking the test to repeat the page's long options: the tests
# run shortened forms (fewer steps, a scratch folder), as the walk-throughs always have.
#
# Usage: check_doc_commands.sh SOURCE_DIR. Exit 0 when every block is tied, 1 otherwise,
# naming FILE:LINE of each block and what is missing.
set -u
root=${1:?usage: check_doc_commands.sh SOURCE_DIR}
cd "$root" || exit 1
cm=tests/CMakeLists.txt

# The text a test runs: its definition in tests/CMakeLists.txt (from its add_test to the
# next add_test, endforeach or blank line) and the files that definition names.
definition() {
  local name=$1 text=""
  if grep -qE "^[[:space:]]*ferry_test\(${name}\)" "$cm"; then
    text="ferry_test(${name})"
    [[ -f tests/${name}.cpp ]] && text+=$'\n'$(cat "tests/${name}.cpp")
  else
    # add_test(NAME pattern ...): ${var} inside a foreach stands for any word.
    text=$(awk -v want="$name" '
      function matches(pat,   re) {
        re = pat; gsub(/\$\{[A-Za-z_]+\}/, "[A-Za-z0-9_]+", re)
        return want ~ ("^" re "$")
      }
      /add_test\(NAME / {
        grab = 0
        n = $0; sub(/.*add_test\(NAME /, "", n); sub(/[ )].*/, "", n)
        if (n !~ /^\$\{[A-Za-z_]+\}$/ && matches(n)) grab = 1   # ferry_test itself: add_test(NAME ${name})
      }
      grab && (/^[[:space:]]*$/ || /endforeach/) { grab = 0 }
      grab { print }' "$cm")
    [[ -z "$text" ]] && return 1
  fi
  # Files the definition runs: scripts beside the tests, test sources of its executables.
  local f
  for f in $(grep -oE '(CMAKE_CURRENT_SOURCE_DIR\}|tests)/[A-Za-z0-9_./-]+\.(sh|cpp)' <<<"$text" |
             sed -E 's#^CMAKE_CURRENT_SOURCE_DIR\}/#tests/#' | sort -u); do
    [[ -f "$f" ]] && text+=$'\n'$(cat "$f")
  done
  for f in $(grep -oE 'TARGET_FILE:test_[a-z0-9_]+' <<<"$text" | sed 's/TARGET_FILE://' | sort -u); do
    [[ -f tests/$f.cpp ]] && text+=$'\n'$(cat "tests/$f.cpp")
  done
  printf '%s\n' "$text"
}

# What a command line must find in its tests: the verb, and each repository file by name.
tokens() {
  local line=$1
  grep -oE '(^|[ /])ferry(-train)? +(train|launch|plan|doctor|export|plot|tokenize|config|bench)( +[a-z][a-z0-9_-]*)?' <<<"$line" |
    sed -E 's#^[ /]?ferry-train#ferry train#; s#^[ /]?ferry +##' |
    awk '{ if ($1 == "bench" || $1 == "config" || $1 == "launch") print ($2 == "" ? $1 : $1 " " $2); else print $1 }'
  grep -oE '(^|[ =/$])(examples|tests|scripts|benchmarks)/[A-Za-z0-9_./-]+' <<<"$line" |
    sed -E 's#.*/##' | grep -E '\.[a-z]+$'
}

# Blocks: FILE<TAB>LINE<TAB>MARKER<TAB>COMMANDS (commands joined by \x1f, continuation
# lines folded, prompts like "node1$ " and trailing comments removed).
blocks() {
  awk '
    function flush() {
      if (have) printf "%s\t%d\t%s\t%s\n", bfile, bline, marker, cmds
      have = 0
    }
    FNR == 1 { if (want_marker) { flush(); want_marker = 0 } fence = 0 }
    want_marker && !/^[[:space:]]*$/ {
      m = $0; sub(/^[[:space:]]+/, "", m)
      marker = (m ~ /^<!-- (tested|not run by the tests):/) ? m : "NONE"
      want_marker = 0; flush()
    }
    /^[[:space:]]*```/ {
      if (!fence) {
        fence = 1; sh = ($0 ~ /^[[:space:]]*```(sh|bash|shell)[[:space:]]*$/)
        if (sh) { bfile = FILENAME; bline = FNR; cmds = ""; cur = "" }
      } else {
        fence = 0
        if (sh) { if (cur != "") cmds = cmds cur "\x1f"; have = 1; marker = "NONE"; want_marker = 1 }
        sh = 0
      }
      next
    }
    fence && sh {
      l = $0
      sub(/^[[:space:]]*[A-Za-z0-9_-]+\$ /, "", l)     # a prompt such as node1$
      sub(/^[[:space:]]+/, "", l)
      if (cur == "" && (l ~ /^#/ || l ~ /^\.\.\./ || l ~ /^\[/ || l ~ /^</ || l == "")) next
      cont = (l ~ /\\$/)
      sub(/\\$/, "", l)
      sub(/[[:space:]]+#.*$/, "", l)
      cur = cur l " "
      if (!cont) { cmds = cmds cur "\x1f"; cur = "" }
    }
    END { if (want_marker) flush() }' "$@"
}

mapfile -t pages < <(ls README.md; find docs -name '*.md' | sort)
bad=0 nblocks=0 ntested=0 nnot=0
declare -A defs
while IFS=$'\t' read -r file line marker cmds; do
  nblocks=$((nblocks + 1))
  where="$file:$line"
  case "$marker" in
    "<!-- not run by the tests:"*)
      reason=${marker#<!-- not run by the tests:}; reason=${reason%-->}
      if [[ -z "${reason// /}" ]]; then
        echo "$where: 'not run by the tests' gives no reason"; bad=$((bad + 1))
      fi
      nnot=$((nnot + 1)); continue ;;
    "<!-- tested:"*) ;;
    *)
      echo "$where: a sh block with neither <!-- tested: TEST ... --> nor <!-- not run by the tests: REASON --> after it"
      bad=$((bad + 1)); continue ;;
  esac
  names=${marker#<!-- tested:}; names=${names%-->}
  union=""
  for t in $names; do
    if [[ -z "${defs[$t]+x}" ]]; then
      if d=$(definition "$t"); then defs[$t]=$d; else defs[$t]="__undefined__"; fi
    fi
    if [[ "${defs[$t]}" == "__undefined__" ]]; then
      echo "$where: test '$t' is not defined in $cm"; bad=$((bad + 1)); continue
    fi
    union+=${defs[$t]}$'\n'
  done
  [[ -z "$names" || -z "${names// /}" ]] && { echo "$where: 'tested:' names no test"; bad=$((bad + 1)); continue; }
  ntested=$((ntested + 1))
  IFS=$'\x1f' read -r -a lines <<<"$cmds"
  for cmd in "${lines[@]}"; do
    [[ -z "${cmd// /}" ]] && continue
    while IFS= read -r tok; do
      [[ -z "$tok" ]] && continue
      esc=$(sed 's/[.[\*^$+?(){}|]/\\&/g' <<<"$tok")
      if ! grep -qE "(^|[^A-Za-z0-9_-])${esc}([^A-Za-z0-9_-]|$)" <<<"$union"; then
        echo "$where: '$tok' (from: ${cmd% }) is not in what $names run"
        bad=$((bad + 1))
      fi
    done < <(tokens "$cmd")
  done
done < <(blocks "${pages[@]}")

if ((bad > 0)); then
  echo "check_doc_commands: $bad problem(s) in $nblocks sh blocks of ${#pages[@]} pages"
  exit 1
fi
echo "check_doc_commands: $nblocks sh blocks in ${#pages[@]} pages: $ntested run by tests, $nnot not runnable here, each with its reason"
