// FP8 e4m3 block-scaled linear layers for prefill-sized batches (issue 6 groundwork, not wired into
// the model): y[M, N] = x[M, K] · W[N, K]ᵀ + bias[N], fp32 output, through cuBLASLt's Hopper
// block-scaled FP8 kernels (DeepSeek-V3 style: activations 1×128, weights 128×128, fp32 scales).
//
// Scales are powers of two (model/fp8_convert.h's fp8_block_scale: the smallest 2^e with
// amax / 2^e ≤ 448), for activations too: x · 2^-e is exact, so the quantizer's bytes are a pure
// function of the input (tests compare them bit for bit with a CPU loop), and dequantization is
// exact. Cost against amax / 448: at most one binade of e4m3's range, no mantissa bits.
//
// Layouts (cuBLAS sees row-major y = x·Wᵀ as column-major yᵀ = W·xᵀ, "TN": W is its A, stored
// K_pad × N column-major and transposed by opA; x is its B, K_pad × M_pad column-major):
//   Fp8Weight.q       e4m3 [N, K_pad]                  row-major, zeros in columns K..K_pad
//   Fp8Weight.scales  f32  [⌈N/128⌉, K_pad/128]        row-major (K blocks contiguous), 1 in pads
//       (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: one scale per 128×128 block, the inner
//       (K) block index fastest, its stride rounded up to a multiple of 4 blocks; K_pad/128 is a
//       multiple of 4, so the stride is K_pad/128 whichever way cuBLAS rounds.)
//   activations q     e4m3 [M_pad, K_pad]              row-major, zero rows M..M_pad, zeros K..K_pad
//   activations s     f32  [K_pad/128, M_pad]          M fastest ("outer-dimension major", what
//       CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F reads: PyTorch's 1x128 check wants strides (1, M),
//       Transformer Engine's GEMM-ready 1D scales are [⌈K/128⌉, round_up(M, 4)]); scale 1 in pads.
//
// Padding rules, and why:
//   K_pad = round_up(K, 512): measured on the H200, cuBLASLt's block-scaled FP8 is silently wrong at
//     K = 2944 (23 K blocks) and right at 3072 / 4096; with K_pad/128 a multiple of 4 the weight
//     scales' row stride is unambiguous. Zero columns add exact zeros to every dot product.
//   M_pad = round_up(M, 4): the two sources above disagree on the activation scales' stride when M
//     is not a multiple of 4 (M or round_up(M, 4)); running the GEMM on M_pad rows makes them agree.
//     So the output y needs room for M_pad rows (rows M..M_pad are written, zeros plus bias).
//   cuBLASLt refuses M = 1 (measured); the runner returns kUnimplemented below M = 2 (decode uses
//   the GEMV kernels anyway) and the caller can fall back to fp8_gemm_reference.
//
// Bias: cuBLASLt's FP8 kernels with an fp32 output take a bf16 bias (cuBLAS docs, cublasLtMatmul FP8
// table); gpt-oss biases are bf16 on disk, so the bias here is bf16 [N]. When no algorithm offers the
// BIAS epilogue, the runner adds the bias with a small kernel instead (same result).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "core/status.h"
#include "kernels/cuda/device_buffer.h"

namespace gptoss::kernels::cuda {

inline constexpr int kFp8GemmBlock = 128;
inline constexpr int kFp8GemmKAlign = 512;  // K_pad multiple: K_pad / 128 a multiple of 4
inline constexpr int kFp8GemmMAlign = 4;    // M_pad multiple: see the padding rules above

inline int fp8_gemm_k_pad(int k) { return (k + kFp8GemmKAlign - 1) / kFp8GemmKAlign * kFp8GemmKAlign; }
inline int fp8_gemm_m_pad(int m) { return (m + kFp8GemmMAlign - 1) / kFp8GemmMAlign * kFp8GemmMAlign; }

// ---- activations ---------------------------------------------------------------------------------

// Quantizes x [m, k] (row-major, ld = k) into xq [m_pad, k_pad] e4m3 and xs [k_pad/128, m_pad] fp32
// (layouts above; m_pad = fp8_gemm_m_pad(m)). Per row and 128-wide group along K: scale =
// fp8_block_scale(amax of the elements present), q = e4m3_rne_satfinite(x / scale). Pads: q = 0,
// scale = 1 for groups with no element present. k_pad: a multiple of 128, ≥ k.
void quantize_act_fp8(const float* x, int m, int k, int k_pad, uint8_t* xq, float* xs, cudaStream_t stream);
// Same from bf16 x [m, k].
void quantize_act_fp8_bf16(const void* x, int m, int k, int k_pad, uint8_t* xq, float* xs, cudaStream_t stream);

// ---- weights (load time) -------------------------------------------------------------------------

// A weight in the GEMM layout. Owns its device memory.
struct Fp8Weight {
    DeviceBuffer q;       // e4m3 [n, k_pad]
    DeviceBuffer scales;  // f32 [⌈n/128⌉, k_pad/128]
    int n = 0, k = 0, k_pad = 0;

