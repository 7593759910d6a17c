// Host launchers of the CUDA backend (sm_90a). Every pointer is device memory unless noted; every
// launcher runs on the given stream and checks the launch. Shapes use the model config's names.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

// x[t, :] = embed[ids[t], :] (bf16 table -> fp32).
void embedding(const int32_t* ids, int num_tokens, const void* table_bf16, int hidden_size, float* x,
               cudaStream_t stream);

// Residual update fused with the next RMSNorm:
//   x[t] += Σ_{k<num_add} add_weights[t, k] · add[t, k, :] + add_bias      (skipped when add == nullptr)
//   out[t] = bf16(x[t] / sqrt(mean(x[t]²) + eps) · weight)                  (skipped when out == nullptr)
// add_weights == nullptr means weight 1. add_bias may be nullptr.
struct ResidualRmsNormArgs {
    float* x = nullptr;                  // [num_tokens, hidden_size] residual stream, updated in place
    const float* add = nullptr;          // [num_tokens, num_add, hidden_size]
    bool add_bf16 = false;               // add holds bf16 (MoeFp8Args::y_bf16), not fp32
    const float* add_weights = nullptr;  // [num_tokens, num_add]
    const float* add_bias = nullptr;     // [hidden_size]
    int num_add = 1;
    const float* weight = nullptr;  // [hidden_size] norm gain
    void* out = nullptr;            // [num_tokens, hidden_size] bf16
    float* out_f32 = nullptr;       // optional fp32 copy of the normed rows (router input), may be null
    // Optional [num_tokens]: each row's 1 / rms, the factor of out_f32 = (x · inv_rms) · weight (a
    // consumer that normalizes x itself, RouterTopkArgs::norm_inv_rms, gets out_f32's bits).
    float* out_inv_rms = nullptr;
    // Optional: out's rows as e4m3 [num_tokens, hidden_size] with one scale a row [num_tokens], the
    // bytes of moe_fp8_quant_rows(out, by_token = false) (the MoE's token rows, gathered per
    // assignment by moe_fp8_gather_rows). In the norm kernel where residual_rmsnorm_fuses_row_q
    // says so (then out may be null), else by moe_fp8_quant_rows after it (then out is needed).
    uint8_t* out_row_q = nullptr;
    float* out_row_scale = nullptr;
    int num_tokens = 0;
    int hidden_size = 0;
    float eps = 1e-5f;
    // Optional: the bf16 normed rows quantized for an FP8 GEMM, the bytes quantize_act_fp8_bf16 of
    // out would give: e4m3 [q_m_pad, q_k_pad] and scales [q_k_pad / 128, q_m_pad] (fp8_gemm.h's
    // layouts; q_m_pad = fp8_gemm_m_pad(num_tokens), q_k_pad a multiple of 128 ≥ hidden_size). Where
    // residual_rmsnorm_fuses_quant says so in the norm itself, else by quantize_act_fp8_bf16 after
    // it (then out is needed).
    uint8_t* out_q = nullptr;
    float* out_q_scale = nullptr;
    int q_k_pad = 0, q_m_pad = 0;
};
void residual_rmsnorm(const ResidualRmsNormArgs& args, cudaStream_t stream);
// Whether residual_rmsnorm quantizes out_q inside the norm kernel (then out may be null).
bool residual_rmsnorm_fuses_quant(const ResidualRmsNormArgs& args);
// Whether residual_rmsnorm writes out_row_q inside the norm kernel (then out may be null).
bool residual_rmsnorm_fuses_row_q(const ResidualRmsNormArgs& args);

// Bias add + YaRN RoPE (NeoX half-split) + KV-cache write, from the fused QKV projection output.
struct QkvRopeArgs {
    const void* qkv = nullptr;    // [num_tokens, (num_heads + 2·num_kv_heads) · head_dim] fp32 (or bf16), no bias
    bool qkv_bf16 = false;        // qkv holds bf16 (Fp8GemmRunner's bf16 output), not fp32
    const float* bias = nullptr;  // [(num_heads + 2·num_kv_heads) · head_dim]
    const int32_t* positions = nullptr;     // [num_tokens]
    const int32_t* slot_mapping = nullptr;  // [num_tokens] block·block_size + offset; < 0: skip write
    const float* inv_freq = nullptr;        // [head_dim / 2]
    float attention_scaling = 1.0f;
    // [num_tokens, num_heads, head_dim] bf16; null: q is not written, only k and v (the prefill
    // attention then takes q from qkv itself, PagedAttentionArgs::q_raw). qkv_gemv_rope needs it.
    void* q_out = nullptr;
    void* k_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] bf16
    void* v_cache = nullptr;
    bool kv_fp8 = false;  // the caches hold e4m3 (kernels/args/paged_attention_args.h), not bf16
    int num_tokens = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 64;
};
void qkv_bias_rope_kv_write(const QkvRopeArgs& args, cudaStream_t stream);

// out[t, i] = (cos, sin) of positions[t] · inv_freq[i] times scaling (rope_cos_sin's values) for
// i < half: one table a forward, shared by every layer's prompt attention (PagedAttentionArgs::
// q_rope_cs). out: [num_tokens, half, 2] floats. (r36: the k/v RoPE kernel reading it instead of
// its own sincosf was slower, rope_kv 0.457 -> 0.513 ms at 20b 8k: not used there.)
void rope_cos_sin_table(const int32_t* positions, int num_tokens, const float* inv_freq, int half, float scaling,
                        float* out, cudaStream_t stream);

// Paged KV blocks between one layer's cache (K or V) and a contiguous buffer, for disaggregated prefill's
// transfers: gather out[i] = cache[ids[i]]; scatter cache[ids[i]] = in[i], skipping ids < 0. Blocks of
// block_bytes (a multiple of 16); ids[n] on the device.
void gather_kv_blocks(const void* cache, const int32_t* ids, int n, int64_t block_bytes, void* out,
                      cudaStream_t stream);
void scatter_kv_blocks(const void* in, const int32_t* ids, int n, int64_t block_bytes, void* cache,
                       cudaStream_t stream);

// n bf16 (or e4m3) values, uniform in [-2, 2), from a counter-based hash (benchmark fill).
void fill_random_bf16(void* out, int64_t n, uint64_t seed, cudaStream_t stream);
void fill_random_fp8(void* out, int64_t n, uint64_t seed, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
