// MoE on the CUDA backend: router (fp32 logits, top-k, softmax over the k), routing plans, the
// weight-only MXFP4 expert kernels for small batches (decode), and the pieces of the bf16 grouped
// path for large batches (prefill: gather → per-expert GEMM → SwiGLU → GEMM → scatter).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

// logits = h · Wrᵀ + b in fp32 (h fp32 for decision stability near ties), then top-k (ties to the
// lower index) and softmax over the k chosen.
struct RouterTopkArgs {
    const float* h = nullptr;         // [num_tokens, hidden_size] fp32
    const void* weight = nullptr;     // [num_experts, hidden_size] bf16
    const float* bias = nullptr;      // [num_experts]
    int32_t* expert_ids = nullptr;    // [num_tokens, experts_per_token]
    float* expert_weights = nullptr;  // [num_tokens, experts_per_token]
    int num_tokens = 0;
    int hidden_size = 0;
    int num_experts = 0;
    int experts_per_token = 0;
    // fp32 scratch of router_topk_scratch(num_tokens, num_experts) floats: with it the logits are a
    // tiled kernel's (split over K for small batches) and the selection a warp per token; without
    // it (or a hidden size not a multiple of 32) one CTA per token does both (slow: ~0.3 ms a layer
    // at 256 tokens, H200).
    float* logits = nullptr;
    // With logits: the logits on the tensor cores (fp32 h split into bf16 hi + lo, ~2^-16 relative
    // to Σ|h·w|) instead of fp32 FMAs; ≤ 128 experts and hidden_size % 64 == 0 (else the fp32
    // kernel). The model's default (r25, r26).
    bool tensor_cores = false;
    // With both set, h is the residual stream x and the router's rows are (x · norm_inv_rms[t]) ·
    // norm_weight, the bits residual_rmsnorm would write as out_f32 (ResidualRmsNormArgs::
    // out_inv_rms): the norm skips that [tokens, hidden] fp32 write. Only where
    // router_topk_normalizes says so (the tensor-core logits).
    const float* norm_inv_rms = nullptr;  // [num_tokens]
    const float* norm_weight = nullptr;   // [hidden_size]
};
void router_topk(const RouterTopkArgs& args, cudaStream_t stream);
bool router_topk_normalizes(int num_experts, int hidden_size, bool tensor_cores);
// Floats of router_topk's scratch for up to num_tokens tokens, and the K splits it uses.
int64_t router_topk_scratch(int num_tokens, int num_experts);
int router_topk_splits(int num_tokens, int num_experts, int hidden_size, bool tensor_cores = false);
// Router logits for decode-sized batches (num_tokens <= 8): one CTA per expert row, the hidden
// dimension split over its threads (a 32-row GEMV with one warp per row leaves the GPU idle).
// logits[t, e] = h[t] · W[e] (no bias: topk_softmax adds it).
void router_logits_small(const float* h, const void* weight, int num_tokens, int hidden_size, int num_experts,
                         float* logits, cudaStream_t stream);
// The same selection from precomputed logits [num_tokens, num_experts] (bias not yet added).
void topk_softmax(const float* logits, const float* bias, int num_tokens, int num_experts, int experts_per_token,
                  int32_t* expert_ids, float* expert_weights, cudaStream_t stream);

