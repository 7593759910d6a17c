// Throughput of the weight decodes the decode-path kernels use, per SM and clock, in values (one
// value = one weight turned into a 16-bit MMA operand half):
//
//   e4m3_bits : e4m3 -> bf16 by bit moves and one bf16x2 multiply by 2^120 (gemv.cu's
//               e4m3x4_to_bf16x2; the FP8 GEMVs' decode today)
//   e4m3_cvt  : e4m3 -> f16 by cvt.rn.f16x2.e4m3x2 (native on sm_89+; the f16 MMA's operand)
//   e2m1_bits : e2m1 -> bf16 (value · 2^-126) by mask, multiply and mask (mxfp4_bits.h e2m1x8_raw;
//               moe_decode_mma's decode today)
//   e2m1_cvt  : e2m1 -> e4m3 by two bit moves a word, then cvt.rn.f16x2.e4m3x2 (the W4A8 path's
//               bit moves, moe_common.cuh)
//
// Each thread decodes 8 independent words an iteration (enough independent work to hide the
// latencies), folds the results into an xor so nothing is dead, and the grid is 8 CTAs of 256
// threads an SM. Usage: cvt_bench [iterations]. Prints values per SM-clock (clock64 in each CTA)
// and the kernel time.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t cvt_e4m3x2(uint32_t w16) {  // the low 2 bytes
    uint32_t d;
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(w16));
    return d;
}
__device__ __forceinline__ uint32_t cvt_e4m3x2_hi(uint32_t w) {  // the high 2 bytes
    uint32_t d;
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(w));
    return d;
}

// 4 values a word.
__device__ __forceinline__ uint32_t e4m3_bits(uint32_t w) {
    constexpr uint32_t k2p120 = 0x7B807B80u;
    const uint32_t even = bf16x2_mul(((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u), k2p120);
    const uint32_t odd = bf16x2_mul(((w >> 4) & 0x07f007f0u) | (w & 0x80008000u), k2p120);
    return even ^ odd;
}
__device__ __forceinline__ uint32_t e4m3_cvt(uint32_t w) { return cvt_e4m3x2(w) ^ cvt_e4m3x2_hi(w); }
// 8 values a word.
__device__ __forceinline__ uint32_t e2m1_bits(uint32_t w) {
    const uint32_t hi = w >> 8;
    const uint32_t r0 = ((w & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
    const uint32_t r1 = ((w & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
    const uint32_t r2 = ((hi & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
    const uint32_t r3 = ((hi & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
    return r0 ^ r1 ^ r2 ^ r3;
}
// e2m1 -> e4m3 (value · 2^-6) by moe_common.cuh's two bit moves a word (the W4A8 path), then
// cvt.rn.f16x2.e4m3x2 four times.
__device__ __forceinline__ uint32_t e2m1_cvt(uint32_t w) {
    const uint32_t lo = ((w & 0x07070707u) << 2) | ((w << 4) & 0x80808080u);  // the low nibbles
    const uint32_t hi = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);         // the high nibbles
    return cvt_e4m3x2(lo) ^ cvt_e4m3x2_hi(lo) ^ cvt_e4m3x2(hi) ^ cvt_e4m3x2_hi(hi);
}

template <int kKind>
__global__ void __launch_bounds__(256) bench(const uint32_t* in, uint32_t* out, int iters, long long* cycles) {
    uint32_t w[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        w[i] = in[(threadIdx.x + i * 256) & 4095];
        acc[i] = 0u;
    }
    __syncthreads();
    const long long c0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t x = w[i] + static_cast<uint32_t>(it);  // a new word each time, 1 IADD
            uint32_t r;
            if constexpr (kKind == 0) r = e4m3_bits(x);
            if constexpr (kKind == 1) r = e4m3_cvt(x);
            if constexpr (kKind == 2) r = e2m1_bits(x);
            if constexpr (kKind == 3) r = e2m1_cvt(x);
            if constexpr (kKind == 4) r = x;  // the loop alone
            acc[i] ^= r;
        }
    }
    __syncthreads();
    const long long c1 = clock64();
    uint32_t f = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) f ^= acc[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = f;
    if (threadIdx.x == 0) cycles[blockIdx.x] = c1 - c0;
}

template <int kKind>
void run(const char* name, int values_per_word, int iters, int sms, const uint32_t* in, uint32_t* out,
         long long* cycles) {
    const int ctas_per_sm = 8, grid = sms * ctas_per_sm;
    bench<kKind><<<grid, 256>>>(in, out, iters, cycles);  // warm-up
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    bench<kKind><<<grid, 256>>>(in, out, iters, cycles);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    long long* h = static_cast<long long*>(std::malloc(sizeof(long long) * grid));
    CK(cudaMemcpy(h, cycles, sizeof(long long) * grid, cudaMemcpyDeviceToHost));
    double mean = 0;
    for (int i = 0; i < grid; ++i) mean += static_cast<double>(h[i]);
    mean /= grid;
    std::free(h);
    // All 8 CTAs of an SM run at once (256 threads, few registers), so an SM's clocks are one CTA's.
    const double values_per_sm = static_cast<double>(ctas_per_sm) * 256.0 * iters * 8 * values_per_word;
    std::printf("| %-10s | %8.3f | %10.0f | %8.2f | %8.2f |\n", name, ms, mean, values_per_sm / mean,
                values_per_sm * sms / (ms * 1e-3) / 1e12);
}

}  // namespace

int main(int argc, char** argv) {
    const int iters = argc > 1 ? std::atoi(argv[1]) : 4096;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint32_t *in = nullptr, *out = nullptr;
    long long* cycles = nullptr;
    CK(cudaMalloc(&in, 4096 * 4));
    CK(cudaMalloc(&out, static_cast<size_t>(sms) * 8 * 256 * 4));
    CK(cudaMalloc(&cycles, static_cast<size_t>(sms) * 8 * 8));
    uint32_t h[4096];
    uint32_t s = 12345u;
    for (auto& v : h) v = (s = s * 1664525u + 1013904223u);
    CK(cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice));
    std::printf("iterations %d, %d SMs, 8 CTAs x 256 threads an SM, 8 words a thread an iteration\n", iters, sms);
    std::printf("| decode | ms | cycles a CTA | values / SM-clock | Tvalues/s |\n|---|---:|---:|---:|---:|\n");
    run<4>("loop only", 4, iters, sms, in, out, cycles);
    run<0>("e4m3_bits", 4, iters, sms, in, out, cycles);
    run<1>("e4m3_cvt", 4, iters, sms, in, out, cycles);
    run<2>("e2m1_bits", 8, iters, sms, in, out, cycles);
    run<3>("e2m1_cvt", 8, iters, sms, in, out, cycles);
    return 0;
}