    // From the on-disk format (model/fp8_convert.h), already on the device: q_src [n, k] e4m3,
    // scales_src [⌈n/128⌉, ⌈k/128⌉]. Copies into the padded layout; k_pad = fp8_gemm_k_pad(k).
    static Fp8Weight from_fp8_blocks(const uint8_t* q_src, const float* scales_src, int n, int k, cudaStream_t stream);
    // From bf16 w [n, k] on the device: 128×128 block quantization exactly as
    // model::quantize_fp8_blocks (scales from the elements present), then padded.
    static Fp8Weight from_bf16(const void* w, int n, int k, cudaStream_t stream);
};

// The kernels behind Fp8Weight (into caller-owned buffers, for arenas).
// q_out [n, k_pad], s_out [⌈n/128⌉, k_pad/128]; k_pad a multiple of 128, ≥ k.
void pad_fp8_weight(const uint8_t* q_src, const float* scales_src, int n, int k, int k_pad, uint8_t* q_out,
                    float* s_out, cudaStream_t stream);
void quantize_weight_fp8_bf16(const void* w, int n, int k, int k_pad, uint8_t* q_out, float* s_out,
                              cudaStream_t stream);
// The same for a layer's MXFP4 experts (blocks [E, n, k/32, 16], e8m0 scales [E, n, k/32], k a
// multiple of 32) straight from the packed bytes: q_out [E, n, k_pad], s_out [E, ⌈n/128⌉, k_pad/128],
// byte for byte what mxfp4_to_bf16 then quantize_weight_fp8_bf16 give per expert, except that
// only the ⌈k/128⌉ K blocks holding columns are written (the rest of q_out and s_out is left as
// it is). expert_offsets [E + 1] (device, or null): experts without rows are skipped.
void quantize_weight_fp8_mxfp4(const uint8_t* blocks, const uint8_t* scales, int num_experts, int n, int k, int k_pad,
                               const int* expert_offsets, uint8_t* q_out, float* s_out, cudaStream_t stream);

// ---- GEMM ----------------------------------------------------------------------------------------

// Plain CUDA reference (tests, and the fallback where cuBLASLt refuses a shape): one thread per
// output, y[r, c] = Σ_blocks (Σ_{k in block} e4m3(xq[r,k]) · e4m3(wq[c,k])) · xs[kb, r] · ws[c/128, kb]
// + bias[c], fp32 throughout. xq/xs in the activation layout with row stride k_pad and scale
// stride m_pad = fp8_gemm_m_pad(m); writes rows 0..m only. bias: bf16 [n] or null. y_bf16: y holds
// bf16 (the fp32 result rounded to nearest even), else fp32.
void fp8_gemm_reference(const uint8_t* xq, const float* xs, const Fp8Weight& w, const void* bias, void* y, int m,
                        cudaStream_t stream, bool y_bf16 = false);

// One runner per model (stream): gemm() updates the cached plans' pointers and layouts on every
// call, so a runner is not to be shared between threads.
class Fp8GemmRunner {
public:
    explicit Fp8GemmRunner(size_t workspace_bytes = 32u << 20);
    ~Fp8GemmRunner();
    Fp8GemmRunner(const Fp8GemmRunner&) = delete;
    Fp8GemmRunner& operator=(const Fp8GemmRunner&) = delete;

    // y [m_pad, w.n] fp32 row-major = x · Wᵀ (+ bias); xq [m_pad, w.k_pad], xs [w.k_pad/128, m_pad]
    // as written by quantize_act_fp8; bias bf16 [w.n] or null. kUnimplemented when m < 2 or when
    // cuBLASLt has no block-scaled algorithm for the shape (cached: asking again is cheap).
    // The first call per (m, n, k_pad, bias, y_bf16) queries the heuristic: warm up before graph
    // capture. y_bf16: y holds bf16 (cuBLASLt's epilogue rounds the fp32 sums; session 11, not
    // yet run), else fp32.
    Status gemm(const uint8_t* xq, const float* xs, const Fp8Weight& w, const void* bias, void* y, int m,
                cudaStream_t stream, bool y_bf16 = false);

private:
    struct Plan;
    // Plans per (M bucket, n, k_pad, bias, bf16 output); exact: for this M only (after the
    // bucket's failed).
    Plan& plan_for(int m_pad, int n, int k_pad, bool bias, bool y_bf16, bool exact);
    Status run(Plan& p, const uint8_t* xq, const float* xs, const Fp8Weight& w, const void* bias, void* y, int m_pad,
               bool y_bf16, cudaStream_t stream);

    void* handle_ = nullptr;  // cublasLtHandle_t
    DeviceBuffer workspace_;
    size_t workspace_bytes_;
    std::map<std::tuple<int, int, int, bool, bool>, std::unique_ptr<Plan>> plans_;
    std::set<std::tuple<int, int, int, bool, bool>> warned_;  // shapes already reported as unsupported
};

}  // namespace gptoss::kernels::cuda
