// Whether down's weights can be read by 32-column groups at the memory rate (NOTES "where it stands": the split-K
// down tail of gate_up would have each gate_up CTA multiply its slice of the intermediate by the matching group of
// down's columns, reading down's MXFP4 weights as 2,880 rows of 16 bytes a group instead of whole 16-row tiles).
//
// The bytes are down's code bytes of four 20b experts: 4 × 2,880 rows × 1,440 bytes (2,880 e2m1 columns), 16.6 MB,
// read with 16-byte loads into a checksum, L2 flushed before every timed launch (the step reads them from DRAM):
//   tiles    a CTA reads 16 whole rows (23 KB, contiguous): 720 CTAs, today's down kernel's shape
//   frag     the same tiles in the decode kernels' order (each lane its MMA fragment's words: a warp's 16-byte loads
//            touch 8 rows × 64 bytes; session 57)
//   group32  a CTA reads one 32-column group of every row of one expert (16 bytes a row, rows 1,440 bytes apart):
//            2,880 columns / 32 = 90 groups an expert, 360 CTAs of 46 KB
//   group64  two adjacent groups a CTA (32 bytes a row: one whole sector), 180 CTAs of 92 KB
//   group32x 90 groups an expert as in group32, but the CTAs of neighbouring groups run at the same time
//            (blockIdx maps group-major) so the sector's other half is read while it is in L2
// Each layout's checksum (the sum of every 32-bit word, any order) must equal the contiguous one's.
//
// Usage: strided_read_bench [repeats=50]. Prints µs a launch (median) and GB/s for each layout and 128 / 256
// threads a CTA.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"