// Decode router in one launch (num_tokens <= 8): logits (+ bias) -> top-k (ties to the lower
// index) -> softmax over the k -> the stable routing plan of moe_plan. One CTA per expert row
// computes that row's logits for every token; the last CTA to finish (a ticket counter) selects
// and plans. Replaces router_logits_small + topk_softmax + moe_plan (three launches and a
// single-thread selection) on the decode path.
struct RouterPlanSmallArgs {
    const float* h = nullptr;               // [num_tokens, hidden_size] fp32
    const void* weight = nullptr;           // [num_experts, hidden_size] bf16
    const float* bias = nullptr;            // [num_experts]
    float* logits = nullptr;                // [num_tokens, num_experts] scratch: logits with the bias
    int32_t* expert_ids = nullptr;          // [num_tokens, experts_per_token], by descending logit
    float* expert_weights = nullptr;        // [num_tokens, experts_per_token]
    int32_t* expert_offsets = nullptr;      // [num_experts + 1]
    int32_t* sorted_assignments = nullptr;  // [num_tokens · experts_per_token], stable
    uint32_t* counter = nullptr;            // one word, zero before the first call; every call leaves it zero
    int num_tokens = 0;                     // 1 .. 8
    int hidden_size = 0;                    // multiple of 8, at most 4096
    int num_experts = 0;                    // at most 256
    int experts_per_token = 0;              // at most 8
    // Optional (residual != nullptr): the post-attention residual update and RMSNorm, fused in
    // place of a residual_rmsnorm launch. v = residual + add + add_bias (add_bias may be null),
    // h = v · rsqrt(mean(v²) + eps) · norm_weight; the logits are computed from h (the h field above
    // is then unused). The CTAs split the chunks of v (written to residual_out, which must not be
    // residual: other CTAs still read it), h (h_out, fp32) and, if set, h_bf16_out (bf16).
    const float* residual = nullptr;  // [num_tokens, hidden_size]
    const float* add = nullptr;       // [num_tokens, hidden_size]
    const float* add_bias = nullptr;  // [hidden_size]
    const float* norm_weight = nullptr;
    float eps = 1e-5f;
    float* residual_out = nullptr;
    float* h_out = nullptr;
    void* h_bf16_out = nullptr;
    // The cluster kernel's CTAs at most: 8 (the portable size); 16 = up to 16 (a non-portable
    // cluster, 8 experts a CTA for 65-128 experts: half the rows each CTA stages; where the device
    // cannot schedule it, 8); 0 = GPTOSS_ROUTER_CLUSTER's choice (16 unless it says 8; r38 call 1:
    // 120b batch 1 2.48 → 2.40 ms a step with 16).
    int cluster_ctas = 0;
};
void router_plan_small(const RouterPlanSmallArgs& args, cudaStream_t stream);

// Groups the num_assignments = num_tokens·k assignments (index t·k + slot) by expert:
// expert_offsets[E + 1] (exclusive prefix sums of counts) and sorted_assignments[num_assignments],
// in assignment order inside an expert (a stable sort: deterministic). E ≤ 257 (256 experts and an
// EP plan's bucket for other ranks' experts); every id in [0, E).
void moe_plan(const int32_t* expert_ids, int num_assignments, int num_experts, int32_t* expert_offsets,
              int32_t* sorted_assignments, cudaStream_t stream);

// Weight-only MXFP4 experts for small batches. Every expert's weights are read from memory once per
// call, whatever number of tokens chose it (up to 4 tokens per pass; an expert with more tokens
// re-reads a 128-row tile from L2 per further pass). Two launches (gate_up + SwiGLU into act, then
// down into y) on a persistent grid whose size does not depend on the routing: graph-capturable.
// The decode step's residual update after the MoE at one token, fused into the down launch (session 36):
// instead of a norm kernel between the MoE and the next layer's QKV GEMV, the last down CTA of each
// 16-element tile of the hidden row (a ticket a tile; one CTA an active expert) updates
// x[i] += Σ_k w_k · y_k[i] (k in order, fused multiply-adds: residual_rmsnorm's arithmetic) for its 16
// elements, writes h[i] = bf16(x[i] · gain[i]) (the next norm's output before its 1 / rms) and the
// tile's Σ x[i]² to ss_parts[tile]. The consumer (GemvArgs::x_ss_parts) scales its sums by
// 1 / rms = rsqrt(Σ ss_parts / hidden + eps), which is linear, so the GEMV of h times 1 / rms is the
// GEMV of the normed row. num_tokens == 1, hidden_size % 16 == 0. Where the chosen decode kernel has no
// ticket (the fp32 weight-only kernels, moe_decode_wg), moe_mxfp4 runs moe_residual_tail after it.
struct MoeResidualTail {
    float* x = nullptr;              // [hidden_size] the residual row, updated in place
    const float* weights = nullptr;  // [experts_per_token] the routing weights of the token's assignments
    const float* gain = nullptr;     // [hidden_size] the next norm's weight
    void* h = nullptr;               // [hidden_size] bf16 out: x · gain
    float* ss_parts = nullptr;       // [hidden_size / 16] Σ x² of each tile
    uint32_t* counters = nullptr;    // [hidden_size / 16] tickets, zero between launches (left zero)
};
inline constexpr int kMoeTailTile = 16;

