#!/usr/bin/env bash
# Runs this checkout's CUDA build on a GPU machine that has the CUDA toolkit but none of
# ferry's other dependencies (no MPICH, Boost, liburing...): binaries built here travel
# with the non-CUDA shared libraries they load; CUDA, cuBLAS and NCCL come from the GPU
# machine (same major versions as here: check `nvcc --version` on both).
#
#   bash scripts/gpu_carry.sh pack [BUILD] [TARBALL]   here: BUILD (default build) ->
#                                                      TARBALL (default .gpu/gpu.tar.xz)
#   source scripts/gpu_carry.sh unpack [TARBALL]       there, from the checkout's root:
#                                                      unpacks to /tmp/ferry-carry and sets
#                                                      PATH and LD_LIBRARY_PATH
#
# The test binaries find data through the source path compiled into them (FERRY_SOURCE_DIR):
# unpack links that path to the checkout when it is elsewhere. What this was used for, and
# what it measured: docs/design/gpu-questions.md, "The first GPU run".
verb=${1:-}
case "$verb" in
  pack)
    set -u
    build=${2:-build}
    tarball=${3:-.gpu/gpu.tar.xz}
    stage=$(mktemp -d)
    mkdir -p "$stage/bin" "$stage/lib" "$(dirname "$tarball")"
    # The unit tests a GPU runs: built on demand in make test's release folder
    # (FERRY_SPLIT_TESTS leaves them out of its default build).
    cmake --build "$build" --target ferry ferry-bench test_device test_backend_ops test_fused_ops test_cuda_training test_train ||
      exit 1
    bins=("$build/examples/ferry" "$build/examples/ferry-bench")
    for t in test_device test_backend_ops test_fused_ops test_cuda_training test_train; do
      [ -x "$build/tests/$t" ] && bins+=("$build/tests/$t")
    done
    cp "${bins[@]}" "$stage/bin/" && strip "$stage"/bin/* 2>/dev/null
    for tool in mpiexec.hydra hydra_pmi_proxy; do
      p=$(command -v "$tool") && cp -L "$p" "$stage/bin/"
    done
    # Every library the binaries load, except the C and C++ runtimes (the GPU machine's are
    # as new or newer, and its Python needs its own), the loader and CUDA's libraries.
    (cd "$(dirname "$0")/.." && pwd) >"$stage/source_dir"  # FERRY_SOURCE_DIR of the test binaries
    for b in "$stage"/bin/*; do ldd "$b" 2>/dev/null; done | awk '/=> \// {print $3}' | sort -u |
      grep -vE '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
      while read -r lib; do cp -L "$lib" "$stage/lib/"; done
    tar cf - -C "$stage" . | xz -T0 -6 >"$tarball"
    rm -rf "$stage"
    ls -l "$tarball"
    ;;
  unpack)
    tarball=${2:-.gpu/gpu.tar.xz}
    dest=/tmp/ferry-carry
    mkdir -p "$dest" && tar xJf "$tarball" -C "$dest" || return 1 2>/dev/null || exit 1
    cudalibs=""
    for lib in libnccl.so.2 libcublasLt.so.13 libcudart.so.13; do
      found=$(find / -name "$lib" -not -path '/proc/*' 2>/dev/null | head -1)
      [ -n "$found" ] && cudalibs="$cudalibs:$(dirname "$found")"
    done
    export LD_LIBRARY_PATH="$dest/lib$cudalibs:${LD_LIBRARY_PATH:-}"
    ln -sf "$dest/bin/mpiexec.hydra" "$dest/bin/mpiexec"
    export PATH="$dest/bin:$PATH"
    src=$(cat "$dest/source_dir" 2>/dev/null)
    if [ -n "$src" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
    ldd "$dest/bin/ferry" | grep 'not found' && echo "gpu_carry: libraries missing (above)"
    echo "gpu_carry: binaries in $dest/bin on PATH; CUDA libraries from${cudalibs:- nowhere}"
    ;;
  *)
    echo "usage: bash scripts/gpu_carry.sh pack [BUILD] [TARBALL] | source scripts/gpu_carry.sh unpack [TARBALL]" >&2
    exit 2
    ;;
esac
