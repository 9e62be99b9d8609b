#!/usr/bin/env bash
# The arrows of docs/design/README.md ("Map"), checked on every #include "..." of ferry's sources:
# a file may include headers of its own folder and of the folders below it, never above.
#   tools -> train -> hf -> ckpt -> zero -> config -> offload -> nn -> base
#                                               comm --------------> base
# testing/ (emulations, fakes) is for tests only: no library includes it. Foreign APIs stay
# in their room: <mpi.h> in comm (and the doctor and benchmarks, which probe MPI itself,
# and testing's NCCL emulation, which moves collectives over MPI; tests' <cuda_runtime.h>
# and <nccl.h> are the emulated targets', resolved to testing/cuda_shim),
# <liburing.h> in offload (and the doctor, which probes io_uring itself), <nccl.h> and the CUDA headers in comm and nn;
# getenv in base/env.cpp, where every variable ferry reads is declared.
# Usage: check_layers.sh [SOURCE_DIR]; prints each violation, exits 1 if there is one.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# folder -> the folders (prefixes) its files may include
declare -A allowed=(
  [base]="base"
  [nn]="nn base"
  [comm]="comm base"
  [offload]="offload nn base"
  [runtime/text]="runtime/text base"
  [runtime/config]="runtime/config offload comm nn base"
  [runtime/zero]="runtime/zero runtime/config offload comm nn base"
  [runtime/ckpt]="runtime/ckpt runtime/zero runtime/config offload comm nn base"
  [runtime/hf]="runtime/hf runtime/text runtime/ckpt runtime/zero runtime/config offload comm nn base"
  [runtime/train]="runtime/train runtime/text runtime/hf runtime/ckpt runtime/zero runtime/config offload comm nn base"
  [runtime/tools]="runtime/tools runtime/text runtime/train runtime/hf runtime/ckpt runtime/zero runtime/config offload comm nn base"
  [testing]="testing comm nn base"
  [examples]="examples benchmarks runtime offload comm nn base"
  [benchmarks]="benchmarks runtime offload comm nn base"
  [tests]="tests testing runtime offload comm nn base benchmarks"
)
declare -A foreign=(
  [mpi.h]="comm runtime/tools benchmarks tests testing"
  [liburing.h]="offload runtime/tools tests"
  [pcre2.h]="runtime/text"
  [utf8proc.h]="runtime/text"
  [nccl.h]="comm tests"
  [cuda_runtime.h]="nn comm tests"
  [cublas_v2.h]="nn"
  [yaml-cpp/yaml.h]="runtime/config"
)

folder_of() {
  local f=$1
  case "$f" in
    runtime/*/*) echo "${f%/*}" ;;
    runtime/*) echo runtime ;;
    */*) echo "${f%%/*}" ;;
    *) echo . ;;
  esac
}

bad=0
checked=0
while IFS= read -r file; do
  folder=$(folder_of "$file")
  [ -n "${allowed[$folder]+x}" ] || { echo "$file: folder '$folder' has no place in the arrows (tests/check_layers.sh)"; bad=1; continue; }
  while IFS=: read -r line inc; do
    checked=$((checked + 1))
    # bash's own regex, not a sed per include: the script forked thousands of them (20 s in CI).
    [[ $inc =~ ^#include\ \"([^\"]+)\" ]] || continue
    target=${BASH_REMATCH[1]}
    case "$target" in */*) ;; *) continue ;; esac  # same-folder or generated, no prefix
    ok=0
    for prefix in ${allowed[$folder]}; do
      case "$target" in "$prefix"/*) ok=1; break ;; esac
    done
    if [ $ok -eq 0 ]; then
      echo "$file:$line: includes \"$target\", but $folder may include only: ${allowed[$folder]}"
      bad=1
    fi
  done < <(grep -n '^#include "' "$file" || true)
  while IFS=: read -r line inc; do
    [[ $inc =~ ^#include\ \<([^\>]+)\> ]] || continue
    header=${BASH_REMATCH[1]}
    rooms=${foreign[$header]:-}
    [ -n "$rooms" ] || continue
    ok=0
    for prefix in $rooms; do
      case "$folder" in "$prefix" | "$prefix"/*) ok=1; break ;; esac
    done
    if [ $ok -eq 0 ]; then
      echo "$file:$line: includes <$header>, which belongs to: $rooms"
      bad=1
    fi
  done < <(grep -n '^#include <' "$file" || true)
done < <(git ls-files --cached --others --exclude-standard '*.h' '*.cpp' '*.cu' 2>/dev/null || find . -name '*.h' -o -name '*.cpp' -o -name '*.cu' | sed 's#^\./##')

# The environment is read in one room: base/env.cpp declares every variable ferry reads and
# env_value reads it (tests and testing/'s emulations read their own switches directly).
while IFS= read -r hit; do
  echo "$hit: reads the environment outside base/env.cpp (declare the variable there, read it with env_value)"
  bad=1
done < <(git grep --untracked -n 'getenv(' -- '*.h' '*.cpp' '*.cu' ':!base/env.cpp' ':!base/env.h' ':!tests' ':!testing' 2>/dev/null || true)

if [ $bad -ne 0 ]; then
  echo "check_layers: includes against the arrows (docs/design/README.md, \"Map\") or the environment read outside base/env"
  exit 1
fi
echo "check_layers: $checked includes follow the arrows"
