#pragma once

#include <cstdint>

namespace gptoss::kernels {

// Batched causal GQA attention with sinks over a paged bf16 (or e4m3) KV cache, for the CUDA backend. Every
// pointer is device memory; lengths and positions are read on the device, so a launch can be
// captured in a CUDA graph once and replayed with new metadata.
//
// Sequence s owns new query tokens [query_start[s], query_start[s+1]) of q/out, at positions
// seq_start_pos[s], seq_start_pos[s] + 1, …; its keys 0 .. (last position) are already in the cache
// (the RoPE/KV-write kernel runs first), reached through block_tables[s · max_blocks_per_seq + b]
// for logical block b (positions [b·block_size, (b+1)·block_size)). With sliding_window > 0 a
// query at position i sees keys i − sliding_window < j ≤ i, and the table entries for older blocks
// are never read (they may be −1).
//
// Softmax (MODEL.md §4.4): scores = q·k · scale; the sink logit sinks[h] (unscaled) joins the
// denominator only: out = Σ_j e^{s_j − M} v_j / (Σ_j e^{s_j − M} + e^{sink − M}).
struct PagedAttentionArgs {
    const void* q = nullptr;        // [num_tokens, num_heads, head_dim] bf16, post-RoPE (or q_raw below)
    void* out = nullptr;            // [num_tokens, num_heads, head_dim] bf16
    const float* sinks = nullptr;   // [num_heads]
    const void* k_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] bf16
    const void* v_cache = nullptr;  // same
    // The caches hold e4m3 (OCP e4m3fn, scale 1: the value itself, as vLLM's --kv-cache-dtype fp8
    // without calibrated scales) instead of bf16. CUDA only.
    bool kv_fp8 = false;
    // With kv_fp8, the decode kernel's f16 MMAs take K and V straight from the e4m3 tile instead of
    // a widened bf16 copy (kernels/cuda/attention.cu; opt-in, session 7, not yet run).
    bool fp8_direct = false;
    // Prefill on warpgroup MMAs (wgmma) instead of mma.sync (kernels/cuda/attention.cu; the CUDA
    // model sets it unless GPTOSS_ATTN_PREFILL_WGMMA=0).
    bool prefill_wgmma = false;
    // With prefill_wgmma, a bf16 cache and block_size % 16 == 0: the K/V tiles arrive by TMA (16-row
    // pieces through the block table) into a 3-stage ring with mbarriers, so the two warpgroups of
    // a CTA no longer meet at a barrier every tile (kernels/cuda/attention.cu; the CUDA model sets it
    // unless GPTOSS_ATTN_PREFILL_TMA=0).
    bool prefill_tma = false;
    // With prefill_tma: P·V of the previous KV tile runs under the softmax of the current one (the
    // FlashAttention-3 intra-warpgroup overlap; same bits; kernels/cuda/attention.cu; the CUDA model
    // sets it unless GPTOSS_ATTN_PREFILL_PIPE=0).
    bool prefill_pipe = false;
    // With prefill_pipe: the CTA's two warpgroups take turns at issuing their wgmmas (named
    // barriers), one's softmax under the other's products (FlashAttention-3's ping-pong; same bits).
    // r34: ~1% faster on full layers past 2k queries, slower on sliding ones (the CUDA model's rule,
    // CudaModel kPingPongMinQuery).
    bool prefill_pingpong = false;
    // With prefill_pipe: the softmax kept before the P·V wait by a store of the row sums (same bits;
    // session 34, kernels/cuda/attention.cu kOrder; full 8k -1.7%). -1: on unless
    // GPTOSS_ATTN_SOFTMAX_ORDER=0; 0 off; 1 on.
    int prefill_softmax_order = -1;
    // The TMA prefill kernels zero a KV tile's V rows outside the query tile's visible keys
    // [kv_lo, p_last] in shared memory (P = 0 times a non-finite row would be NaN) only where a
    // row can hold a slot past the sequence's last written key: every row they load is a key of
    // the sequence in [kv_lo & ~15, p_last | 15] (16-key pieces through the block table), so
    // elsewhere the masked rows are written keys and P = 0 alone drops them, the same bits (r46;
    // attention_bench sliding 8k 157.6 -> 152.4 us). true: zero them on every such tile, as before
    // r46 (A/B runs, tests).
    bool prefill_zero_all_rows = false;
    // CUDA prefill only: q straight from the QKV projection's rows instead of `q`: the kernel adds
    // the bias and rotates (YaRN RoPE at q_positions) as it loads each query tile, the same bf16 bits
    // as the RoPE kernel's q (which then writes only k and v: QkvRopeArgs::q_out = null). Saves
    // writing q and reading it back (8k: 2 × 67 MB a layer) for ~2.5 us a query tile (r34: 8k
    // prefill 20b neutral, 120b −0.7 to −1.6 ms). Null: q is used.
    const void* q_raw = nullptr;           // [num_tokens, q_raw_stride] bf16; q heads' elements first
    int q_raw_stride = 0;                  // elements a token row, a multiple of 8
    const float* q_bias = nullptr;         // [num_heads · head_dim]
    const int32_t* q_positions = nullptr;  // [num_tokens]
    const float* rope_inv_freq = nullptr;  // [head_dim / 2]
    float rope_scaling = 1.0f;             // YaRN's concentration (cos and sin times it)
    // Optional with q_raw: [num_tokens, head_dim / 2, 2] (cos, sin) of each token's position, the
    // table of kernels::cuda::rope_cos_sin_table (the values the kernel would compute): a query tile
    // copies its rows (4 KB) with its Q instead of loading positions and running sincosf.
    const float* q_rope_cs = nullptr;
    // CUDA prefill only: the output also (or, in the pipelined TMA kernels, instead: out is then not
    // written) as the O projection's FP8 GEMM input, the bytes quantize_act_fp8_bf16 of out would
    // give: e4m3 [out_q_m_pad, num_heads · head_dim] and scales [num_heads · head_dim / 128,
    // out_q_m_pad] (kernels/cuda/fp8_gemm.h; out_q_m_pad = fp8_gemm_m_pad(num_tokens), padding rows
    // zero with scale 1). Saves the bf16 rows' write and the quantizer's pass (8k: ~130 MB a layer).
    uint8_t* out_q = nullptr;
    float* out_q_scale = nullptr;
    int out_q_m_pad = 0;
    const int32_t* block_tables = nullptr;   // [num_seqs, max_blocks_per_seq]
    const int32_t* seq_start_pos = nullptr;  // [num_seqs]
    const int32_t* query_start = nullptr;    // [num_seqs + 1], query_start[0] = 0
    int max_blocks_per_seq = 0;
    int num_seqs = 0;
    int num_tokens = 0;       // query_start[num_seqs] (host copy, for grid sizing)
    int max_query_len = 0;    // host upper bound on any sequence's new tokens (grid sizing)
    int max_context_len = 0;  // host upper bound on any sequence's last position + 1 (grid sizing)
    int num_heads = 64;
    int num_kv_heads = 8;
    int head_dim = 64;
    int block_size = 16;
    int sliding_window = 0;  // 0 = full causal
    float scale = 0.125f;
    // Split-KV (flash-decoding) workspace, used by the decode kernel: at least
    // num_seqs · num_heads · max_splits · (head_dim + 2) floats.
    float* workspace = nullptr;
    int max_splits = 1;
};

}  // namespace gptoss::kernels
