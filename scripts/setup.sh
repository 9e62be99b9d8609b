#!/usr/bin/env bash
# Installs, from Debian's packages, what ferry needs to build, run and test.
# Skips what is present, says what it does, works as root or through sudo.
# CUDA (nvcc, cuBLAS, NCCL) is never installed here: CMake detects it under
# /usr/local/cuda and builds the CUDA parts only when it is found.
#   bash scripts/setup.sh            # ferry's packages
#   bash scripts/setup.sh PKG...     # these packages instead, by the same rules
#                                    # (scripts/make_peers_env.sh: the peers' packages)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  mpich libmpich-dev
  liburing-dev
  libmimalloc-dev
  libeigen3-dev
  libboost-test-dev
  nlohmann-json3-dev
  libyaml-cpp-dev  # accelerate's YAML config files (ferry train --fsdp)
  libcli11-dev
  libpcre2-dev
  libutf8proc-dev
  fio
  gnuplot-nox
  libomp-dev  # make test-tsan: LLVM's OpenMP runtime and its Archer tool, which TSan understands
  clang libclang-rt-14-dev  # make test-fuzz: clang's libFuzzer (Debian 12's clang is 14)
)
if [ $# -gt 0 ]; then
  for p in "$@"; do
    case "$p" in
      -*) echo "[setup] '$p' is not a package name" >&2; exit 2 ;;
    esac
  done
  packages=("$@")
fi

missing=()
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    continue
  fi
  missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[setup] all ${#packages[@]} Debian packages asked for are present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo_cmd=()
elif command -v sudo >/dev/null 2>&1; then
  sudo_cmd=(sudo)
else
  echo "[setup] missing packages: ${missing[*]}" >&2
  echo "[setup] not root and no sudo: install them as root, then run again" >&2
  exit 1
fi

echo "[setup] installing from Debian's packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "[setup] done"