struct MoeMxfp4Args {
    const void* h = nullptr;                      // [num_tokens, hidden_size] bf16 (post-norm)
    const float* h_f32 = nullptr;                 // same rows in fp32; used instead of h when set
    const int32_t* expert_offsets = nullptr;      // [num_experts + 1]
    const int32_t* sorted_assignments = nullptr;  // [num_tokens · k]
    const uint8_t* gate_up_blocks = nullptr;      // [E, 2I, H/32, 16]
    const uint8_t* gate_up_scales = nullptr;      // [E, 2I, H/32]
    const float* gate_up_bias = nullptr;          // [E, 2I]
    const uint8_t* down_blocks = nullptr;         // [E, H, I/32, 16]
    const uint8_t* down_scales = nullptr;         // [E, H, I/32]
    const float* down_bias = nullptr;             // [E, H]
    float* act = nullptr;                         // [num_tokens · k, I] scratch: SwiGLU output per assignment
    float* y = nullptr;                           // [num_tokens · k, H] expert outputs (bias included)
    int num_tokens = 0;
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_experts = 0;
    int experts_per_token = 0;
    float swiglu_limit = 7.0f;
    float swiglu_alpha = 1.702f;
    // -1: GPTOSS_MOE_DECODE's choice (default 1); 1: the tensor-core kernel (moe_decode_mma) where
    // it applies (≤ 8 tokens), else the fp32 weight-only kernels; 4: moe_decode_wg there instead;
    // 0: always the fp32 kernels.
    int kernel = -1;
    // The FP8 copy of the experts for moe_decode_fp8 (MoeFp8Args' layout: e4m3 [E, n, k_pad], zero
    // past k, and 128×128 block scales [E, ⌈n/128⌉, k_pad/128]); the MXFP4 fields above are then unused.
    const uint8_t* gate_up_f8 = nullptr;
    const float* gate_up_f8_scale = nullptr;
    int gate_up_k_pad = 0;
    const uint8_t* down_f8 = nullptr;
    const float* down_f8_scale = nullptr;
    int down_k_pad = 0;
    // Optional (tail.x set): the residual update after the down projection (MoeResidualTail).
    MoeResidualTail tail;
    // moe_decode_mma's gate_up at 1-2 tokens as a loop over tiles on the resident grid
    // (moe_decode_mma_loop_kernel, session 37; the same bits as one tile a CTA): 1 on, 0 off, -1
    // GPTOSS_MOE_LOOP's choice (on unless =0). decode_loop_grid: its CTAs (0: the resident ones; a test
    // sets fewer).
    int decode_loop = -1;
    int decode_loop_grid = 0;
    // The same for down (moe_decode_mma_down_loop_kernel, session 37; run in session 38): 1 on at 1-2 tokens,
    // 0 off, -1 GPTOSS_MOE_DOWN_LOOP's choice (unset: at 2 tokens only; =1 at 1-2; =0 never).
    // decode_loop_grid applies to it too.
    int decode_down_loop = -1;
    // The gate_up loop kernel's first-tile requests spread over this many ns (CTA b sleeps b / grid of it
    // before its first weight loads, so that DRAM serves the first tiles in an order rather than all of them
    // interleaved and late): -1 GPTOSS_MOE_STAGGER_NS's value (unset: 2,000 at one token, 0 at two), 0 none.
    // Timing only, the same bits (session 40; r55 measured 20b batch 1 −9 to −23 µs a step, 120b −8).
    int decode_stagger_ns = -1;
    // Set by the launcher only (GPTOSS_MOE_STAMPS=path, a timing diagnostic; session 41): this launch's rows of
    // the stamp buffer ([CTA][kMoeStampEvents] %globaltimer ns), written by thread 0 of every CTA of the
    // stamping instantiations of the gate_up loop and one-tile down kernels; dumped to the path at exit.
    unsigned long long* stamps = nullptr;
    // Optional: the same experts in the decode layout (moe_pack_decode), read instead of the blocks / scales above
    // by the tensor-core decode kernels (moe_decode_mma, ≤ 8 tokens); every other kernel reads the published layout.
    // All four set, or none used.
    const uint8_t* gate_up_packed = nullptr;         // [E · 2I / 16 tiles][⌈H/128⌉ steps][64 chunks][16 bytes]
    const uint8_t* gate_up_packed_scales = nullptr;  // [E · 2I / 16 tiles][⌈H/128⌉ steps][64 bytes]
    const uint8_t* down_packed = nullptr;            // [E · H / 16][⌈I/128⌉][64][16]
    const uint8_t* down_packed_scales = nullptr;     // [E · H / 16][⌈I/128⌉][64]
};
inline bool moe_decode_packed(const MoeMxfp4Args& a) {
    return a.gate_up_packed != nullptr && a.gate_up_packed_scales != nullptr && a.down_packed != nullptr &&
           a.down_packed_scales != nullptr;
}
// The decode layout of MXFP4 weights [rows][groups][16 bytes] with scales [rows][groups] (rows a multiple of 16):
// 16-row tiles, each as S = ⌈groups / 4⌉ steps of 4 groups, a step's 16 × 4 code words as 64 chunks of 16 bytes:
// chunk l = 4g + t holds row g's group 4s + t and chunk 32 + l row g + 8's (g < 8, t < 4); its scales as 64 bytes,
// (row g, row g + 8) of group 4s + t at 2l. A decode warp's lane l then reads chunks l and 32 + l and the scale
// pair 2l of each of its steps: 512 contiguous bytes a load instruction. The slots past the last group (groups not
// a multiple of 4) are zero and never read. Each 4-byte code word is stored in the decode bit order
// (kernels/mxfp4_bits.h e2m1x8_to_decode_bits: 8 integer ops a word to bf16 instead of 13; session 69).
// Sizes: moe_packed_decode_bytes (codes, or scales).
int64_t moe_packed_decode_bytes(int64_t rows, int groups, bool scales);
void moe_pack_decode(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int groups, uint8_t* packed_blocks,
                     uint8_t* packed_scales, cudaStream_t stream);
