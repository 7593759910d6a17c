// Device helpers shared by the CUDA kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (kMax: max) over a block of up to 1024 threads; every thread gets the result. `scratch` holds
// 32 floats.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = kMax ? warp_max(v) : warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
    return kMax ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// e2m1 code -> fp32 by building the bits (MODEL.md §3): bit 3 sign, bits 2..1 exponent (bias 1),
// bit 0 mantissa. Exponent 0 is the subnormal pair {0, 0.5}. Branch-free, no table lookups.
__device__ __forceinline__ float e2m1_value(uint32_t code) {
    const uint32_t e = (code >> 1) & 3u, m = code & 1u;
    const uint32_t normal = ((e + 126u) << 23) | (m << 22);
    const uint32_t bits = (e == 0u ? (m ? 0x3f000000u : 0u) : normal) | ((code & 8u) << 28);
    return __uint_as_float(bits);
}

// 2^(s-127) for an E8M0 byte s in 1..254 by building the float's exponent field directly; s = 0
// (2^-127, subnormal) and 255 (NaN in OCP, inf in the reference) are handled by exp2f.
__device__ __forceinline__ float e8m0_to_f32(uint32_t s) {
    return (s - 1u < 254u) ? __uint_as_float(s << 23) : exp2f(static_cast<float>(static_cast<int>(s) - 127));
}

// One KV-cache element: bf16, or e4m3 (round to nearest even, saturating to ±448; NaN stays NaN)
// when the cache is FP8 (QkvRopeArgs / PagedAttentionArgs kv_fp8).
__device__ __forceinline__ void store_kv(void* cache, int64_t i, float v, bool fp8) {
    if (fp8)
        static_cast<__nv_fp8_storage_t*>(cache)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    else
        static_cast<__nv_bfloat16*>(cache)[i] = __float2bfloat16(v);
}

// RoPE (YaRN, NeoX half split; MODEL.md §4.3) as every CUDA kernel that rotates computes it, so
// that they agree bit for bit (qkv_rope_kernel, qkv_gemv_rope, the prefill attention's Q taken
// straight from the QKV rows, PagedAttentionArgs::q_raw): the angle position · inv_freq in fp32 as
// transformers, cos and sin times the concentration, then y1 = x1·c − x2·s, y2 = x2·c + x1·s with
// the multiply-add contraction written out (no compiler choice left).
__device__ __forceinline__ void rope_cos_sin(int pos, float inv_freq, float scaling, float& c, float& s) {
    sincosf(__fmul_rn(static_cast<float>(pos), inv_freq), &s, &c);
    c = __fmul_rn(c, scaling);
    s = __fmul_rn(s, scaling);
}
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float s, float& y1, float& y2) {
    y1 = __fmaf_rn(x1, c, -__fmul_rn(x2, s));
    y2 = __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

// Counter-based uniform in [0, 1): the same splitmix64 construction as runtime::uniform_at.
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace gptoss::kernels::cuda

// ---- programmatic dependent launch (sm_90) ------------------------------------------------------
// A kernel launched with launch_pdl() (kernels/cuda/launch.h) may start while the kernel before it
// in the stream is still running. It must call pdl_wait() before it reads or writes any memory the
// earlier kernels touch (weights may be read before); pdl_wait() returns once they have completed
// and their writes are visible (a no-op for a normal launch). pdl_trigger() lets the next kernel
// be launched now rather than when this one exits.
namespace gptoss::kernels::cuda {
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
}  // namespace gptoss::kernels::cuda
