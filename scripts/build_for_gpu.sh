#!/usr/bin/env bash
# Builds the CUDA binaries on this (development) machine and stages them in .device/ for the
# device tool to carry to the H200 (tools/gpu_check.sh runs them there). Non-CUDA libraries are
# linked statically; cuBLASLt and the CUDA runtime come from the host's CUDA 13 install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-cuda"
[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja -DGPTOSS_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" gptoss cuda_kernel_tests attention_bench moe_bench gemv_bench boundary_bench
mkdir -p "$root/.device"
cp "$build/gptoss" "$build/tests/cuda_kernel_tests" "$build/bench/kernels/attention_bench" "$build/bench/kernels/moe_bench" "$build/bench/kernels/gemv_bench" "$build/bench/kernels/boundary_bench" "$root/.device/"
# Debian's cpp-httplib is a shared library only (its header is the split, declarations-only
# form): carry it and its brotli dependencies; tools/gpu_check.sh puts .device/lib on the path.
mkdir -p "$root/.device/lib"
for lib in $(ldd "$root/.device/gptoss" | awk '/httplib|brotli/{print $3}'); do cp -L "$lib" "$root/.device/lib/"; done
# CUPTI for the opt-in kernel trace (GPTOSS_KERNEL_TRACE, cli/kernel_trace.h; loaded at run time).
for lib in /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13; do
  [ -f "$lib" ] && { cp -L "$lib" "$root/.device/lib/"; break; }
done
git -C "$root" rev-parse --short HEAD > "$root/.device/REVISION"
# The binaries outgrew the device tool's 64 MiB carry limit (with the tracked tree): carry
# .device_pack (one gzip archive, ~15 MB) instead; tools/gpu_check.sh unpacks it when .device is absent.
mkdir -p "$root/.device_pack"
tar -C "$root" -czf "$root/.device_pack/device.tgz" .device
du -sh "$root/.device" "$root/.device_pack"