inline constexpr int kMoeStampEvents = 16;
// The residual update of MoeResidualTail alone, from y (the down projection's output rows of the
// token's experts_per_token assignments): one CTA a tile.
void moe_residual_tail(const MoeResidualTail& tail, const float* y, int hidden_size, int experts_per_token,
                       cudaStream_t stream);
// Batches of up to 8 tokens: moe_decode_mma (bf16 activations, fp32 accumulation on the tensor
// cores) unless kernel / GPTOSS_MOE_DECODE=0 says otherwise; else fp32 weight-only kernels.
void moe_mxfp4(const MoeMxfp4Args& args, cudaStream_t stream);
inline constexpr int kMoeDecodeMmaMaxTokens = 8;
bool moe_decode_mma_supported(const MoeMxfp4Args& args);
void moe_decode_mma(const MoeMxfp4Args& args, cudaStream_t stream);
// The same batches with e4m3 activations (W4A8) on wgmma m64n8k32: each token row (h for gate_up,
// the fp32 act for down) quantized in 1×128 blocks (scale amax / 448, round to nearest even), the
// MXFP4 weights exact, a k32 wgmma a group of every row, the group and block scales applied in
// fp32; a CTA one warpgroup over 64 rows and all of K. MoeMxfp4Args::kernel = 4 /
// GPTOSS_MOE_DECODE=4. Rows a multiple of 64, K ≤ 4,096. Opt-in: r29 measured it slower than
// moe_decode_mma (20b batch 1 2.310 vs 1.872 ms a step; too few bytes in flight a CTA). Its
// mma.sync form (moe_decode_w4a8, e4m3 MMAs emulated on sm_90) was slower still and is removed.
// The same batches on the FP8 copy of the experts (gate_up_f8 and down_f8 set): 16-row tiles of the
// active experts, e4m3 -> f16 in registers (one instruction a pair), the input rows rounded to bf16
// and staged as f16, f16 MMAs with fp32 sums, the block scales in fp32 (moe_decode.cu). Twice
// MXFP4's bytes for a fraction of moe_decode_mma's instructions. H and I multiples of 64, ≤ 3,072.
bool moe_decode_fp8_shapes_ok(int hidden, int inter, int num_experts);
bool moe_decode_fp8_supported(const MoeMxfp4Args& args);
void moe_decode_fp8(const MoeMxfp4Args& args, cudaStream_t stream);
bool moe_decode_wg_supported(const MoeMxfp4Args& args);
void moe_decode_wg(const MoeMxfp4Args& args, cudaStream_t stream);

