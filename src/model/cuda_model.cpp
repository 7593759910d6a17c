#include "model/cuda_model.h"

#if defined(GPTOSS_HAVE_CUDA)

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "core/logging.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/parallel_ops.h"
#include "kernels/cuda/sampling.h"
#include "kernels/ops.h"

namespace gptoss::model {

namespace kc = kernels::cuda;
using kc::DeviceBuffer;

namespace {

// Host matrix (bf16/f16/f32) -> device bf16.
DeviceBuffer upload_bf16(const void* data, DType dtype, int64_t n) {
    if (dtype == DType::kBF16) return DeviceBuffer::from_host(data, static_cast<size_t>(n) * 2);
    std::vector<float> f(static_cast<size_t>(n));
    kernels::cpu::row_to_f32(data, dtype, static_cast<int>(n), f.data());
    std::vector<uint16_t> b(f.size());
    for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
    return DeviceBuffer::from_host(b.data(), b.size() * 2);
}

DeviceBuffer upload_f32(const std::vector<float>& v) { return DeviceBuffer::from_host(v.data(), v.size() * 4); }

struct DeviceLayer {
    DeviceBuffer input_norm, post_norm;                           // [H] f32
    DeviceBuffer qkv_w;                                           // [qw + 2·kvw, H] bf16 (q, k, v rows concatenated)
    DeviceBuffer qkv_b;                                           // [qw + 2·kvw] f32
    DeviceBuffer o_w;                                             // [H, qw] bf16
    DeviceBuffer o_b;                                             // [H] f32
    DeviceBuffer sinks;                                           // [nq] f32
    DeviceBuffer router_w;                                        // [E, H] bf16
    DeviceBuffer router_b;                                        // [E] f32
    DeviceBuffer gu_blocks, gu_scales, down_blocks, down_scales;  // MXFP4 (published layout)
    // CudaModelOptions::moe_decode_packed: the same in the decode layout (kernels/cuda/moe.h moe_pack_decode)
    DeviceBuffer gu_packed, gu_packed_s, down_packed, down_packed_s;
    DeviceBuffer gu_bf16, down_bf16;            // [E, 2I, H], [E, H, I] bf16 (large-batch path)
    DeviceBuffer gu_b, down_b;                  // [E, 2I], [E, H] f32
    DeviceBuffer k_cache, v_cache;              // [num_blocks, block_size, nkv, hd] bf16
    kc::Fp8Weight qkv_f8, o_f8;                 // options.fp8: in place of qkv_w, o_w
    std::vector<kc::Fp8Weight> gu_f8, down_f8;  // options.fp8: per expert (if they fit)
    // options.fp8 where moe_fp8 runs: the FP8 experts in one allocation each instead (gu_f8 and
    // down_f8 stay empty): e4m3 [E, n, k_pad] and block scales [E, ⌈n/128⌉, k_pad/128].
    DeviceBuffer gu_f8q, gu_f8s, down_f8q, down_f8s;
};

}  // namespace

struct CudaModel::Impl {
    GptOssConfig c;
    CudaModelOptions opt;
    // This rank's slice (the whole model without comms): local heads, experts, units, vocab rows.
    WeightShard sh;
    int nq = 0, nkv = 0;         // local q / kv heads
    int vocab_chunk = 0;         // lm_head rows held here (the TP slice, padded to ceil(V / tp))
    int tp = 1, dp = 1, ep = 1;  // group sizes (1 without comms)
    bool world_reduce = false;   // MoE outputs are partial sums: all-reduce over the world
    DeviceBuffer hg, hg32, ycomb, logits_local, logits_gather;  // parallel scratch
    DeviceBuffer gu_scratch, down_scratch;                      // one expert in bf16 (no bf16 copy kept)
    // options.fp8: lm_head, the W8A8 GEMMs, their activation scratch (e4m3 rows and 1×128 scales),
    // and one expert in FP8 when no FP8 expert copy is kept.
    bool fp8 = false, have_fp8_experts = false;
    // CudaModelOptions::moe_decode_packed: a decode-layout copy of the MXFP4 experts for the decode kernels.
    bool decode_packed = false;
    // CudaModelOptions::fp8_experts: the FP8 copy is the only one (the MXFP4 bytes freed after each
    // layer's conversion; mxfp4 is then false, so every batch takes the grouped FP8 kernels).
    bool fp8_only = false;
    // The FP8 experts as one array a layer for the grouped FP8 kernels (kernels/cuda/moe.h moe_fp8),
    // which then take every batch above mma_tokens (no host synchronisation); else the per-expert
    // cuBLASLt GEMMs. GPTOSS_MOE_FP8_GROUPED=0 keeps the per-expert path (A/B runs).
    bool fp8_grouped = false;
    // The bf16 expert copy through the grouped bf16 kernels (kernels/cuda/moe.h moe_bf16_grouped,
    // no host synchronisation) in place of per-expert cuBLAS: 20b 1k prefill 27.8 -> 19.7 ms, 8k
    // 133.1 -> 129.4 (r24). GPTOSS_MOE_BF16_GROUPED=0 keeps cuBLAS (A/B runs).
    bool bf16_grouped = [] {
        const char* v = std::getenv("GPTOSS_MOE_BF16_GROUPED");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // MoeFp8Args::persistent (one CTA an SM over the work items): 2,434 -> 2,354 us a layer at 8k
    // tokens, 445 -> 451 at 1k (r24). GPTOSS_MOE_FP8_PERSISTENT=0: one CTA an item (A/B runs).
    bool fp8_grouped_persistent = [] {
        const char* v = std::getenv("GPTOSS_MOE_FP8_PERSISTENT");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // MoeFp8Args::narrow_min (r30): GPTOSS_MOE_NARROW_TAIL=0 runs partial tiles 128 tokens wide (A/B);
    // =8 lets them go down to 8 and 16 tokens (compiled only in session 15); default 32.
    int moe_narrow_min = [] {
        const char* v = std::getenv("GPTOSS_MOE_NARROW_TAIL");
        return v == nullptr ? 32 : std::strcmp(v, "0") == 0 ? 0 : std::strcmp(v, "8") == 0 ? 8 : 32;
    }();
    int fp8_grouped_wg = [] {  // GPTOSS_MOE_FP8_WG=2|3: MoeFp8Args::warpgroups (A/B runs)
        const char* v = std::getenv("GPTOSS_MOE_FP8_WG");
        return v != nullptr && (std::strcmp(v, "2") == 0 || std::strcmp(v, "3") == 0) ? std::atoi(v) : 0;
    }();
    // options.fp8 without an FP8 expert copy (120b: 115 GB would not fit beside MXFP4): batches of at
    // least fp8_jit_tokens tokens convert the layer's active experts MXFP4 -> e4m3 into one scratch
    // (quantize_weight_fp8_mxfp4, the load-time conversion's bytes) and take moe_fp8.
    // GPTOSS_MOE_FP8_JIT=0: never; GPTOSS_MOE_FP8_JIT_MIN_TOKENS: the threshold.
    bool fp8_jit = false;
    int fp8_jit_tokens = 4096;
    // Instead of the conversion, moe_mxfp4_fp8 on the MXFP4 experts themselves (the same batches;
    // 120b 8k prefill 207.8 -> 169.8 ms, r28). CudaModelOptions::moe_mx / GPTOSS_MOE_MX=0: off.
    bool mx_grouped = false;
    int decode_kernel = -1;  // MoeMxfp4Args::kernel for decode batches (CudaModelOptions::moe_decode_wg)
    DeviceBuffer jit_gu_q, jit_gu_s, jit_down_q, jit_down_s;
    kc::Fp8Weight lm_head_f8, gu_f8_scratch, down_f8_scratch;
    std::unique_ptr<kc::Fp8GemmRunner> fp8_gemm;
    DeviceBuffer xq8, xs8;
    cudaStream_t stream = nullptr;
    std::unique_ptr<kc::GemmRunner> gemm;
    DeviceBuffer embed, lm_head, final_norm, inv_freq;
    float attention_scaling = 1.0f;
    std::vector<DeviceLayer> layers;
    bool mxfp4 = false;
    bool have_bf16_experts = false;
    int mxfp4_tokens = 32;  // batches up to this many MoE rows take the weight-only MXFP4 kernels
    // Batches above mxfp4_tokens and up to this many MoE rows take the tensor-core grouped MXFP4
    // kernels (kernels/cuda/moe.h moe_mma: no host synchronisation, graph-capturable); above it the
    // per-expert cuBLAS(Lt) GEMMs. GPTOSS_MOE_MMA_MAX_TOKENS overrides (0: off), for A/B runs.
    int mma_tokens = 1024;
    bool mma_ok = false;  // the shapes suit moe_mma
    DeviceBuffer mma_tiles, mma_count;
    bool use_mma(int rows) const { return mma_ok && rows > mxfp4_tokens && rows <= mma_tokens; }
    // The warpgroup (wgmma) grouped kernels where the shapes suit them and options.moe_wgmma
    // (GPTOSS_MOE_WGMMA) allows: above mma_tokens (else per-expert cuBLAS(Lt) GEMMs), and in place of
    // moe_mma once experts average ≥ 64 rows (moe_bench: 1,024 tokens on 32 experts 1.23 vs 1.62 ms,
    // 256 tokens 0.72 vs 0.68 ms).
    bool wgmma_ok = false;
    // Its warp-specialized variant once experts average ≥ 64 rows (x gathered first; moe_bench, 32
    // experts, r20: 8,192 tokens 5.83 vs 6.62 ms, 1,024 tokens 1.07 vs 1.22 ms; 256 tokens 0.81 vs
    // 0.59 ms). GPTOSS_MOE_WGMMA_WS=0 never, 1 always.
    int wgmma_ws = -1;
    // GPTOSS_MOE_W4A8=1: in place of moe_wgmma, FP8 wgmma on e4m3 activation rows (moe_w4a8; not yet
    // run on a GPU). Its buffers: xq8w [assignments, max(H, I)] e4m3, xs8w one scale per row.
    bool w4a8 = false;
    // y holds bf16 (moe_fp8's down with MoeFp8Args::y_bf16): set by each moe() call for the next
    // residual norm; never under a world reduce (moe_combine reads fp32). GPTOSS_MOE_Y_BF16=0: fp32.
    bool y_bf16 = false;
    bool y_bf16_allowed = [] {
        const char* v = std::getenv("GPTOSS_MOE_Y_BF16");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    DeviceBuffer xq8w, xs8w;
    // The post-attention norm also writes its rows as e4m3 with one scale a row (hq_tok, hs_tok:
    // ResidualRmsNormArgs::out_row_q) where the MoE takes the grouped FP8 / MX kernels, which then
    // gather those bytes per assignment (moe_fp8_gather_rows) instead of quantizing h's bf16 rows
    // once per assignment (the same bytes). GPTOSS_MOE_ROWQ=0: off (A/B runs).
    bool rowq_allowed = [] {
        const char* v = std::getenv("GPTOSS_MOE_ROWQ");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    DeviceBuffer hq_tok, hs_tok;
    // Whether moe(rows, ...) quantizes h's rows for the grouped FP8 or MX kernels (the order of its
    // tests). Where it says so, the norm writes the e4m3 rows and skips h's bf16 rows, and moe()
    // gets h_bf16 = null: a branch that would read h then stops with an error (need_h in moe())
    // instead of reading stale rows.
    // Decode batches of up to fp8_decode_tokens MoE rows on the FP8 copy (moe_decode_fp8): where the
    // copy is one array a projection (fp8_grouped); CudaModelOptions::moe_decode_fp8_tokens.
    int fp8_decode_tokens = 0;
    bool use_fp8_decode(int rows) const { return rows <= fp8_decode_tokens; }
    bool moe_reads_fp8_rows(int rows) const {
        if (use_fp8_decode(rows)) return false;
        if (mx_grouped && rows >= fp8_jit_tokens) return true;
        if (fp8_jit && rows >= fp8_jit_tokens) return true;
        if (use_wgmma(rows) || use_mma(rows) || (mxfp4 && rows <= mxfp4_tokens)) return false;
        return fp8_grouped;
    }
    bool use_wgmma_ws(int rows) const { return wgmma_ws == 1 || (wgmma_ws < 0 && rows >= 64 * num_experts); }
    bool use_wgmma(int rows) const {
        return wgmma_ok && rows > mxfp4_tokens && (rows > mma_tokens || rows * experts_per_token >= 64 * num_experts);
    }
    int experts_per_token = 4, num_experts = 32;  // of the whole model (EP: rows per expert average over all)
    int num_blocks_full = 0, num_blocks_sliding = 0, max_blocks_per_seq = 0;
    size_t weight_bytes = 0, kv_bytes = 0;

    // Activations and metadata, sized for opt.max_tokens / opt.max_seqs.
    DeviceBuffer x_alt;  // [kGemvMaxTokens, H]: the residual's other buffer when the router fuses the norm
    DeviceBuffer x, h, h32, qkv, q, attn, o, expert_ids, expert_w, offsets, sorted, act, y, xg, gu, actb, yd;
    DeviceBuffer norm_inv;  // [T] the post-attention norm's 1 / rms when the router normalizes x itself
    DeviceBuffer rope_cs;   // [T, head_dim / 2, 2] each token's RoPE (cos, sin) for the prompt path (rope_table)
    // The step's inputs: views into step_arena, laid out per forward call by (tokens, sequences,
    // table stride, sampled) — the decode graph's key, so a replayed graph's pointers stay valid —
    // and uploaded by one copy from pinned memory (step_host). Fourteen pageable copies a step
    // before (r26). GPTOSS_PACKED_UPLOAD=0: the same layout by one pageable copy per input.
    struct ArenaView {
        void* p = nullptr;
        template <typename T = void>
        T* as() const {
            return static_cast<T*>(p);
        }
        void* get() const { return p; }
    };
    ArenaView ids, positions, slots_full, slots_sliding, tables_full, tables_sliding, seq_start, query_start;
    ArenaView logit_rows;
    DeviceBuffer step_arena;
    uint8_t* step_host = nullptr;  // pinned, step_arena's size
    // KV transfers (read_kv_blocks / write_kv_blocks): one layer's K or V of up to kv_staging_blocks blocks, and
    // their ids; allocated at the first transfer.
    static constexpr size_t kKvStagingBytes = size_t{8} << 20;
    DeviceBuffer kv_staging, kv_staging_ids;
    uint8_t* kv_staging_host = nullptr;  // pinned, kv_staging's size: whole copies at full speed, then host memcpys
    int kv_staging_blocks = 0;
    Status copy_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out, const uint8_t* in);
    // Logits rows bound for the host land here first (pinned: a D2H copy at full speed; a pageable destination is
    // staged by the driver at a fraction of it), then one memcpy each into the caller's vector. Steps with more host
    // rows than fit copy straight to the vector.
    static constexpr int kPinnedLogitRows = 8;
    float* logits_host = nullptr;  // [kPinnedLogitRows, V]
    cudaEvent_t step_uploaded = nullptr;
    bool packed_upload = [] {
        const char* v = std::getenv("GPTOSS_PACKED_UPLOAD");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // GPTOSS_STEP_EVENTS=1: each sampled step's device span (upload to the ids' copy back) by two
    // timing events, for the bench to set against the wall step (the host's share of a step).
    bool step_events = [] {
        const char* v = std::getenv("GPTOSS_STEP_EVENTS");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    cudaEvent_t span_begin = nullptr, span_end = nullptr;
    float last_span_ms = -1.0f;
    // GPTOSS_HOST_TIMING=1: for each forward call, the host's time at a few points of the launch
    // sequence and, by an event at each, where the GPU's timeline stood (a diagnostic for gaps in
    // which the GPU waits for the host), printed on stderr after the call.
    bool host_timing = [] {
        const char* v = std::getenv("GPTOSS_HOST_TIMING");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    static constexpr int kTimingPoints = 8;
    cudaEvent_t timing_ev[kTimingPoints] = {};
    std::chrono::steady_clock::time_point timing_host[kTimingPoints];
    const char* timing_name[kTimingPoints] = {};
    int timing_n = 0;
    void timing_point(const char* name) {
        if (!host_timing || timing_n >= kTimingPoints) return;
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
        if (capturing != cudaStreamCaptureStatusNone) return;  // a graph's body: no host time to compare
        if (!timing_ev[timing_n]) CUDA_CHECK(cudaEventCreate(&timing_ev[timing_n]));
        timing_host[timing_n] = std::chrono::steady_clock::now();
        CUDA_CHECK(cudaEventRecord(timing_ev[timing_n], stream));
        timing_name[timing_n++] = name;
    }
    void timing_report(int tokens) {  // after the stream's synchronisation
        if (!host_timing || timing_n == 0) return;
        std::string line = "host timing (" + std::to_string(tokens) + " tokens):";
        for (int i = 1; i < timing_n; ++i) {
            float gpu_ms = 0.0f;
            CUDA_CHECK(cudaEventElapsedTime(&gpu_ms, timing_ev[i - 1], timing_ev[i]));
            const double host_ms =
                std::chrono::duration<double, std::milli>(timing_host[i] - timing_host[i - 1]).count();
            char buf[160];
            std::snprintf(buf, sizeof buf, " | %s host %.3f gpu %.3f ms", timing_name[i], host_ms, gpu_ms);
            line += buf;
        }
        std::fprintf(stderr, "%s\n", line.c_str());
        timing_n = 0;
    }
    DeviceBuffer hsel, logits, attn_workspace, router_logits;
    // With the FP8 KV cache, decode attention's MMAs read the e4m3 tile directly
    // (PagedAttentionArgs::fp8_direct; r23: B=128 at 32k 1,673 → 1,442 µs, 20b step 30.3 → 28.0 ms).
    // GPTOSS_ATTN_FP8_DIRECT=0: the kernel that widens the tile to bf16 in shared memory first.
    bool attn_fp8_direct = [] {
        const char* v = std::getenv("GPTOSS_ATTN_FP8_DIRECT");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // Prefill attention on warpgroup MMAs (PagedAttentionArgs::prefill_wgmma): attention_bench 8k
    // causal 1,814 -> 1,489 us, 20b --fp8 8k prefill 97.4 -> 93.0 ms (r24).
    // GPTOSS_ATTN_PREFILL_WGMMA=0: the mma.sync (FA2) kernel.
    bool attn_prefill_wgmma = [] {
        const char* v = std::getenv("GPTOSS_ATTN_PREFILL_WGMMA");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The wgmma prefill attention with its K/V tiles by TMA into an mbarrier ring
    // (PagedAttentionArgs::prefill_tma; bf16 caches): r25 attention_bench 8k 1,513 -> 1,482 us, 32k
    // 23,399 -> 22,587 us. GPTOSS_ATTN_PREFILL_TMA=0: the cp.async kernel.
    bool attn_prefill_tma = [] {
        const char* v = std::getenv("GPTOSS_ATTN_PREFILL_TMA");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The prompt path's FP8 QKV and output projections write bf16 instead of fp32 (RoPE and the
    // residual norm read it): 8k tokens, 84 + 47 MB less written and read again a layer; the
    // rounding is transformers' (bf16 linear outputs). r27: 8k prefill 88.30 -> 87.87 ms (20b),
    // 213.85 -> 211.47 ms (120b). GPTOSS_GEMM_BF16_OUT=0: fp32 outputs (A/B runs).
    // See router_norms in forward. r29 (8k --fp8 prefill, same run): 20b 82.03 -> 81.35 ms, 120b
    // 168.35 -> 167.85. GPTOSS_ROUTER_NORM=0: off (A/B runs).
    bool router_norm_allowed = [] {
        const char* v = std::getenv("GPTOSS_ROUTER_NORM");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    bool norm_quant_allowed = [] {  // see the pre-attention norm in forward; GPTOSS_NORM_QUANT=0: off
        const char* v = std::getenv("GPTOSS_NORM_QUANT");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    bool gemm_bf16_out = [] {
        const char* v = std::getenv("GPTOSS_GEMM_BF16_OUT");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // With the TMA kernel, P·V of the previous KV tile under the softmax of the current one
    // (PagedAttentionArgs::prefill_pipe): r27 attention_bench 8k full 1,435 -> 1,376 us, 20b 8k
    // prefill attention 19.44 -> 18.71 ms. GPTOSS_ATTN_PREFILL_PIPE=0: without (A/B runs).
    // PagedAttentionArgs::prefill_pingpong on full layers of batches with at least
    // kPingPongMinQuery queries (r34 attention_bench, same run: full 8k 1,379 -> 1,366 us, 32k
    // 21,627 -> 21,158, but 1k 33.2 -> 34.3 and sliding 8k 122 -> 130). GPTOSS_ATTN_PINGPONG=0:
    // never, =1: on every prefill launch (A/B runs).
    static constexpr int kPingPongMinQuery = 2048;
    int attn_pingpong = [] {
        const char* v = std::getenv("GPTOSS_ATTN_PINGPONG");
        return v == nullptr ? -1 : std::atoi(v) != 0 ? 1 : 0;
    }();
    // The prompt path's attention writes its rows quantized for the O projection's FP8 GEMM
    // (PagedAttentionArgs::out_q) instead of bf16 rows that a quantizer pass then reads (8k: ~130 MB a
    // layer). GPTOSS_ATTN_OUT_Q=0: bf16 rows and the quantizer (A/B runs).
    bool attn_out_q = [] {
        const char* v = std::getenv("GPTOSS_ATTN_OUT_Q");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The prompt path's attention takes q from the QKV projection's bf16 rows and rotates it as it
    // loads each query tile (PagedAttentionArgs::q_raw); the RoPE kernel then writes only k and v:
    // 8k, 2 × 67 MB a layer less. r34 (8k --fp8 prefill, paired runs): rope_kv −45 us a layer,
    // attention +40 (~2.5 us a query tile: sliding layers +31%); 20b neutral, 120b −0.7 to −1.6 ms.
    // GPTOSS_ATTN_QROPE=0: the RoPE kernel writes q (A/B runs).
    bool attn_q_rope = [] {
        const char* v = std::getenv("GPTOSS_ATTN_QROPE");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The prompt path's RoPE (cos, sin) once a forward into rope_cs (kernels::cuda::rope_cos_sin_table):
    // with q_raw, each query tile of the attention copies its rows with its Q instead of loading
    // positions and running sincosf (same bits). r36 (8k --fp8, same run): attention_bench sliding
    // 164.2 -> 156.6-157.4 us, full 1,432 -> 1,416-1,423; 20b attention stage 21.63-21.68 -> 21.23-21.31
    // ms. GPTOSS_ROPE_TABLE=0: off.
    bool rope_table = [] {
        const char* v = std::getenv("GPTOSS_ROPE_TABLE");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    bool attn_prefill_pipe = [] {
        const char* v = std::getenv("GPTOSS_ATTN_PREFILL_PIPE");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // PagedAttentionArgs::prefill_zero_all_rows (the prompt attention before r46) with
    // GPTOSS_ATTN_ZERO_ALL=1 (A/B runs).
    bool attn_zero_all = [] {
        const char* v = std::getenv("GPTOSS_ATTN_ZERO_ALL");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    // The router logits of batches past the fused decode router on the tensor cores
    // (RouterTopkArgs::tensor_cores): 8k --fp8 prefill, router 15.9 -> 5.9 ms on 120b, 3.6 -> 2.2 ms
    // on 20b (r25, with the K split; 7.5 and 4.1 ms without), then 5.7 -> 3.5 and 2.1 -> 1.2 ms
    // (r26, h staged in shared memory). GPTOSS_ROUTER_MMA=0: the fp32 tiled kernel.
    bool router_mma = [] {
        const char* v = std::getenv("GPTOSS_ROUTER_MMA");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    DeviceBuffer router_counter;  // [1] u32 ticket of the fused decode router (kept zero between calls)
    // MoeResidualTail (one token): the tiles' Σ x² and tickets (kept zero between calls), and the
    // tail the next moe() call passes to its decode kernels (set by the layer loop).
    DeviceBuffer tail_parts, tail_counters;
    kc::MoeResidualTail moe_tail;
    bool tail_enabled = true;
    // Whether moe(rows, ...) takes the decode kernels that apply MoeResidualTail (the order of its tests).
    bool moe_takes_tail(int rows) const {
        if (use_fp8_decode(rows)) return true;
        if ((mx_grouped || fp8_jit) && rows >= fp8_jit_tokens) return false;
        if (use_wgmma(rows) || use_mma(rows)) return false;
        return mxfp4 && rows <= mxfp4_tokens;
    }
    static constexpr int kLogitChunk = 256;
    // Weight-only MXFP4 kernels (moe_decode_mma) up to this many MoE rows, the grouped moe_mma_v4
    // above. r42 (20b / 120b --fp8, 1k context, ms a step, crossover 4 vs 8): 5 rows 4.618 → 3.766 /
    // 7.368 → 6.042, 6 rows 4.865 → 5.178 / 7.840 → 8.939, 7 and 8 within ±4% either way.
    static constexpr int kMxfp4MmaCrossover = 5;
    static constexpr int kMaxSplits = 64;

    Status init(const GptOssWeights& w);
    Status allocate_kv(int block_size, int num_blocks_full, int num_blocks_sliding);
    size_t kv_block_bytes(int block_size) const;
    Status forward(std::span<const ForwardSequence> seqs, std::vector<float>* out,
                   std::span<const CudaModel::SampleParams> sample_params, std::vector<int32_t>* sampled,
                   int dp_max_tokens);
    Status validate(std::span<const ForwardSequence> seqs, bool sample, int blocks_full, int blocks_sliding) const;
    // The experts on T rows of (h_bf16, h_f32); expert ids are this rank's (localized under EP).
    // rows_q: hq_tok / hs_tok hold h's rows quantized (ResidualRmsNormArgs::out_row_q).
    void moe(int T, int layer, bool plan_done, const void* h_bf16, const float* h_f32, bool rows_q = false);
    // y[m, w.n] = x[m, w.k] · Wᵀ with FP8 weights: the weight-only GEMV up to kGemvMaxTokens rows
    // (x fp32 or bf16), else x (bf16) quantized per 1×128 into (xq, xs) and the cuBLASLt W8A8
    // GEMM, which writes fp8_gemm_m_pad(m) rows of y.
    // weights_fixed = false (a scratch rewritten by the kernels just before): never the GEMV, whose
    // PDL launch loads weights before waiting for the previous kernel.
    // y_bf16: y holds bf16 (the cuBLASLt path only: never with m ≤ kGemvMaxTokens).
    void linear_f8(const void* x, bool x_bf16, const kc::Fp8Weight& w, float* y, int m, uint8_t* xq, float* xs,
                   bool weights_fixed = true, bool y_bf16 = false);
    // The GEMM of linear_f8 on rows already quantized (xq [m_pad, k_pad], xs [k_pad/128, m_pad]).
    void gemm_f8(const uint8_t* xq, const float* xs, const kc::Fp8Weight& w, float* y, int m, bool y_bf16);
    void set_device() const {
        if (opt.device >= 0) CUDA_CHECK(cudaSetDevice(opt.device));
    }
    // The step inputs' offsets in step_arena for T tokens, S sequences and block tables of `stride`
    // entries (with the sampling parameters when `sampled`), each segment 16-byte aligned, in this
    // order: ids, positions, slots_full, slots_sliding, logit_rows (T each), seq_start (S),
    // query_start (S + 1), tables_full, tables_sliding (S · stride), then temperature, top_p,
    // top_k (S), seed, draw (S, 8 bytes). With `offsets`, stores them (14 entries); returns the bytes.
    static size_t step_layout(int T, int S, int stride, bool sampled, size_t* offsets) {
        const size_t sizes[14] = {4u * T,
                                  4u * T,
                                  4u * T,
                                  4u * T,
                                  4u * T,
                                  4u * S,
                                  4u * (S + 1),
                                  4u * static_cast<size_t>(S) * stride,
                                  4u * static_cast<size_t>(S) * stride,
                                  sampled ? 4u * S : 0u,
                                  sampled ? 4u * S : 0u,
                                  sampled ? 4u * S : 0u,
                                  sampled ? 8u * S : 0u,
                                  sampled ? 8u * S : 0u};
        size_t off = 0;
        for (int i = 0; i < 14; ++i) {
            if (offsets) offsets[i] = off;
            off += (sizes[i] + 15) & ~size_t{15};
        }
        return off;
    }
    ArenaView s_temp, s_top_p, s_top_k, s_seed, s_draw;
    DeviceBuffer s_out, s_work;
    // sample_again: the sequences of the last forward_sample whose logits rows are still in `logits` (0: none), and
    // its inputs (one upload: rows, temperature, top_p, top_k, seed, draw, then the mask words) and ids.
    int again_rows = 0;
    DeviceBuffer again_in, again_out;
    DeviceBuffer again_edits;  // sample_again's LogitEdits: grows to the largest set of edits a call has brought
    // sample_again's upload for n rows of `words` mask words: the mask words start at again_bits_offset(n).
    static size_t again_bits_offset(int n) { return ((20u * n + 7) & ~size_t{7}) + 16u * n; }
    static size_t again_bytes(int n, int words) { return again_bits_offset(n) + 4u * n * words; }
    Status sample_again(std::span<const int> rows, std::span<const CudaModel::SampleParams> params,
                        std::span<const uint32_t> bits, std::span<const CudaModel::LogitEdits> edits,
                        std::vector<int32_t>* ids);

    // GPTOSS_PROFILE=1: time each stage with CUDA events (device time only; launch gaps excluded)
    // and print the accumulated table at exit. A debugging aid, off by default.
    bool profile = std::getenv("GPTOSS_PROFILE") != nullptr;
    bool use_graphs = std::getenv("GPTOSS_NO_GRAPHS") == nullptr;
    // GPTOSS_SPLIT_SAMPLING=0: sampled rows drawn by one CTA each (the kernel before session 49's split draw).
    bool split_sampling = [] {
        const char* v = std::getenv("GPTOSS_SPLIT_SAMPLING");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The FP8 tensor-core GEMVs (every gemv_fp8 but kRowPerWarp) round x to bf16 (RN) before their
    // MMAs, and the norms write those RN bf16 rows (h) beside the fp32 ones: the decode QKV and
    // lm_head GEMVs read h, the same bits with half of x's bytes and no conversion (r42).
    // GPTOSS_GEMV_X_F32=1: the fp32 rows, as before r42 (an A/B switch).
    bool gemv_x_f32 = [] {
        const char* v = std::getenv("GPTOSS_GEMV_X_F32");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    bool gemv_x_bf16() const { return fp8 && !gemv_x_f32 && gemv_fp8 != kc::GemvFp8Kernel::kRowPerWarp; }
    // Decode-path switches for A/B runs (bench/NOTES.md r11): GPTOSS_DECODE_FUSED=0 goes back to
    // the three router launches (logits, top-k, plan); GPTOSS_GEMV_V1=1 to the r2 GEMV kernel.
    bool decode_fused = [] {
        const char* v = std::getenv("GPTOSS_DECODE_FUSED");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The post-attention residual update + RMSNorm inside the fused decode router (one launch less
    // a layer; the residual then alternates between x and x_alt), for batches of up to
    // fused_norm_max_tokens. r29 (20b --fp8, 1k context, same run): batch 1 1.872 -> 1.814 ms a
    // step, 2 2.527 -> 2.485, but 4 3.584 -> 3.607 and 8 5.508 -> 5.621 (the router's one CTA a
    // token does the norm's work serially). GPTOSS_DECODE_FUSED_NORM=0 never, =1 up to 8 tokens.
    int fused_norm_max_tokens = [] {
        const char* v = std::getenv("GPTOSS_DECODE_FUSED_NORM");
        if (v != nullptr && std::strcmp(v, "0") == 0) return 0;
        if (v != nullptr && std::strcmp(v, "1") == 0) return kc::kGemvMaxTokens;
        return 2;
    }();
    // GPTOSS_GEMV_FP8=row|mma|mma1: the FP8 decode GEMVs (QKV, O, lm_head) by one warp per row or on
    // the tensor cores (gemv.h); mma1: only the one-wave tensor-core variant (the default where k ≤
    // 3,072). (r29 measured and removed a W8A8 form, a8: e4m3 mma.sync is emulated on sm_90; 20b
    // batch 1 +3.7%, batch 8 +19%; and the GEMV's x staged in shared memory: no gain at batch 1.)
    kc::GemvFp8Kernel gemv_fp8 = [] {
        const char* v = std::getenv("GPTOSS_GEMV_FP8");
        if (v != nullptr && std::strcmp(v, "row") == 0) return kc::GemvFp8Kernel::kRowPerWarp;
        if (v != nullptr && std::strcmp(v, "mma") == 0) return kc::GemvFp8Kernel::kMma;
        if (v != nullptr && std::strcmp(v, "mma1") == 0) return kc::GemvFp8Kernel::kMmaOneWave;
        return kc::GemvFp8Kernel::kAuto;
    }();
    // r11 measured the v2 GEMV slower in the model (3.44 vs 3.15 ms per batch-1 step): v1 is the
    // default, GPTOSS_GEMV_V1=0 selects v2.
    // GPTOSS_QKV_FUSED=0: the decode QKV GEMV and the bias + RoPE + KV write as two kernels.
    bool qkv_fused = [] {
        const char* v = std::getenv("GPTOSS_QKV_FUSED");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // CudaModelOptions::qkv_attn_tail (set at load): 0 off, 1 sliding layers, 2 every layer.
    int qkv_attn_tail = 0;
    DeviceBuffer attn_tail_counters;  // [num_kv_heads] u32 tickets of the QKV kernel's attention tail (zero)
    bool gemv_v1 = [] {
        const char* v = std::getenv("GPTOSS_GEMV_V1");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // Decode step graphs by (batch, table stride, MoE rows: differs from the batch only under DP).
    // At most kMaxGraphs kept; the least recently replayed one goes first (a long-running server sees
    // many (batch, stride) pairs).
    struct CachedGraph {
        cudaGraphExec_t exec = nullptr;
        uint64_t last_use = 0;
    };
    std::map<std::tuple<int, int, int, bool, bool>, CachedGraph> graphs;
    uint64_t graph_clock = 0;
    static constexpr size_t kMaxGraphs = 64;
    std::set<std::tuple<int, int, int, bool, bool>> warmed;
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    std::map<std::string, double> stage_ms;
    int profiled_calls = 0;
    void mark(const char* name) {
        if (!profile) return;
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        CUDA_CHECK(cudaEventRecord(e, stream));
        marks.emplace_back(name, e);
    }
    void collect() {
        if (!profile || marks.empty()) return;
        CUDA_CHECK(cudaStreamSynchronize(stream));
        for (size_t i = 1; i < marks.size(); ++i) {
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
            stage_ms[marks[i].first] += ms;
        }
        for (auto& m : marks) cudaEventDestroy(m.second);
        marks.clear();
        ++profiled_calls;
    }
    ~Impl() {
        for (auto& [k, g] : graphs) cudaGraphExecDestroy(g.exec);
        if (step_uploaded) cudaEventDestroy(step_uploaded);
        if (span_begin) cudaEventDestroy(span_begin);
        for (cudaEvent_t e : timing_ev)
            if (e) cudaEventDestroy(e);
        if (span_end) cudaEventDestroy(span_end);
        if (step_host) cudaFreeHost(step_host);
        if (logits_host) cudaFreeHost(logits_host);
        if (kv_staging_host) cudaFreeHost(kv_staging_host);
        if (!profile || profiled_calls == 0) return;
        double total = 0;
        for (auto& [k, v] : stage_ms) total += v;
        std::fprintf(stderr, "GPTOSS_PROFILE: %d forward calls, device ms per call by stage:\n", profiled_calls);
        for (auto& [k, v] : stage_ms)
            std::fprintf(stderr, "  %-14s %9.3f ms  %5.1f%%\n", k.c_str(), v / profiled_calls, 100.0 * v / total);
        std::fprintf(stderr, "  %-14s %9.3f ms\n", "total", total / profiled_calls);
    }
};

Status CudaModel::Impl::init(const GptOssWeights& w) {
    c = w.config;
    sh = w.shard;
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0)
        return failed_precondition("no CUDA device is available");
    if (opt.device >= device_count)
        return failed_precondition("CUDA device " + std::to_string(opt.device) + " is not visible");
    set_device();
    if (c.head_dim != 64) return invalid_argument("the CUDA backend supports head_dim 64 only");
    // (The CPU backend takes unquantized experts of any width; the CUDA kernels are written for 32-wide groups.)
    if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0)
        return invalid_argument("the CUDA backend needs hidden_size (" + std::to_string(c.hidden_size) +
                                ") and intermediate_size (" + std::to_string(c.intermediate_size) +
                                ") to be multiples of 32");
    // FP8 experts are dequantized to a bf16 copy at load and take the bf16 GEMM path at every batch
    // size (no weight-only FP8 decode kernel yet): correct, not yet fast, and too large for 120b.
    if (opt.comms) {
        tp = opt.comms->tp->size();
        dp = opt.comms->dp->size();
        world_reduce = opt.comms->world->size() > 1;
        ep = c.num_experts / sh.num_experts;
    } else if (sh.num_q_heads != c.num_attention_heads || sh.num_experts != c.num_experts ||
               sh.inter_size != c.intermediate_size || sh.vocab_size != c.vocab_size) {
        return invalid_argument("a weight shard needs its rank's communicators (CudaModelOptions::comms)");
    }
    if (sh.inter_size <= 0)
        return invalid_argument("this layout leaves a rank without expert intermediate units on the CUDA backend");
    nq = sh.num_q_heads;
    nkv = sh.num_kv_heads;
    vocab_chunk = (c.vocab_size + tp - 1) / tp;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    gemm = std::make_unique<kc::GemmRunner>();
    // Experts, intermediate units and lm_head rows are this rank's; the router sees every expert.
    const int64_t H = c.hidden_size, I = sh.inter_size, E = sh.num_experts, V = c.vocab_size, Er = c.num_experts;
    const int64_t qw = static_cast<int64_t>(nq) * c.head_dim, kvw = static_cast<int64_t>(nkv) * c.head_dim;
    const int64_t qkvw = qw + 2 * kvw;

    embed = upload_bf16(w.embed_tokens.data, w.embed_tokens.dtype, V * H);
    lm_head = DeviceBuffer(static_cast<size_t>(vocab_chunk) * H * 2);  // rows past the vocabulary stay zero
    CUDA_CHECK(cudaMemset(lm_head.get(), 0, lm_head.bytes()));
    {
        DeviceBuffer rows = upload_bf16(w.lm_head.data, w.lm_head.dtype, static_cast<int64_t>(sh.vocab_size) * H);
        CUDA_CHECK(cudaMemcpy(lm_head.get(), rows.get(), rows.bytes(), cudaMemcpyDeviceToDevice));
    }
    final_norm = upload_f32(w.norm);
    {
        const CpuForward cpu(w);  // one definition of the YaRN frequencies for both backends
        inv_freq = upload_f32(cpu.inv_freq());
        attention_scaling = cpu.attention_scaling();
    }
    mxfp4 = w.layers[0].expert_format == kernels::ExpertFormat::kMxfp4;
    have_bf16_experts = !mxfp4 || opt.bf16_experts;
    if (mxfp4 && have_bf16_experts) {
        // A bf16 copy of the experts (~3.8× their MXFP4 bytes) must leave room: gpt-oss-120b's
        // (228 GB) never fits, so large batches then dequantize one expert at a time instead.
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const double bf16_bytes = static_cast<double>(c.num_hidden_layers) * E * 3 * I * H * 2;
        if (bf16_bytes > 0.6 * static_cast<double>(free_b)) have_bf16_experts = false;
    }
    fp8 = opt.fp8;
    const int64_t kp_h = kc::fp8_gemm_k_pad(static_cast<int>(H)), kp_i = kc::fp8_gemm_k_pad(static_cast<int>(I));
    if (fp8) {
        fp8_gemm = std::make_unique<kc::Fp8GemmRunner>();
        if (mxfp4) {
            // The FP8 copy (lossless from MXFP4, ~2× its bytes with K padded to 3072) replaces
            // the bf16 copy; gpt-oss-120b's (122 GB) does not fit beside the MXFP4 weights, so
            // large batches there convert one expert at a time.
            have_bf16_experts = false;
            size_t free_b = 0, total_b = 0;
            CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            const double f8_bytes = static_cast<double>(c.num_hidden_layers) * E * (2 * I * kp_h + H * kp_i);
            // GPTOSS_FP8_EXPERT_COPY=0: no copy even where it fits (A/B runs of 20b on the MXFP4 paths
            // that 120b takes; as CudaModelOptions::bf16_experts = false).
            const char* fc = std::getenv("GPTOSS_FP8_EXPERT_COPY");
            have_fp8_experts = opt.bf16_experts && f8_bytes <= 0.6 * static_cast<double>(free_b) &&
                               (fc == nullptr || std::strcmp(fc, "0") != 0);
            const char* g = std::getenv("GPTOSS_MOE_FP8_GROUPED");
            const bool grouped_ok = kc::moe_fp8_supported(static_cast<int>(2 * I), static_cast<int>(H),
                                                          static_cast<int>(kp_h), static_cast<int>(E)) &&
                                    kc::moe_fp8_supported(static_cast<int>(H), static_cast<int>(I),
                                                          static_cast<int>(kp_i), static_cast<int>(E));
            if (opt.fp8_experts) {  // the FP8 copy only: the MXFP4 bytes are dropped layer by layer
                if (!grouped_ok)
                    return invalid_argument("--fp8-experts needs the grouped FP8 kernels (sm_90a, expert widths " +
                                            std::to_string(2 * I) + " x " + std::to_string(H) + " and " +
                                            std::to_string(H) + " x " + std::to_string(I) + " unsupported)");
                // + one layer's MXFP4 bytes while it converts, and room for the rest of the model
                const double layer_mx = static_cast<double>(E) * 3 * I * H * 4.25 / 8;
                if (f8_bytes + layer_mx > 0.85 * static_cast<double>(free_b))
                    return resource_exhausted("not enough device memory for the FP8 experts (" +
                                              std::to_string(static_cast<int64_t>(f8_bytes) >> 20) + " MiB, " +
                                              std::to_string(free_b >> 20) + " MiB free)");
                have_fp8_experts = true;
                fp8_only = true;
            }
            fp8_grouped = have_fp8_experts && grouped_ok &&
                          (fp8_only || (opt.moe_fp8_grouped != 0 && (g == nullptr || std::strcmp(g, "0") != 0)));
        }
    }
    // The decode-layout copy of the MXFP4 experts (CudaModelOptions::moe_decode_packed), where it fits.
    const int64_t gu_rows = E * 2 * I, dn_rows = E * H;
    const int gu_groups = static_cast<int>(H / 32), dn_groups = static_cast<int>(I / 32);
    if (mxfp4 && !fp8_only && gu_rows % 16 == 0 && dn_rows % 16 == 0 && H % 32 == 0 && I % 32 == 0) {
        int want = opt.moe_decode_packed;
        if (want < 0) {
            const char* v = std::getenv("GPTOSS_MOE_PACKED");
            want = v == nullptr ? -1 : std::strcmp(v, "1") == 0 ? 1 : 0;
        }
        if (want != 0) {
            size_t free_b = 0, total_b = 0;
            CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            const double layer_mx = static_cast<double>(E) * 3 * I * H * 4.25 / 8;  // still to upload, a layer
            const double packed = static_cast<double>(kc::moe_packed_decode_bytes(gu_rows, gu_groups, false) +
                                                      kc::moe_packed_decode_bytes(gu_rows, gu_groups, true) +
                                                      kc::moe_packed_decode_bytes(dn_rows, dn_groups, false) +
                                                      kc::moe_packed_decode_bytes(dn_rows, dn_groups, true));
            // + the FP8 copy made beside it (20b --fp8) and 8 GiB for the rest
            const double f8 = have_fp8_experts ? static_cast<double>(E) * (2 * I * kp_h + H * kp_i) : 0.0;
            const double need = c.num_hidden_layers * (packed + layer_mx + f8) + 8.0 * (1 << 30);
            decode_packed = moe_decode_packed_choice(want, c.num_hidden_layers * packed, need,
                                                     static_cast<double>(free_b), static_cast<double>(total_b));
            if (decode_packed)
                LOG_INFO("moe_decode_packed: a decode-layout copy of the experts (%lld MiB) for batches of 1-8 tokens",
                         static_cast<long long>(c.num_hidden_layers * packed) >> 20);
            else if (want == 1)
                LOG_WARN(
                    "moe_decode_packed: the decode-layout copy of the experts (%lld MiB) does not fit beside "
                    "the model (%zu MiB free); decode reads the published layout",
                    static_cast<long long>(c.num_hidden_layers * packed) >> 20, free_b >> 20);
        }
    }
    // Staging for the load-time conversions: one expert's gate_up (the largest matrix) in bf16.
    DeviceBuffer expert_tmp;
    if (have_fp8_experts) expert_tmp = DeviceBuffer(static_cast<size_t>(std::max(2 * I * H, H * I)) * 2);
    layers.resize(c.num_hidden_layers);
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const LayerWeights& L = w.layers[l];
        DeviceLayer& D = layers[l];
        D.input_norm = upload_f32(L.input_layernorm);
        D.post_norm = upload_f32(L.post_attention_layernorm);
        {
            // Concatenate q, k, v rows into one [qkvw, H] bf16 matrix: one GEMM instead of three.
            D.qkv_w = DeviceBuffer(static_cast<size_t>(qkvw * H) * 2);
            DeviceBuffer parts[3] = {upload_bf16(L.q_proj.data, L.q_proj.dtype, qw * H),
                                     upload_bf16(L.k_proj.data, L.k_proj.dtype, kvw * H),
                                     upload_bf16(L.v_proj.data, L.v_proj.dtype, kvw * H)};
            size_t off = 0;
            for (auto& p : parts) {
                CUDA_CHECK(cudaMemcpy(D.qkv_w.as<uint8_t>() + off, p.get(), p.bytes(), cudaMemcpyDeviceToDevice));
                off += p.bytes();
            }
            std::vector<float> b;
            b.insert(b.end(), L.q_bias.begin(), L.q_bias.end());
            b.insert(b.end(), L.k_bias.begin(), L.k_bias.end());
            b.insert(b.end(), L.v_bias.begin(), L.v_bias.end());
            D.qkv_b = upload_f32(b);
        }
        D.o_w = upload_bf16(L.o_proj.data, L.o_proj.dtype, H * qw);
        // The uploads are cudaMemcpy calls (legacy stream, pageable memory: they may return before
        // the DMA lands); the conversions below run on `stream`: wait for the copies first.
        CUDA_CHECK(cudaDeviceSynchronize());
        if (fp8) {  // quantize on the device, then drop the bf16 weights
            D.qkv_f8 = kc::Fp8Weight::from_bf16(D.qkv_w.get(), static_cast<int>(qkvw), static_cast<int>(H), stream);
            D.o_f8 = kc::Fp8Weight::from_bf16(D.o_w.get(), static_cast<int>(H), static_cast<int>(qw), stream);
            CUDA_CHECK(cudaStreamSynchronize(stream));
            D.qkv_w = DeviceBuffer();
            D.o_w = DeviceBuffer();
        }
        D.o_b = upload_f32(L.o_bias);
        D.sinks = upload_f32(L.sinks);
        D.router_w = upload_bf16(L.router.data, L.router.dtype, Er * H);
        D.router_b = upload_f32(L.router_bias);
        D.gu_b = upload_f32(L.gate_up_bias);
        // A MoE-TP rank other than 0 adds no down bias (zeros keep every kernel's contract).
        D.down_b = upload_f32(L.down_bias.empty() ? std::vector<float>(static_cast<size_t>(E * H), 0.0f) : L.down_bias);
        if (mxfp4) {
            D.gu_blocks = DeviceBuffer::from_host(L.gate_up_blocks, static_cast<size_t>(E * 2 * I * H / 2));
            D.gu_scales = DeviceBuffer::from_host(L.gate_up_scales, static_cast<size_t>(E * 2 * I * H / 32));
            D.down_blocks = DeviceBuffer::from_host(L.down_blocks, static_cast<size_t>(E * H * I / 2));
            D.down_scales = DeviceBuffer::from_host(L.down_scales, static_cast<size_t>(E * H * I / 32));
            CUDA_CHECK(cudaDeviceSynchronize());  // as above: the copies land before `stream` reads them
            if (decode_packed) {
                D.gu_packed = DeviceBuffer(kc::moe_packed_decode_bytes(gu_rows, gu_groups, false));
                D.gu_packed_s = DeviceBuffer(kc::moe_packed_decode_bytes(gu_rows, gu_groups, true));
                D.down_packed = DeviceBuffer(kc::moe_packed_decode_bytes(dn_rows, dn_groups, false));
                D.down_packed_s = DeviceBuffer(kc::moe_packed_decode_bytes(dn_rows, dn_groups, true));
                kc::moe_pack_decode(D.gu_blocks.as<uint8_t>(), D.gu_scales.as<uint8_t>(), gu_rows, gu_groups,
                                    D.gu_packed.as<uint8_t>(), D.gu_packed_s.as<uint8_t>(), stream);
                kc::moe_pack_decode(D.down_blocks.as<uint8_t>(), D.down_scales.as<uint8_t>(), dn_rows, dn_groups,
                                    D.down_packed.as<uint8_t>(), D.down_packed_s.as<uint8_t>(), stream);
            }
            if (have_bf16_experts) {
                D.gu_bf16 = DeviceBuffer(static_cast<size_t>(E * 2 * I * H) * 2);
                D.down_bf16 = DeviceBuffer(static_cast<size_t>(E * H * I) * 2);
                kc::mxfp4_to_bf16(D.gu_blocks.as<uint8_t>(), D.gu_scales.as<uint8_t>(), E * 2 * I, H, D.gu_bf16.get(),
                                  stream);
                kc::mxfp4_to_bf16(D.down_blocks.as<uint8_t>(), D.down_scales.as<uint8_t>(), E * H, I, D.down_bf16.get(),
                                  stream);
            }
            if (fp8_grouped) {  // the same conversion into one array per projection
                const auto nb = [](int64_t n) { return (n + 127) / 128; };
                D.gu_f8q = DeviceBuffer(static_cast<size_t>(E * 2 * I * kp_h));
                D.gu_f8s = DeviceBuffer(static_cast<size_t>(E * nb(2 * I) * (kp_h / 128)) * 4);
                D.down_f8q = DeviceBuffer(static_cast<size_t>(E * H * kp_i));
                D.down_f8s = DeviceBuffer(static_cast<size_t>(E * nb(H) * (kp_i / 128)) * 4);
                for (int64_t e = 0; e < E; ++e) {
                    kc::mxfp4_to_bf16(D.gu_blocks.as<uint8_t>() + e * 2 * I * H / 2,
                                      D.gu_scales.as<uint8_t>() + e * 2 * I * H / 32, 2 * I, H, expert_tmp.get(),
                                      stream);
                    kc::quantize_weight_fp8_bf16(expert_tmp.get(), static_cast<int>(2 * I), static_cast<int>(H),
                                                 static_cast<int>(kp_h), D.gu_f8q.as<uint8_t>() + e * 2 * I * kp_h,
                                                 D.gu_f8s.as<float>() + e * nb(2 * I) * (kp_h / 128), stream);
                    kc::mxfp4_to_bf16(D.down_blocks.as<uint8_t>() + e * H * I / 2,
                                      D.down_scales.as<uint8_t>() + e * H * I / 32, H, I, expert_tmp.get(), stream);
                    kc::quantize_weight_fp8_bf16(expert_tmp.get(), static_cast<int>(H), static_cast<int>(I),
                                                 static_cast<int>(kp_i), D.down_f8q.as<uint8_t>() + e * H * kp_i,
                                                 D.down_f8s.as<float>() + e * nb(H) * (kp_i / 128), stream);
                }
                if (fp8_only) {  // the copy replaces the MXFP4 bytes (the next layer's upload reuses them)
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                    D.gu_blocks = DeviceBuffer();
                    D.gu_scales = DeviceBuffer();
                    D.down_blocks = DeviceBuffer();
                    D.down_scales = DeviceBuffer();
                }
            } else if (have_fp8_experts) {  // MXFP4 -> bf16 (exact) -> FP8 128×128 (exact: model/fp8_convert.h)
                for (int64_t e = 0; e < E; ++e) {
                    kc::mxfp4_to_bf16(D.gu_blocks.as<uint8_t>() + e * 2 * I * H / 2,
                                      D.gu_scales.as<uint8_t>() + e * 2 * I * H / 32, 2 * I, H, expert_tmp.get(),
                                      stream);
                    D.gu_f8.push_back(kc::Fp8Weight::from_bf16(expert_tmp.get(), static_cast<int>(2 * I),
                                                               static_cast<int>(H), stream));
                    kc::mxfp4_to_bf16(D.down_blocks.as<uint8_t>() + e * H * I / 2,
                                      D.down_scales.as<uint8_t>() + e * H * I / 32, H, I, expert_tmp.get(), stream);
                    D.down_f8.push_back(
                        kc::Fp8Weight::from_bf16(expert_tmp.get(), static_cast<int>(H), static_cast<int>(I), stream));
                }
            }
        } else if (L.expert_format == kernels::ExpertFormat::kFp8Block) {
            const auto blocks = [](int64_t n) { return (n + 127) / 128; };
            DeviceBuffer q = DeviceBuffer::from_host(L.gate_up_fp8, static_cast<size_t>(E * 2 * I * H));
            DeviceBuffer sc =
                DeviceBuffer::from_host(L.gate_up_fp8_scale, static_cast<size_t>(E * blocks(2 * I) * blocks(H)) * 4);
            D.gu_bf16 = DeviceBuffer(static_cast<size_t>(E * 2 * I * H) * 2);
            kc::fp8_block_to_bf16(q.as<uint8_t>(), sc.as<float>(), E, static_cast<int>(2 * I), static_cast<int>(H),
                                  D.gu_bf16.get(), stream);
            DeviceBuffer qd = DeviceBuffer::from_host(L.down_fp8, static_cast<size_t>(E * H * I));
            DeviceBuffer sd =
                DeviceBuffer::from_host(L.down_fp8_scale, static_cast<size_t>(E * blocks(H) * blocks(I)) * 4);
            D.down_bf16 = DeviceBuffer(static_cast<size_t>(E * H * I) * 2);
            kc::fp8_block_to_bf16(qd.as<uint8_t>(), sd.as<float>(), E, static_cast<int>(H), static_cast<int>(I),
                                  D.down_bf16.get(), stream);
            CUDA_CHECK(cudaStreamSynchronize(stream));  // before the temporaries are freed
        } else {
            D.gu_bf16 = upload_bf16(L.gate_up_dense, L.dense_dtype, E * 2 * I * H);
            D.down_bf16 = upload_bf16(L.down_dense, L.dense_dtype, E * H * I);
        }
        for (DeviceBuffer* b : {&D.input_norm, &D.post_norm, &D.qkv_w,       &D.qkv_b,       &D.o_w,
                                &D.o_b,        &D.sinks,     &D.router_w,    &D.router_b,    &D.gu_b,
                                &D.down_b,     &D.gu_blocks, &D.gu_scales,   &D.down_blocks, &D.down_scales,
                                &D.gu_bf16,    &D.down_bf16, &D.gu_f8q,      &D.gu_f8s,      &D.down_f8q,
                                &D.down_f8s,   &D.gu_packed, &D.gu_packed_s, &D.down_packed, &D.down_packed_s})
            weight_bytes += b->bytes();
        for (const kc::Fp8Weight* f : {&D.qkv_f8, &D.o_f8}) weight_bytes += f->q.bytes() + f->scales.bytes();
        for (const auto* v : {&D.gu_f8, &D.down_f8})
            for (const kc::Fp8Weight& f : *v) weight_bytes += f.q.bytes() + f.scales.bytes();
    }
    if (fp8) {
        CUDA_CHECK(cudaDeviceSynchronize());  // lm_head was filled on the legacy stream
        lm_head_f8 = kc::Fp8Weight::from_bf16(lm_head.get(), vocab_chunk, static_cast<int>(H), stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        lm_head = DeviceBuffer();
        weight_bytes += lm_head_f8.q.bytes() + lm_head_f8.scales.bytes();
    }
    weight_bytes += embed.bytes() + lm_head.bytes();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    expert_tmp = DeviceBuffer();
    if (fp8_only) mxfp4 = false;  // no MXFP4 bytes left: every MoE batch through the FP8 copy

    // Activations.
    const int64_t T = opt.max_tokens, S = opt.max_seqs, K = c.experts_per_token;
    const int64_t Tm = T * dp, A = Tm * K;  // MoE rows: every DP group's tokens
    x = DeviceBuffer(T * H * 4);
    x_alt = DeviceBuffer(static_cast<int64_t>(std::min<int64_t>(T, kc::kGemvMaxTokens)) * H * 4);
    h = DeviceBuffer(T * H * 2);
    h32 = DeviceBuffer(T * H * 4);
    norm_inv = DeviceBuffer(T * 4);
    rope_cs = DeviceBuffer(T * c.head_dim * 4);  // head_dim / 2 pairs of floats a token
    // + kFp8GemmMAlign rows: a W8A8 GEMM writes its M rounded up to a multiple of 4.
    const int64_t mpad = kc::kFp8GemmMAlign;
    qkv = DeviceBuffer((T + mpad) * qkvw * 4);
    q = DeviceBuffer(T * qw * 2);
    attn = DeviceBuffer(T * qw * 2);
    o = DeviceBuffer((T + mpad) * H * 4);
    expert_ids = DeviceBuffer(A * 4);
    expert_w = DeviceBuffer(A * 4);
    offsets = DeviceBuffer((E + 2) * 4);  // + the EP bucket of other ranks' experts
    sorted = DeviceBuffer(A * 4);
    // Without a bf16 copy the large-batch path dequantizes every active expert (~113 MB of traffic
    // each) per layer: the weight-only kernels stay cheaper up to ~128 tokens (r15/r16).
    mxfp4_tokens = have_bf16_experts || have_fp8_experts ? opt.mxfp4_max_tokens : std::max(opt.mxfp4_max_tokens, 128);
    mma_ok = mxfp4 && kc::moe_mma_supported(static_cast<int>(2 * I), static_cast<int>(H), static_cast<int>(E)) &&
             kc::moe_mma_supported(static_cast<int>(H), static_cast<int>(I), static_cast<int>(E));
    // With a bf16 or FP8 expert copy, cuBLAS(Lt) per expert is faster from ~512 rows (H200 r17:
    // 1,024-token prefill 28.9 ms through cuBLAS, 47.5 ms through moe_mma); without one the
    // per-expert path dequantizes every active expert per layer: moe_mma wins up to a few thousand
    // rows (120b: 1k prefill 127 vs 309 ms; 8k 582 vs 538 ms).
    mma_tokens = opt.moe_mma_max_tokens >= 0             ? opt.moe_mma_max_tokens
                 : have_bf16_experts || have_fp8_experts ? 256
                                                         : 2048;
    if (const char* v = std::getenv("GPTOSS_MOE_MMA_MAX_TOKENS")) mma_tokens = std::max(0, std::atoi(v));
    // With the grouped kernels the weight-only ones keep only the smallest batches (20b, step ms,
    // weight-only vs grouped, r16's kernels: 1 token 2.89 vs 4.31, 2: 4.06 vs 5.75, 4: 7.31 vs 7.69,
    // 8: 12.6 vs 11.3, 16: 21.1 vs 11.6; r42's moe_decode_mma: see kMxfp4MmaCrossover).
    if (mma_ok && mma_tokens > 0) mxfp4_tokens = std::min(opt.mxfp4_max_tokens, kMxfp4MmaCrossover);
    if (const char* v = std::getenv("GPTOSS_MXFP4_MAX_TOKENS")) mxfp4_tokens = std::max(0, std::atoi(v));
    experts_per_token = c.experts_per_token;
    num_experts = static_cast<int>(Er);  // rows per expert on average: assignments / all experts (EP too)
    wgmma_ok = mxfp4 && kc::moe_wgmma_supported(static_cast<int>(2 * I), static_cast<int>(H), static_cast<int>(E)) &&
               kc::moe_wgmma_supported(static_cast<int>(H), static_cast<int>(I), static_cast<int>(E));
    int want_wgmma = opt.moe_wgmma;
    if (const char* v = std::getenv("GPTOSS_MOE_WGMMA")) want_wgmma = std::atoi(v) != 0 ? 1 : 0;
    wgmma_ok = wgmma_ok && (want_wgmma == 1 || (want_wgmma < 0 && !have_bf16_experts && !have_fp8_experts));
    if (const char* v = std::getenv("GPTOSS_MOE_WGMMA_WS")) wgmma_ws = std::atoi(v) != 0 ? 1 : 0;
    if (const char* v = std::getenv("GPTOSS_MOE_W4A8")) w4a8 = wgmma_ok && std::atoi(v) != 0;
    if (w4a8) {
        xq8w = DeviceBuffer(A * std::max(H, I));
        xs8w = DeviceBuffer(A * 4);
    }
    if (mma_ok || wgmma_ok || fp8_grouped || bf16_grouped) {
        mma_tiles = DeviceBuffer(static_cast<size_t>(2 * (A / kc::moe_mma_block_rows(false) + E + 2)) * 4);
        mma_count = DeviceBuffer(4);
    }
    if (fp8_grouped && ep == 1 &&
        kc::moe_decode_fp8_shapes_ok(static_cast<int>(H), static_cast<int>(I), static_cast<int>(E))) {
        fp8_decode_tokens = opt.moe_decode_fp8_tokens >= 0 ? opt.moe_decode_fp8_tokens : fp8_only ? 1 : 0;
        if (const char* v = std::getenv("GPTOSS_MOE_DECODE_FP8_MAX_TOKENS")) fp8_decode_tokens = std::atoi(v);
        fp8_decode_tokens = std::clamp(fp8_decode_tokens, 0, kc::kMoeDecodeMmaMaxTokens);
    }
    act = DeviceBuffer(static_cast<int64_t>(std::max(mxfp4_tokens, fp8_decode_tokens)) * K * I * 4);
    y = DeviceBuffer(A * H * 4);
    if (mxfp4 && !have_bf16_experts && !have_fp8_experts) {  // one expert's weights at a time (large batches)
        gu_scratch = DeviceBuffer(2 * I * H * 2);
        down_scratch = DeviceBuffer(H * I * 2);
        if (fp8) {
            auto scratch = [&](int n, int k) {
                kc::Fp8Weight f;
                f.n = n;
                f.k = k;
                f.k_pad = kc::fp8_gemm_k_pad(k);
                f.q = DeviceBuffer(static_cast<size_t>(n) * f.k_pad);
                f.scales = DeviceBuffer(static_cast<size_t>((n + 127) / 128) * (f.k_pad / 128) * 4);
                return f;
            };
            gu_f8_scratch = scratch(static_cast<int>(2 * I), static_cast<int>(H));
            down_f8_scratch = scratch(static_cast<int>(H), static_cast<int>(I));
        }
    }
    mx_grouped =
        [&] {
            if (opt.moe_mx >= 0) return opt.moe_mx == 1;
            const char* v = std::getenv("GPTOSS_MOE_MX");
            return v == nullptr || std::strcmp(v, "0") != 0;
        }() &&
        fp8 && mxfp4 && !have_fp8_experts && ep == 1 &&
        kc::moe_mxfp4_fp8_supported(static_cast<int>(2 * I), static_cast<int>(H), static_cast<int>(E)) &&
        kc::moe_mxfp4_fp8_supported(static_cast<int>(H), static_cast<int>(I), static_cast<int>(E)) &&
        kc::moe_fp8_act_scale(static_cast<float>(c.swiglu_limit)) > 0.0f;
    if (fp8 && opt.moe_decode_wg >= 0) decode_kernel = opt.moe_decode_wg == 1 ? 4 : 1;
    if (mx_grouped) {
        // No conversion to pay for: worth it from 512 tokens (120b prefill, r28: 512 tokens 48.3 ->
        // 42.2 ms, 1,024 78.0 -> 47.3; but 256 33.7 -> 37.0, and decode batches 32-128 slower).
        fp8_jit_tokens = 512;
        if (opt.moe_fp8_jit_min_tokens >= 0) fp8_jit_tokens = opt.moe_fp8_jit_min_tokens;
        if (const char* t = std::getenv("GPTOSS_MOE_FP8_JIT_MIN_TOKENS")) fp8_jit_tokens = std::max(0, std::atoi(t));
        mx_grouped = fp8_jit_tokens > 0 && Tm >= fp8_jit_tokens;
    }
    if (!mx_grouped && fp8 && mxfp4 && !have_fp8_experts && ep == 1 &&
        kc::moe_fp8_supported(static_cast<int>(2 * I), static_cast<int>(H), static_cast<int>(kp_h),
                              static_cast<int>(E)) &&
        kc::moe_fp8_supported(static_cast<int>(H), static_cast<int>(I), static_cast<int>(kp_i), static_cast<int>(E))) {
        const char* v = std::getenv("GPTOSS_MOE_FP8_JIT");
        if (opt.moe_fp8_jit_min_tokens >= 0) fp8_jit_tokens = opt.moe_fp8_jit_min_tokens;
        if (const char* t = std::getenv("GPTOSS_MOE_FP8_JIT_MIN_TOKENS")) fp8_jit_tokens = std::max(0, std::atoi(t));
        const auto nb = [](int64_t n) { return (n + 127) / 128; };
        const int64_t bytes = E * (2 * I * kp_h + H * kp_i) + E * (nb(2 * I) * (kp_h / 128) + nb(H) * (kp_i / 128)) * 4;
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        fp8_jit = (v == nullptr || std::strcmp(v, "0") != 0) && fp8_jit_tokens > 0 && Tm >= fp8_jit_tokens &&
                  static_cast<double>(bytes) <= 0.25 * static_cast<double>(free_b);
        if (fp8_jit) {
            jit_gu_q = DeviceBuffer(static_cast<size_t>(E * 2 * I * kp_h));
            jit_gu_s = DeviceBuffer(static_cast<size_t>(E * nb(2 * I) * (kp_h / 128)) * 4);
            jit_down_q = DeviceBuffer(static_cast<size_t>(E * H * kp_i));
            jit_down_s = DeviceBuffer(static_cast<size_t>(E * nb(H) * (kp_i / 128)) * 4);
            // K blocks past the last column are never written by the conversion nor read by moe_fp8.
            for (DeviceBuffer* b : {&jit_gu_q, &jit_gu_s, &jit_down_q, &jit_down_s})
                CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
        }
    }
    if ((fp8_jit || mx_grouped) && mma_tiles.get() == nullptr) {  // the grouped kernels' tile list
        mma_tiles = DeviceBuffer(static_cast<size_t>(2 * (A / kc::moe_mma_block_rows(false) + E + 2)) * 4);
        mma_count = DeviceBuffer(4);
    }
    if (fp8) {  // activation rows for the W8A8 GEMMs: every token, or every assignment padded per expert
        const int64_t rows = std::max(T, A) + mpad * (E + 2);
        const int64_t kp = std::max({kp_h, kp_i, static_cast<int64_t>(kc::fp8_gemm_k_pad(static_cast<int>(qw)))});
        xq8 = DeviceBuffer(rows * kp);
        xs8 = DeviceBuffer(rows * (kp / 128) * 4);
        if (rowq_allowed && H % 16 == 0 && moe_reads_fp8_rows(static_cast<int>(Tm))) {
            hq_tok = DeviceBuffer(Tm * H);
            hs_tok = DeviceBuffer(Tm * 4);
        }
    }
    {
        xg = DeviceBuffer(A * H * 2);
        gu = DeviceBuffer((A + mpad) * 2 * I * 4);
        actb = DeviceBuffer(A * I * 2);
        yd = DeviceBuffer((A + mpad) * H * 4);
    }
    hsel = DeviceBuffer(static_cast<int64_t>(kLogitChunk) * H * 2);
    logits = DeviceBuffer(static_cast<int64_t>(kLogitChunk) * V * 4);
    attn_workspace = DeviceBuffer(S * c.num_attention_heads * kMaxSplits * (c.head_dim + 2) * 4);
    router_logits = DeviceBuffer(  // the decode router's logits, or router_topk's scratch
        std::max<int64_t>(kc::kGemvMaxTokens * Er,
                          kc::router_topk_scratch(static_cast<int>(Tm), static_cast<int>(Er))) *
        4);
    if (dp > 1) {
        hg = DeviceBuffer(Tm * H * 2);
        hg32 = DeviceBuffer(Tm * H * 4);
    }
    if (world_reduce) ycomb = DeviceBuffer(Tm * H * 4);
    if (tp > 1) {
        logits_local = DeviceBuffer(static_cast<int64_t>(kLogitChunk) * vocab_chunk * 4);
        logits_gather = DeviceBuffer(static_cast<int64_t>(kLogitChunk) * vocab_chunk * tp * 4);
    }
    router_counter = DeviceBuffer(4);
    CUDA_CHECK(cudaMemsetAsync(router_counter.get(), 0, 4, stream));
    attn_tail_counters = DeviceBuffer(static_cast<size_t>(std::max(nkv, 1)) * 4);
    CUDA_CHECK(cudaMemsetAsync(attn_tail_counters.get(), 0, attn_tail_counters.bytes(), stream));
    if (H % kc::kMoeTailTile == 0) {
        const int64_t tiles = H / kc::kMoeTailTile;
        tail_parts = DeviceBuffer(tiles * 4);
        tail_counters = DeviceBuffer(tiles * 4);
        CUDA_CHECK(cudaMemsetAsync(tail_counters.get(), 0, tiles * 4, stream));
    }
    tail_enabled = opt.moe_residual_tail && H % kc::kMoeTailTile == 0;
    if (opt.qkv_attn_tail >= 0) {
        qkv_attn_tail = std::min(opt.qkv_attn_tail, 2);
    } else {
        const char* v = std::getenv("GPTOSS_QKV_ATTN_TAIL");
        qkv_attn_tail = v != nullptr ? std::clamp(std::atoi(v), 0, 2) : 1;
    }
    if (const char* v = std::getenv("GPTOSS_MOE_TAIL")) tail_enabled = tail_enabled && std::strcmp(v, "0") != 0;
    s_out = DeviceBuffer(S * 4);
    again_in = DeviceBuffer(again_bytes(static_cast<int>(std::min<int64_t>(S, kLogitChunk)), (c.vocab_size + 31) / 32));
    again_out = DeviceBuffer(4u * std::min<int64_t>(S, kLogitChunk));
    s_work = DeviceBuffer(kc::sample_workspace_bytes(kLogitChunk));
    CUDA_CHECK(cudaMemsetAsync(s_work.get(), 0, kc::sample_workspace_bytes(kLogitChunk), stream));
    if (opt.defer_kv_cache) return ok_status();
    // KV cache: sliding layers need a window's worth of blocks per sequence; full layers get the rest.
    const size_t block_bytes = kv_block_bytes(opt.block_size);
    const int n_sliding_layers =
        static_cast<int>(std::count(c.layer_types.begin(), c.layer_types.end(), LayerType::kSlidingAttention));
    const int n_full_layers = c.num_hidden_layers - n_sliding_layers;
    int nsl = opt.num_blocks_sliding > 0
                  ? opt.num_blocks_sliding
                  : static_cast<int>(S * ((c.sliding_window + opt.block_size - 1) / opt.block_size + 2));
    int nfull = opt.num_blocks_full;
    if (nfull <= 0) {
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        const double budget = static_cast<double>(free_b) * opt.kv_cache_fraction -
                              static_cast<double>(nsl) * block_bytes * n_sliding_layers;
        nfull =
            static_cast<int>(std::max(0.0, budget / (static_cast<double>(block_bytes) * std::max(1, n_full_layers))));
    }
    return allocate_kv(opt.block_size, nfull, nsl);
}

size_t CudaModel::Impl::kv_block_bytes(int block_size) const {
    // K and V, one layer: bf16, or e4m3 with kv_fp8.
    return static_cast<size_t>(block_size) * nkv * c.head_dim * 2 * (opt.kv_fp8 ? 1 : 2);
}

Status CudaModel::Impl::allocate_kv(int block_size, int nfull, int nsl) {
    if (kv_bytes > 0) return failed_precondition("the KV cache is already allocated");
    if (block_size <= 0 || (block_size & (block_size - 1)) != 0)
        return invalid_argument("KV block size must be a power of two");
    opt.block_size = block_size;
    num_blocks_full = nfull;
    num_blocks_sliding = nsl;
    const int64_t S = opt.max_seqs;
    max_blocks_per_seq = (c.max_position_embeddings + block_size - 1) / block_size;
    {  // the step inputs' arena at its largest layout (step_layout), and its pinned twin
        const size_t bytes =
            step_layout(static_cast<int>(opt.max_tokens), static_cast<int>(S), max_blocks_per_seq, true, nullptr);
        step_arena = DeviceBuffer(bytes);
        if (step_host) CUDA_CHECK(cudaFreeHost(step_host));
        CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&step_host), bytes, cudaHostAllocDefault));
        if (!logits_host)
            CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&logits_host),
                                     static_cast<size_t>(kPinnedLogitRows) * c.vocab_size * 4, cudaHostAllocDefault));
        if (!step_uploaded) CUDA_CHECK(cudaEventCreateWithFlags(&step_uploaded, cudaEventDisableTiming));
    }
    const size_t block_bytes = kv_block_bytes(block_size);
    size_t need = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) need += (c.is_sliding(l) ? nsl : nfull) * block_bytes;
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (nfull <= 0 || nsl <= 0 || need > free_b)
        return resource_exhausted("not enough device memory for the KV cache (" + std::to_string(need >> 20) +
                                  " MiB asked, " + std::to_string(free_b >> 20) + " MiB free)");
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const size_t nb = c.is_sliding(l) ? nsl : nfull;
        layers[l].k_cache = DeviceBuffer(nb * block_bytes / 2);
        layers[l].v_cache = DeviceBuffer(nb * block_bytes / 2);
        kv_bytes += nb * block_bytes;
    }
    return ok_status();
}

Status CudaModel::Impl::copy_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out, const uint8_t* in) {
    if (kv_bytes == 0) return failed_precondition("the KV cache is not allocated");
    const int nb = sliding ? num_blocks_sliding : num_blocks_full;
    for (int32_t id : ids)
        if (id >= nb || (id < 0 && in == nullptr))
            return out_of_range("KV block id " + std::to_string(id) + " out of range");
    const size_t per = kv_block_bytes(opt.block_size) / 2;  // one layer's K (or V) of a block
    if (!kv_staging.get()) {
        kv_staging_blocks = static_cast<int>(std::clamp<size_t>(kKvStagingBytes / per, 1, 65536));
        const size_t bytes = static_cast<size_t>(kv_staging_blocks) * per;
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        if (free_b < bytes + (size_t{64} << 20))  // a margin for the driver and the allocator's granularity
            return resource_exhausted("no device memory left for the KV transfer's staging buffer (" +
                                      std::to_string(bytes >> 20) + " MiB, " + std::to_string(free_b >> 20) +
                                      " MiB free)");
        if (cudaHostAlloc(reinterpret_cast<void**>(&kv_staging_host), bytes, cudaHostAllocDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            kv_staging_host = nullptr;
            return resource_exhausted("no pinned host memory for the KV transfer's staging buffer (" +
                                      std::to_string(bytes >> 20) + " MiB)");
        }
        kv_staging = DeviceBuffer(bytes);
        kv_staging_ids = DeviceBuffer(static_cast<size_t>(kv_staging_blocks) * sizeof(int32_t));
    }
    int pool_layers = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) pool_layers += c.is_sliding(l) == sliding ? 1 : 0;
    const size_t stride = 2 * static_cast<size_t>(pool_layers) * per;  // a block's bytes on the host
    for (size_t first = 0; first < ids.size(); first += static_cast<size_t>(kv_staging_blocks)) {
        const int n = static_cast<int>(std::min(ids.size() - first, static_cast<size_t>(kv_staging_blocks)));
        CUDA_CHECK(cudaMemcpyAsync(kv_staging_ids.get(), ids.data() + first, n * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream));
        size_t offset = first * stride;  // this layer's K (then V) of the chunk's first block on the host
        for (int l = 0; l < c.num_hidden_layers; ++l) {
            if (c.is_sliding(l) != sliding) continue;
            // One layer's K (then V) of the chunk: gathered into kv_staging, one copy to the pinned buffer, then a
            // host memcpy a block into its place (the driver may split a strided copy to or from pageable memory into
            // one copy a row).
            for (const DeviceBuffer* cache : {&layers[l].k_cache, &layers[l].v_cache}) {
                if (in == nullptr) {
                    kc::gather_kv_blocks(cache->get(), kv_staging_ids.as<int32_t>(), n, static_cast<int64_t>(per),
                                         kv_staging.get(), stream);
                    CUDA_CHECK(
                        cudaMemcpyAsync(kv_staging_host, kv_staging.get(), n * per, cudaMemcpyDeviceToHost, stream));
                    CUDA_CHECK(cudaStreamSynchronize(stream));
                    for (int i = 0; i < n; ++i) std::memcpy(out + offset + i * stride, kv_staging_host + i * per, per);
                } else {
                    for (int i = 0; i < n; ++i) std::memcpy(kv_staging_host + i * per, in + offset + i * stride, per);
                    CUDA_CHECK(
                        cudaMemcpyAsync(kv_staging.get(), kv_staging_host, n * per, cudaMemcpyHostToDevice, stream));
                    kc::scatter_kv_blocks(kv_staging.get(), kv_staging_ids.as<int32_t>(), n, static_cast<int64_t>(per),
                                          cache->get(), stream);
                    CUDA_CHECK(cudaStreamSynchronize(stream));  // before the pinned buffer is filled again
                }
                offset += per;
            }
        }
    }
    return ok_status();
}

void CudaModel::Impl::linear_f8(const void* x, bool x_bf16, const kc::Fp8Weight& w, float* yout, int m, uint8_t* xq,
                                float* xs, bool weights_fixed, bool y_bf16) {
    if (m <= kc::kGemvMaxTokens && w.k % 16 == 0 && weights_fixed) {
        ENGINE_CHECK(!y_bf16, "linear_f8: the GEMV writes fp32");
        kc::GemvArgs g;
        g.x = x;
        g.x_bf16 = x_bf16;
        g.w = w.q.get();
        g.w_scale = w.scales.as<float>();
        g.w_ld = w.k_pad;
        g.y = yout;
        g.num_tokens = m;
        g.n = w.n;
        g.k = w.k;
        g.fp8_kernel = gemv_fp8;
        kc::gemv_bf16w(g, stream);
        return;
    }
    if (x_bf16)
        kc::quantize_act_fp8_bf16(x, m, w.k, w.k_pad, xq, xs, stream);
    else
        kc::quantize_act_fp8(static_cast<const float*>(x), m, w.k, w.k_pad, xq, xs, stream);
    gemm_f8(xq, xs, w, yout, m, y_bf16);
}

void CudaModel::Impl::gemm_f8(const uint8_t* xq, const float* xs, const kc::Fp8Weight& w, float* yout, int m,
                              bool y_bf16) {
    // cuBLASLt without an algorithm for this shape: the plain kernel, same arithmetic, slower.
    if (!fp8_gemm->gemm(xq, xs, w, nullptr, yout, m, stream, y_bf16).ok())
        kc::fp8_gemm_reference(xq, xs, w, nullptr, yout, m, stream, y_bf16);
}

void CudaModel::Impl::moe(int T, int l, bool plan_done, const void* h_bf16, const float* h_f32, bool rows_q) {
    const auto need_h = [&] {
        ENGINE_CHECK(h_bf16 != nullptr,
                     "moe: %d rows took a branch that reads h's bf16 rows, which the norm skipped "
                     "(moe_reads_fp8_rows disagrees with moe())",
                     T);
        return h_bf16;
    };
    DeviceLayer& D = layers[l];
    const int H = c.hidden_size, I = sh.inter_size, E = sh.num_experts, K = c.experts_per_token;
    const int A = T * K;
    const bool small = mxfp4 && T <= mxfp4_tokens;
    y_bf16 = false;
    if (ep > 1) {
        // Other ranks' experts go to bucket E, which no expert kernel reads: their rows of y must
        // read as zero in the combine.
        CUDA_CHECK(cudaMemsetAsync(y.get(), 0, static_cast<size_t>(A) * H * 4, stream));
        kc::moe_plan(expert_ids.as<int32_t>(), A, E + 1, offsets.as<int32_t>(), sorted.as<int32_t>(), stream);
    } else if (!plan_done) {
        kc::moe_plan(expert_ids.as<int32_t>(), A, E, offsets.as<int32_t>(), sorted.as<int32_t>(), stream);
    }
    // The decode kernels' arguments (moe_mxfp4 on MXFP4, moe_decode_fp8 on the FP8 copy) but for the
    // weights. The fp32 rows where the norm wrote them: experts see unrounded inputs.
    auto decode_args = [&] {
        kc::MoeMxfp4Args m;
        m.h_f32 = h_f32;
        m.h = h_f32 != nullptr ? h_bf16 : need_h();
        m.expert_offsets = offsets.as<int32_t>();
        m.sorted_assignments = sorted.as<int32_t>();
        m.gate_up_bias = D.gu_b.as<float>();
        m.down_bias = D.down_b.as<float>();
        m.act = act.as<float>();
        m.y = y.as<float>();
        m.num_tokens = T;
        m.hidden_size = H;
        m.intermediate_size = I;
        m.num_experts = E;
        m.experts_per_token = K;
        m.swiglu_limit = static_cast<float>(c.swiglu_limit);
        m.swiglu_alpha = static_cast<float>(c.swiglu_alpha);
        m.tail = moe_tail;
        return m;
    };
    ENGINE_CHECK(moe_tail.x == nullptr || (T == 1 && moe_takes_tail(T) && ep == 1),
                 "moe: the residual tail was set for %d rows on a path without it", T);
    if (use_fp8_decode(T)) {  // decode batches on the FP8 copy
        kc::MoeMxfp4Args m = decode_args();
        m.gate_up_f8 = D.gu_f8q.as<uint8_t>();
        m.gate_up_f8_scale = D.gu_f8s.as<float>();
        m.gate_up_k_pad = static_cast<int>(kc::fp8_gemm_k_pad(H));
        m.down_f8 = D.down_f8q.as<uint8_t>();
        m.down_f8_scale = D.down_f8s.as<float>();
        m.down_k_pad = static_cast<int>(kc::fp8_gemm_k_pad(I));
        kc::moe_decode_fp8(m, stream);
        return;
    }
    // Arguments of the grouped kernels' gate_up launch, after listing the tiles of `bm` rows.
    auto mma_args = [&](int bm) {
        const int max_tiles = (A + bm - 1) / bm + E;
        kc::moe_mma_tiles(offsets.as<int32_t>(), E, bm, max_tiles, mma_tiles.as<int32_t>(), mma_count.as<int32_t>(),
                          stream);
        kc::MoeMmaArgs m;
        m.x = need_h();
        m.x_by_token = true;
        m.experts_per_token = K;
        m.expert_offsets = offsets.as<int32_t>();
        m.sorted_assignments = sorted.as<int32_t>();
        m.tiles = mma_tiles.as<int32_t>();
        m.tile_count = mma_count.as<int32_t>();
        m.max_tiles = max_tiles;
        m.blocks = D.gu_blocks.as<uint8_t>();
        m.scales = D.gu_scales.as<uint8_t>();
        m.bias = D.gu_b.as<float>();
        m.act = actb.get();
        m.n = 2 * I;
        m.k = H;
        m.num_experts = E;
        m.swiglu_limit = static_cast<float>(c.swiglu_limit);
        m.swiglu_alpha = static_cast<float>(c.swiglu_alpha);
        return m;
    };
    auto to_down = [&](kc::MoeMmaArgs& m) {  // the same launch's down projection into y
        m.x = actb.get();
        m.x_by_token = false;
        m.blocks = D.down_blocks.as<uint8_t>();
        m.scales = D.down_scales.as<uint8_t>();
        m.bias = D.down_b.as<float>();
        m.y = y.as<float>();
        m.n = H;
        m.k = I;
    };
    // The grouped FP8 / bf16 kernels' common arguments, after listing the 128-row tiles.
    auto grouped_args = [&] {
        const int bt = kc::kMoeFp8BlockTokens;
        kc::MoeFp8Args m;
        m.max_tiles = (A + bt - 1) / bt + E;
        kc::moe_mma_tiles(offsets.as<int32_t>(), E, bt, m.max_tiles, mma_tiles.as<int32_t>(), mma_count.as<int32_t>(),
                          stream);
        m.num_rows = A;
        m.expert_offsets = offsets.as<int32_t>();
        m.sorted_assignments = sorted.as<int32_t>();
        m.tiles = mma_tiles.as<int32_t>();
        m.tile_count = mma_count.as<int32_t>();
        m.num_experts = E;
        m.swiglu_limit = static_cast<float>(c.swiglu_limit);
        m.swiglu_alpha = static_cast<float>(c.swiglu_alpha);
        m.narrow_min = moe_narrow_min;
        return m;
    };
    // FP8 experts, grouped (moe_fp8): e4m3 rows of h (gathered by token, one scale each), gate_up
    // + SwiGLU into e4m3 act, down into y. No host synchronisation.
    auto grouped_fp8 = [&](const uint8_t* gu_q, const float* gu_s, const uint8_t* down_q, const float* down_s) {
        kc::MoeFp8Args m = grouped_args();
        if (rows_q)
            kc::moe_fp8_gather_rows(hq_tok.as<uint8_t>(), hs_tok.as<float>(), sorted.as<int32_t>(), K, A, H, false, H,
                                    xq8.as<uint8_t>(), xs8.as<float>(), stream);
        else
            kc::moe_fp8_quant_rows(need_h(), true, sorted.as<int32_t>(), K, A, H, xq8.as<uint8_t>(), xs8.as<float>(),
                                   stream);
        m.xq = xq8.as<uint8_t>();
        m.x_scale = xs8.as<float>();
        m.wq = gu_q;
        m.w_scale = gu_s;
        m.bias = D.gu_b.as<float>();
        m.act = actb.get();
        m.n = 2 * I;
        m.k = H;
        m.k_pad = kc::fp8_gemm_k_pad(H);
        m.warpgroups = fp8_grouped_wg;
        m.persistent = fp8_grouped_persistent;
        // The clamped SwiGLU is bounded: act goes straight to e4m3 with one scale (into actb's
        // bytes), else bf16 act and its rows quantized.
        const float act_scale = kc::moe_fp8_act_scale(m.swiglu_limit);
        if (act_scale > 0.0f) {
            m.act_q = actb.as<uint8_t>();
            m.act_q_inv_scale = 1.0f / act_scale;
        }
        kc::moe_fp8(m, true, stream);
        if (act_scale > 0.0f) {
            m.xq = actb.as<uint8_t>();
            m.x_scale = nullptr;
            m.x_scale_value = act_scale;
            m.act_q = nullptr;
        } else {
            kc::moe_fp8_quant_rows(actb.get(), false, nullptr, K, A, I, xq8.as<uint8_t>(), xs8.as<float>(), stream);
        }
        m.wq = down_q;
        m.w_scale = down_s;
        m.bias = D.down_b.as<float>();
        m.act = nullptr;
        m.y = y.as<float>();
        y_bf16 = m.y_bf16 = y_bf16_allowed && !world_reduce;
        m.n = H;
        m.k = I;
        m.k_pad = kc::fp8_gemm_k_pad(I);
        kc::moe_fp8(m, false, stream);
    };
    if (mx_grouped && T >= fp8_jit_tokens) {
        // The MXFP4 experts as they are: rows of h in the MX K order, gate_up's act_q in it too
        // (rows kp_i apart; the last K block's positions past I zeroed first: gate_up does not write
        // them and the down GEMM reads them against zero codes), then down.
        const int kp_h = (static_cast<int>(H) + 127) / 128 * 128, kp_i = (static_cast<int>(I) + 127) / 128 * 128;
        kc::MoeFp8Args m = grouped_args();
        if (rows_q)
            kc::moe_fp8_gather_rows(hq_tok.as<uint8_t>(), hs_tok.as<float>(), sorted.as<int32_t>(), K, A, H, true, kp_h,
                                    xq8.as<uint8_t>(), xs8.as<float>(), stream);
        else
            kc::moe_fp8_quant_rows_mx(need_h(), true, sorted.as<int32_t>(), K, A, H, kp_h, xq8.as<uint8_t>(),
                                      xs8.as<float>(), stream);
        m.xq = xq8.as<uint8_t>();
        m.x_scale = xs8.as<float>();
        m.w_mx = D.gu_blocks.as<uint8_t>();
        m.w_mx_scale = D.gu_scales.as<uint8_t>();
        m.bias = D.gu_b.as<float>();
        m.n = 2 * I;
        m.k = H;
        m.k_pad = kp_h;
        const float act_scale = kc::moe_fp8_act_scale(m.swiglu_limit);
        m.act_q = actb.as<uint8_t>();
        m.act_q_inv_scale = 1.0f / act_scale;
        m.act_mx_order = true;
        m.act_q_stride = kp_i;
        if (kp_i != I) CUDA_CHECK(cudaMemset2DAsync(actb.as<uint8_t>() + kp_i - 128, kp_i, 0, 128, A, stream));
        kc::moe_mxfp4_fp8(m, true, stream);
        m.xq = actb.as<uint8_t>();
        m.x_scale = nullptr;
        m.x_scale_value = act_scale;
        m.act_q = nullptr;
        m.act_mx_order = false;
        m.w_mx = D.down_blocks.as<uint8_t>();
        m.w_mx_scale = D.down_scales.as<uint8_t>();
        m.bias = D.down_b.as<float>();
        m.y = y.as<float>();
        y_bf16 = m.y_bf16 = y_bf16_allowed && !world_reduce;
        m.n = H;
        m.k = I;
        m.k_pad = kp_i;
        kc::moe_mxfp4_fp8(m, false, stream);
        return;
    }
    if (fp8_jit && T >= fp8_jit_tokens) {
        // This layer's active experts converted to FP8 into the scratch (stream order: the previous
        // layer's kernels are done with it), then as the FP8 copy.
        kc::quantize_weight_fp8_mxfp4(D.gu_blocks.as<uint8_t>(), D.gu_scales.as<uint8_t>(), E, 2 * I, H,
                                      kc::fp8_gemm_k_pad(H), offsets.as<int32_t>(), jit_gu_q.as<uint8_t>(),
                                      jit_gu_s.as<float>(), stream);
        kc::quantize_weight_fp8_mxfp4(D.down_blocks.as<uint8_t>(), D.down_scales.as<uint8_t>(), E, H, I,
                                      kc::fp8_gemm_k_pad(I), offsets.as<int32_t>(), jit_down_q.as<uint8_t>(),
                                      jit_down_s.as<float>(), stream);
        grouped_fp8(jit_gu_q.as<uint8_t>(), jit_gu_s.as<float>(), jit_down_q.as<uint8_t>(), jit_down_s.as<float>());
        return;
    }
    if (use_wgmma(T) && w4a8) {  // e4m3 rows of h, then of act (one scale per row)
        const int bt = kc::moe_wgmma_block_tokens(A, num_experts) <= 32 ? 32 : 64;
        kc::MoeMmaArgs m = mma_args(bt);
        kc::moe_quant_rows_fp8(need_h(), true, sorted.as<int32_t>(), K, A, H, xq8w.as<uint8_t>(), xs8w.as<float>(),
                               stream);
        m.x = xq8w.get();
        m.x_by_token = false;
        m.x_scale = xs8w.as<float>();
        kc::moe_w4a8(m, true, bt, stream);
        to_down(m);
        kc::moe_quant_rows_fp8(actb.get(), false, nullptr, K, A, I, xq8w.as<uint8_t>(), xs8w.as<float>(), stream);
        m.x = xq8w.get();
        m.x_by_token = false;
        kc::moe_w4a8(m, false, bt, stream);
        return;
    }
    if (use_wgmma(T)) {
        const int bt = kc::moe_wgmma_block_tokens(A, num_experts);  // rows per local expert ≈ A / all experts
        kc::MoeMmaArgs m = mma_args(bt);
        const bool ws = use_wgmma_ws(A);
        if (ws) {  // the warp-specialized kernels read x in tile-row order: gather it first
            kc::moe_gather(need_h(), sorted.as<int32_t>(), A, K, H, xg.get(), stream);
            m.x = xg.get();
            m.x_by_token = false;
            m.num_rows = A;
        }
        kc::moe_wgmma(m, true, bt, stream, ws);
        to_down(m);
        m.num_rows = A;
        kc::moe_wgmma(m, false, bt, stream, ws);
        return;
    }
    if (use_mma(T)) {
        // Tensor-core grouped GEMMs: 64-row tiles once experts average ≥ 64 rows, else 16-row ones
        // (moe_bench --mma, r17: 256 tokens on 32 experts, 64-row tiles 777 µs a layer).
        const bool large = A >= 64 * E;
        kc::MoeMmaArgs m = mma_args(kc::moe_mma_block_rows(large));
        m.large = large;
        kc::moe_mma(m, true, stream);
        to_down(m);
        kc::moe_mma(m, false, stream);
        return;
    }
    if (small) {
        kc::MoeMxfp4Args m = decode_args();
        m.h = need_h();  // the fp32 weight-only and W4A8 kernels read the bf16 rows
        m.gate_up_blocks = D.gu_blocks.as<uint8_t>();
        m.gate_up_scales = D.gu_scales.as<uint8_t>();
        m.down_blocks = D.down_blocks.as<uint8_t>();
        m.down_scales = D.down_scales.as<uint8_t>();
        if (decode_packed) {
            m.gate_up_packed = D.gu_packed.as<uint8_t>();
            m.gate_up_packed_scales = D.gu_packed_s.as<uint8_t>();
            m.down_packed = D.down_packed.as<uint8_t>();
            m.down_packed_scales = D.down_packed_s.as<uint8_t>();
        }
        m.kernel = decode_kernel;
        kc::moe_mxfp4(m, stream);
        return;
    }
    if (fp8_grouped) {
        grouped_fp8(D.gu_f8q.as<uint8_t>(), D.gu_f8s.as<float>(), D.down_f8q.as<uint8_t>(), D.down_f8s.as<float>());
        return;
    }
    if (bf16_grouped && have_bf16_experts && !fp8) {
        // The bf16 expert copy, grouped (moe_bf16_grouped): x gathered into tile-row order, gate_up +
        // SwiGLU into bf16 act, down into y. No host synchronisation.
        kc::MoeFp8Args m = grouped_args();
        kc::moe_gather(need_h(), sorted.as<int32_t>(), A, K, H, xg.get(), stream);
        m.xq = xg.as<uint8_t>();
        m.wq = D.gu_bf16.as<uint8_t>();
        m.bias = D.gu_b.as<float>();
        m.act = actb.get();
        m.n = 2 * I;
        m.k = m.k_pad = H;
        kc::moe_bf16_grouped(m, true, stream);
        m.xq = actb.as<uint8_t>();
        m.wq = D.down_bf16.as<uint8_t>();
        m.bias = D.down_b.as<float>();
        m.act = nullptr;
        m.y = y.as<float>();
        m.n = H;
        m.k = m.k_pad = I;
        kc::moe_bf16_grouped(m, false, stream);
        return;
    }
    // Large batch: per-expert bf16 GEMMs over the tokens grouped by expert. The group sizes are
    // needed on the host to launch the GEMMs (prefill only; decode batches take the path above).
    std::vector<int32_t> off(E + 1);
    CUDA_CHECK(cudaMemcpyAsync(off.data(), offsets.get(), (E + 1) * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // Under EP the assignments past off[E] are other ranks' (the extra bucket): leave their rows of
    // y at zero.
    const int An = ep > 1 ? off[E] : A;
    kc::moe_gather(need_h(), sorted.as<int32_t>(), An, K, H, xg.get(), stream);
    if (fp8 && mxfp4) {
        // W8A8: per expert, its rows quantized per 1×128 into their own slice of the scratch (M
        // padded to 4: each expert's activation scales are their own [K/128, M_pad] block), then
        // the cuBLASLt GEMM — for every expert, however few its rows (a token's result does not
        // depend on how many others chose its experts; and the scratch weights, rewritten per
        // expert, must not meet the GEMV's early weight loads). A GEMM writes up to 3 rows past its expert's: the next
        // expert's rows, which its own GEMM (later in stream order) overwrites, or the spare rows past A.
        const int kph = kc::fp8_gemm_k_pad(H), kpi = kc::fp8_gemm_k_pad(I);
        auto expert_gemms = [&](const uint16_t* xin, int kin, int kp, std::vector<kc::Fp8Weight>& copy,
                                kc::Fp8Weight& scratch, bool gate_up, float* yout, int nout) {
            int64_t prow = 0;  // padded row offset into the scratch
            for (int e = 0; e < E; ++e) {
                const int n = off[e + 1] - off[e];
                if (n == 0) continue;
                const kc::Fp8Weight* wt = have_fp8_experts ? &copy[e] : &scratch;
                if (!have_fp8_experts) {  // MXFP4 -> bf16 -> FP8, one expert (stream order keeps it safe)
                    if (gate_up) {
                        kc::mxfp4_to_bf16(D.gu_blocks.as<uint8_t>() + static_cast<int64_t>(e) * 2 * I * H / 2,
                                          D.gu_scales.as<uint8_t>() + static_cast<int64_t>(e) * 2 * I * H / 32, 2 * I,
                                          H, gu_scratch.get(), stream);
                        kc::quantize_weight_fp8_bf16(gu_scratch.get(), 2 * I, H, kph, scratch.q.as<uint8_t>(),
                                                     scratch.scales.as<float>(), stream);
                    } else {
                        kc::mxfp4_to_bf16(D.down_blocks.as<uint8_t>() + static_cast<int64_t>(e) * H * I / 2,
                                          D.down_scales.as<uint8_t>() + static_cast<int64_t>(e) * H * I / 32, H, I,
                                          down_scratch.get(), stream);
                        kc::quantize_weight_fp8_bf16(down_scratch.get(), H, I, kpi, scratch.q.as<uint8_t>(),
                                                     scratch.scales.as<float>(), stream);
                    }
                }
                linear_f8(xin + static_cast<int64_t>(off[e]) * kin, true, *wt,
                          yout + static_cast<int64_t>(off[e]) * nout, n, xq8.as<uint8_t>() + prow * kp,
                          xs8.as<float>() + prow * (kp / 128), false);
                prow += kc::fp8_gemm_m_pad(n);
            }
        };
        expert_gemms(xg.as<uint16_t>(), H, kph, D.gu_f8, gu_f8_scratch, true, gu.as<float>(), 2 * I);
        kc::moe_swiglu_sorted(gu.as<float>(), D.gu_b.as<float>(), offsets.as<int32_t>(), E, An, I,
                              static_cast<float>(c.swiglu_limit), static_cast<float>(c.swiglu_alpha), actb.get(),
                              stream);
        expert_gemms(actb.as<uint16_t>(), I, kpi, D.down_f8, down_f8_scratch, false, yd.as<float>(), H);
        kc::moe_scatter(yd.as<float>(), D.down_b.as<float>(), offsets.as<int32_t>(), E, sorted.as<int32_t>(), An, H,
                        y.as<float>(), stream);
        return;
    }
    for (int e = 0; e < E; ++e) {
        const int n = off[e + 1] - off[e];
        if (n == 0) continue;
        const uint16_t* wgu = D.gu_bf16.as<uint16_t>() + static_cast<int64_t>(e) * 2 * I * H;
        if (!have_bf16_experts) {  // dequantize this expert into the scratch (stream order keeps it safe)
            kc::mxfp4_to_bf16(D.gu_blocks.as<uint8_t>() + static_cast<int64_t>(e) * 2 * I * H / 2,
                              D.gu_scales.as<uint8_t>() + static_cast<int64_t>(e) * 2 * I * H / 32, 2 * I, H,
                              gu_scratch.get(), stream);
            wgu = gu_scratch.as<uint16_t>();
        }
        gemm->gemm(xg.as<uint16_t>() + static_cast<int64_t>(off[e]) * H, wgu,
                   gu.as<float>() + static_cast<int64_t>(off[e]) * 2 * I, kc::GemmOut::kF32, n, 2 * I, H, stream);
    }
    kc::moe_swiglu_sorted(gu.as<float>(), D.gu_b.as<float>(), offsets.as<int32_t>(), E, An, I,
                          static_cast<float>(c.swiglu_limit), static_cast<float>(c.swiglu_alpha), actb.get(), stream);
    for (int e = 0; e < E; ++e) {
        const int n = off[e + 1] - off[e];
        if (n == 0) continue;
        const uint16_t* wdn = D.down_bf16.as<uint16_t>() + static_cast<int64_t>(e) * H * I;
        if (!have_bf16_experts) {
            kc::mxfp4_to_bf16(D.down_blocks.as<uint8_t>() + static_cast<int64_t>(e) * H * I / 2,
                              D.down_scales.as<uint8_t>() + static_cast<int64_t>(e) * H * I / 32, H, I,
                              down_scratch.get(), stream);
            wdn = down_scratch.as<uint16_t>();
        }
        gemm->gemm(actb.as<uint16_t>() + static_cast<int64_t>(off[e]) * I, wdn,
                   yd.as<float>() + static_cast<int64_t>(off[e]) * H, kc::GemmOut::kF32, n, H, I, stream);
    }
    kc::moe_scatter(yd.as<float>(), D.down_b.as<float>(), offsets.as<int32_t>(), E, sorted.as<int32_t>(), An, H,
                    y.as<float>(), stream);
}

Status CudaModel::Impl::validate(std::span<const ForwardSequence> seqs, bool sample, int blocks_full,
                                 int blocks_sliding) const {
    const int bs = opt.block_size, V = c.vocab_size;
    if (static_cast<int>(seqs.size()) > opt.max_seqs)
        return invalid_argument("batch of " + std::to_string(seqs.size()) + " sequences exceeds max_seqs " +
                                std::to_string(opt.max_seqs));
    int64_t tokens = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
        const ForwardSequence& q = seqs[s];
        const int64_t n = static_cast<int64_t>(q.tokens.size());
        if (n == 0) return invalid_argument("sequence " + std::to_string(s) + " has no new tokens");
        if (sample && q.all_logits) return invalid_argument("forward_sample takes one logits row per sequence");
        tokens += n;
        const int64_t end = static_cast<int64_t>(q.start_pos) + n;
        if (q.start_pos < 0 || end > c.max_position_embeddings)
            return out_of_range("positions up to " + std::to_string(end) + " exceed the model's context of " +
                                std::to_string(c.max_position_embeddings) + " tokens");
        const int64_t nb = (end + bs - 1) / bs;
        if (static_cast<int64_t>(q.block_table_full.size()) < nb ||
            static_cast<int64_t>(q.block_table_sliding.size()) < nb)
            return invalid_argument("block table too short for " + std::to_string(end) + " positions");
        const int64_t first_sliding = std::max<int64_t>(0, q.start_pos - c.sliding_window + 1) / bs;
        for (int64_t b = 0; b < nb; ++b) {
            const int32_t f = q.block_table_full[b], sl = q.block_table_sliding[b];
            if (f < 0 || f >= blocks_full)
                return invalid_argument("block table entry " + std::to_string(b) + " = " + std::to_string(f) +
                                        " is not a valid block");
            if (b >= first_sliding && (sl < 0 || sl >= blocks_sliding))
                return invalid_argument("sliding block table entry " + std::to_string(b) + " = " + std::to_string(sl) +
                                        " is not a valid block");
        }
        for (int32_t id : q.tokens)
            if (id < 0 || id >= V)
                return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                        std::to_string(V) + ")");
    }
    if (tokens > opt.max_tokens)
        return invalid_argument("batch of " + std::to_string(tokens) + " tokens exceeds max_tokens " +
                                std::to_string(opt.max_tokens));
    return ok_status();
}

Status CudaModel::Impl::forward(std::span<const ForwardSequence> seqs, std::vector<float>* out,
                                std::span<const CudaModel::SampleParams> sample_params, std::vector<int32_t>* sampled,
                                int dp_max_tokens) {
    const int H = c.hidden_size, K = c.experts_per_token, V = c.vocab_size;
    const int qw = nq * c.head_dim, kvw = nkv * c.head_dim, qkvw = qw + 2 * kvw;
    const int bs = opt.block_size;
    set_device();
    if (kv_bytes == 0) return failed_precondition("forward before the KV cache was allocated");
    // Under parallelism every rank must join every collective: an empty step is the driver's bug.
    if (seqs.empty()) return opt.comms ? invalid_argument("a parallel rank needs a sequence every step") : ok_status();
    timing_n = 0;
    timing_point("entry");
    again_rows = 0;  // `logits` is about to be overwritten
    RETURN_IF_ERROR(validate(seqs, sampled != nullptr, num_blocks_full, num_blocks_sliding));
    // Host-side metadata (the batch is valid from here on).
    std::vector<int32_t> h_ids, h_pos, h_sf, h_ss, h_rows, h_seq_start, h_qstart = {0};
    // Block tables go up with a row stride of this batch's longest table, not the model maximum.
    int stride = 1;
    for (const ForwardSequence& q : seqs)
        stride = std::max<int>(stride,
                               static_cast<int>((static_cast<int64_t>(q.start_pos) + q.tokens.size() + bs - 1) / bs));
    if (stride > max_blocks_per_seq) return out_of_range("sequence longer than the model's context");
    // Round up to a power of two: decode graphs are keyed by (batch, stride), so a growing context
    // re-captures only when it crosses a power of two.
    stride = std::min(max_blocks_per_seq, static_cast<int>(std::bit_ceil(static_cast<unsigned>(stride))));
    std::vector<int32_t> h_tf(seqs.size() * stride, -1), h_ts(h_tf.size(), -1);
    int max_q = 0;
    bool decode = true;
    for (size_t s = 0; s < seqs.size(); ++s) {
        const ForwardSequence& q = seqs[s];
        const int n = static_cast<int>(q.tokens.size());
        const int64_t nb = (static_cast<int64_t>(q.start_pos) + n + bs - 1) / bs;
        for (int64_t b = 0; b < nb; ++b) {
            h_tf[s * stride + b] = q.block_table_full[b];
            h_ts[s * stride + b] = q.block_table_sliding[b];
        }
        for (int i = 0; i < n; ++i) {
            const int32_t id = q.tokens[i];
            const int pos = q.start_pos + i;
            if (q.all_logits || i == n - 1) h_rows.push_back(static_cast<int32_t>(h_ids.size()));
            h_ids.push_back(id);
            h_pos.push_back(pos);
            h_sf.push_back(q.block_table_full[pos / bs] * bs + pos % bs);
            h_ss.push_back(q.block_table_sliding[pos / bs] * bs + pos % bs);
        }
        h_seq_start.push_back(q.start_pos);
        h_qstart.push_back(static_cast<int32_t>(h_ids.size()));
        max_q = std::max(max_q, n);
        decode = decode && n == 1;
    }
    const int T = static_cast<int>(h_ids.size());
    // MoE rows: under DP every group's tokens, each group padded to the largest.
    const int Tmax = dp > 1 ? dp_max_tokens : T;
    if (dp > 1 && (Tmax < T || Tmax > opt.max_tokens))
        return invalid_argument("dp_max_tokens " + std::to_string(Tmax) + " does not cover this group's " +
                                std::to_string(T) + " tokens");
    const int Tm = Tmax * dp;
    const int dp_rank = dp > 1 ? opt.comms->dp->rank() : 0;
    const int S = static_cast<int>(seqs.size());
    // The step's inputs, packed at step_layout's offsets (the views point there), one upload.
    size_t offs[14];
    const size_t step_bytes = step_layout(T, S, stride, sampled != nullptr, offs);
    ArenaView* views[14] = {&ids,       &positions,   &slots_full,  &slots_sliding,  &logit_rows,
                            &seq_start, &query_start, &tables_full, &tables_sliding, &s_temp,
                            &s_top_p,   &s_top_k,     &s_seed,      &s_draw};
    for (int i = 0; i < 14; ++i) views[i]->p = static_cast<uint8_t*>(step_arena.get()) + offs[i];
    CUDA_CHECK(cudaEventSynchronize(step_uploaded));  // the previous step's upload has left step_host
    auto put = [&](int i, const void* src, size_t bytes) {
        if (bytes == 0) return;
        if (packed_upload)
            std::memcpy(step_host + offs[i], src, bytes);
        else
            CUDA_CHECK(cudaMemcpyAsync(views[i]->p, src, bytes, cudaMemcpyHostToDevice, stream));
    };
    put(0, h_ids.data(), h_ids.size() * 4);
    put(1, h_pos.data(), h_pos.size() * 4);
    put(2, h_sf.data(), h_sf.size() * 4);
    put(3, h_ss.data(), h_ss.size() * 4);
    put(4, h_rows.data(), h_rows.size() * 4);
    put(7, h_tf.data(), h_tf.size() * 4);
    put(8, h_ts.data(), h_ts.size() * 4);
    put(5, h_seq_start.data(), h_seq_start.size() * 4);
    put(6, h_qstart.data(), h_qstart.size() * 4);

    const int R = static_cast<int>(h_rows.size());
    if (sampled != nullptr && (R != S || static_cast<int>(sample_params.size()) != S))
        return invalid_argument("forward_sample needs one logits row and one parameter set per sequence");
    // A step with a sampled (non-greedy) row draws it with many CTAs a row (kc::SampleArgs::split_draws); a greedy
    // step keeps the shorter launch sequence. Part of the graph's key.
    const bool split_draws =
        sampled != nullptr && split_sampling &&
        std::any_of(sample_params.begin(), sample_params.end(),
                    [](const CudaModel::SampleParams& p) { return p.temperature > 0.0f && p.top_k != 1; });
    if (sampled != nullptr) {
        std::vector<float> temp(S), top_p(S);
        std::vector<int32_t> top_k(S);
        std::vector<uint64_t> seed(S), draw(S);
        for (int s = 0; s < S; ++s) {
            temp[s] = sample_params[s].temperature;
            top_p[s] = sample_params[s].top_p;
            top_k[s] = sample_params[s].top_k;
            seed[s] = sample_params[s].seed;
            draw[s] = sample_params[s].draw_index;
        }
        put(9, temp.data(), S * 4);
        put(10, top_p.data(), S * 4);
        put(11, top_k.data(), S * 4);
        put(12, seed.data(), S * 8);
        put(13, draw.data(), S * 8);
    }
    timing_point("prepared");
    const bool span = step_events && sampled != nullptr;
    if (span) {
        if (!span_begin) CUDA_CHECK(cudaEventCreate(&span_begin));
        if (!span_end) CUDA_CHECK(cudaEventCreate(&span_end));
        CUDA_CHECK(cudaEventRecord(span_begin, stream));
    }
    if (packed_upload)
        CUDA_CHECK(cudaMemcpyAsync(step_arena.get(), step_host, step_bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaEventRecord(step_uploaded, stream));
    // With device sampling, the rows whose logits the caller also wants: their slot in `out`.
    std::vector<int> host_row(sampled != nullptr ? S : 0, -1);
    size_t out_base = 0;
    if (sampled != nullptr && out != nullptr) {
        int n = 0;
        for (int s = 0; s < S; ++s)
            if (sample_params[s].return_logits) host_row[s] = n++;
        out_base = out->size();
        out->resize(out_base + static_cast<size_t>(n) * V);
    }
    // Every device launch of the step, with no host synchronisation when the MoE takes the MXFP4
    // path: the decode step is captured as a CUDA graph per (batch size, table stride) and replayed.
    // Decode-sized batches run their projections as GEMVs on fp32 activations: cuBLASLt reads
    // weights far below bandwidth at M <= 8, and fp32 inputs round less.
    const bool small = T <= kc::kGemvMaxTokens;
    const bool small_moe = Tm <= kc::kGemvMaxTokens;  // router path (MoE rows differ from T under DP)
    // fp32 x (small batches) or bf16 x (cuBLASLt) times bf16 W[n, k]ᵀ into fp32 y.
    auto linear = [&](const void* xin, const void* w, const float* bias, float* yout, int n, int k) {
        if (small) {
            kc::GemvArgs g;
            g.x = xin;
            g.w = w;
            g.bias = bias;
            g.y = yout;
            g.num_tokens = T;
            g.n = n;
            g.k = k;
            g.legacy = gemv_v1;
            kc::gemv_bf16w(g, stream);
        } else {
            gemm->gemm(xin, w, yout, kc::GemmOut::kF32, T, n, k, stream);
        }
    };
    // lm_head for requested rows [r0, r0 + n) into `logits`: a GEMV on the fp32 rows when every
    // row is requested in a decode-sized batch, else gather the bf16 rows and use cuBLASLt.
    // Collectives enqueue on the stream; the first failure (NCCL errors, never user input) fails
    // the step after the body.
    Status comm_status;
    auto collective = [&](Status st) {
        if (comm_status.ok() && !st.ok()) comm_status = st;
    };
    auto lm_head_rows = [&](int r0, int n) {
        // TP: this rank's ceil(V / tp) vocabulary rows, gathered over the group and interleaved.
        float* dst = tp > 1 ? logits_local.as<float>() : logits.as<float>();
        const int rows = tp > 1 ? vocab_chunk : V;
        if (fp8 && small && R == T) {
            const bool xb = gemv_x_bf16();  // the same bits either way
            linear_f8(xb ? h.get() : h32.get(), xb, lm_head_f8, dst, T, xq8.as<uint8_t>(), xs8.as<float>());
        } else if (fp8) {
            kc::moe_gather(h.get(), logit_rows.as<int32_t>() + r0, n, 1, H, hsel.get(), stream);
            linear_f8(hsel.get(), true, lm_head_f8, dst, n, xq8.as<uint8_t>(), xs8.as<float>());
        } else if (small && R == T) {
            linear(h32.get(), lm_head.get(), nullptr, dst, rows, H);
        } else {
            kc::moe_gather(h.get(), logit_rows.as<int32_t>() + r0, n, 1, H, hsel.get(), stream);
            gemm->gemm(hsel.get(), lm_head.get(), dst, kc::GemmOut::kF32, n, rows, H, stream);
        }
        if (tp > 1) {
            collective(opt.comms->tp->all_gather(dst, logits_gather.get(), static_cast<size_t>(n) * vocab_chunk,
                                                 DType::kF32, stream));
            kc::vocab_interleave(logits_gather.as<float>(), tp, n, vocab_chunk, V, logits.as<float>(), stream);
        }
    };
    // The MoE output that the next residual update adds: per-assignment rows weighted by the router
    // (one rank), or the rank-summed combination (parallel), of which this DP group's rows are ours.
    auto moe_residual = [&](kc::ResidualRmsNormArgs& rn) {
        if (world_reduce) {
            rn.add = ycomb.as<float>() + static_cast<size_t>(dp_rank) * Tmax * H;
            rn.add_weights = nullptr;
            rn.num_add = 1;
        } else {
            rn.add = y.as<float>();
            rn.add_bf16 = y_bf16;
            rn.add_weights = expert_w.as<float>();
            rn.num_add = K;
        }
    };
    auto body = [&] {
        mark("start");
        // The residual stream: x, or x_alt after a router that fused the norm wrote the update there.
        float* xr = x.as<float>();
        float* xo = x_alt.as<float>();
        timing_point("uploaded");
        kc::embedding(ids.as<int32_t>(), T, embed.get(), H, xr, stream);
        mark("embedding");
        timing_point("embedding");
        // Prompt batches: the RoPE (cos, sin) of every token once, for all layers (rope_table).
        const bool use_rope_table = rope_table && !small && !decode;
        if (use_rope_table)
            kc::rope_cos_sin_table(positions.as<int32_t>(), T, inv_freq.as<float>(), c.head_dim / 2, attention_scaling,
                                   rope_cs.as<float>(), stream);
        timing_point("rope_table");
        // MoeResidualTail (one token, one GPU): each layer's down launch updates the residual and writes
        // the next layer's h = x · gain and Σ x² parts; that layer's QKV GEMV applies 1 / rms (no norm kernel).
        const bool tail_path = [&] {
            if (!tail_enabled || T != 1 || Tm != 1 || !fp8 || !small || !qkv_fused || !gemv_x_bf16() || world_reduce ||
                ep != 1 || tp != 1 || dp != 1 || !moe_takes_tail(Tm) || H % 64 != 0)
                return false;
            kc::GemvArgs g;
            g.w_scale = layers[0].qkv_f8.scales.as<float>();
            g.w_ld = layers[0].qkv_f8.k_pad;
            g.fp8_kernel = gemv_fp8;
            g.num_tokens = 1;
            g.n = qkvw;
            g.k = H;
            return kc::gemv_fp8_mma_applies(g, true, c.head_dim);
        }();
        bool tail_in = false;  // this layer's h and Σ x² parts come from the previous layer's down launch
        for (int l = 0; l < c.num_hidden_layers; ++l) {
            if (l == 1) timing_point("layer0");
            DeviceLayer& D = layers[l];
            const bool sliding = c.is_sliding(l);
            // x += Σ_k w_k · y_k (previous layer's MoE), then the attention norm.
            kc::ResidualRmsNormArgs rn;
            rn.x = xr;
            moe_residual(rn);
            if (l == 0) rn.add = nullptr;
            rn.weight = D.input_norm.as<float>();
            rn.out = h.get();
            const bool fuse_qkv = small && qkv_fused && (!fp8 || H % 16 == 0);
            const bool qkv_x_bf16 = fuse_qkv && gemv_x_bf16();  // the fused QKV GEMV reads h (same bits)
            rn.out_f32 = small && !qkv_x_bf16 ? h32.as<float>() : nullptr;
            rn.num_tokens = T;
            rn.hidden_size = H;
            rn.eps = static_cast<float>(c.rms_norm_eps);
            const bool qkv_bf16 = fp8 && !small && gemm_bf16_out;
            // The prompt path's FP8 QKV: the norm also writes its rows quantized (the bytes of
            // quantize_act_fp8_bf16 of h; in the norm kernel where it can, then without h, which only
            // the QKV GEMM reads). 8k prefill 84.06 -> 83.62 ms (20b), 208.66 -> 207.06 (120b), r28.
            // GPTOSS_NORM_QUANT=0: h, then the quantizer.
            const bool norm_quant = fp8 && !small && !fuse_qkv && norm_quant_allowed;
            if (norm_quant) {
                rn.out_q = xq8.as<uint8_t>();
                rn.out_q_scale = xs8.as<float>();
                rn.q_k_pad = D.qkv_f8.k_pad;
                rn.q_m_pad = kc::fp8_gemm_m_pad(T);
                if (kc::residual_rmsnorm_fuses_quant(rn)) rn.out = nullptr;
            }
            if (!tail_in) {
                kc::residual_rmsnorm(rn, stream);
                mark("norm");
            }
            if (norm_quant)
                gemm_f8(xq8.as<uint8_t>(), xs8.as<float>(), D.qkv_f8, qkv.as<float>(), T, qkv_bf16);
            else if (!fuse_qkv && fp8)
                linear_f8(small ? h32.get() : h.get(), !small, D.qkv_f8, qkv.as<float>(), T, xq8.as<uint8_t>(),
                          xs8.as<float>(), true, qkv_bf16);
            else if (!fuse_qkv)
                linear(small ? h32.get() : h.get(), D.qkv_w.get(), nullptr, qkv.as<float>(), qkvw, H);
            mark("qkv_gemm");
            // The prompt path's attention rotates q itself (attn_q_rope); the GEMV path writes q.
            const bool q_in_attention = attn_q_rope && !decode && !fuse_qkv && qkv_bf16;
            kernels::PagedAttentionArgs pa;
            pa.q = q_in_attention ? nullptr : q.get();
            if (q_in_attention) {
                pa.q_raw = qkv.get();
                pa.q_raw_stride = static_cast<int>(qkvw);
                pa.q_bias = D.qkv_b.as<float>();
                pa.q_positions = positions.as<int32_t>();
                pa.rope_inv_freq = inv_freq.as<float>();
                pa.rope_scaling = attention_scaling;
                pa.q_rope_cs = use_rope_table ? rope_cs.as<float>() : nullptr;
            }
            pa.out = attn.get();
            pa.sinks = D.sinks.as<float>();
            pa.k_cache = D.k_cache.get();
            pa.v_cache = D.v_cache.get();
            pa.kv_fp8 = opt.kv_fp8;
            pa.fp8_direct = attn_fp8_direct;
            pa.prefill_wgmma = attn_prefill_wgmma;
            pa.prefill_tma = attn_prefill_tma;
            pa.prefill_pipe = attn_prefill_pipe;
            pa.prefill_pingpong = attn_pingpong < 0 ? !sliding && max_q >= kPingPongMinQuery : attn_pingpong == 1;
            pa.prefill_zero_all_rows = attn_zero_all;
            pa.block_tables = sliding ? tables_sliding.as<int32_t>() : tables_full.as<int32_t>();
            pa.seq_start_pos = seq_start.as<int32_t>();
            pa.query_start = query_start.as<int32_t>();
            pa.max_blocks_per_seq = stride;
            pa.num_seqs = S;
            pa.num_tokens = T;
            pa.max_query_len = max_q;
            pa.max_context_len = stride * bs;  // the table's capacity: a bound valid for every replay of a graph
            pa.num_heads = nq;
            pa.num_kv_heads = nkv;
            pa.head_dim = c.head_dim;
            pa.block_size = bs;
            pa.sliding_window = sliding ? c.sliding_window : 0;
            pa.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
            pa.workspace = attn_workspace.as<float>();
            pa.max_splits = kMaxSplits;
            // The O projection's FP8 GEMM input straight from the attention (linear_f8 would quantize
            // attn's rows the same way; at ≤ kGemvMaxTokens it takes the GEMV on bf16 rows instead).
            const bool o_in_q = fp8 && !decode && attn_out_q && T > kc::kGemvMaxTokens && D.o_f8.k_pad == qw;
            if (o_in_q) {
                pa.out_q = xq8.as<uint8_t>();
                pa.out_q_scale = xs8.as<float>();
                pa.out_q_m_pad = kc::fp8_gemm_m_pad(T);
            }
            kc::QkvRopeArgs r;
            r.qkv = qkv.get();
            r.qkv_bf16 = qkv_bf16;
            r.bias = D.qkv_b.as<float>();
            r.positions = positions.as<int32_t>();
            r.slot_mapping = sliding ? slots_sliding.as<int32_t>() : slots_full.as<int32_t>();
            r.inv_freq = inv_freq.as<float>();
            r.attention_scaling = attention_scaling;
            r.q_out = q_in_attention ? nullptr : q.get();
            r.k_cache = D.k_cache.get();
            r.v_cache = D.v_cache.get();
            r.kv_fp8 = opt.kv_fp8;
            r.num_tokens = T;
            r.num_heads = nq;
            r.num_kv_heads = nkv;
            r.head_dim = c.head_dim;
            bool attn_tail = false;  // the attention ran in the QKV kernel (qkv_attn_tail)
            if (fuse_qkv) {          // decode: the QKV GEMV writes q and the cache itself (same arithmetic)
                kc::GemvArgs g;
                g.x = qkv_x_bf16 ? h.get() : h32.get();
                g.x_bf16 = qkv_x_bf16;
                g.w = fp8 ? D.qkv_f8.q.get() : D.qkv_w.get();
                g.w_scale = fp8 ? D.qkv_f8.scales.as<float>() : nullptr;
                g.w_ld = fp8 ? D.qkv_f8.k_pad : 0;
                g.fp8_kernel = gemv_fp8;
                g.num_tokens = T;
                g.n = qkvw;
                g.k = H;
                if (tail_in) {  // h = x · gain: the GEMV applies the norm's 1 / rms
                    g.x = h.get();
                    g.x_bf16 = true;
                    g.x_ss_parts = tail_parts.as<float>();
                    g.x_ss_n = H / kc::kMoeTailTile;
                    g.x_eps = static_cast<float>(c.rms_norm_eps);
                }
                attn_tail =
                    qkv_attn_tail >= (sliding ? 1 : 2) && decode && !q_in_attention &&
                    kc::qkv_attention_tail_applies(g, r, S, pa.sliding_window, opt.kv_fp8, bs, pa.max_context_len);
                if (attn_tail) {
                    kc::QkvAttnTailArgs ta;
                    ta.out = pa.out;
                    ta.sinks = pa.sinks;
                    ta.block_table = pa.block_tables;
                    ta.seq_start_pos = pa.seq_start_pos;
                    ta.query_start = pa.query_start;
                    ta.counters = attn_tail_counters.as<uint32_t>();
                    ta.block_size = pa.block_size;
                    ta.window = pa.sliding_window;
                    ta.scale = pa.scale;
                    kc::qkv_gemv_rope_attention(g, r, ta, stream);
                } else {
                    kc::qkv_gemv_rope(g, r, stream);
                }
            } else {
                kc::qkv_bias_rope_kv_write(r, stream);
            }
            mark("rope_kv");

            if (attn_tail)
                ;  // the QKV kernel ran it
            else if (decode)
                kc::paged_attention_decode(pa, stream);
            else
                kc::paged_attention_prefill(pa, stream);
            if (!attn_tail) mark("attention");                              // else its time is rope_kv's
            const bool o_bf16 = fp8 && !small && tp == 1 && gemm_bf16_out;  // a TP reduce sums fp32
            if (o_in_q) {
                gemm_f8(xq8.as<uint8_t>(), xs8.as<float>(), D.o_f8, o.as<float>(), T, o_bf16);
            } else if (fp8) {
                linear_f8(attn.get(), true, D.o_f8, o.as<float>(), T, xq8.as<uint8_t>(), xs8.as<float>(), true, o_bf16);
            } else if (small) {
                kc::GemvArgs g;
                g.x = attn.get();
                g.x_bf16 = true;
                g.w = D.o_w.get();
                g.y = o.as<float>();
                g.num_tokens = T;
                g.n = H;
                g.k = qw;
                g.legacy = gemv_v1;
                kc::gemv_bf16w(g, stream);
            } else {
                gemm->gemm(attn.get(), D.o_w.get(), o.get(), kc::GemmOut::kF32, T, H, qw, stream);
            }
            mark("o_gemm");
            if (tp > 1) {  // heads are split: sum the partial projections (bias on TP rank 0 only)
                collective(opt.comms->tp->all_reduce_sum(o.get(), static_cast<size_t>(T) * H, DType::kF32, stream));
                mark("tp_allreduce");
            }
            // Decode-sized batches: the router's logits, top-k, softmax and MoE plan in one launch
            // (its plan is over every expert, so not under EP); on one DP group it also does the
            // residual update and the post-attention norm.
            const bool fused_router = small_moe && decode_fused && ep == 1;
            const bool norm_in_router = fused_router && dp == 1 && T <= fused_norm_max_tokens;
            bool moe_rows_q = false, h_skipped = false;
            // Larger batches on one DP group whose experts read only bf16 h: the router normalizes
            // the residual itself (the same fp32 bits), so the norm skips its [T, H] fp32 copy.
            const bool router_norms = router_norm_allowed && !small_moe && dp == 1 && !(mxfp4 && Tm <= mxfp4_tokens) &&
                                      kc::router_topk_normalizes(c.num_experts, H, router_mma);
            if (!norm_in_router) {
                kc::ResidualRmsNormArgs rn2;
                rn2.x = xr;
                rn2.add = o.as<float>();
                rn2.add_bf16 = o_bf16;
                rn2.add_bias = D.o_b.as<float>();
                rn2.num_add = 1;
                rn2.weight = D.post_norm.as<float>();
                rn2.out = h.get();
                rn2.out_f32 = router_norms ? nullptr : h32.as<float>();
                rn2.out_inv_rms = router_norms ? norm_inv.as<float>() : nullptr;
                rn2.num_tokens = T;
                rn2.hidden_size = H;
                rn2.eps = static_cast<float>(c.rms_norm_eps);
                // The MoE's e4m3 token rows (one DP group: its rows are the MoE's).
                moe_rows_q = hq_tok.get() != nullptr && dp == 1 && !small_moe && moe_reads_fp8_rows(Tm);
                if (moe_rows_q) {
                    rn2.out_row_q = hq_tok.as<uint8_t>();
                    rn2.out_row_scale = hs_tok.as<float>();
                    // h's bf16 rows then have no reader (the router reads h32 or the residual, the
                    // grouped FP8 / MX MoE only the e4m3 rows): not written (47 MB a layer at 8k).
                    if (kc::residual_rmsnorm_fuses_row_q(rn2)) {
                        rn2.out = nullptr;
                        h_skipped = true;
                    }
                }
                kc::residual_rmsnorm(rn2, stream);
                mark("norm");
            }

            // DP: the experts see every group's rows. Ours go to our slot of [dp, Tmax, H] (padding
            // rows zeroed: the router must see finite values), then an in-place all-gather.
            const void* moe_h = h_skipped ? nullptr : h.get();
            const float* moe_h32 = h32.as<float>();
            if (dp > 1) {
                const size_t row0 = static_cast<size_t>(dp_rank) * Tmax;
                uint8_t* g16 = hg.as<uint8_t>() + row0 * H * 2;
                uint8_t* g32 = hg32.as<uint8_t>() + row0 * H * 4;
                CUDA_CHECK(
                    cudaMemcpyAsync(g16, h.get(), static_cast<size_t>(T) * H * 2, cudaMemcpyDeviceToDevice, stream));
                CUDA_CHECK(
                    cudaMemcpyAsync(g32, h32.get(), static_cast<size_t>(T) * H * 4, cudaMemcpyDeviceToDevice, stream));
                if (Tmax > T) {
                    CUDA_CHECK(cudaMemsetAsync(g16 + static_cast<size_t>(T) * H * 2, 0,
                                               static_cast<size_t>(Tmax - T) * H * 2, stream));
                    CUDA_CHECK(cudaMemsetAsync(g32 + static_cast<size_t>(T) * H * 4, 0,
                                               static_cast<size_t>(Tmax - T) * H * 4, stream));
                }
                collective(
                    opt.comms->dp->all_gather(g16, hg.get(), static_cast<size_t>(Tmax) * H, DType::kBF16, stream));
                collective(
                    opt.comms->dp->all_gather(g32, hg32.get(), static_cast<size_t>(Tmax) * H, DType::kF32, stream));
                moe_h = hg.get();
                moe_h32 = hg32.as<float>();
                mark("dp_gather");
            }

            if (fused_router) {
                kc::RouterPlanSmallArgs rp;
                rp.h = moe_h32;
                rp.weight = D.router_w.get();
                rp.bias = D.router_b.as<float>();
                rp.logits = router_logits.as<float>();
                rp.expert_ids = expert_ids.as<int32_t>();
                rp.expert_weights = expert_w.as<float>();
                rp.expert_offsets = offsets.as<int32_t>();
                rp.sorted_assignments = sorted.as<int32_t>();
                rp.counter = router_counter.as<uint32_t>();
                rp.num_tokens = Tm;
                rp.hidden_size = H;
                rp.num_experts = c.num_experts;
                rp.experts_per_token = K;
                if (norm_in_router) {  // rp.h is not read: the router normalizes the residual itself
                    rp.h = nullptr;
                    rp.residual = xr;
                    rp.add = o.as<float>();
                    rp.add_bias = D.o_b.as<float>();
                    rp.norm_weight = D.post_norm.as<float>();
                    rp.eps = static_cast<float>(c.rms_norm_eps);
                    rp.residual_out = xo;
                    rp.h_out = h32.as<float>();
                    rp.h_bf16_out = h.get();
                    std::swap(xr, xo);
                }
                kc::router_plan_small(rp, stream);
            } else if (small_moe) {  // router logits by the GEMV (fp32 h), then the top-k selection
                kc::router_logits_small(moe_h32, D.router_w.get(), Tm, H, c.num_experts, router_logits.as<float>(),
                                        stream);
                kc::topk_softmax(router_logits.as<float>(), D.router_b.as<float>(), Tm, c.num_experts, K,
                                 expert_ids.as<int32_t>(), expert_w.as<float>(), stream);
            } else {
                kc::RouterTopkArgs ra;
                ra.h = moe_h32;
                if (router_norms) {
                    ra.h = xr;
                    ra.norm_inv_rms = norm_inv.as<float>();
                    ra.norm_weight = D.post_norm.as<float>();
                }
                ra.weight = D.router_w.get();
                ra.bias = D.router_b.as<float>();
                ra.expert_ids = expert_ids.as<int32_t>();
                ra.expert_weights = expert_w.as<float>();
                ra.num_tokens = Tm;
                ra.hidden_size = H;
                ra.num_experts = c.num_experts;
                ra.experts_per_token = K;
                ra.logits = router_logits.as<float>();
                ra.tensor_cores = router_mma;
                kc::router_topk(ra, stream);
            }
            if (ep > 1) kc::ep_localize(expert_ids.as<int32_t>(), Tm * K, sh.expert_begin, sh.num_experts, stream);
            mark("router");
            tail_in = tail_path && l + 1 < c.num_hidden_layers;
            if (tail_in) {
                moe_tail.x = xr;
                moe_tail.weights = expert_w.as<float>();
                moe_tail.gain = layers[l + 1].input_norm.as<float>();
                moe_tail.h = h.get();
                moe_tail.ss_parts = tail_parts.as<float>();
                moe_tail.counters = tail_counters.as<uint32_t>();
            }
            moe(Tm, l, fused_router, moe_h, moe_h32, moe_rows_q);
            moe_tail = {};
            mark("moe");
            if (world_reduce) {  // partial over experts / units: combine, then sum over the world
                kc::moe_combine(y.as<float>(), expert_w.as<float>(), Tm, K, H, ycomb.as<float>(), stream);
                collective(
                    opt.comms->world->all_reduce_sum(ycomb.get(), static_cast<size_t>(Tm) * H, DType::kF32, stream));
                mark("moe_allreduce");
            }
        }
        timing_point("layers");
        // Final residual update and norm, then lm_head on the requested rows, a chunk at a time.
        kc::ResidualRmsNormArgs rn;
        rn.x = xr;
        moe_residual(rn);
        rn.weight = final_norm.as<float>();
        rn.out = h.get();
        rn.out_f32 = small && !gemv_x_bf16() ? h32.as<float>() : nullptr;  // lm_head_rows' x
        rn.num_tokens = T;
        rn.hidden_size = H;
        rn.eps = static_cast<float>(c.rms_norm_eps);
        kc::residual_rmsnorm(rn, stream);
        mark("norm");
        if (sampled != nullptr) {
            // One row per sequence; lm_head and sampling stay on the device, only ids come back.
            for (int r0 = 0; r0 < R; r0 += kLogitChunk) {
                const int n = std::min(kLogitChunk, R - r0);
                lm_head_rows(r0, n);
                kc::SampleArgs sa;
                sa.logits = logits.as<float>();
                sa.temperature = s_temp.as<float>() + r0;
                sa.top_p = s_top_p.as<float>() + r0;
                sa.top_k = s_top_k.as<int32_t>() + r0;
                sa.seed = s_seed.as<uint64_t>() + r0;
                sa.draw_index = s_draw.as<uint64_t>() + r0;
                sa.out = s_out.as<int32_t>() + r0;
                sa.num_seqs = n;
                sa.vocab_size = V;
                sa.workspace = s_work.get();
                sa.split_draws = split_draws;
                kc::sample(sa, stream);
                // Rows the caller samples itself: from this chunk's logits (a batch this large never
                // runs as a graph; smaller ones are copied after the step).
                if (R > kLogitChunk)
                    for (int i = r0; i < r0 + n; ++i)
                        if (host_row[i] >= 0)
                            CUDA_CHECK(cudaMemcpyAsync(out->data() + out_base + static_cast<size_t>(host_row[i]) * V,
                                                       logits.as<float>() + static_cast<size_t>(i - r0) * V,
                                                       static_cast<size_t>(V) * 4, cudaMemcpyDeviceToHost, stream));
            }
            mark("lm_head_sample");
        } else if (R <= kLogitChunk) {
            lm_head_rows(0, R);  // one chunk: inside the step (and its graph); copied out below
        }
    };
    // Decode steps replay a graph per (batch, table stride, MoE rows, sampled on device or not, split draws):
    // forward_sample (bench) and forward (the engine, which samples on the host) alike.
    const bool graphable = use_graphs && !profile && decode && (mxfp4 || fp8_only) &&
                           (Tm <= mxfp4_tokens || use_mma(Tm) || use_wgmma(Tm) || fp8_grouped ||
                            (bf16_grouped && have_bf16_experts && !fp8)) &&
                           R <= kLogitChunk;
    if (!graphable) {
        body();
    } else {
        const auto key = std::make_tuple(S, stride, Tm, sampled != nullptr, split_draws);
        auto it = graphs.find(key);
        if (it != graphs.end()) {
            it->second.last_use = ++graph_clock;
            CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
        } else if (!warmed.count(key)) {
            body();  // first time: eager, which also settles the cuBLASLt plans for these shapes
            warmed.insert(key);
        } else {
            cudaGraph_t graph;
            CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            body();
            CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            cudaGraphExec_t exec;
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            CUDA_CHECK(cudaGraphDestroy(graph));
            if (graphs.size() >= kMaxGraphs) {
                auto lru = std::min_element(graphs.begin(), graphs.end(), [](const auto& a, const auto& b) {
                    return a.second.last_use < b.second.last_use;
                });
                // A launch still in flight completes: cudaGraphExecDestroy frees it afterwards.
                CUDA_CHECK(cudaGraphExecDestroy(lru->second.exec));
                graphs.erase(lru);
            }
            graphs.emplace(key, CachedGraph{exec, ++graph_clock});
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
        }
    }
    RETURN_IF_ERROR(comm_status);
    // Rows [0, n) of the host copy: through logits_host when they fit (copied on by finish_rows after the sync).
    const size_t row_bytes = static_cast<size_t>(V) * 4;
    int staged = 0;  // rows in logits_host bound for out->data() + out_at
    size_t out_at = 0;
    auto finish_rows = [&] {
        if (staged > 0) std::memcpy(out->data() + out_at, logits_host, static_cast<size_t>(staged) * row_bytes);
    };
    if (sampled != nullptr) {
        if (R <= kLogitChunk) {
            const int n_host = out != nullptr ? static_cast<int>((out->size() - out_base) / static_cast<size_t>(V)) : 0;
            const bool pin = logits_host != nullptr && n_host > 0 && n_host <= kPinnedLogitRows;
            for (int i = 0; i < R; ++i)
                if (host_row[i] >= 0)
                    CUDA_CHECK(cudaMemcpyAsync(pin ? logits_host + static_cast<size_t>(host_row[i]) * V
                                                   : out->data() + out_base + static_cast<size_t>(host_row[i]) * V,
                                               logits.as<float>() + static_cast<size_t>(i) * V, row_bytes,
                                               cudaMemcpyDeviceToHost, stream));
            if (pin) {
                staged = n_host;
                out_at = out_base;
            }
        }
        timing_point("body");
        sampled->resize(S);
        CUDA_CHECK(cudaMemcpyAsync(sampled->data(), s_out.get(), S * 4, cudaMemcpyDeviceToHost, stream));
        if (span) CUDA_CHECK(cudaEventRecord(span_end, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        finish_rows();
        if (span) CUDA_CHECK(cudaEventElapsedTime(&last_span_ms, span_begin, span_end));
        timing_report(T);
        collect();
        if (R <= kLogitChunk && opt.comms == nullptr) again_rows = S;  // the rows stay in `logits`
        return ok_status();
    }
    const size_t base = out->size();
    out->resize(base + static_cast<size_t>(R) * V);
    const bool pin = logits_host != nullptr && R <= kPinnedLogitRows;
    for (int r0 = 0; r0 < R; r0 += kLogitChunk) {
        const int n = std::min(kLogitChunk, R - r0);
        if (R > kLogitChunk) lm_head_rows(r0, n);  // else the step already computed the one chunk
        CUDA_CHECK(cudaMemcpyAsync(pin ? logits_host : out->data() + base + static_cast<size_t>(r0) * V, logits.get(),
                                   static_cast<size_t>(n) * row_bytes, cudaMemcpyDeviceToHost, stream));
    }
    if (pin) {
        staged = R;
        out_at = base;
    }
    mark("lm_head_copy");
    timing_point("body");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    finish_rows();
    timing_report(T);
    collect();
    return ok_status();
}

Status CudaModel::Impl::sample_again(std::span<const int> rows, std::span<const CudaModel::SampleParams> params,
                                     std::span<const uint32_t> bits, std::span<const CudaModel::LogitEdits> edits,
                                     std::vector<int32_t>* ids) {
    const int n = static_cast<int>(rows.size());
    const int V = c.vocab_size, words = (V + 31) / 32;
    if (params.size() != rows.size()) return invalid_argument("sample_again: one parameter set per row");
    if (!edits.empty() && edits.size() != rows.size())
        return invalid_argument("sample_again: one set of edits per row");
    if (!bits.empty() && bits.size() != rows.size() * static_cast<size_t>(words))
        return invalid_argument("sample_again: " + std::to_string(bits.size()) + " mask words for " +
                                std::to_string(n) + " rows of " + std::to_string(words));
    if (static_cast<size_t>(n) * 4 > again_out.bytes())
        return invalid_argument("sample_again: " + std::to_string(n) + " rows, more than the model's " +
                                std::to_string(again_out.bytes() / 4));
    for (int r : rows)
        if (r < 0 || r >= again_rows)
            return failed_precondition("sample_again: row " + std::to_string(r) +
                                       " is not a logits row of the last forward_sample on this model");
    for (const CudaModel::LogitEdits& e : edits) {
        const auto bad = [V](int32_t id) { return id < 0 || id >= V; };
        for (const auto& [id, v] : e.add)
            if (bad(id)) return invalid_argument("sample_again: edit of token " + std::to_string(id));
        for (int32_t id : e.repeat)
            if (bad(id)) return invalid_argument("sample_again: edit of token " + std::to_string(id));
        for (const auto& [id, v] : e.subtract)
            if (bad(id)) return invalid_argument("sample_again: edit of token " + std::to_string(id));
    }
    ids->clear();
    if (n == 0) return ok_status();
    set_device();
    // One upload: rows, temperature, top_p, top_k, min_p (4 bytes each), seed, draw (8), the mask words.
    const size_t off_seed = (20u * n + 7) & ~size_t{7}, off_bits = again_bits_offset(n);
    const size_t bytes = off_bits + 4u * bits.size();  // ≤ again_bytes(n, words) ≤ again_in's
    std::vector<uint8_t> host(bytes);
    for (int i = 0; i < n; ++i) {
        const CudaModel::SampleParams& p = params[static_cast<size_t>(i)];
        std::memcpy(host.data() + 4u * i, &rows[static_cast<size_t>(i)], 4);
        std::memcpy(host.data() + 4u * (n + i), &p.temperature, 4);
        std::memcpy(host.data() + 4u * (2 * n + i), &p.top_p, 4);
        std::memcpy(host.data() + 4u * (3 * n + i), &p.top_k, 4);
        std::memcpy(host.data() + 4u * (4 * n + i), &p.min_p, 4);
        std::memcpy(host.data() + off_seed + 8u * i, &p.seed, 8);
        std::memcpy(host.data() + off_seed + 8u * (n + i), &p.draw_index, 8);
    }
    if (!bits.empty()) std::memcpy(host.data() + off_bits, bits.data(), 4u * bits.size());
    CUDA_CHECK(cudaMemcpyAsync(again_in.get(), host.data(), bytes, cudaMemcpyHostToDevice, stream));
    const uint8_t* d = static_cast<const uint8_t*>(again_in.get());
    const bool edited = std::any_of(edits.begin(), edits.end(), [](const CudaModel::LogitEdits& e) {
        return !e.add.empty() || !e.repeat.empty() || !e.subtract.empty();
    });
    std::vector<int32_t> edit_words;  // offsets (3 · (n + 1)), repetition (n), then ids / values of each list
    if (edited) {
        // int32 words: add, repeat, subtract offsets; repetition; add ids, add values; repeat ids; subtract ids,
        // values.
        size_t n_add = 0, n_rep = 0, n_sub = 0;
        for (const auto& e : edits) n_add += e.add.size(), n_rep += e.repeat.size(), n_sub += e.subtract.size();
        const size_t o_add = 0, o_rep = n + 1, o_sub = 2 * (n + 1), o_r = 3 * (n + 1), o_aid = o_r + n,
                     o_av = o_aid + n_add, o_rid = o_av + n_add, o_sid = o_rid + n_rep, o_sv = o_sid + n_sub;
        edit_words.assign(o_sv + n_sub, 0);
        size_t ja = 0, jr = 0, js = 0;
        for (int i = 0; i < n; ++i) {
            const CudaModel::LogitEdits& e = edits[static_cast<size_t>(i)];
            edit_words[o_add + i] = static_cast<int32_t>(ja);
            edit_words[o_rep + i] = static_cast<int32_t>(jr);
            edit_words[o_sub + i] = static_cast<int32_t>(js);
            std::memcpy(&edit_words[o_r + i], &e.repetition, 4);
            for (const auto& [id, v] : e.add) {
                edit_words[o_aid + ja] = id;
                std::memcpy(&edit_words[o_av + ja++], &v, 4);
            }
            for (int32_t id : e.repeat) edit_words[o_rid + jr++] = id;
            for (const auto& [id, v] : e.subtract) {
                edit_words[o_sid + js] = id;
                std::memcpy(&edit_words[o_sv + js++], &v, 4);
            }
        }
        edit_words[o_add + n] = static_cast<int32_t>(ja);
        edit_words[o_rep + n] = static_cast<int32_t>(jr);
        edit_words[o_sub + n] = static_cast<int32_t>(js);
        const size_t edit_bytes = 4u * edit_words.size();
        if (again_edits.bytes() < edit_bytes) again_edits = DeviceBuffer(std::max(edit_bytes, 2 * again_edits.bytes()));
        CUDA_CHECK(cudaMemcpyAsync(again_edits.get(), edit_words.data(), edit_bytes, cudaMemcpyHostToDevice, stream));
        const int32_t* w = again_edits.as<int32_t>();
        kc::LogitEditArgs ea;
        ea.logits = logits.as<float>();
        ea.row_index = reinterpret_cast<const int32_t*>(d);
        ea.num_seqs = n;
        ea.vocab_size = V;
        ea.add_offset = w + o_add;
        ea.repeat_offset = w + o_rep;
        ea.subtract_offset = w + o_sub;
        ea.repetition = reinterpret_cast<const float*>(w + o_r);
        ea.add_id = w + o_aid;
        ea.add_value = reinterpret_cast<const float*>(w + o_av);
        ea.repeat_id = w + o_rid;
        ea.subtract_id = w + o_sid;
        ea.subtract_value = reinterpret_cast<const float*>(w + o_sv);
        kc::edit_logits(ea, stream);
    }
    kc::SampleArgs sa;
    sa.logits = logits.as<float>();
    sa.row_index = reinterpret_cast<const int32_t*>(d);
    sa.temperature = reinterpret_cast<const float*>(d + 4u * n);
    sa.top_p = reinterpret_cast<const float*>(d + 8u * n);
    sa.top_k = reinterpret_cast<const int32_t*>(d + 12u * n);
    sa.min_p = reinterpret_cast<const float*>(d + 16u * n);
    sa.seed = reinterpret_cast<const uint64_t*>(d + off_seed);
    sa.draw_index = reinterpret_cast<const uint64_t*>(d + off_seed + 8u * n);
    sa.allowed_bits = bits.empty() ? nullptr : reinterpret_cast<const uint32_t*>(d + off_bits);
    sa.out = again_out.as<int32_t>();
    sa.num_seqs = n;
    sa.vocab_size = V;
    sa.workspace = s_work.get();  // zeroed and left zeroed, shared in stream order with the step's draws
    sa.split_draws = std::any_of(params.begin(), params.end(),
                                 [](const CudaModel::SampleParams& p) { return p.temperature > 0.0f && p.top_k != 1; });
    kc::sample(sa, stream);
    ids->resize(static_cast<size_t>(n));
    CUDA_CHECK(cudaMemcpyAsync(ids->data(), again_out.get(), 4u * n, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // The edited rows are not this step's logits any more: no second draw of them.
    if (edited) again_rows = 0;
    return ok_status();
}

StatusOr<std::unique_ptr<CudaModel>> CudaModel::create(const GptOssWeights& weights, const CudaModelOptions& options) {
    auto impl = std::make_unique<Impl>();
    impl->opt = options;
    RETURN_IF_ERROR(impl->init(weights));
    return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() {
    if (impl_) impl_->set_device();  // buffers and graphs belong to the model's device
    if (impl_ && impl_->stream) cudaStreamDestroy(impl_->stream);
}
Status CudaModel::forward(std::span<const ForwardSequence> seqs, std::vector<float>* logits, int dp_max_tokens) {
    return impl_->forward(seqs, logits, {}, nullptr, dp_max_tokens);
}
Status CudaModel::allocate_kv_cache(int block_size, int num_blocks_full, int num_blocks_sliding) {
    impl_->set_device();
    return impl_->allocate_kv(block_size, num_blocks_full, num_blocks_sliding);
}
size_t CudaModel::free_device_memory() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return free_b;
}
Status CudaModel::forward_sample(std::span<const ForwardSequence> seqs, std::span<const SampleParams> params,
                                 std::vector<int32_t>* ids, int dp_max_tokens, std::vector<float>* logits) {
    return impl_->forward(seqs, logits, params, ids, dp_max_tokens);
}
Status CudaModel::validate(std::span<const ForwardSequence> seqs, bool sample, int blocks_full,
                           int blocks_sliding) const {
    if (impl_->kv_bytes == 0) return failed_precondition("forward before the KV cache was allocated");
    return impl_->validate(seqs, sample, blocks_full < 0 ? impl_->num_blocks_full : blocks_full,
                           blocks_sliding < 0 ? impl_->num_blocks_sliding : blocks_sliding);
}
size_t CudaModel::total_device_memory() {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    return total_b;
}
size_t CudaModel::free_device_memory(int device) {
    if (device >= 0 && cudaSetDevice(device) != cudaSuccess) return 0;
    return free_device_memory();
}
Status CudaModel::sample_again(std::span<const int> rows, std::span<const SampleParams> params,
                               std::span<const uint32_t> bits, std::span<const LogitEdits> edits,
                               std::vector<int32_t>* ids) {
    return impl_->sample_again(rows, params, bits, edits, ids);
}
void CudaModel::fill_kv_random(uint64_t seed) {
    impl_->set_device();
    for (size_t l = 0; l < impl_->layers.size(); ++l) {
        auto& L = impl_->layers[l];
        if (impl_->opt.kv_fp8) {
            kc::fill_random_fp8(L.k_cache.get(), static_cast<int64_t>(L.k_cache.bytes()), seed + 2 * l, impl_->stream);
            kc::fill_random_fp8(L.v_cache.get(), static_cast<int64_t>(L.v_cache.bytes()), seed + 2 * l + 1,
                                impl_->stream);
        } else {
            kc::fill_random_bf16(L.k_cache.get(), static_cast<int64_t>(L.k_cache.bytes() / 2), seed + 2 * l,
                                 impl_->stream);
            kc::fill_random_bf16(L.v_cache.get(), static_cast<int64_t>(L.v_cache.bytes() / 2), seed + 2 * l + 1,
                                 impl_->stream);
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}
Status CudaModel::read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out) {
    impl_->set_device();
    return impl_->copy_kv_blocks(sliding, ids, out, nullptr);
}
Status CudaModel::write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* in) {
    impl_->set_device();
    return impl_->copy_kv_blocks(sliding, ids, nullptr, in);
}
const GptOssConfig& CudaModel::config() const { return impl_->c; }
int CudaModel::block_size() const { return impl_->opt.block_size; }
int CudaModel::num_blocks(bool sliding) const { return sliding ? impl_->num_blocks_sliding : impl_->num_blocks_full; }
size_t CudaModel::weight_bytes() const { return impl_->weight_bytes; }
size_t CudaModel::kv_cache_bytes() const { return impl_->kv_bytes; }
float CudaModel::last_step_span_ms() const { return impl_->last_span_ms; }

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace gptoss::model

#else  // no CUDA backend in this build

namespace gptoss::model {

struct CudaModel::Impl {};

StatusOr<std::unique_ptr<CudaModel>> CudaModel::create(const GptOssWeights&, const CudaModelOptions&) {
    return unimplemented("this build has no CUDA backend (configure with a CUDA toolkit, GPTOSS_CUDA=ON)");
}
CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;
Status CudaModel::forward(std::span<const ForwardSequence>, std::vector<float>*, int) {
    return unimplemented("no CUDA backend");
}
const GptOssConfig& CudaModel::config() const {
    static GptOssConfig none;
    return none;
}
int CudaModel::block_size() const { return 0; }
int CudaModel::num_blocks(bool) const { return 0; }
size_t CudaModel::weight_bytes() const { return 0; }
size_t CudaModel::kv_cache_bytes() const { return 0; }
float CudaModel::last_step_span_ms() const { return -1.0f; }
Status CudaModel::forward_sample(std::span<const ForwardSequence>, std::span<const SampleParams>, std::vector<int32_t>*,
                                 int, std::vector<float>*) {
    return unimplemented("no CUDA backend");
}
Status CudaModel::sample_again(std::span<const int>, std::span<const SampleParams>, std::span<const uint32_t>,
                               std::span<const LogitEdits>, std::vector<int32_t>*) {
    return unimplemented("no CUDA backend");
}
void CudaModel::fill_kv_random(uint64_t) {}
Status CudaModel::read_kv_blocks(bool, std::span<const int32_t>, uint8_t*) { return unimplemented("no CUDA backend"); }
Status CudaModel::write_kv_blocks(bool, std::span<const int32_t>, const uint8_t*) {
    return unimplemented("no CUDA backend");
}
Status CudaModel::allocate_kv_cache(int, int, int) { return unimplemented("no CUDA backend"); }
size_t CudaModel::free_device_memory() { return 0; }
size_t CudaModel::free_device_memory(int) { return 0; }
size_t CudaModel::total_device_memory() { return 0; }
Status CudaModel::validate(std::span<const ForwardSequence>, bool, int, int) const {
    return unimplemented("no CUDA backend");
}
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }

}  // namespace gptoss::model

#endif
