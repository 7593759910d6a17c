// Small-batch GEMV for decode: y[m, n] = Σ_k x[m, k] · W[n, k] (+ bias[n]) for m < num_tokens ≤ 8,
// bf16 (or FP8 e4m3 with 128×128 block scales) weights [N, K] read once at full bandwidth, activations in fp32 or bf16,
// fp32 accumulation and output. cuBLASLt's choices at M = 1 read weights far below bandwidth (bench/NOTES.md r2).
// Default kernel (k ≤ 4096): a persistent grid of warps, each walking rows n-strided with the whole
// next row's 16-byte loads in flight while it computes the current one; weights bypass L1 so the
// activations stay there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

constexpr int kGemvMaxTokens = 8;

// kMmaOneWave: the tensor-core kernel with 6 K steps a warp and its block scales in shared memory,
// 3 CTAs an SM (k ≤ 3,072; else kMma). kAuto: kMmaOneWave where k allows, else kMma.
enum class GemvFp8Kernel { kAuto, kRowPerWarp, kMma, kMmaOneWave };

struct GemvArgs {
    const void* x = nullptr;  // [num_tokens, k], fp32 (x_bf16 = false) or bf16
    bool x_bf16 = false;
    const void* w = nullptr;  // [n, k] bf16, or e4m3 [n, w_ld] when w_scale is set
    // FP8 weights (kernels/cuda/fp8_gemm.h Fp8Weight: q [n, k_pad], scales [⌈n/128⌉, k_pad/128]):
    // w_scale = Fp8Weight::scales, w_ld = Fp8Weight::k_pad; the kernel reads columns < k only, so
    // the zero padding costs no bandwidth. k a multiple of 16. (fp8_kernel below picks the kernel.)
    const float* w_scale = nullptr;
    int w_ld = 0;
    const float* bias = nullptr;  // [n] or nullptr
    float* y = nullptr;           // [num_tokens, n]
    int num_tokens = 0;           // 1 .. kGemvMaxTokens
    int n = 0;
    int k = 0;  // multiple of 8
    // The r2 kernel (one warp per row, one launch-wide wave, two load rounds for k = 2880), kept
    // for comparison and as a fallback (GPTOSS_GEMV_V1=1 in the CUDA model).
    bool legacy = false;
    // FP8 weights: which kernel (gemv.cu). kAuto and kMma: the tensor-core kernel where k % 64 == 0
    // (it rounds x to bf16; r22: 1.7× the one-warp-per-row kernel at 1 token, 6× at 4), else one
    // warp per row; kAuto takes its one-wave variant where w_ld ≤ 3,072.
    GemvFp8Kernel fp8_kernel = GemvFp8Kernel::kAuto;
    // The tensor-core kernels' MMAs in f16 at one token (e4m3 -> f16 in one instruction; x rounded
    // to bf16, then staged as f16 once a CTA): the same products as bf16 MMAs but for x below 2^-14
    // in magnitude (rounded within 2^-25). false, GPTOSS_GEMV_F16=0, or more tokens: bf16 MMAs.
    bool mma_f16 = true;
    // Optional, FP8 weights on the tensor-core kernels (gemv_fp8_mma_applies): x is a norm's output
    // before its 1 / rms (MoeResidualTail's h = x · gain, one token), and every sum is scaled by
    // rsqrt(Σ_{i < x_ss_n} x_ss_parts[i] / k + x_eps) before the bias (the sum in a fixed order, the
    // same in every CTA).
    const float* x_ss_parts = nullptr;
    int x_ss_n = 0;
    float x_eps = 0.0f;
};
// Whether the tensor-core FP8 kernels run these arguments (qkv: with RoPE, as qkv_gemv_rope): the
// kernels that take GemvArgs::x_ss_parts.
bool gemv_fp8_mma_applies(const GemvArgs& args, bool qkv, int head_dim);
void gemv_bf16w(const GemvArgs& args, cudaStream_t stream);

// The decode QKV projection fused with what follows it (ops.h qkv_bias_rope_kv_write): rows i and
// i + head_dim/2 of a head (the pair RoPE rotates) are computed together for every token, then the
// bias is added, q and k heads rotated, q written (bf16) and k, v stored into the paged cache (bf16
// or, with r.kv_fp8, e4m3). Same arithmetic, in the same order, as the plain GEMV followed by
// qkv_bias_rope_kv_write: gemv_bf16w(legacy) for bf16 weights; for FP8 weights gemv_bf16w with the
// same fp8_kernel (the tensor-core kernel rounds x to bf16, one warp per row does not). g.w is the
// concatenated [q; k; v] weight, g.n = (num_heads + 2·num_kv_heads)·head_dim, g.bias and g.y unused
// (the bias is r.bias); r.qkv unused.
struct QkvRopeArgs;
void qkv_gemv_rope(const GemvArgs& g, const QkvRopeArgs& r, cudaStream_t stream);

// The decode attention of one token inside the QKV kernel (qkv_gemv_rope_attention): the last of the
// 10 · head_dim / 16 CTAs of each kv head (its 8 q heads, its k and its v head; a ticket) reads q and the
// visible keys and values (the token's own just written) and writes that kv head's 8 query heads of the
// attention output, as paged_attention_decode does (sink once, P in bf16 for P·V, fp32 sums; 8 warps of 16
// keys a 128-key chunk with an online softmax, merged at the end, so not the same bits). One sequence of
// one token, bf16 KV cache, head_dim 64, 8 q heads a kv head (qkv_attention_tail_applies).
struct QkvAttnTailArgs {
    void* out = nullptr;                     // [num_heads, 64] bf16 (PagedAttentionArgs::out)
    const float* sinks = nullptr;            // [num_heads]
    const int32_t* block_table = nullptr;    // the sequence's row of the block table
    const int32_t* seq_start_pos = nullptr;  // [1]: the token's position
    const int32_t* query_start = nullptr;    // [2]: a decode token when query_start[1] − query_start[0] = 1
    uint32_t* counters = nullptr;            // [num_kv_heads] tickets, zero between launches (the last CTA resets)
    int block_size = 16;                     // a power of two
    int window = 128;                        // 0: a full (causal) layer
    float scale = 0.125f;                    // of q · k
};
// Whether the tail takes these: FP8 weights on the tensor-core kernels and the shapes above; a sliding
// window of 1-128 keys (one chunk), or at most 2,048 visible keys by max_context_len (a full layer: the
// chunks run one after another in one CTA a kv head).
bool qkv_attention_tail_applies(const GemvArgs& g, const QkvRopeArgs& r, int num_seqs, int window, bool kv_fp8,
                                int block_size, int max_context_len);
void qkv_gemv_rope_attention(const GemvArgs& g, const QkvRopeArgs& r, const QkvAttnTailArgs& t, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
