// gpt-oss on the CUDA backend: device weights, a paged bf16 KV cache, preallocated activations, and
// the forward pass over a batch (the same ForwardSequence batches as CpuForward). Built only when
// the CUDA backend is (GPTOSS_HAVE_CUDA).
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/gpt_oss_forward.h"
#include "model/gpt_oss_weights.h"
#include "parallel/communicator.h"

namespace gptoss::model {

struct CudaModelOptions {
    int max_tokens = 16384;   // most new tokens in one forward call
    int max_seqs = 256;       // most sequences in one forward call
    int block_size = 16;      // KV block size (tokens)
    int num_blocks_full = 0;  // 0: size from kv_cache_fraction of free memory
    int num_blocks_sliding = 0;
    double kv_cache_fraction = 0.85;  // of the memory free after weights and activations
    bool bf16_experts = true;         // keep a bf16 copy of the experts for large batches (needs ~2× expert memory)
    int mxfp4_max_tokens = 32;        // batches up to this many tokens use the weight-only MXFP4 experts
                                      // (at most 4 where the grouped tensor-core kernels run)
    // MoE rows up to which the grouped tensor-core MXFP4 kernels (kernels/cuda/moe.h moe_mma) run
    // past the weight-only ones; above, per-expert cuBLAS(Lt) GEMMs. -1: 256 with a bf16 or FP8
    // expert copy, 2048 without; 0: off.
    int moe_mma_max_tokens = -1;
    // The warpgroup (wgmma) grouped MXFP4 kernels (kernels/cuda/moe.h moe_wgmma), where the widths
    // suit them, for batches past mma's range and for those whose experts average ≥ 64 rows:
    // -1 when no bf16 or FP8 expert copy is kept (with one, per-expert cuBLAS(Lt) was faster on the
    // H200: 20b 8k prefill 148 vs 225 ms), 1 always, 0 never. GPTOSS_MOE_WGMMA=0 or 1 overrides.
    int moe_wgmma = -1;
    // With fp8 and the FP8 expert copy: the grouped FP8 kernels (kernels/cuda/moe.h moe_fp8, e4m3
    // activation rows with one scale each, no host synchronisation) for the batches past mma's
    // range: -1 where the GPU and widths allow (sm_90a), 0 never (per-expert cuBLASLt W8A8 GEMMs,
    // activations per 1×128). GPTOSS_MOE_FP8_GROUPED=0 also turns it off.
    int moe_fp8_grouped = -1;
    // With fp8 and MXFP4 experts: keep the experts only as the FP8 copy (128×128 block scales, the
    // published H200 account's format), each layer's MXFP4 bytes dropped once converted, so every
    // batch takes the grouped FP8 kernels. gpt-oss-120b's copy (122 GB) fits only this way. For
    // prompt-heavy serving (a prefill instance): prompts run at the FP8 kernels' rate, decode reads
    // ~2x the MXFP4 bytes. Session 14, compiled only (bench/serve --fp8-experts). Ignored without
    // fp8 or for experts not stored as MXFP4; overrides moe_fp8_grouped = 0 / GPTOSS_MOE_FP8_GROUPED=0.
    bool fp8_experts = false;
    // With fp8 and no FP8 expert copy (gpt-oss-120b): batches of at least this many tokens take the
    // grouped FP8 GEMMs on the MXFP4 experts as they are (moe_mx below), or, with moe_mx off,
    // convert each layer's active experts to FP8 into one scratch (~3.4 GB for 120b) and take the
    // grouped FP8 kernels; smaller ones keep the MXFP4 kernels. -1: 512 with moe_mx, else 4096;
    // 0: never.
    // GPTOSS_MOE_FP8_JIT=0 turns the conversion off, GPTOSS_MOE_FP8_JIT_MIN_TOKENS sets the threshold.
    int moe_fp8_jit_min_tokens = -1;
    // Those batches on the MXFP4 experts themselves instead (moe_mxfp4_fp8; no conversion, no
    // scratch): 1 on, 0 off, -1 GPTOSS_MOE_MX's choice (on unless =0).
    int moe_mx = -1;
    // With fp8: decode batches (≤ 8 tokens) through moe_decode_wg (e4m3 activations in 1×128
    // blocks, the MXFP4 experts exact, wgmma; 1) instead of moe_decode_mma (bf16 activations; 0);
    // -1 GPTOSS_MOE_DECODE's choice (moe_decode_mma unless =4). r29: slower (kernels/cuda/moe.h).
    int moe_decode_wg = -1;
    // With fp8 and the FP8 experts in one array a projection: decode batches of up to this many MoE
    // rows through moe_decode_fp8 (the FP8 copy, e4m3 -> f16, f16 MMAs) instead of the MXFP4 kernels
    // or the grouped FP8 ones. -1: 1 where the FP8 copy is the only one (fp8_experts), else 0
    // (r50, batch-1 step: 20b 1.54 -> 1.70 ms beside MXFP4; 120b --fp8-experts 2.72 -> 2.49, batch 2
    // even); GPTOSS_MOE_DECODE_FP8_MAX_TOKENS overrides. At most kMoeDecodeMmaMaxTokens (8).
    int moe_decode_fp8_tokens = -1;
    // MXFP4 experts: a second copy in the decode layout (kernels/cuda/moe.h moe_pack_decode: each decode warp's
    // loads 512 contiguous bytes, its words in a bit order that takes 8 integer ops to bf16 instead of 13) read by
    // the tensor-core decode kernels (≤ 8 tokens), where it fits with 8 GiB to spare; the prompt kernels keep the
    // published layout. 1 on, 0 off, -1 GPTOSS_MOE_PACKED's choice (1 / 0); unset, on where the copy is at most an
    // eighth of the GPU's memory (20b on an H200). r81 (H100, 20b): batch 1 −0.8%, 2 −0.7%, 4 −6.3%, 8 equal.
    int moe_decode_packed = -1;
    // With fp8, one token a step on one GPU: the residual update after each layer's MoE in the down
    // launch (kernels/cuda/moe.h MoeResidualTail) and the next layer's norm scale in its QKV GEMV,
    // instead of a norm kernel between them. GPTOSS_MOE_TAIL=0 turns it off (A/B runs).
    bool moe_residual_tail = true;
    // With fp8, one sequence decoding: the attention inside the QKV kernel (kernels/cuda/gemv.h QkvAttnTailArgs)
    // instead of its own launch: 1 in sliding layers, 2 in every layer (full ones while the table holds at most
    // 2,048 keys), 0 off. -1: GPTOSS_QKV_ATTN_TAIL if set, else 1 (r58: 20b batch 1 at 1k 1.389-1.407 -> 1.362-1.369
    // ms, 120b 2.058 -> 2.016; mode 2 was 12-15% slower: one CTA walking ~1,000 keys).
    int qkv_attn_tail = -1;
    // ParallelCudaModel: small fp32 all-reduces (decode's per-layer TP and MoE reductions) through
    // the one-shot peer kernel (kernels/cuda/peer_allreduce.h) instead of NCCL. Also
    // GPTOSS_PEER_ALLREDUCE=1. Needs peer access between the GPUs.
    bool peer_allreduce = false;
    bool defer_kv_cache = false;  // allocate the KV cache later, with allocate_kv_cache()
    // FP8 e4m3 with 128×128 block scales (power-of-two, kernels/cuda/fp8_gemm.h) for the QKV, O and
    // lm_head weights, quantized from bf16 at load: weight-only FP8 GEMVs at decode (fp32
    // activations), W8A8 cuBLASLt GEMMs (activations per 1×128) for larger batches. MXFP4 experts
    // also get an FP8 copy (lossless) for batches above mxfp4_max_tokens, in place of the bf16 copy
    // (or one expert at a time when the copy does not fit). Off: the bf16 path.
    bool fp8 = false;
    // The paged KV cache in FP8 e4m3 (scale 1, values rounded to nearest and saturated to ±448, as
    // vLLM's --kv-cache-dtype fp8 without calibrated scales) instead of bf16: half the cache bytes
    // per token, read and written by the attention kernels (kernels/args/paged_attention_args.h).
    bool kv_fp8 = false;
    int device = -1;  // CUDA device (-1: the calling thread's current one)
    // Parallel rank (model/parallel_cuda_model.h): the weights are this rank's shard and these
    // NCCL communicators join the ranks' forward passes. Null: the whole model on one GPU.
    parallel::RankComms* comms = nullptr;
};

// Whether the decode-layout copy of the MXFP4 experts is made (CudaModelOptions::moe_decode_packed): want 1 (asked),
// 0 (refused) or -1 (unasked: only a copy of at most an eighth of the GPU's memory, which leaves the KV cache most of
// its room), given the copy's bytes, all that the model's load still needs with it (8 GiB to spare included) and the
// GPU's free and total bytes.
inline bool moe_decode_packed_choice(int want, double copy_bytes, double need_bytes, double free_bytes,
                                     double total_bytes) {
    if (want == 0 || need_bytes > free_bytes) return false;
    return want == 1 || copy_bytes <= total_bytes / 8;
}

class CudaModel {
public:
    static StatusOr<std::unique_ptr<CudaModel>> create(const GptOssWeights& weights, const CudaModelOptions& options);
    ~CudaModel();

