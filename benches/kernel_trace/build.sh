#!/usr/bin/env bash
# Builds the CUDA injection library libkernel_trace.so (see README.md).
#   benches/kernel_trace/build.sh [OUT.so]      (default: benches/kernel_trace/libkernel_trace.so)
# Needs cc, python3 and pip; no CUDA toolkit and no GPU. The CUPTI and CUDA headers come from
# NVIDIA's pip wheels (downloaded into a temporary folder, or taken from KT_WHEEL_DIR if it
# already holds them). libcupti is NOT linked: the library dlopens libcupti.so.13 at run time.
# KT_CUDA_VER picks the wheel versions (default 13.0.*, the CUDA of the GPU machine's
# PyTorch cu130); any 13.x works, the record fields read are the same in all of them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-$here/libkernel_trace.so}
ver=${KT_CUDA_VER:-13.0.*}
cc=${CC:-cc}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

wheels=${KT_WHEEL_DIR:-$tmp/wheels}
mkdir -p "$wheels"
# cupti: cupti*.h; cuda-runtime: cuda.h, builtin_types.h...; cuda-crt: crt/host_defines.h
for pkg in nvidia-cuda-cupti nvidia-cuda-runtime nvidia-cuda-crt; do
  whl_glob="${pkg//-/_}-*.whl"
  if ! compgen -G "$wheels/$whl_glob" >/dev/null; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "$pkg==$ver"
  fi
  for w in "$wheels"/$whl_glob; do
    python3 -m zipfile -e "$w" "$tmp/unpacked"
  done
done
inc=$tmp/unpacked/nvidia/cu13/include
for h in cupti.h cupti_activity.h cuda.h crt/host_defines.h; do
  [ -f "$inc/$h" ] || { echo "build.sh: $h not found under $inc" >&2; exit 1; }
done

mkdir -p "$(dirname "$out")"
set -x
"$cc" -O2 -g -Wall -Wextra -shared -fPIC -fvisibility=hidden -I"$inc" \
  "$here/kernel_trace.c" -o "$out" -ldl -lpthread
{ set +x; } 2>/dev/null
nm -D --defined-only "$out" | grep -q ' T InitializeInjection$' \
  || { echo "build.sh: InitializeInjection not exported" >&2; exit 1; }
echo "built $out"