namespace {

constexpr int kExperts = 4, kRows = 2880, kRowBytes = 1440;  // 2,880 e2m1 codes a row
constexpr size_t kBytes = static_cast<size_t>(kExperts) * kRows * kRowBytes;

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned long long words(uint4 v) {
    return static_cast<unsigned long long>(v.x) + v.y + v.z + v.w;
}

__device__ __forceinline__ void finish(unsigned long long acc, unsigned long long* sum) {
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(sum, acc);
}

// 16 whole rows a CTA: 16 × 90 sixteen-byte pieces.
__global__ void tiles(const uint8_t* w, unsigned long long* sum) {
    const uint4* base = reinterpret_cast<const uint4*>(w + static_cast<size_t>(blockIdx.x) * 16 * kRowBytes);
    // Every load of the thread issued before any is used (at most 12 a thread at 128 threads).
    constexpr int kN = 16 * kRowBytes / 16, kMax = 12;
    uint4 v[kMax];
#pragma unroll
    for (int j = 0; j < kMax; ++j) {
        const int i = threadIdx.x + j * blockDim.x;
        v[j] = i < kN ? ld_stream(base + i) : make_uint4(0, 0, 0, 0);
    }
    unsigned long long acc = 0;
#pragma unroll
    for (int j = 0; j < kMax; ++j) acc += words(v[j]);
    finish(acc, sum);
}

// 16 whole rows a CTA as the decode kernels read them (moe_decode_mma's decode_load, 4 warps of 128 threads): warp
// w covers 128-wide K steps [s0, s0 + ns) of the 23 (90 groups of 16 bytes a row); lane (g, t) loads group
// 4(s0 + i) + t of rows g and g + 8 at each step i: a warp instruction touches 8 rows × 64 bytes, 1,440 bytes apart.
__global__ void frag(const uint8_t* w, unsigned long long* sum) {
    const uint4* base = reinterpret_cast<const uint4*>(w + static_cast<size_t>(blockIdx.x) * 16 * kRowBytes);
    constexpr int G = kRowBytes / 16, S = (G + 3) / 4, kMaxSteps = 6;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int s0 = warp * S / 4, ns = (warp + 1) * S / 4 - s0;
    uint4 lo[kMaxSteps], hi[kMaxSteps];
#pragma unroll
    for (int i = 0; i < kMaxSteps; ++i) {
        const int grp = 4 * (s0 + i) + t;
        const bool live = i < ns && grp < G;
        lo[i] = live ? ld_stream(base + g * G + grp) : make_uint4(0, 0, 0, 0);
        hi[i] = live ? ld_stream(base + (g + 8) * G + grp) : make_uint4(0, 0, 0, 0);
    }
    unsigned long long acc = 0;
#pragma unroll
    for (int i = 0; i < kMaxSteps; ++i) acc += words(lo[i]) + words(hi[i]);
    finish(acc, sum);
}

// `width` bytes (16 or 32) of every row of one expert, at column byte offset group · width.
template <int kWidth>
__global__ void groups(const uint8_t* w, unsigned long long* sum, bool group_major) {
    constexpr int kGroups = kRowBytes / kWidth;  // 90 or 45 an expert
    const int e = group_major ? blockIdx.x % kExperts : blockIdx.x / kGroups;
    const int g = group_major ? blockIdx.x / kExperts : blockIdx.x % kGroups;
    const uint8_t* base = w + static_cast<size_t>(e) * kRows * kRowBytes + static_cast<size_t>(g) * kWidth;
    unsigned long long acc = 0;
    constexpr int kPieces = kWidth / 16, kN = kRows * kPieces, kBatch = 12;
    // Batches of 12 loads a thread in flight before any is used.
    for (int i0 = threadIdx.x; i0 < kN; i0 += kBatch * blockDim.x) {
        uint4 v[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = i0 + j * blockDim.x, row = i / kPieces, piece = i % kPieces;
            v[j] = i < kN
                       ? ld_stream(reinterpret_cast<const uint4*>(base + static_cast<size_t>(row) * kRowBytes) + piece)
                       : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) acc += words(v[j]);
    }
    finish(acc, sum);
}

}  // namespace

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? std::max(3, std::atoi(argv[1])) : 50;
    uint8_t* w = nullptr;
    uint8_t* flush = nullptr;
    unsigned long long* sum = nullptr;
    const size_t flush_bytes = size_t{256} << 20;  // over any Hopper L2 (50-60 MB)
    CHECK_CUDA(cudaMalloc(&w, kBytes));
    CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
    CHECK_CUDA(cudaMalloc(&sum, sizeof(unsigned long long)));
    std::vector<uint8_t> host(kBytes);
    uint32_t x = 12345;
    for (auto& b : host) {
        x = x * 1664525u + 1013904223u;
        b = static_cast<uint8_t>(x >> 24);
    }
    CHECK_CUDA(cudaMemcpy(w, host.data(), kBytes, cudaMemcpyHostToDevice));
    cudaEvent_t t0, t1;
    CHECK_CUDA(cudaEventCreate(&t0));
    CHECK_CUDA(cudaEventCreate(&t1));
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs, L2 %d MB; %.1f MB of down's code bytes (4 experts of 20b), L2 flushed each launch\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, kBytes / 1e6);
    std::printf("%-10s %7s %6s %10s %8s %8s\n", "layout", "threads", "CTAs", "KB a CTA", "us", "GB/s");
    unsigned long long want = 0;
    auto run = [&](const char* name, int threads, int ctas, auto launch) {
        std::vector<float> us;
        unsigned long long got = 0;
        for (int r = 0; r < repeats; ++r) {
            CHECK_CUDA(cudaMemsetAsync(flush, r & 0xff, flush_bytes));
            CHECK_CUDA(cudaMemsetAsync(sum, 0, sizeof(unsigned long long)));
            CHECK_CUDA(cudaEventRecord(t0));
            launch();
            CHECK_CUDA(cudaEventRecord(t1));
            CHECK_CUDA(cudaEventSynchronize(t1));
            CHECK_CUDA(cudaGetLastError());
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
            us.push_back(ms * 1000.0f);
            CHECK_CUDA(cudaMemcpy(&got, sum, sizeof(got), cudaMemcpyDeviceToHost));
        }
        if (want == 0) want = got;
        std::sort(us.begin(), us.end());
        const float med = us[us.size() / 2];
        std::printf("%-10s %7d %6d %10.1f %8.2f %8.0f%s\n", name, threads, ctas, kBytes / 1024.0 / ctas, med,
                    kBytes / (med * 1e-6) / 1e9, got == want ? "" : "  CHECKSUM MISMATCH");
        if (got != want) std::exit(2);
    };
    for (int threads : {128, 256}) {
        const int n_tiles = kExperts * kRows / 16;
        run("tiles", threads, n_tiles, [&] { tiles<<<n_tiles, threads>>>(w, sum); });
        if (threads == 128) run("frag", threads, n_tiles, [&] { frag<<<n_tiles, threads>>>(w, sum); });
        const int n32 = kExperts * (kRowBytes / 16), n64 = kExperts * (kRowBytes / 32);
        run("group32", threads, n32, [&] { groups<16><<<n32, threads>>>(w, sum, false); });
        run("group32x", threads, n32, [&] { groups<16><<<n32, threads>>>(w, sum, true); });
        run("group64", threads, n64, [&] { groups<32><<<n64, threads>>>(w, sum, false); });
    }
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(flush));
    CHECK_CUDA(cudaFree(sum));
    return 0;
}