    // With defer_kv_cache: allocates the paged cache (bf16 or, with kv_fp8, e4m3 K and V per layer). Once.
    Status allocate_kv_cache(int block_size, int num_blocks_full, int num_blocks_sliding);
    // Free device memory now (0 without a device), on the current device or on `device`.
    static size_t free_device_memory();
    static size_t free_device_memory(int device);
    // The current device's whole memory (0 without a device).
    static size_t total_device_memory();

    // The host-side checks forward() starts with (batch and token limits, token ids, positions,
    // block tables against the given block counts; -1 = this model's), without running anything.
    // The parallel driver runs them for every DP group before any rank starts a step.
    Status validate(std::span<const ForwardSequence> seqs, bool sample, int blocks_full = -1,
                    int blocks_sliding = -1) const;

    // Same contract as CpuForward::forward (block ids index this model's KV cache); logits are
    // copied to host.
    // dp_max_tokens: under DP (options.comms), the most new tokens any DP group runs this step (the
    // experts see every group's tokens, padded to this); ignored otherwise.
    Status forward(std::span<const ForwardSequence> seqs, std::vector<float>* logits, int dp_max_tokens = 0);

    // Per-sequence sampling parameters for forward_sample (see kernels/cuda/sampling.h).
    struct SampleParams {
        float temperature = 0.0f;  // 0: greedy
        float top_p = 1.0f;
        int top_k = 0;
        uint64_t seed = 0;
        uint64_t draw_index = 0;
        bool return_logits = false;  // also copy this row's logits to the host (the caller samples it)
        float min_p = 0.0f;          // sample_again only: drop tokens below min_p times the most probable one's
    };
    // sample_again's edits of a row before its draw: the host sampler's bias and penalties in its order (see
    // runtime/sampler.h LogitEdits, whose fields these are).
    struct LogitEdits {
        std::vector<std::pair<int32_t, float>> add;
        std::vector<int32_t> repeat;
        float repetition = 1.0f;
        std::vector<std::pair<int32_t, float>> subtract;
    };
    // Runs the batch and samples one token per sequence on the device (only the ids come back, and
    // with `logits` the rows whose params ask for them, appended in sequence order). Every
    // sequence's all_logits must be false.
    Status forward_sample(std::span<const ForwardSequence> seqs, std::span<const SampleParams> params,
                          std::vector<int32_t>* ids, int dp_max_tokens = 0, std::vector<float>* logits = nullptr);
    // Draws again, on the device and under masks, rows of the last forward_sample: rows[i] is a sequence index of
    // that call, drawn with params[i] (return_logits ignored); with `bits` (rows.size() · ⌈V / 32⌉ words, V the
    // vocabulary) token t of row i may be drawn only where bit t % 32 of word i · ⌈V / 32⌉ + t / 32 is set: the
    // host sampler's masked draw (the rest at -inf) on the device's noise. ids[i] = -1 where the row holds a NaN
    // or infinity or its mask allows nothing. Valid only right after forward_sample on a model of one GPU (no
    // comms) with at most 256 sequences, whose logits stay on the device until the next forward: else an error.
    // `edits` (empty, or one a row) first change the rows in place, bit for bit as the host sampler would (the rows
    // cannot be drawn again after an edit).
    Status sample_again(std::span<const int> rows, std::span<const SampleParams> params, std::span<const uint32_t> bits,
                        std::span<const LogitEdits> edits, std::vector<int32_t>* ids);
    // Fills the KV cache with random bf16 values (benchmarks that pretend a context is cached).
    void fill_kv_random(uint64_t seed);
    // Disaggregated prefill (runtime/kv_transfer.h): copies blocks of one pool (`sliding`) between the cache and
    // host memory, block ids[i] <-> bytes [i·B, (i+1)·B) with B = 2 · (layers of the pool) · (bytes of one
    // layer's K of a block): for each layer of the pool in order, K then V. write skips ids < 0. Synchronous.
    Status read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out);
    Status write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* in);

    const GptOssConfig& config() const;
    int block_size() const;
    int num_blocks(bool sliding) const;
    // Device bytes held by weights, KV cache and activations.
    size_t weight_bytes() const;
    size_t kv_cache_bytes() const;
    // With GPTOSS_STEP_EVENTS=1, the last forward_sample's device span in ms (its upload to its ids'
    // copy back, by timing events); -1 otherwise.
    float last_step_span_ms() const;

    struct Impl;

private:
    explicit CudaModel(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// True when this build has the CUDA backend and a device is visible.
bool cuda_available();
// Visible CUDA devices (0 without the CUDA backend).
int cuda_device_count();

}  // namespace gptoss::model