// Grouped expert GEMMs on the tensor cores for batches past the weight-only kernels (moe_mma.cu):
// MXFP4 weights dequantized in registers, bf16 activations, fp32 accumulation; no host
// synchronisation (graph-capturable). Per layer: moe_plan, moe_mma_tiles, moe_mma(gate_up: SwiGLU
// into act), moe_mma(down: + bias into y at each assignment's row).
inline constexpr int kMaxMoeMmaExperts = 256;
// Rows per tile: 16 (decode-sized batches: a few rows per expert) or 64.
int moe_mma_block_rows(bool large);
// n % 64 == 0, k % 32 == 0, k ≤ 4096, num_experts ≤ kMaxMoeMmaExperts.
bool moe_mma_supported(int n, int k, int num_experts);
// tiles[2i], tiles[2i + 1] = (expert, row tile) for every block_rows rows of each expert, in expert
// order; *tile_count = their number (at most max_tiles = ceil(assignments / block_rows) + experts).
void moe_mma_tiles(const int32_t* expert_offsets, int num_experts, int block_rows, int max_tiles, int32_t* tiles,
                   int32_t* tile_count, cudaStream_t stream);
struct MoeMmaArgs {
    const void* x = nullptr;  // gate_up: h bf16 [tokens, k] (row of assignment i: sorted[i] / experts_per_token);
                              // down: act bf16 [assignments, k] in sorted order (row i)
    bool x_by_token = true;
    int experts_per_token = 4;
    const int32_t* expert_offsets = nullptr;      // [num_experts + 1]
    const int32_t* sorted_assignments = nullptr;  // [assignments]
    const int32_t* tiles = nullptr;               // from moe_mma_tiles
    const int32_t* tile_count = nullptr;
    int max_tiles = 0;   // the grid's tile rows (the bound passed to moe_mma_tiles)
    bool large = false;  // 64-row tiles (else 16); the same as given to moe_mma_tiles
    // 16-row tiles (where n % 192 == 0; else always 0): -1 = GPTOSS_MOE_MMA_V4's choice (default
    // 5); 0 = the shared-memory kernel (cp.async weights, ldmatrix activations); 2 = weights straight
    // into registers; 3 = the same built for 3 CTAs an SM; 5 = weights landing per lane in shared
    // memory by cp.async (3 CTAs an SM; ~8% faster than 2, r21). For A/B runs and tests.
    int small_kernel = -1;
    const uint8_t* blocks = nullptr;  // [E, n, k/32, 16]
    const uint8_t* scales = nullptr;  // [E, n, k/32]
    const float* bias = nullptr;      // [E, n]
    void* act = nullptr;              // gate_up: bf16 [assignments, n/2]
    float* y = nullptr;               // down: fp32 [assignments, n], row = assignment index
    int n = 0, k = 0, num_experts = 0;
    int num_rows = 0;                // rows of x when !x_by_token (the warp-specialized moe_wgmma's tensor map)
    const float* x_scale = nullptr;  // moe_w4a8: x is e4m3 rows (moe_quant_rows_fp8), one scale per row
    float swiglu_limit = 7.0f;
    float swiglu_alpha = 1.702f;
};
void moe_mma(const MoeMmaArgs& args, bool gate_up, cudaStream_t stream);

