// Hopper (sm_90a) warpgroup MMA basics with no other dependency (attention.cu, and through
// hopper.cuh the MoE kernels): proxy fence, wgmma fences and groups, register fences, the
// 128-byte-swizzle shared-memory matrix descriptor.
#pragma once

#include <cstdint>

namespace gptoss::kernels::cuda {

// cp.async and st.shared writes are generic-proxy writes; wgmma reads shared memory through the
// async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving register traffic across the asynchronous wgmma.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void reg_fence(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory matrix descriptor, 128-byte swizzle (rows of 128 bytes, 8-row atoms of 1 KB, atoms
// 1 KB apart), start address in 16-byte units. The tile base must be 1024-aligned.
// - K-major (the operand's K contiguous in a row): the 32-byte K steps inside a row (k16 of bf16,
//   k32 of e4m3) advance the start address by 32 bytes.
// - MN-major (a B operand read transposed, imm-trans-b = 1; rows are K, 64 bf16 of N a row): the
//   same descriptor; a k16 step is two atoms, 2 KB. With N = 64 the leading offset is unused.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
    uint64_t d = static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4);
    d |= static_cast<uint64_t>(1) << 16;          // leading-dimension offset (unused when swizzled)
    d |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride between 8-row atoms
    d |= static_cast<uint64_t>(1) << 62;          // 128-byte swizzle
    return d;
}

}  // namespace gptoss::kernels::cuda
