#!/usr/bin/env bash
# Every relative link of README.md and docs/**/*.md resolves: the file or folder exists
# and, for a link with #anchor into a Markdown page, the page has a heading with that
# anchor (GitHub's rule: lower case, punctuation other than - and _ dropped, spaces to -).
# Links inside fenced code blocks and inline code are not links; http(s) and mailto links
# are not checked (no network here).
#
# Usage: check_doc_links.sh SOURCE_DIR. Exit 0 when every link resolves, 1 otherwise,
# naming each broken link as FILE:LINE: target (why).
set -u
root=${1:?usage: check_doc_links.sh SOURCE_DIR}
cd "$root" || exit 1

# The anchors of a Markdown file, one per line.
anchors() {
  awk '
    /^[ ]*```/ { fence = !fence; next }
    fence { next }
    /^#+ / {
      h = $0; sub(/^#+ +/, "", h); sub(/ +#* *$/, "", h)
      h = tolower(h)
      gsub(/[^a-z0-9 _-]/, "", h)
      gsub(/ /, "-", h)
      n = seen[h]++
      print (n ? h "-" n : h)
    }' "$1"
}

# FILE<TAB>LINE<TAB>TARGET for every link outside code.
links() {
  awk '
    /^[ ]*```/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)            # inline code is not a link
      while (match(line, /\]\([^) ]+\)/)) {
        t = substr(line, RSTART + 2, RLENGTH - 3)
        printf "%s\t%d\t%s\n", FILENAME, FNR, t
        line = substr(line, RSTART + RLENGTH)
      }
    }' "$@"
}

mapfile -t pages < <(ls README.md; find docs -name '*.md' | sort)
bad=0
checked=0
while IFS=$'\t' read -r file line target; do
  case "$target" in http://*|https://*|mailto:*) continue ;; esac
  checked=$((checked + 1))
  path=${target%%#*}
  anchor=
  [[ "$target" == *"#"* ]] && anchor=${target#*#}
  if [[ -z "$path" ]]; then
    dest=$file
  else
    dest=$(dirname "$file")/$path
  fi
  if [[ ! -e "$dest" ]]; then
    echo "$file:$line: $target (no such file: $dest)"
    bad=$((bad + 1))
    continue
  fi
  if [[ -n "$anchor" ]]; then
    if [[ "$dest" != *.md ]]; then
      echo "$file:$line: $target (an anchor into a file that is not Markdown)"
      bad=$((bad + 1))
    elif ! anchors "$dest" | grep -qxF -- "$anchor"; then
      echo "$file:$line: $target (no heading with anchor #$anchor in $dest)"
      bad=$((bad + 1))
    fi
  fi
done < <(links "${pages[@]}")

if ((bad > 0)); then
  echo "check_doc_links: $bad broken link(s) of $checked in ${#pages[@]} pages"
  exit 1
fi
echo "check_doc_links: all $checked relative links of ${#pages[@]} pages resolve"