// The same grouped GEMMs for prefill-sized batches on Hopper's warpgroup tensor cores
// (moe_wgmma.cu; sm_90a): weights as the register operand (dequantized MXFP4), activation tiles of
// `block_tokens` rows (16, 32, 64 or 128; the block_rows given to moe_mma_tiles) from shared memory.
// MoeMmaArgs as for moe_mma (`large` unused).
// n % 192 == 0, k % 32 == 0, k ≤ 4096, num_experts ≤ kMaxMoeMmaExperts.
bool moe_wgmma_supported(int n, int k, int num_experts);
// Tile rows for a batch: 128 once experts average ≥ 96 rows, 64 above 32, else 32 or 16.
int moe_wgmma_block_tokens(int assignments, int num_experts);
// warp_specialized: a producer warp feeds the tensor cores by TMA through per-stage mbarriers
// (needs x in tile-row order, x_by_token false and num_rows set: gather first with moe_gather).
void moe_wgmma(const MoeMmaArgs& args, bool gate_up, int block_tokens, cudaStream_t stream,
               bool warp_specialized = false);

// W4A8 (not yet run on a GPU; GPTOSS_MOE_W4A8=1): the same grouped GEMMs with FP8 wgmma, the
// MXFP4 weights dequantized to e4m3 in registers, activations e4m3 rows with one scale per row
// (x_scale; x_by_token false) from moe_quant_rows_fp8. block_tokens 32 or 64; moe_wgmma's widths.
void moe_w4a8(const MoeMmaArgs& args, bool gate_up, int block_tokens, cudaStream_t stream);
// xq[i] = e4m3(x[row i] / xs[i]), xs[i] = amax(x[row i]) / 448, elements in moe_w4a8's order inside
// each 32-element group; row i is sorted[i] / experts_per_token when by_token, else i. dim % 32 == 0.
void moe_quant_rows_fp8(const void* x, bool by_token, const int32_t* sorted, int experts_per_token, int rows, int dim,
                        uint8_t* xq, float* xs, cudaStream_t stream);

// FP8 experts (W8A8, sm_90a; moe_fp8.cu): the grouped GEMMs for prefill-sized batches when the
// experts are held as e4m3 with 128×128 block scales (kernels/cuda/fp8_gemm.h's Fp8Weight layout,
// all experts in one allocation) and the activation rows as e4m3 with one scale per row
// (moe_fp8_quant_rows). Tiles of kMoeFp8BlockTokens rows (moe_mma_tiles with that block_rows).
constexpr int kMoeFp8BlockTokens = 128;
struct MoeFp8Args {
    const uint8_t* xq = nullptr;     // e4m3 [num_rows, k] in tile-row (sorted) order
    const float* x_scale = nullptr;  // [num_rows], or null: every row's scale is x_scale_value
    float x_scale_value = 1.0f;
    int num_rows = 0;
    const int32_t* expert_offsets = nullptr;      // [num_experts + 1]
    const int32_t* sorted_assignments = nullptr;  // [assignments] (down: y's row of tile row i)
    const int32_t* tiles = nullptr;               // moe_mma_tiles(block_rows = kMoeFp8BlockTokens)
    const int32_t* tile_count = nullptr;
    int max_tiles = 0;
    const uint8_t* wq = nullptr;     // e4m3 [num_experts, n, k_pad] (zero past k)
    const float* w_scale = nullptr;  // [num_experts, ⌈n/128⌉, k_pad/128]
    const float* bias = nullptr;     // [num_experts, n]
    void* act = nullptr;             // gate_up: bf16 [num_rows, n/2], SwiGLU of rows (2j, 2j + 1)
    // gate_up: instead of act, e4m3 [num_rows, n/2] of SwiGLU · act_q_inv_scale (one scale for every
    // row, moe_fp8_act_scale: the clamped SwiGLU is bounded), ready for the down launch.
    uint8_t* act_q = nullptr;
    float act_q_inv_scale = 0.0f;
    float* y = nullptr;  // down: fp32 [assignments, n], row = assignment index
    // down: y holds bf16 instead (the residual norm reads it as ResidualRmsNormArgs::add_bf16): half
    // the bytes of the largest prefill tensor written and read again (8k tokens: 377 -> 189 MB a
    // layer each way); y's rounding to bf16 (2^-9 relative) is far below the FP8 weights' error.
    bool y_bf16 = false;
    int n = 0, k = 0, k_pad = 0, num_experts = 0;
    float swiglu_limit = 7.0f;
    float swiglu_alpha = 1.702f;
    // Consumer warpgroups a CTA (64 features each): 0 = the default (3), or 2 or 3 (tests, A/B).
    int warpgroups = 0;
    // One CTA an SM looping over the work items (epilogues overlap the next item's loads), instead
    // of one CTA an item (r24: 2,434 -> 2,354 us a layer at 8k tokens; the model sets it).
    bool persistent = false;
    int persistent_ctas = 0;  // its grid: 0 = one CTA an SM; tests set a few so each CTA loops
    // The persistent kernels (moe_fp8's, moe_mxfp4_fp8) run an item of fewer than 128 tile rows (an
    // expert's last tile) with m64nN wgmmas: N the rows rounded up to a multiple of 32, or to 8 or
    // 16 where narrow_min allows (bit-identical sums; less tensor work where experts have few rows
    // past a multiple of 128, as 120b's ~256 at 8k tokens, or at decode). narrow_min: the narrowest
    // N, 32 (measured, r30), 8 (16 and 8 too: session 15, compiled only) or 0 (always 128).
    int narrow_min = 32;
    // moe_mxfp4_fp8 (the same GEMMs on the MXFP4 experts as published; wq and w_scale unused): the
    // blocks [num_experts, n, k/2] (two e2m1 codes a byte, the even element in the low nibble)
    // and e8m0 scales [num_experts, n, k/32]. xq is then [num_rows, k_pad] in the MX K order
    // (moe_mx_k_position), written by moe_fp8_quant_rows_mx or by a gate_up with act_mx_order.
    const uint8_t* w_mx = nullptr;
    const uint8_t* w_mx_scale = nullptr;
    // gate_up's act_q in the MX K order, rows act_q_stride (the down's k_pad) bytes apart; the
    // positions of the last 128-block past n/2 are not written (the caller zeroes them).
    bool act_mx_order = false;
    int act_q_stride = 0;
};
// The MX K order: within each 128-wide block of K, element p (the weights' order) sits at
// position moe_mx_k_position(p) of the activation row, so that in the kernel's register A
// fragments lane t of a quad holds only elements of the row's MXFP4 group t of the block (one
// scale a lane and row). p = 32·t + 8·s + 4·h + j goes to 32·s + 16·h + 4·t + j (s: the k32
// step, h: the fragment's half, j: the byte in its register).
inline constexpr int moe_mx_k_position(int p) {
    const int q = p & 127, t = q >> 5, s = (q >> 3) & 3, h = (q >> 2) & 1, j = q & 3;
    return (p & ~127) + 32 * s + 16 * h + 4 * t + j;
}
// The one scale of act_q for a SwiGLU clamped at swiglu_limit (a power of two with the bound
// (limit + 1) · limit inside ±448: 1/8 for gpt-oss's 7), or 0 when the limit is not finite.
float moe_fp8_act_scale(float swiglu_limit);
// n % 16 == 0, k % 16 == 0, k ≤ k_pad (a multiple of 128), k ≤ 8,192, num_experts ≤
// kMaxMoeMmaExperts, and the driver's tensor-map encoder present.
bool moe_fp8_supported(int n, int k, int k_pad, int num_experts);
void moe_fp8(const MoeFp8Args& args, bool gate_up, cudaStream_t stream);
// The same grouped GEMMs on the experts' bf16 copy (session 8, compiled only, not yet run): xq and
// wq hold bf16 (x rows [num_rows, k] in tile-row order, weights [num_experts, n, k]; k_pad = k),
// w_scale and x_scale unused (x_scale null, x_scale_value 1), gate_up writes bf16 act. fp32
// accumulation, no host synchronisation. k % 8 == 0.
void moe_bf16_grouped(const MoeFp8Args& args, bool gate_up, cudaStream_t stream);
// xq[i] = e4m3(x[row i] / xs[i]) (round to nearest even, saturating), xs[i] = amax(x[row i]) / 448
// (1 for a zero row); row i is sorted[i] / experts_per_token when by_token, else i. x bf16,
// dim % 16 == 0, dim ≤ 8,192.
void moe_fp8_quant_rows(const void* x, bool by_token, const int32_t* sorted, int experts_per_token, int rows, int dim,
                        uint8_t* xq, float* xs, cudaStream_t stream);
// The same rows in the MX K order, [rows, dim_pad] (dim_pad: dim rounded up to 128; the
// positions of elements past dim hold 0).
void moe_fp8_quant_rows_mx(const void* x, bool by_token, const int32_t* sorted, int experts_per_token, int rows,
                           int dim, int dim_pad, uint8_t* xq, float* xs, cudaStream_t stream);
// The bytes of moe_fp8_quant_rows(x, by_token = true, ...) (mx: of moe_fp8_quant_rows_mx) from
// the token rows quantized once, xq_tok [tokens, dim] and xs_tok [tokens] (what
// moe_fp8_quant_rows(x, by_token = false) writes; ResidualRmsNormArgs::out_row_q): row i is token
// row sorted[i] / experts_per_token, copied (mx: moved into the MX K order, dim_pad bytes a row,
// zeros past dim). At 8k tokens this reads the token rows ~4 times from L2 instead of x's bf16 rows
// from DRAM. dim % 16 == 0, dim ≤ 8,192.
void moe_fp8_gather_rows(const uint8_t* xq_tok, const float* xs_tok, const int32_t* sorted, int experts_per_token,
                         int rows, int dim, bool mx, int dim_pad, uint8_t* xq, float* xs, cudaStream_t stream);
// Grouped GEMMs of FP8 activation rows with the MXFP4 experts themselves (sm_90a; session 12,
// compiled only): the packed weights by TMA (12 KB a stage for 192 rows × 128 of K, against FP8's
// 24 KB), converted in the consumer warps to e4m3 register A operands of wgmma (each lane's codes
// share one group scale; the group's offset from the row's largest scale in the block folded into
// the e4m3 values, exact while it is ≤ 8, and the row's 2^(max − 127) applied when the block's
// sums are promoted). Otherwise moe_fp8's persistent kernel: the same epilogues, biases and act_q.
// No conversion of the experts to FP8 first (the 120b path converted each layer's active experts).
// n % 16 == 0, k % 32 == 0, k_pad = k rounded up to 128 ≤ 8,192.
bool moe_mxfp4_fp8_supported(int n, int k, int num_experts);
void moe_mxfp4_fp8(const MoeFp8Args& args, bool gate_up, cudaStream_t stream);

// Large-batch path helpers (the GEMMs run through GemmRunner between them).
// xg[i, :] = h[sorted_assignments[i] / k, :] (bf16 rows).
void moe_gather(const void* h, const int32_t* sorted_assignments, int num_assignments, int k, int hidden_size, void* xg,
                cudaStream_t stream);
// act[i, j] = bf16(SwiGLU(gu[i, 2j] + b[e_i, 2j], gu[i, 2j+1] + b[e_i, 2j+1])), e_i from expert_offsets.
void moe_swiglu_sorted(const float* gu, const float* gate_up_bias, const int32_t* expert_offsets, int num_experts,
                       int num_assignments, int intermediate_size, float limit, float alpha, void* act,
                       cudaStream_t stream);
// y[sorted_assignments[i], :] = yd[i, :] + down_bias[e_i, :].
void moe_scatter(const float* yd, const float* down_bias, const int32_t* expert_offsets, int num_experts,
                 const int32_t* sorted_assignments, int num_assignments, int hidden_size, float* y,
                 cudaStream_t stream);
// MXFP4 [rows, cols/32, 16] + [rows, cols/32] -> bf16 [rows, cols] (exact), for the bf16 path.
void mxfp4_to_bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int cols, void* out,
                   cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
