// Weight-only MXFP4 expert GEMMs for decode batches of up to 8 tokens on the tensor cores
// (moe_mxfp4's default there; kernels/cuda/moe.h). Design (bench/NOTES.md r21):
//
// - The weights are the MMA's A operand (16 output rows × 16 of K per mma.m16n8k16), the tokens its
//   8 columns: an expert never has more than 8 tokens at these batch sizes, so one MMA column
//   block holds them all and no padding rows are read (moe_mma's 16-row tiles put the tokens in
//   M and waste 15/16 of the tensor work at batch 1, which costs nothing, but need 192 columns a
//   CTA: too few CTAs at batch 1).
// - A CTA is one 16-row tile of one expert; its 4 warps split K. A lane (g, t) owns MXFP4 group
//   4s + t of rows g and g + 8 for each of its warp's 128-wide K steps s: one 16-byte load per row
//   and step. All of a warp's loads (≤ 6 steps: K ≤ 3,072) are issued before any math, so a CTA has
//   its whole 16 × K tile in flight; at batch 1 a gate_up launch is 1,440 CTAs of 24.5 KB.
// - K order inside an MMA is free as long as A and B agree: word q of a lane's group gives four
//   bf16x2 registers holding codes (i, i + 4) (mxfp4_bits.h e2m1x8_raw, value · 2^-126), times the
//   group scale 2^(s - 1) (one exact bf16x2 multiply; two past s = 128), and feeds two MMAs. The
//   activations are staged once per warp in that order as bf16 pairs (one 16-byte shared-memory
//   read per word): gate_up's columns are the batch's tokens, down's the tile's assignments.
// - fp32 accumulation in the MMAs; the 4 warps' partial sums meet in shared memory, then gate_up
//   applies bias + clamped SwiGLU per (gate, up) row pair and writes fp32 act rows, down adds the
//   bias and writes fp32 y rows at the assignment's index (as the fp32 weight-only kernels do).
// - The down launch reads the routing plan and issues its weight loads before pdl_wait(): the plan
//   was written by the router, which completed before the gate_up kernel passed its own wait (and
//   so before this launch began); only act, gate_up's output, needs the wait.
// - What bounds it (r31 ncu, 20b batch 1): the instruction stream, not the memory system. gate_up
//   issues 11.0 M warp instructions for 35 MB (~320 a KB: the e2m1 decode, the scale multiplies,
//   the MMAs) at 47% of the issue slots (IPC 2.2 of 4, 3.5 warps a scheduler, long scoreboard and
//   fixed-latency waits first). A persistent form (one CTA an SM, gate_up and down in one launch,
//   16-row tiles through a TMA bulk-copy ring, a grid-wide barrier) took the same 41 us a layer
//   under ncu and was slower in the graph (20b batch 1 1.827 -> 1.993 ms: one CTA of ~216 KB an
//   SM leaves no room for the next kernel's early launch); removed (b3407c2 has it). r38 tried two
//   more ways to keep DRAM busy during the math, both slower and removed: CTAs looping over tiles
//   with the next tile's weights in a second register buffer (e524c5d), and L2 bulk prefetch of the
//   later waves' tiles (bae59b6: with the weights in L2, gate_up was no faster). r41 put gate_up and
//   down in one launch, each down CTA waiting on a per-expert counter instead of the whole gate_up
//   grid (0ec3d19: same bits; 20b batch 1 1.650-1.655 -> 1.664-1.680 ms a step, 120b 2.413 ->
//   2.449; much slower at 4-8 tokens): removed. r52: gate_up at 1-2 tokens as a loop over tiles on
//   the resident grid, with no second register buffer (5 CTAs an SM kept) and the next tile's loads
//   issued before the current tile's epilogue: 20b batch 1 1.493 -> 1.414 ms a step
//   (moe_decode_mma_loop_kernel below, the default). What the later waves paid was their start (the
//   plan's and x's round trips before the weight loads), not the overlap. r53: the loop's next tile
//   by one bulk copy into a shared-memory stage as soon as the stage was free (the same bits) was
//   slower (20b batch 1 +20-30 µs a step, 120b +84; bench/results/2026-12-04_h200_r53/
//   s38d-loop-stage.patch), and ncu put the loop kernel at 43% of its issue slots with 1.26 eligible
//   warps a scheduler, 34% of DRAM peak: its q loop is 17.5 instructions an HMMA (bench/NOTES.md r53).
//   r55: down's tile in shared memory (all 720 one-token CTAs resident, their weights requested early) made gate_up
//   +3.5 µs a layer and down +2.2 (bench/results/2026-12-04_h200_r55/s40d-down-smem.patch): gate_up is bound by
//   DRAM's queue, and any other traffic during it comes out of its time; its first tiles' requests are staggered
//   (MoeMxfp4Args::decode_stagger_ns: 20b batch 1 -9 to -23 µs a step).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace gptoss::kernels::cuda {
namespace {

// The CTA shape: kWarps warps split K, each at most kMaxSteps(kWarps) 128-wide steps (K ≤ 24 · 128 =
// 3,072). 4 warps. (8 warps, half the weight registers a lane and 3 CTAs an SM to hide the
// dequantization's dependency chains, were no faster: r27, 20b batch-1 step 2.070 -> 2.089 ms.)
constexpr int kRows = 16;          // output rows per CTA
constexpr int kStepsPerTile = 24;  // kWarps · kMaxSteps
constexpr int kGroupSlots = 5;     // uint4 slots per staged group (4 words + 1 padding)
constexpr int kMaxExpertsScan = 256;
template <int kWarps>
struct DecodeShape {
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kMaxSteps = kStepsPerTile / kWarps;  // 128-wide K steps per warp
    static constexpr int kMaxGroups = 4 * kMaxSteps;          // MXFP4 groups per warp
    // Slots a staged token row: ≡ 4 (mod 8), so 16-byte reads of rows g = 0..7 are conflict-free.
    static constexpr int kTokenSlots = kMaxGroups * kGroupSlots + ((4 - (kMaxGroups * kGroupSlots) % 8) + 8) % 8;
};
static_assert(DecodeShape<4>::kTokenSlots == 124, "the 4-warp layout (r25)");

// bf16x2 multipliers for scale byte s: 2^(s - 1) when it is a bf16 (s ≤ 128), else 2^126 then
// 2^(s - 127) (s = 255 gives inf, as e8m0_to_f32 does).
__device__ __forceinline__ uint32_t scale_first(uint32_t s) {
    const uint32_t h = (s <= 128u ? s + 126u : 253u) << 7;
    return h | (h << 16);
}
__device__ __forceinline__ uint32_t scale_second(uint32_t s) {
    const uint32_t h = (s <= 128u ? 127u : s) << 7;  // 1.0 when the first multiply was the whole scale
    return h | (h << 16);
}

// GPTOSS_MOE_STAMPS (session 41, a timing diagnostic; MoeMxfp4Args::stamps): thread 0 writes %globaltimer (ns)
// for event ev of its CTA. `dep` is an input of the timer read, so the read waits for the value it depends on
// (e.g. the first use of a tile's weights). Event kMoeStampEvents - 1 holds the CTA's SM id.
template <bool kOn>
__device__ __forceinline__ void moe_stamp(unsigned long long* stamps, int ev, uint32_t dep = 0u) {
    if constexpr (kOn) {
        if (threadIdx.x == 0) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep) : "memory");
            stamps[static_cast<int64_t>(blockIdx.x) * kMoeStampEvents + ev] = t;
            if (ev == 0) {
                uint32_t sm;
                asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
                stamps[static_cast<int64_t>(blockIdx.x) * kMoeStampEvents + kMoeStampEvents - 1] = sm;
            }
        }
    }
}

// The active experts in expert order (the same list in every CTA): the `slot`-th one's id and
// token range, or e = -1 past the list. Warp 0 only. `cg`: read through L2 only (the down launch
// reads the plan before pdl_wait, so nothing may come from a stale L1 line).
// All of a lane's offsets are loaded before the first ballot: one L2 round trip, not one per 32
// experts (120b: 4).
constexpr int kPlanChunks = kMaxExpertsScan / 32;
// A lane's experts 32i + lane: their plan offsets (lo, hi), all loads issued before any is used.
__device__ __forceinline__ void load_plan_offsets(const int32_t* offsets, int E, int (&los)[kPlanChunks],
                                                  int (&his)[kPlanChunks]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < kPlanChunks; ++i) {
        const int e = 32 * i + lane;
        los[i] = e < E ? __ldcg(offsets + e) : 0;
        his[i] = e < E ? __ldcg(offsets + e + 1) : 0;
    }
}
__device__ __forceinline__ void find_slot(const int32_t* offsets, int E, int slot, int* s_info) {
    constexpr int kChunks = kPlanChunks;
    const int lane = threadIdx.x & 31;
    int los[kChunks], his[kChunks];
    load_plan_offsets(offsets, E, los, his);
    int n = 0;
    int found = 0;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
        const int e = 32 * i + lane;
        const int lo = los[i], hi = his[i];
        const bool active = hi > lo;
        const unsigned m = __ballot_sync(0xffffffffu, active);
        if (active && n + __popc(m & ((1u << lane) - 1u)) == slot) {
            s_info[0] = e;
            s_info[1] = lo;
            s_info[2] = hi - lo;
        }
        found |= (n + __popc(m) > slot);
        n += __popc(m);
    }
    if (lane == 0) {
        if (!found) s_info[0] = -1;
        s_info[3] = n;  // the active experts (MoeResidualTail's tickets a tile)
    }
}

// The CTA's tile: the slot-th active expert (e < 0: none, and the PDL handshake is done: return),
// its tokens and the tile's first row. s_info: 4 ints of shared memory. Every thread calls it.
struct DecodeTile {
    int e, tok0, ntok, row0;
};
// kTileRows: the rows a CTA covers.
template <bool kGateUp, int kTileRows = kRows>
__device__ __forceinline__ DecodeTile decode_tile(const MoeMxfp4Args& a, int* s_info) {
    const int rows = kGateUp ? 2 * a.intermediate_size : a.hidden_size;
    const int tiles = rows / kTileRows;
    const int slot = blockIdx.x / tiles;
    DecodeTile d{-1, 0, 0, static_cast<int>(blockIdx.x % tiles) * kTileRows};
    if constexpr (kGateUp) pdl_wait();  // the plan comes from the kernel just before
    if ((threadIdx.x >> 5) == 0) find_slot(a.expert_offsets, a.num_experts, slot, s_info);
    __syncthreads();
    d.e = s_info[0];
    if (d.e < 0) {
        if constexpr (!kGateUp) pdl_wait();
        pdl_trigger();
        return d;
    }
    d.tok0 = s_info[1];
    d.ntok = min(s_info[2], 8);
    return d;
}

// MoeResidualTail: element i of tile j by thread i - 16j of a 16-thread group (lanes 0-15 of a warp);
// returns the tile's Σ x² (the same fixed tree in every form, so the in-kernel tail and
// moe_residual_tail give the same bits). y: the token's K rows of H.
__device__ __forceinline__ void residual_tail_tile(const MoeResidualTail& t, const float* y, int H, int K, int j) {
    const int i = j * kMoeTailTile + (threadIdx.x & 15);
    // Every load issued before the sums (indices clamped, the values past K unused): one L2 round trip.
    constexpr int kMaxK = 4;
    float w[kMaxK], yk[kMaxK];
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
        const int kc = min(k, K - 1);
        w[k] = __ldcg(t.weights + kc);
        yk[k] = __ldcg(y + static_cast<int64_t>(kc) * H + i);
    }
    const float x = __ldcg(t.x + i), gain = __ldg(t.gain + i);
    float acc = 0.0f;  // residual_rmsnorm_rows: x + (0 + Σ_k w_k · y_k), fused multiply-adds in k order
#pragma unroll
    for (int k = 0; k < kMaxK; ++k)
        if (k < K) acc = __fmaf_rn(w[k], yk[k], acc);
    for (int k = kMaxK; k < K; ++k)
        acc = __fmaf_rn(__ldcg(t.weights + k), __ldcg(y + static_cast<int64_t>(k) * H + i), acc);
    const float v = __fadd_rn(x, acc);
    t.x[i] = v;
    static_cast<__nv_bfloat16*>(t.h)[i] = __float2bfloat16(__fmul_rn(v, gain));
    float ss = __fmul_rn(v, v);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0x0000ffffu, ss, o, 16));
    if ((threadIdx.x & 15) == 0) t.ss_parts[j] = ss;
}
// After a down CTA's y stores (at one token): a ticket for the tile of H at row0; the last of its
// n_active CTAs (one an active expert) does the tile's residual update. The ticket is one
// atom.acq_rel.gpu (r45: cheaper than fence + atomicAdd + fence): the release covers the CTA's y stores
// (before the barrier, cumulative), the acquire the other CTAs'. The last one leaves the counter at zero.
__device__ __forceinline__ void residual_tail_ticket(const MoeMxfp4Args& a, int row0, int n_active) {
    __shared__ int s_last;
    const int j = row0 / kMoeTailTile;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(a.tail.counters + j) : "memory");
        s_last = static_cast<int>(prev) + 1 >= n_active;
        if (s_last) a.tail.counters[j] = 0u;  // every CTA of the tile has taken its ticket
    }
    __syncthreads();
    if (s_last && threadIdx.x < kMoeTailTile) residual_tail_tile(a.tail, a.y, a.hidden_size, a.experts_per_token, j);
}

// The warps' partial sums (lane (g, t): rows g, g + 8 × columns 2t, 2t + 1) meet in shared memory;
// gate_up applies bias + clamped SwiGLU per (gate, up) row pair and writes fp32 act rows, down adds
// the bias and writes fp32 y rows. The tile's assignment tk is s_as[tk] (act's / y's row) in MMA
// column s_col[tk] (gate_up at 1-2 tokens: its token; else tk). back(sum, tk) scales assignment tk's
// sums back (moe_decode_fp8's f16 staging), before the bias.
struct NoScaleBack {
    __device__ __forceinline__ float operator()(float v, int) const { return v; }
};
// n_active: the active experts (find_slot's s_info[3]), for down's MoeResidualTail.
template <int kWarps>
__device__ __forceinline__ void decode_red_store(const float (&acc)[4], float (&red)[kWarps][kRows][8]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    red[warp][g][2 * t] = acc[0];
    red[warp][g][2 * t + 1] = acc[1];
    red[warp][g + 8][2 * t] = acc[2];
    red[warp][g + 8][2 * t + 1] = acc[3];
}
// kRedStored: the caller stored acc into red already (decode_red_store; acc unread).
template <bool kGateUp, int kWarps, typename Back = NoScaleBack, bool kRedStored = false>
__device__ __forceinline__ void decode_epilogue(const MoeMxfp4Args& a, const float (&acc)[4],
                                                float (&red)[kWarps][kRows][8], int e, int row0, int ntok,
                                                const int* s_as, const int* s_col, int n_active, Back back = {}) {
    const int H = a.hidden_size, I = a.intermediate_size;
    const int rows = kGateUp ? 2 * I : H;
    if constexpr (!kRedStored) decode_red_store<kWarps>(acc, red);
    __syncthreads();
    if constexpr (kGateUp) {
        // Rows 2p, 2p + 1 of the tile are gate and up of intermediate column (row0 / 2 + p).
        if (threadIdx.x < 8 * ntok) {
            const int p = threadIdx.x & 7, tk = threadIdx.x >> 3, c = s_col[tk];
            float gate = 0.0f, up = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                gate += red[w][2 * p][c];
                up += red[w][2 * p + 1][c];
            }
            gate = back(gate, tk);
            up = back(up, tk);
            const int64_t b = static_cast<int64_t>(e) * rows + row0 + 2 * p;
            a.act[static_cast<int64_t>(s_as[tk]) * I + row0 / 2 + p] =
                swiglu(gate + a.gate_up_bias[b], up + a.gate_up_bias[b + 1], a.swiglu_limit, a.swiglu_alpha);
        }
    } else {
        if (threadIdx.x < kRows * ntok) {
            const int r = threadIdx.x & 15, tk = threadIdx.x >> 4, c = s_col[tk];
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) v += red[w][r][c];
            a.y[static_cast<int64_t>(s_as[tk]) * H + row0 + r] =
                back(v, tk) + a.down_bias[static_cast<int64_t>(e) * rows + row0 + r];
        }
        if (a.tail.x != nullptr) residual_tail_ticket(a, row0, n_active);
    }
}

// A warp's K range: its 128-wide steps [s0, s0 + ns) of the input's G MXFP4 groups, groups
// [gbeg, gbeg + ng) (4 a step; ng ≥ 1 wherever ns > 0).
template <int kWarps>
struct WarpK {
    int s0, ns, gbeg, ng;
    __device__ __forceinline__ explicit WarpK(int G) {
        const int warp = threadIdx.x >> 5;
        const int S = (G + 3) / 4;
        s0 = warp * S / kWarps;
        const int s1 = (warp + 1) * S / kWarps;
        ns = s1 - s0;
        gbeg = 4 * s0;
        ng = min(4 * s1, G) - gbeg;
    }
};

// Stage a warp's groups of `nrows` input rows (row_ptr(r): the row's first element, fp32 or bf16)
// into xs as bf16 pairs in MMA order: uint4 (row, local group, word q) = pairs (8q + i, 8q + i + 4),
// i = 0..3. Items at index row · kItemsPerToken + 4 · gl + q, the slots past a warp's 4 · ng
// skipped: no division by a runtime value (r32 ncu: the old index math, two divisions an item, was
// 30% of gate_up's instructions at batch 1). Four items a lane at a time, their loads issued together
// (the item clamped, its store skipped past the end): one L2 round trip for a row's whole K range
// at batch 1.
template <int kWarps, bool kF32, typename RowPtr>
__device__ __forceinline__ void stage_rows(uint4* xs, int nrows, const WarpK<kWarps>& wk, RowPtr row_ptr) {
    using Sh = DecodeShape<kWarps>;
    constexpr int kItemsPerToken = 4 * Sh::kMaxGroups;
    const int lane = threadIdx.x & 31;
    const int n_items = nrows * kItemsPerToken, n_live = 4 * wk.ng;
    for (int base = lane; base < n_items; base += 32 * 4) {
        float v[4][8];
        int dst[4];
        bool live[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int it = base + 32 * u, tk = min(it / kItemsPerToken, nrows - 1), r = it % kItemsPerToken;
            live[u] = it < n_items && r < n_live;
            const int q = r & 3, gl = min(r >> 2, wk.ng - 1);
            const int col = (wk.gbeg + gl) * 32 + 8 * q;
            dst[u] = tk * Sh::kTokenSlots + gl * kGroupSlots + q;
            if constexpr (kF32) {
                const float* src = static_cast<const float*>(row_ptr(tk)) + col;
                const float4 x0 = *reinterpret_cast<const float4*>(src);
                const float4 x1 = *reinterpret_cast<const float4*>(src + 4);
                v[u][0] = x0.x, v[u][1] = x0.y, v[u][2] = x0.z, v[u][3] = x0.w;
                v[u][4] = x1.x, v[u][5] = x1.y, v[u][6] = x1.z, v[u][7] = x1.w;
            } else {
                const uint4 w4 = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(row_ptr(tk)) + col);
                const uint32_t wds[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    v[u][2 * i] = __uint_as_float(wds[i] << 16);
                    v[u][2 * i + 1] = __uint_as_float(wds[i] & 0xffff0000u);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (live[u])
                xs[dst[u]] = make_uint4(pack_bf16x2(v[u][0], v[u][4]), pack_bf16x2(v[u][1], v[u][5]),
                                        pack_bf16x2(v[u][2], v[u][6]), pack_bf16x2(v[u][3], v[u][7]));
    }
}

// A warp's weights of one 16-row tile: lane (g, t) holds group 4(s0 + i) + t of rows g and g + 8 for
// each of its steps i (zero words and scale 127 past the warp's steps or G).
template <int kMaxSteps>
struct DecodeWeights {
    uint4 lo[kMaxSteps], hi[kMaxSteps];
    uint32_t slo[kMaxSteps], shi[kMaxSteps];
};
// All of them requested now (r_lo: row g's index in the [E · rows] weight rows). kLean (session 38): the
// step's group index from one 64-bit base a row (r53's ncu of the loop kernel found the per-step 64-bit
// index math, ~300 instructions a warp a tile, a fifth of its instructions); the same addresses.
// kPacked (session 63): blocks / scales are in the decode layout (moe_pack_decode, moe.h), where a warp's load
// instruction reads 512 contiguous bytes instead of 8 rows × 64 bytes 1,440 apart, and its scales one 64-byte run
// instead of two sets of 8 rows × 4 bytes (r72: the fragment order alone read 16% slower). The same words and scales
// reach the same registers.
template <int kMaxSteps, int kWarps, bool kLean = true, bool kPacked = false>
__device__ __forceinline__ void decode_load(DecodeWeights<kMaxSteps>& w, const uint8_t* blocks, const uint8_t* scales,
                                            int64_t r_lo, int G, const WarpK<kWarps>& wk) {
    const int t = threadIdx.x & 3;
    if constexpr (kPacked) {
        // Lane l's words of step s at chunk 64·s + l of its tile (row g's) and 32 chunks on (row g + 8's), its scale
        // pair at byte 64·s + 2l: one base a lane, then constant offsets a step. Keep this form: its PTX is the one
        // that passed on the device (bench/NOTES.md r76, call 6). Two forms of the same arithmetic, kLean's opaque zero
        // in it or the tile index as r_lo >> 4, made the gate_up loop kernel's tiles after a CTA's first read wrong
        // words at bf16 h (every such tile, every grid; memcheck clean, the PTX read right): not explained. The
        // tests MoeDecodeMmaLoopIsTheSameBits (variants 8-10) and MoeDecodeMmaEdgeShapesAndScales catch it.
        const int lane = threadIdx.x & 31, g = lane >> 2;
        const int64_t c = (r_lo - g) * (4 * ((G + 3) / 4)) + 64 * wk.s0 + lane;  // tile · 64·S + 64·s0 + lane
        const uint8_t* pb = blocks + 16 * c;
        const uint8_t* ps = scales + c + lane;
        const int g_left = G - 4 * wk.s0 - t;  // step i's group is in range while 4i < g_left
#pragma unroll
        for (int i = 0; i < kMaxSteps; ++i) {
            if (i < wk.ns && 4 * i < g_left) {
                w.lo[i] = ldg_stream(pb + 1024 * i);
                w.hi[i] = ldg_stream(pb + 1024 * i + 512);
                // Two byte loads, not one 16-bit load split in registers: the split's ALU ops waited for the load
                // right where it was issued, so the loop kernel's epilogue waited for the next tile's scales (r77
                // stamps: tile 0's epilogue 4.6 µs against 2.4).
                w.slo[i] = __ldg(ps + 64 * i);
                w.shi[i] = __ldg(ps + 64 * i + 1);
            } else {
                w.lo[i] = w.hi[i] = make_uint4(0u, 0u, 0u, 0u);
                w.slo[i] = w.shi[i] = 127u;
            }
        }
        return;
    }
    if constexpr (kLean) {
        // An opaque zero keeps this index math here: hoisted out of the loop kernel's tile loop it spilled
        // 20 bytes at the 96-register cap (r53 s38f).
        int z;
        asm volatile("mov.u32 %0, 0;" : "=r"(z));
        const int64_t first = r_lo * G + (4 * wk.s0 + t + z);  // row g's group of step 0
        const int row8 = 8 * G + z;                            // row g + 8
        const int g_left = G - 4 * wk.s0 - t + z;              // step i's group is in range while 4i < g_left
#pragma unroll
        for (int i = 0; i < kMaxSteps; ++i) {
            if (i < wk.ns && 4 * i < g_left) {
                const int64_t gi = first + 4 * i;
                w.lo[i] = ldg_stream(blocks + gi * 16);
                w.hi[i] = ldg_stream(blocks + (gi + row8) * 16);
                w.slo[i] = __ldg(scales + gi);
                w.shi[i] = __ldg(scales + gi + row8);
            } else {
                w.lo[i] = w.hi[i] = make_uint4(0u, 0u, 0u, 0u);
                w.slo[i] = w.shi[i] = 127u;
            }
        }
        return;
    }
    const int64_t r_hi = r_lo + 8;
#pragma unroll
    for (int i = 0; i < kMaxSteps; ++i) {
        const int grp = 4 * (wk.s0 + i) + t;
        if (i < wk.ns && grp < G) {
            w.lo[i] = ldg_stream(blocks + (r_lo * G + grp) * 16);
            w.hi[i] = ldg_stream(blocks + (r_hi * G + grp) * 16);
            w.slo[i] = __ldg(scales + r_lo * G + grp);
            w.shi[i] = __ldg(scales + r_hi * G + grp);
        } else {
            w.lo[i] = w.hi[i] = make_uint4(0u, 0u, 0u, 0u);
            w.slo[i] = w.shi[i] = 127u;
        }
    }
}
// Whether any of the warp's scales needs the second multiply (s > 128).
template <int kMaxSteps>
__device__ __forceinline__ bool decode_two(const DecodeWeights<kMaxSteps>& w) {
    uint32_t big = 0;
#pragma unroll
    for (int i = 0; i < kMaxSteps; ++i) big |= (w.slo[i] | w.shi[i]) > 128u;
    return __any_sync(0xffffffffu, big != 0);
}

// acc (rows g, g + 8 × columns 2t, 2t + 1) += the warp's K range of the tile × its staged rows. No
// branch in a q step (r32: 20b batch 1 1.825 -> 1.781 ms a step, 120b 2.681 -> 2.612): the second
// scale multiply is chosen once for the warp's steps (kTwo: two loop bodies), and the x fragment is
// read unconditionally: lanes g >= nrows read row nrows - 1 (their MMA column is never stored) and
// lanes past G a staged group (their A is zero, so the product is).
// kPacked: the words are in the decode layout's bit order (e2m1x8_to_decode_bits): 8 integer ops a word, not 13.
template <int kWarps, bool kTwo, bool kPacked = false>
__device__ __forceinline__ void decode_steps(float (&acc)[4], const DecodeWeights<DecodeShape<kWarps>::kMaxSteps>& w,
                                             const uint4* xs, int nrows, const WarpK<kWarps>& wk) {
    using Sh = DecodeShape<kWarps>;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < Sh::kMaxSteps; ++i) {
        if (i >= wk.ns) break;
        const int gl = 4 * i + t;
        const uint4* xrow = xs + min(g, nrows - 1) * Sh::kTokenSlots + min(gl, wk.ng - 1) * kGroupSlots;
        const uint32_t m_lo = scale_first(w.slo[i]), m_hi = scale_first(w.shi[i]);
        const uint32_t m2_lo = scale_second(w.slo[i]), m2_hi = scale_second(w.shi[i]);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint4 xb = xrow[q];
            const uint32_t wl = q == 0 ? w.lo[i].x : q == 1 ? w.lo[i].y : q == 2 ? w.lo[i].z : w.lo[i].w;
            const uint32_t wh = q == 0 ? w.hi[i].x : q == 1 ? w.hi[i].y : q == 2 ? w.hi[i].z : w.hi[i].w;
            uint32_t rl[4], rh[4];
            if constexpr (kPacked) {
                e2m1x8_raw_decode_bits(wl, rl);
                e2m1x8_raw_decode_bits(wh, rh);
            } else {
                e2m1x8_raw(wl, rl);
                e2m1x8_raw(wh, rh);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                rl[j] = bf16x2_mul(rl[j], m_lo);
                rh[j] = bf16x2_mul(rh[j], m_hi);
                if (kTwo) {
                    rl[j] = bf16x2_mul(rl[j], m2_lo);
                    rh[j] = bf16x2_mul(rh[j], m2_hi);
                }
            }
            // a0/a2: row g, codes (0, 4) / (1, 5); a1/a3: row g + 8. Then codes (2, 6) / (3, 7).
            mma_bf16(acc, rl[0], rh[0], rl[1], rh[1], xb.x, xb.y);
            mma_bf16(acc, rl[2], rh[2], rl[3], rh[3], xb.z, xb.w);
        }
    }
}

// kEarly (gate_up at 1-2 tokens): 5 CTAs an SM (session 17: its x is staged before its weight
// loads, 97 registers at 4; a fifth CTA needs <= 96).
template <bool kEarly>
constexpr int kDecodeMinBlocks = kEarly ? 5 : 4;
// kDiag (a timing diagnostic, GPTOSS_MOE_DECODE_DIAG; its outputs are garbage): 0 the kernel;
// 1 the weight loads and everything around them, the q loop replaced by a fold of the loaded words
// (the memory side's time); 2 the q loop on words made from the CTA index, no weight loads (the
// instruction side's time); 3 neither (the fixed part: plan, tile, staging, epilogue, launches).
// r34 moe_bench 1 token: kernel 33.4 us, 1: 24.0, 2: 23.4.
// kStamps: GPTOSS_MOE_STAMPS's instantiation (down at one token; events in MoeStamps's legend, below).
// kPacked: the weights in the decode layout (decode_load).
template <bool kGateUp, int kWarps, bool kEarly, int kDiag = 0, bool kStamps = false, bool kPacked = false>
__global__ void __launch_bounds__(DecodeShape<kWarps>::kThreads, kDecodeMinBlocks<kEarly>)
    moe_decode_mma_kernel(const MoeMxfp4Args a) {
    moe_stamp<kStamps>(a.stamps, 0);
    using Sh = DecodeShape<kWarps>;
    constexpr int kMaxSteps = Sh::kMaxSteps, kTokenSlots = Sh::kTokenSlots;
    extern __shared__ uint4 xs_all[];  // [kWarps][max tokens][kTokenSlots]
    __shared__ float red[kWarps][kRows][8];
    __shared__ int s_info[4];
    __shared__ int s_as[8];
    __shared__ int s_col[8];          // the MMA column of the tile's assignment
    __shared__ const void* s_src[8];  // the input row of the tile's assignment (not kEarly)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int H = a.hidden_size, I = a.intermediate_size;
    const int in_dim = kGateUp ? H : I, G = in_dim / 32;
    const int rows = kGateUp ? 2 * I : H;
    const int max_tokens = min(a.num_tokens, 8);
    const bool in_f32 = !kGateUp || a.h_f32 != nullptr;
    const WarpK<kWarps> wk(G);
    uint4* xs = xs_all + warp * max_tokens * kTokenSlots;

    // The tile. kEarly (gate_up at 1-2 tokens): the MMA columns are the tokens (every one staged
    // whether this expert has it or not: the tensor cores' n = 8 costs the same), so x is staged
    // right after pdl_wait while warp 0 finds the tile, off the chain the weights wait on (else the
    // columns are the tile's assignments: x waits for the plan, then for the sorted assignment's
    // load behind the weights, then for its own L2 round trip). r32 call 5, kEarly at every batch:
    // 20b 1.777 -> 1.752 ms a step at batch 1, 2.350 -> 2.321 at 2, but 3.317 -> 3.584 at 4 (all
    // of the batch's rows staged by every CTA, before its weight loads); so 1-2 tokens only.
    // down's columns are always the assignments (act is a row an assignment).
    static_assert(kGateUp || !kEarly, "kEarly is gate_up's");
    int e, tok0, ntok, row0, nrows;
    if constexpr (kEarly) {
        const int tiles = rows / kRows, slot = blockIdx.x / tiles;
        row0 = static_cast<int>(blockIdx.x % tiles) * kRows;
        pdl_wait();  // the plan and h come from the kernel just before
        if (warp == 0) find_slot(a.expert_offsets, a.num_experts, slot, s_info);
        nrows = max_tokens;
        if (wk.ng > 0) {  // a warp without K steps (K < 128 · kWarps) stages nothing
            if (in_f32)
                stage_rows<kWarps, true>(xs, nrows, wk,
                                         [&](int r) -> const void* { return a.h_f32 + static_cast<int64_t>(r) * H; });
            else
                stage_rows<kWarps, false>(xs, nrows, wk, [&](int r) -> const void* {
                    return static_cast<const __nv_bfloat16*>(a.h) + static_cast<int64_t>(r) * H;
                });
        }
        __syncthreads();  // s_info, and every warp's staging done before any may exit
        e = s_info[0];
        if (e < 0) {
            pdl_trigger();
            return;
        }
        tok0 = s_info[1];
        ntok = min(s_info[2], 8);
    } else {
        const DecodeTile tile = decode_tile<kGateUp>(a, s_info);
        moe_stamp<kStamps>(a.stamps, 1, static_cast<uint32_t>(tile.e));
        if (tile.e < 0) return;
        e = tile.e, tok0 = tile.tok0, ntok = tile.ntok, row0 = tile.row0;
        nrows = ntok;
    }

    // This warp's weight loads: all of them, now.
    const uint8_t* blocks = kGateUp ? a.gate_up_blocks : a.down_blocks;
    const uint8_t* scales = kGateUp ? a.gate_up_scales : a.down_scales;
    const int64_t r_lo = static_cast<int64_t>(e) * rows + row0 + g;
    DecodeWeights<kMaxSteps> w;
    if constexpr (kDiag == 2 || kDiag == 3) {
#pragma unroll
        for (int i = 0; i < kMaxSteps; ++i) {
            const uint32_t h = (blockIdx.x * 0x9e3779b9u) ^ (threadIdx.x * 0x85ebca6bu) ^ static_cast<uint32_t>(i);
            const bool live = i < wk.ns && 4 * (wk.s0 + i) + t < G;
            w.lo[i] = live ? make_uint4(h, h * 3u, h * 5u, h * 7u) : make_uint4(0u, 0u, 0u, 0u);
            w.hi[i] = live ? make_uint4(h * 11u, h * 13u, h * 17u, h * 19u) : make_uint4(0u, 0u, 0u, 0u);
            w.slo[i] = w.shi[i] = 127u;
        }
    } else {
        decode_load<kMaxSteps, kWarps, true, kPacked>(w, blocks, scales, r_lo, G, wk);
    }
    moe_stamp<kStamps>(a.stamps, 2);
    // The tile's assignments, loaded after the weight loads are issued. kEarly needs them only in
    // the epilogue (stored there, before its barrier); else their input rows are staged now.
    const int my_as = threadIdx.x < ntok ? __ldcg(a.sorted_assignments + tok0 + threadIdx.x) : 0;
    if constexpr (kEarly) {
        pdl_trigger();
    } else {
        if (threadIdx.x < ntok) {
            s_as[threadIdx.x] = my_as;
            s_col[threadIdx.x] = threadIdx.x;
            if constexpr (kGateUp) {
                const int64_t tok = my_as / a.experts_per_token;
                s_src[threadIdx.x] = in_f32
                                         ? static_cast<const void*>(a.h_f32 + tok * H)
                                         : static_cast<const void*>(static_cast<const __nv_bfloat16*>(a.h) + tok * H);
            } else {
                s_src[threadIdx.x] = a.act + static_cast<int64_t>(my_as) * I;
            }
        }
        if constexpr (!kGateUp) pdl_wait();  // act is the gate_up kernel's output
        moe_stamp<kStamps>(a.stamps, 3);
        pdl_trigger();    // after the wait: at most this kernel and the next in flight
        __syncthreads();  // s_as, s_col, s_src
        if (wk.ng > 0) {  // a warp without K steps stages nothing
            if (in_f32)
                stage_rows<kWarps, true>(xs, nrows, wk, [&](int r) { return s_src[r]; });
            else
                stage_rows<kWarps, false>(xs, nrows, wk, [&](int r) { return s_src[r]; });
        }
    }
    __syncwarp();
    moe_stamp<kStamps>(a.stamps, 4, xs[0].x);

    // Rows g, g + 8 × tokens 2t, 2t + 1. (r25: four independent MMA chains instead of this one took
    // "wait" from 1.06 to 0.85 stalled warps an instruction and the time not at all, 23.39 ->
    // 23.26 us at one token, for 25 more registers: not kept.)
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kDiag == 1 || kDiag == 3) {  // every loaded word consumed, ~2 instructions a word
        uint32_t f = 0;
#pragma unroll
        for (int i = 0; i < kMaxSteps; ++i)
            f ^= w.lo[i].x ^ w.lo[i].y ^ w.lo[i].z ^ w.lo[i].w ^ w.hi[i].x ^ w.hi[i].y ^ w.hi[i].z ^ w.hi[i].w ^
                 w.slo[i] ^ (w.shi[i] << 8);
        acc[0] = __uint_as_float(f & 0x3f7fffffu);
    } else {
        const bool two = decode_two(w);
        moe_stamp<kStamps>(a.stamps, 5, two);
        if (two)
            decode_steps<kWarps, true, kPacked>(acc, w, xs, nrows, wk);
        else
            decode_steps<kWarps, false, kPacked>(acc, w, xs, nrows, wk);
        moe_stamp<kStamps>(a.stamps, 6, __float_as_uint(acc[0]));
    }

    if constexpr (kEarly) {
        if (threadIdx.x < ntok) {
            s_as[threadIdx.x] = my_as;
            s_col[threadIdx.x] = my_as / a.experts_per_token;  // the assignment's token
        }
    }
    decode_epilogue<kGateUp, kWarps>(a, acc, red, e, row0, ntok, s_as, s_col, s_info[3]);
    moe_stamp<kStamps>(a.stamps, 7);
}

// ---- gate_up at 1-2 tokens as a loop over tiles (session 37; the default, GPTOSS_MOE_LOOP=0 off) -------
constexpr int kDefaultStaggerNs = 2000;  // MoeMxfp4Args::decode_stagger_ns's default at one token (session 40)
// moe_decode_mma_kernel<true, 4, true> runs 1,440 CTAs at batch 1 (20b) in 2.2 waves of the 660 that are
// resident (5 an SM); every later-wave CTA pays its own start (find_slot's round trip, x staged again)
// before its weight loads go out, and r34's diagnostics put the pair's fixed part at 12 µs of 33.4. Here
// the grid is the resident CTAs; each finds every active expert once (find_all), stages x once, and
// takes tiles b, b + grid, ...: after a tile's q loop its weight registers are free, so the next tile's
// loads are issued before the tile's epilogue (its barrier and stores). No second register buffer (r38's
// loop form held two and fell to 2-3 CTAs an SM; this one keeps 5). Tile i's sums go to red copy i % 2
// and its assignments to s_as / s_col copy i % 3 (loaded with tile i's weights during tile i - 1, stored
// after tile i - 1's epilogue, so that their round trip is not in front of its barrier): a thread
// writes a copy only after passing the barrier that follows every thread's last reads of it (red: tile
// i - 2's reads end before tile i - 1's barrier; s_as: tile i - 3's before tile i - 1's). The same sums in the same
// order as the one-tile kernel (the same bits). r52 (s38q, one pass): 20b batch 1 at 1k 1.493 -> 1.414 ms
// a step, 120b 2.161 -> 2.081.
constexpr int kLoopMaxSlots = 16;  // active experts at ≤ 2 tokens (k ≤ 8)
// Every active expert in expert order into s_exp / s_tok0 / s_ntok (at most kLoopMaxSlots), their count
// into *s_n. Warp 0 only; find_slot's loads (one L2 round trip).
__device__ __forceinline__ void find_all(const int32_t* offsets, int E, int* s_exp, int* s_tok0, int* s_ntok,
                                         int* s_n) {
    constexpr int kChunks = kPlanChunks;
    const int lane = threadIdx.x & 31;
    int los[kChunks], his[kChunks];
    load_plan_offsets(offsets, E, los, his);
    int n = 0;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
        const int e = 32 * i + lane;
        const bool active = his[i] > los[i];
        const unsigned m = __ballot_sync(0xffffffffu, active);
        const int rank = n + __popc(m & ((1u << lane) - 1u));
        if (active && rank < kLoopMaxSlots) {
            s_exp[rank] = e;
            s_tok0[rank] = los[i];
            s_ntok[rank] = his[i] - los[i];
        }
        n += __popc(m);
    }
    if (lane == 0) *s_n = min(n, kLoopMaxSlots);
}

// kLean: decode_load's (GPTOSS_MOE_LEAN_LOAD=0 the old index math, for A/B). kStep (session 39): the next
// tile by a step kept in shared memory, no runtime division a tile (GPTOSS_MOE_TILE_STEP=0 the old form, two
// divisions by `tiles` a tile, for A/B).
// kStamps: GPTOSS_MOE_STAMPS's instantiation (events in MoeStamps's legend, below).
// kPacked: the weights in the decode layout (decode_load).
template <int kWarps, bool kLean = true, bool kStep = true, bool kStamps = false, bool kPacked = false>
__global__ void __launch_bounds__(DecodeShape<kWarps>::kThreads, kDecodeMinBlocks<true>)
    moe_decode_mma_loop_kernel(const MoeMxfp4Args a) {
    moe_stamp<kStamps>(a.stamps, 0);
    using Sh = DecodeShape<kWarps>;
    constexpr int kMaxSteps = Sh::kMaxSteps;
    extern __shared__ uint4 xs_all[];  // [kWarps][max tokens][kTokenSlots]
    __shared__ float red[2][kWarps][kRows][8];
    __shared__ int s_exp[kLoopMaxSlots], s_tok0[kLoopMaxSlots], s_ntok[kLoopMaxSlots];
    __shared__ int s_nact;
    __shared__ int s_as[3][8], s_col[3][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int H = a.hidden_size, I = a.intermediate_size, G = H / 32, rows = 2 * I, tiles = rows / kRows;
    const int nrows = min(a.num_tokens, 8);
    const WarpK<kWarps> wk(G);
    uint4* xs = xs_all + warp * nrows * Sh::kTokenSlots;

    __shared__ int s_step[2];  // gridDim.x as (slots, tiles), by warp 1 (warp 0 finds the experts)
    static_assert(kWarps >= 2, "s_step is written by thread 32");
    if (threadIdx.x == 32)
        s_step[0] = static_cast<int>(gridDim.x) / tiles, s_step[1] = static_cast<int>(gridDim.x) % tiles;
    pdl_wait();  // the plan and h come from the kernel just before
    moe_stamp<kStamps>(a.stamps, 1);
    if (warp == 0) find_all(a.expert_offsets, a.num_experts, s_exp, s_tok0, s_ntok, &s_nact);
    if (wk.ng > 0) {
        if (a.h_f32 != nullptr)
            stage_rows<kWarps, true>(xs, nrows, wk,
                                     [&](int r) -> const void* { return a.h_f32 + static_cast<int64_t>(r) * H; });
        else
            stage_rows<kWarps, false>(xs, nrows, wk, [&](int r) -> const void* {
                return static_cast<const __nv_bfloat16*>(a.h) + static_cast<int64_t>(r) * H;
            });
    }
    __syncthreads();  // s_exp.., every warp's staging
    moe_stamp<kStamps>(a.stamps, 2);
    // The tile (blockIdx.x, then + gridDim.x a round) as (active expert slot, 16-row tile of it): one division a
    // CTA, none a tile (kStep). The step is read from shared memory where it is used, so that ptxas does not keep
    // it in registers across the q loop (a register form spilled 20 bytes at the 96 cap, r53). r54: 120b batch 1
    // −35 to −44 µs a step, 20b about −10.
    int slot = static_cast<int>(blockIdx.x) / tiles, trow = static_cast<int>(blockIdx.x) % tiles;
    int cur = static_cast<int>(blockIdx.x);  // !kStep: the tile's index, divided by `tiles` where used
    if (slot >= s_nact) {
        moe_stamp<kStamps>(a.stamps, 14);
        pdl_trigger();
        return;
    }
    DecodeWeights<kMaxSteps> w;
    // The tile's weight loads, then the load of its assignment (threads < its tokens), returned.
    const auto issue = [&](int slot, int trow) {
        const int ntok = min(s_ntok[slot], 8);
        decode_load<kMaxSteps, kWarps, kLean, kPacked>(
            w, a.gate_up_blocks, a.gate_up_scales, static_cast<int64_t>(s_exp[slot]) * rows + trow * kRows + g, G, wk);
        return threadIdx.x < ntok ? __ldcg(a.sorted_assignments + s_tok0[slot] + threadIdx.x) : 0;
    };
    // Tile i's assignments into copy i % 3 of s_as / s_col.
    const auto put_as = [&](int as, int p) {
        if (threadIdx.x < 8) {
            s_as[p][threadIdx.x] = as;
            s_col[p][threadIdx.x] = as / a.experts_per_token;  // the assignment's token
        }
    };
    // MoeMxfp4Args::decode_stagger_ns (session 40, A/B): CTA b requests its first tile b / grid of the window
    // later, so that DRAM serves the first tiles in an order instead of all of them interleaved.
    if (a.decode_stagger_ns > 0)  // the host resolves -1 (the default) before the launch
        __nanosleep(static_cast<unsigned>(static_cast<uint64_t>(blockIdx.x) * a.decode_stagger_ns / gridDim.x));
    moe_stamp<kStamps>(a.stamps, 3);
    {
        const int as0 = issue(slot, trow);
        moe_stamp<kStamps>(a.stamps, 4, static_cast<uint32_t>(as0));
        put_as(as0, 0);  // waits for the assignment's round trip here only (the weights' is longer)
    }
    pdl_trigger();
    for (int it = 0;; ++it) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const bool two = decode_two(w);
        if (it < 3) moe_stamp<kStamps>(a.stamps, 5 + 3 * it, two);
        if (two)
            decode_steps<kWarps, true, kPacked>(acc, w, xs, nrows, wk);
        else
            decode_steps<kWarps, false, kPacked>(acc, w, xs, nrows, wk);
        if (it < 3) moe_stamp<kStamps>(a.stamps, 6 + 3 * it, __float_as_uint(acc[0]));
        // The tile's sums into copy p (their registers free), the next tile's loads (the weight
        // registers are free after the q loop), then the epilogue's barrier and stores.
        const int p = it & 1, q = it % 3;
        decode_red_store<kWarps>(acc, red[p]);
        int nslot, nrow, next = 0;
        if constexpr (kStep) {
            nslot = slot + s_step[0], nrow = trow + s_step[1];
            if (nrow >= tiles) nrow -= tiles, ++nslot;
        } else {
            next = cur + static_cast<int>(gridDim.x);
            nslot = next / tiles, nrow = next % tiles;
        }
        const bool more = nslot < s_nact;
        const int next_as = more ? issue(nslot, nrow) : 0;
        if constexpr (!kStep) slot = cur / tiles, trow = cur % tiles;
        decode_epilogue<true, kWarps, NoScaleBack, true>(a, acc, red[p], s_exp[slot], trow * kRows,
                                                         min(s_ntok[slot], 8), s_as[q], s_col[q], s_nact);
        if (it < 3) moe_stamp<kStamps>(a.stamps, 7 + 3 * it);
        if (!more) break;
        put_as(next_as, (it + 1) % 3);  // after the barrier: the round trip off the epilogue's path
        slot = nslot, trow = nrow, cur = next;
    }
    moe_stamp<kStamps>(a.stamps, 14);
}

// down at 1-2 tokens as a loop over tiles (session 37; the default at 2 tokens since session 38, GPTOSS_MOE_DOWN_LOOP):
// moe_decode_mma_loop_kernel's form for down's 720 tiles (20b batch 1; 1.36 waves at 4 CTAs an SM). The
// plan, the tile's experts and the assignments (≤ 16 at ≤ 2 tokens, into shared memory) and the first
// tile's weights come before pdl_wait, as in the one-tile kernel; each tile stages its expert's act rows
// (per warp, into the warp's own region: no CTA barrier), runs the q loop, stores its sums, issues the next
// tile's weight loads, then its epilogue (y, and MoeResidualTail's ticket). The same sums as the one-tile
// kernel.
template <int kWarps, bool kPacked = false>
__global__ void __launch_bounds__(DecodeShape<kWarps>::kThreads, kDecodeMinBlocks<false>)
    moe_decode_mma_down_loop_kernel(const MoeMxfp4Args a) {
    using Sh = DecodeShape<kWarps>;
    constexpr int kMaxSteps = Sh::kMaxSteps;
    constexpr int kMaxAs = 16;         // assignments at ≤ 2 tokens (k ≤ 8)
    extern __shared__ uint4 xs_all[];  // [kWarps][2][kTokenSlots]
    __shared__ float red[2][kWarps][kRows][8];
    __shared__ int s_exp[kLoopMaxSlots], s_tok0[kLoopMaxSlots], s_ntok[kLoopMaxSlots];
    __shared__ int s_nact;
    __shared__ int s_sorted[kMaxAs];
    __shared__ int s_col[8];  // column tk is the tile's assignment tk
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int H = a.hidden_size, I = a.intermediate_size, G = I / 32, tiles = H / kRows;
    const int A = min(a.num_tokens * a.experts_per_token, kMaxAs);
    const WarpK<kWarps> wk(G);
    uint4* xs = xs_all + warp * 2 * Sh::kTokenSlots;

    // The plan was complete before the gate_up launch passed its wait (so before this one began).
    if (warp == 0) find_all(a.expert_offsets, a.num_experts, s_exp, s_tok0, s_ntok, &s_nact);
    if (static_cast<int>(threadIdx.x) < A) s_sorted[threadIdx.x] = __ldcg(a.sorted_assignments + threadIdx.x);
    if (threadIdx.x < 8) s_col[threadIdx.x] = threadIdx.x;
    __syncthreads();
    const int total = s_nact * tiles;
    int cur = blockIdx.x;
    if (cur >= total) {
        pdl_wait();
        pdl_trigger();
        return;
    }
    DecodeWeights<kMaxSteps> w;
    const auto issue = [&](int tile) {
        decode_load<kMaxSteps, kWarps, true, kPacked>(
            w, a.down_blocks, a.down_scales, static_cast<int64_t>(s_exp[tile / tiles]) * H + (tile % tiles) * kRows + g,
            G, wk);
    };
    issue(cur);
    pdl_wait();  // act is the gate_up kernel's output
    pdl_trigger();
    for (int it = 0;; ++it) {
        const int slot = cur / tiles, ntok = min(s_ntok[slot], 8);
        const int* as = s_sorted + s_tok0[slot];
        if (wk.ng > 0)
            stage_rows<kWarps, true>(xs, ntok, wk,
                                     [&](int r) -> const void* { return a.act + static_cast<int64_t>(as[r]) * I; });
        __syncwarp();
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (decode_two(w))
            decode_steps<kWarps, true, kPacked>(acc, w, xs, ntok, wk);
        else
            decode_steps<kWarps, false, kPacked>(acc, w, xs, ntok, wk);
        const int p = it & 1;
        decode_red_store<kWarps>(acc, red[p]);
        const int next = cur + static_cast<int>(gridDim.x);
        if (next < total) issue(next);
        decode_epilogue<false, kWarps, NoScaleBack, true>(a, acc, red[p], s_exp[slot], (cur % tiles) * kRows, ntok, as,
                                                          s_col, s_nact);
        if (next >= total) break;
        cur = next;
    }
}

// Resident CTAs of a loop kernel (0: gate_up's, 1: down's) on this device at `tokens` (1 or 2: its shared
// memory), measured once a device (host-only queries: capturable).
template <typename Kernel>
int loop_grid_capacity(Kernel kernel, int which, int tokens, size_t smem) {
    constexpr int kDevices = 64;
    static std::atomic<int> cached[kDevices][2][2];
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const int slot = std::clamp(tokens, 1, 2) - 1;
    if (dev < kDevices) {
        const int c = cached[dev][which][slot].load(std::memory_order_relaxed);
        if (c > 0) return c;
    }
    int sms = 0, per_sm = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, DecodeShape<4>::kThreads, smem));
    const int cap = std::max(1, per_sm) * sms;
    if (dev < kDevices) cached[dev][which][slot].store(cap, std::memory_order_relaxed);
    return cap;
}

// GPTOSS_MOE_STAMPS=path (session 41, a timing diagnostic): the gate_up loop kernel and the one-tile down kernel
// run their kStamps instantiations, which write %globaltimer stamps a CTA (thread 0) into a device buffer: a slot
// a layer (the launches' gate_up_blocks pointer, numbered in first-seen order, so the first step's layer order),
// [slot][kernel (0 gate_up, 1 down)][CTA][event]. Every replay overwrites its rows, so at exit (atexit) the
// buffer holds the last step's stamps; it is written to `path` as CSV (slot,kernel,cta,event,ns; event 15 is
// the CTA's SM) for tools/moe_stamps.py. Events, gate_up loop: 0 entry, 1 after pdl_wait, 2 after find_all and
// the staging barrier, 3 before the first tile's loads (after the stagger), 4 after them (the assignment's
// load returned), then for tiles 0-2: 5 + 3i the weights' first use (decode_two), 6 + 3i the q loop done,
// 7 + 3i the epilogue done; 14 exit. Down (one tile a CTA): 0 entry, 1 the tile found, 2 its loads issued,
// 3 after pdl_wait, 4 act staged, 5 the weights' first use, 6 the q loop done, 7 the epilogue (and the
// residual tail's ticket) done.
class MoeStamps {
public:
    static constexpr int kSlots = 64, kMaxCtas = 1024;
    static MoeStamps& get() {
        static MoeStamps s;
        return s;
    }
    bool on() const { return !path_.empty(); }
    // The launch's rows, or nullptr (off, too many CTAs or layers, or the buffer could not be made).
    unsigned long long* rows(const void* key, int kernel, int64_t grid) {
        if (!on() || grid > kMaxCtas) return nullptr;
        std::lock_guard<std::mutex> lock(mu_);
        if (buf_ == nullptr) {
            if (cudaMalloc(&buf_, bytes()) != cudaSuccess || cudaMemset(buf_, 0, bytes()) != cudaSuccess) {
                (void)cudaGetLastError();
                std::fprintf(stderr, "GPTOSS_MOE_STAMPS: no device buffer; stamps off\n");
                buf_ = nullptr;
                path_.clear();
                return nullptr;
            }
            std::atexit([] { get().dump(); });
        }
        int slot = 0;
        while (slot < static_cast<int>(keys_.size()) && keys_[slot] != key) ++slot;
        if (slot == static_cast<int>(keys_.size())) {
            if (slot >= kSlots) return nullptr;
            keys_.push_back(key);
        }
        return buf_ + (static_cast<int64_t>(slot) * 2 + kernel) * kMaxCtas * kMoeStampEvents;
    }

private:
    MoeStamps() {
        const char* v = std::getenv("GPTOSS_MOE_STAMPS");
        if (v != nullptr) path_ = v;
    }
    static size_t bytes() { return static_cast<size_t>(kSlots) * 2 * kMaxCtas * kMoeStampEvents * 8; }
    void dump() {
        if (buf_ == nullptr) return;
        std::vector<unsigned long long> h(bytes() / 8);
        if (cudaDeviceSynchronize() != cudaSuccess ||
            cudaMemcpy(h.data(), buf_, bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) {
            std::fprintf(stderr, "GPTOSS_MOE_STAMPS: could not read the stamps back\n");
            return;
        }
        FILE* f = std::fopen(path_.c_str(), "w");
        if (f == nullptr) {
            std::fprintf(stderr, "GPTOSS_MOE_STAMPS: cannot write %s\n", path_.c_str());
            return;
        }
        std::fprintf(f, "slot,kernel,cta,event,ns\n");
        for (size_t i = 0; i < h.size(); ++i) {
            if (h[i] == 0) continue;
            const size_t ev = i % kMoeStampEvents, cta = i / kMoeStampEvents % kMaxCtas;
            const size_t kernel = i / (kMoeStampEvents * kMaxCtas) % 2, slot = i / (kMoeStampEvents * kMaxCtas * 2);
            std::fprintf(f, "%zu,%zu,%zu,%zu,%llu\n", slot, kernel, cta, ev, h[i]);
        }
        std::fclose(f);
    }
    std::string path_;
    std::mutex mu_;
    std::vector<const void*> keys_;
    unsigned long long* buf_ = nullptr;
};

template <bool kGateUp, int kWarps>
void launch(const MoeMxfp4Args& a, cudaStream_t stream) {
    using Sh = DecodeShape<kWarps>;
    const int rows = kGateUp ? 2 * a.intermediate_size : a.hidden_size;
    const int max_tokens = std::min(a.num_tokens, 8);
    // At most min(E, tokens · k) experts have tokens.
    const int64_t experts = std::min(a.num_experts, a.num_tokens * a.experts_per_token);
    const int64_t grid = experts * (rows / kRows);
    const size_t smem = static_cast<size_t>(kWarps) * max_tokens * Sh::kTokenSlots * sizeof(uint4);
    // gate_up's x staged before its weight loads at 1-2 tokens (kEarly; r32 calls 4-5).
    const bool early = kGateUp && a.num_tokens <= 2;
    static const int diag = [] {  // see kDiag
        const char* v = std::getenv("GPTOSS_MOE_DECODE_DIAG");
        return v == nullptr ? 0 : std::clamp(std::atoi(v), 0, 3);
    }();
    static const bool loop_env = [] {  // moe_decode_mma_loop_kernel (MoeMxfp4Args::decode_loop)
        const char* v = std::getenv("GPTOSS_MOE_LOOP");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    // The decode layout (MoeMxfp4Args::gate_up_packed ...): the kPacked kernels read it through the blocks / scales
    // fields of pa. Not for the kDiag kernels.
    const bool packed = diag == 0 && moe_decode_packed(a);
    MoeMxfp4Args pa = a;
    if (packed) {
        pa.gate_up_blocks = a.gate_up_packed, pa.gate_up_scales = a.gate_up_packed_scales;
        pa.down_blocks = a.down_packed, pa.down_scales = a.down_packed_scales;
    }
    if constexpr (kGateUp && kWarps == 4) {
        if (early && diag == 0 && (a.decode_loop < 0 ? loop_env : a.decode_loop == 1)) {  // kDiag: one tile a CTA
            static const bool lean = [] {  // decode_load's kLean (on unless GPTOSS_MOE_LEAN_LOAD=0)
                const char* v = std::getenv("GPTOSS_MOE_LEAN_LOAD");
                return v == nullptr || std::strcmp(v, "0") != 0;
            }();
            static const bool step = [] {  // the loop kernel's kStep (on unless GPTOSS_MOE_TILE_STEP=0)
                const char* v = std::getenv("GPTOSS_MOE_TILE_STEP");
                return v == nullptr || std::strcmp(v, "0") != 0;
            }();
            const auto kernel = packed  ? moe_decode_mma_loop_kernel<4, true, true, false, true>
                                : !step ? moe_decode_mma_loop_kernel<4, true, false>
                                : lean  ? moe_decode_mma_loop_kernel<4, true>
                                        : moe_decode_mma_loop_kernel<4, false>;
            fit_dynamic_smem(kernel, smem);
            // GPTOSS_MOE_LOOP_GRID=N: N CTAs instead of the resident count (A/B runs, session 39: fewer gate_up CTAs
            // an SM leave registers for down's first CTAs, whose weight loads go out before their pdl_wait).
            static const int grid_env = [] {
                const char* v = std::getenv("GPTOSS_MOE_LOOP_GRID");
                return v == nullptr ? 0 : std::max(0, std::atoi(v));
            }();
            const int cap = a.decode_loop_grid > 0 ? a.decode_loop_grid
                            : grid_env > 0         ? grid_env
                                                   : loop_grid_capacity(kernel, 0, a.num_tokens, smem);
            // The first tiles' requests spread over W ns (MoeMxfp4Args::decode_stagger_ns; GPTOSS_MOE_STAGGER_NS=W,
            // unset: 2,000 at one token, none at two). r55 (s40e, 20b batch 1, two interleaved passes): W 0 1.394 /
            // 1.408 ms a step, 1000 1.390 / 1.395, 2000 1.385 / 1.385, 4000 1.404 / 1.393; 120b 0 2.058, 2000 2.050.
            static const int stagger_env = [] {
                const char* v = std::getenv("GPTOSS_MOE_STAGGER_NS");
                return v == nullptr ? -1 : std::clamp(std::atoi(v), 0, 100000);
            }();
            MoeMxfp4Args b = pa;
            if (b.decode_stagger_ns < 0)
                b.decode_stagger_ns = stagger_env >= 0 ? stagger_env : a.num_tokens == 1 ? kDefaultStaggerNs : 0;
            const int lgrid = static_cast<int>(std::min<int64_t>(grid, cap));
            if ((packed || (step && lean)) && a.num_tokens == 1)
                b.stamps = MoeStamps::get().rows(a.gate_up_blocks, 0, lgrid);
            if (b.stamps != nullptr) {
                const auto skernel = packed ? moe_decode_mma_loop_kernel<4, true, true, true, true>
                                            : moe_decode_mma_loop_kernel<4, true, true, true>;
                fit_dynamic_smem(skernel, smem);
                launch_pdl(skernel, lgrid, Sh::kThreads, smem, stream, b);
                return;
            }
            launch_pdl(kernel, lgrid, Sh::kThreads, smem, stream, b);
            return;
        }
    }
    // moe_decode_mma_down_loop_kernel (MoeMxfp4Args::decode_down_loop): GPTOSS_MOE_DOWN_LOOP=1 at 1-2 tokens, =0
    // never; unset, at 2 tokens only (r53: 20b batch 2 −7 to −20 µs a step in three interleaved pairs, batch 1
    // +9 to +18).
    static const int down_loop_env = [] {
        const char* v = std::getenv("GPTOSS_MOE_DOWN_LOOP");
        return v == nullptr ? -1 : std::strcmp(v, "1") == 0 ? 1 : 0;
    }();
    const int down_loop = a.decode_down_loop >= 0 ? a.decode_down_loop : down_loop_env;
    if constexpr (!kGateUp && kWarps == 4) {
        if (a.num_tokens <= 2 && diag == 0 && (down_loop == 1 || (down_loop < 0 && a.num_tokens == 2))) {
            const size_t dsmem = static_cast<size_t>(kWarps) * 2 * Sh::kTokenSlots * sizeof(uint4);
            const auto kernel =
                packed ? moe_decode_mma_down_loop_kernel<4, true> : moe_decode_mma_down_loop_kernel<4, false>;
            fit_dynamic_smem(kernel, dsmem);
            const int cap =
                a.decode_loop_grid > 0 ? a.decode_loop_grid : loop_grid_capacity(kernel, 1, a.num_tokens, dsmem);
            launch_pdl(kernel, static_cast<int>(std::min<int64_t>(grid, cap)), Sh::kThreads, dsmem, stream, pa);
            return;
        }
    }
    auto kernel =
        early ? moe_decode_mma_kernel<kGateUp, kWarps, kGateUp> : moe_decode_mma_kernel<kGateUp, kWarps, false>;
    if (packed)
        kernel = early ? moe_decode_mma_kernel<kGateUp, kWarps, kGateUp, 0, false, true>
                       : moe_decode_mma_kernel<kGateUp, kWarps, false, 0, false, true>;
    else if (diag == 1)
        kernel = early ? moe_decode_mma_kernel<kGateUp, kWarps, kGateUp, 1>
                       : moe_decode_mma_kernel<kGateUp, kWarps, false, 1>;
    else if (diag == 2)
        kernel = early ? moe_decode_mma_kernel<kGateUp, kWarps, kGateUp, 2>
                       : moe_decode_mma_kernel<kGateUp, kWarps, false, 2>;
    else if (diag == 3)
        kernel = early ? moe_decode_mma_kernel<kGateUp, kWarps, kGateUp, 3>
                       : moe_decode_mma_kernel<kGateUp, kWarps, false, 3>;
    if constexpr (!kGateUp && kWarps == 4) {
        if (diag == 0 && a.num_tokens == 1) {
            MoeMxfp4Args b = pa;
            b.stamps = MoeStamps::get().rows(a.gate_up_blocks, 1, grid);
            if (b.stamps != nullptr) {
                const auto skernel = packed ? moe_decode_mma_kernel<false, 4, false, 0, true, true>
                                            : moe_decode_mma_kernel<false, 4, false, 0, true>;
                fit_dynamic_smem(skernel, smem);
                launch_pdl(skernel, static_cast<int>(grid), Sh::kThreads, smem, stream, b);
                return;
            }
        }
    }
    fit_dynamic_smem(kernel, smem);
    launch_pdl(kernel, static_cast<int>(grid), Sh::kThreads, smem, stream, pa);
}

// ---- moe_decode_wg: the W4A8 decode MoE on wgmma m64n8k32 (native FP8 on Hopper) ---------------
//
// r41 split its K over the 4 CTAs of a cluster (moe_decode_wgk, 8a6eda7: each CTA 64 rows × a
// quarter of K with every code word requested at once, partials met by DSMEM; 96 registers, 5 CTAs
// an SM): correct within the W4A8 bounds but much slower, moe_bench 1 token 33.9 -> 56.3 µs, 20b
// batch 1 1.65 -> 2.19 ms a step, 120b 2.39 -> 3.23. Removed. Not separated (no ncu): its six
// serialized wgmma waits a CTA, the per-CTA x quantization, the cluster launches.
//
// mma.sync e4m3 is emulated on sm_90 (converted to f16 by ptxas: NVIDIA/cutlass#1986; an mma.sync
// form of this kernel was measured slower and removed in r29); wgmma's are native. The bf16 kernel
// above issues ~2.3 instructions a weight (r25: 312 warp instructions a KB) and runs at 1.1-1.5
// TB/s; this one was written to cut that. A CTA is one warpgroup over 64 rows of one expert and all of K:
// warp w has rows 16w + g and 16w + g + 8 (the wgmma A fragment: a0 / a1 at k 4t.., a2 / a3 at
// 16 + 4t..), lane t the 4 code bytes 4t.. of each group of both rows (LDG.32, a round of up to
// kWgRound groups issued together), turned into e4m3 by the two bit moves; a k32 wgmma is one
// group of every row (the W4A8 K order), into a 4-float tmp from zero, then 2^(s - 127) of each
// row's group scale in fp32 and the activation block's scale at each 128-block's end (the block
// scales amax / 448, as the FP8 GEMMs' activation quantizer). x (≤ 8 tokens) is quantized the same way into shared
// memory as the B operand: a 128-byte-swizzled 8-row atom per 128 of K (desc_sw128), the byte at K position p of a
// group holding element 8(p / 4) + 2(p % 4) (p < 16) or 8((p - 16) / 4) + 2(p % 4) + 1. Each warp holds all of K for
// its rows, so no cross-warp sum: gate_up pairs rows (gate, up) by a shuffle. Session 13; opt-in (GPTOSS_MOE_DECODE=4;
// tests: CudaMoeDecodeWg, the W4A8 scheme's bounds).
constexpr int kWgRows = 64;
constexpr int kWgRound = 24;      // groups of weight loads in flight a thread (48 registers)
constexpr int kWgMaxBlocks = 32;  // 128-wide K blocks: K ≤ 4,096
// d = A · B (scale-d false: d's input ignored), A from registers, B by descriptor.
__device__ __forceinline__ void wgmma_e4m3_n8_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}
// The byte of the B tile holding group-element e (0..31) of group gi (0..3 within the block) of
// token row n: K position p in the group's k32 step, then the 128-byte swizzle (chunk ^ row).
__device__ __forceinline__ int wg_b_offset(int n, int gi, int e) {
    const int p = (e & 1) * 16 + 4 * (e >> 3) + ((e & 7) >> 1);
    const int k = 32 * gi + p;
    return n * 128 + ((((k >> 4) ^ n) & 7) << 4) + (k & 15);
}

template <bool kGateUp>
__global__ void __launch_bounds__(128) moe_decode_wg_kernel(const MoeMxfp4Args a) {
    extern __shared__ __align__(16)
        uint8_t wg_smem_raw[];  // aligned to 1024 below (a 1024 alignment here would pad every kernel of the file)
    // 1024-aligned B atoms [blocks][8 rows][128 bytes], then the block scales [8][kWgMaxBlocks],
    // then the tile's group scale bytes [64 rows][G].
    uint8_t* xb = wg_smem_raw + ((1024 - (smem_addr(wg_smem_raw) & 1023)) & 1023);
    __shared__ int s_info[4];
    __shared__ int s_as[8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int H = a.hidden_size, I = a.intermediate_size, K = a.experts_per_token;
    const int in_dim = kGateUp ? H : I, G = in_dim / 32, nb = (G + 3) / 4;
    const int rows = kGateUp ? 2 * I : H;
    float* xsc = reinterpret_cast<float*>(xb + nb * 1024);
    uint8_t* s_sc = xb + nb * 1024 + 8 * kWgMaxBlocks * 4;
    const DecodeTile tile = decode_tile<kGateUp, kWgRows>(a, s_info);
    if (tile.e < 0) return;
    const int e = tile.e, tok0 = tile.tok0, ntok = tile.ntok, row0 = tile.row0;
    const uint8_t* blocks = kGateUp ? a.gate_up_blocks : a.down_blocks;
    const uint8_t* scales = kGateUp ? a.gate_up_scales : a.down_scales;
    const int64_t r_lo = static_cast<int64_t>(e) * rows + row0 + 16 * warp + g;
    const uint8_t* w_lo = blocks + r_lo * G * 16 + 4 * t;
    const uint8_t* w_hi = w_lo + static_cast<int64_t>(8) * G * 16;
    // The first round of weight loads before pdl_wait (weights never change).
    uint32_t wl[kWgRound], wh[kWgRound];
    const auto load_round = [&](int gbeg) {
#pragma unroll
        for (int i = 0; i < kWgRound; ++i) {
            const int gi = min(gbeg + i, G - 1);
            wl[i] = __ldg(reinterpret_cast<const uint32_t*>(w_lo + gi * 16));
            wh[i] = __ldg(reinterpret_cast<const uint32_t*>(w_hi + gi * 16));
        }
    };
    load_round(0);
    // The tile's scale bytes: 64 · G contiguous bytes from a 16-byte aligned start (rows and row0
    // are multiples of 64), 16 bytes a thread at a time.
    const uint4* sc_src = reinterpret_cast<const uint4*>(scales + (static_cast<int64_t>(e) * rows + row0) * G);
    uint4 scv[(kWgRows * 128 / 16 + 127) / 128];  // G ≤ 128
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(scv) / sizeof(scv[0])); ++i) {
        const int c = threadIdx.x + 128 * i;
        scv[i] = c < kWgRows * G / 16 ? __ldg(sc_src + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    if (threadIdx.x < ntok) s_as[threadIdx.x] = __ldcg(a.sorted_assignments + tok0 + threadIdx.x);
    if constexpr (!kGateUp) pdl_wait();  // act is the gate_up kernel's output
    pdl_trigger();
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(scv) / sizeof(scv[0])); ++i) {
        const int c = threadIdx.x + 128 * i;
        if (c < kWgRows * G / 16) reinterpret_cast<uint4*>(s_sc)[c] = scv[i];
    }
    __syncthreads();  // s_as, s_sc

    // x: rows of tokens ≥ ntok zero; warp w quantizes blocks w, w + 4, .. of every token row (4
    // values a lane, amax / 448), loads of a token's blocks issued together.
    for (int i = threadIdx.x; i < nb * 8 * 128 / 16; i += 128) {
        const int n = (i >> 3) & 7;
        if (n >= ntok) *reinterpret_cast<uint4*>(xb + 16 * i) = make_uint4(0u, 0u, 0u, 0u);
    }
    for (int tk = 0; tk < ntok; ++tk) {
        const int as = s_as[tk];
        constexpr int kPer = kWgMaxBlocks / 4;
        float v[kPer][4];
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int b = warp + 4 * j;
            const int col = min(128 * b + 4 * lane, in_dim - 4);  // clamped: zeroed below
            if (!kGateUp || a.h_f32 != nullptr) {
                const float* src = kGateUp ? a.h_f32 + static_cast<int64_t>(as / K) * H + col
                                           : a.act + static_cast<int64_t>(as) * I + col;
                const float4 x4 = *reinterpret_cast<const float4*>(src);
                v[j][0] = x4.x, v[j][1] = x4.y, v[j][2] = x4.z, v[j][3] = x4.w;
            } else {
                const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(a.h) +
                                                                static_cast<int64_t>(as / K) * H + col);
                v[j][0] = __uint_as_float(u.x << 16), v[j][1] = __uint_as_float(u.x & 0xffff0000u);
                v[j][2] = __uint_as_float(u.y << 16), v[j][3] = __uint_as_float(u.y & 0xffff0000u);
            }
            if (b >= nb || 128 * b + 4 * lane >= in_dim) v[j][0] = v[j][1] = v[j][2] = v[j][3] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
            const int b = warp + 4 * j;
            if (b >= nb) break;  // warp-uniform
            const float m =
                warp_max(fmaxf(fmaxf(fabsf(v[j][0]), fabsf(v[j][1])), fmaxf(fabsf(v[j][2]), fabsf(v[j][3]))));
            const float inv = m > 0.0f ? fminf(__fdiv_rn(448.0f, m), 3.0e38f) : 1.0f;
            if (lane == 0) xsc[tk * kWgMaxBlocks + b] = (m > 0.0f ? __fdiv_rn(m, 448.0f) : 1.0f) * 64.0f;
            // Group lane / 8 of the block, its elements 4·(lane % 8) + 0..3.
            const int gi = lane >> 3, e0 = 4 * (lane & 7);
            uint8_t* atom = xb + b * 1024;
#pragma unroll
            for (int q = 0; q < 4; ++q)
                atom[wg_b_offset(tk, gi, e0 + q)] =
                    static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(v[j][q], inv), __NV_SATFINITE, __NV_E4M3));
        }
    }
    fence_proxy_async();  // the generic-proxy stores, before wgmma reads them through the async proxy
    __syncthreads();

    // Rows r_lo, r_lo + 8 × tokens 2t, 2t + 1.
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t xb_addr = smem_addr(xb);
    for (int gbeg = 0; gbeg < G; gbeg += kWgRound) {
        if (gbeg > 0) load_round(gbeg);
#pragma unroll
        for (int b4 = 0; b4 < kWgRound / 4; ++b4) {  // a 128-block (a round starts on one: kWgRound % 4 == 0)
            const int kb = gbeg / 4 + b4;
            if (4 * kb >= G) break;
            float tmp[4][4];
            uint32_t af[4][4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = 4 * b4 + q;
                af[q][0] = e2m1_lo_to_e4m3(wl[i]);
                af[q][1] = e2m1_lo_to_e4m3(wh[i]);
                af[q][2] = e2m1_hi_to_e4m3(wl[i]);
                af[q][3] = e2m1_hi_to_e4m3(wh[i]);
#pragma unroll
                for (int r = 0; r < 4; ++r) tmp[q][r] = 0.0f;
            }
            wgmma_fence();
#pragma unroll
            for (int q = 0; q < 4; ++q) wgmma_e4m3_n8_rs(tmp[q], af[q], desc_sw128(xb_addr + kb * 1024 + 32 * q));
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int r = 0; r < 4; ++r) reg_fence(tmp[q][r]);
            float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int gi = 4 * kb + q;
                if (gi >= G) break;
                const float s0 = e8m0_to_f32(s_sc[(16 * warp + g) * G + gi]);
                const float s1 = e8m0_to_f32(s_sc[(16 * warp + g + 8) * G + gi]);
                blk[0] = fmaf(s0, tmp[q][0], blk[0]);
                blk[1] = fmaf(s0, tmp[q][1], blk[1]);
                blk[2] = fmaf(s1, tmp[q][2], blk[2]);
                blk[3] = fmaf(s1, tmp[q][3], blk[3]);
            }
            const float x0 = 2 * t < ntok ? xsc[2 * t * kWgMaxBlocks + kb] : 0.0f;
            const float x1 = 2 * t + 1 < ntok ? xsc[(2 * t + 1) * kWgMaxBlocks + kb] : 0.0f;
            acc[0] = fmaf(x0, blk[0], acc[0]);
            acc[1] = fmaf(x1, blk[1], acc[1]);
            acc[2] = fmaf(x0, blk[2], acc[2]);
            acc[3] = fmaf(x1, blk[3], acc[3]);
        }
    }

    // Epilogue: this thread's rows are complete sums.
    const int rl = row0 + 16 * warp + g;  // and rl + 8
    if constexpr (kGateUp) {
        // Rows 2p (gate) and 2p + 1 (up): lanes g and g ^ 1 (lane ^ 4) hold a pair.
        float o[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) o[r] = __shfl_xor_sync(0xffffffffu, acc[r], 4);
        if ((g & 1) == 0) {
            const int64_t b = static_cast<int64_t>(e) * rows;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // rows rl (acc 0, 1) and rl + 8 (acc 2, 3)
                const int gr = rl + 8 * h;
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int tk = 2 * t + c;
                    if (tk < ntok)
                        a.act[static_cast<int64_t>(s_as[tk]) * I + gr / 2] =
                            swiglu(acc[2 * h + c] + a.gate_up_bias[b + gr], o[2 * h + c] + a.gate_up_bias[b + gr + 1],
                                   a.swiglu_limit, a.swiglu_alpha);
                }
            }
        }
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int gr = rl + 8 * h;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int tk = 2 * t + c;
                if (tk < ntok)
                    a.y[static_cast<int64_t>(s_as[tk]) * H + gr] =
                        acc[2 * h + c] + a.down_bias[static_cast<int64_t>(e) * rows + gr];
            }
        }
    }
}

template <bool kGateUp>
void launch_wg(const MoeMxfp4Args& a, cudaStream_t stream) {
    const int rows = kGateUp ? 2 * a.intermediate_size : a.hidden_size;
    const int in_dim = kGateUp ? a.hidden_size : a.intermediate_size;
    const int nb = (in_dim / 32 + 3) / 4;
    const int64_t experts = std::min(a.num_experts, a.num_tokens * a.experts_per_token);
    const int64_t grid = experts * (rows / kWgRows);
    const size_t smem = 1024 + static_cast<size_t>(nb) * 1024 + 8 * kWgMaxBlocks * 4 + kWgRows * (in_dim / 32);
    auto kernel = moe_decode_wg_kernel<kGateUp>;
    fit_dynamic_smem(kernel, smem);
    launch_pdl(kernel, static_cast<int>(grid), 128, smem, stream, a);
}

// ---- moe_decode_fp8: the same batches on the FP8 copy of the experts (session 35) ---------------
//
// Where the model holds the experts in FP8 as well (20b --fp8; 120b --fp8-experts), a decode step
// can read those: twice MXFP4's bytes, but an e4m3 pair becomes an f16 pair in one instruction
// (cvt.rn.f16x2.e4m3x2) where moe_decode_mma spends ~3 on an e2m1 pair plus its scale multiply, and
// it is that kernel's instructions, not its bytes, that bound it (r31, r45). The FP8 GEMVs' f16 form
// (gemv.cu) reads lm_head at 98% of the copy bandwidth (gemv_bench, r50). A CTA is one 16-row tile
// of one active expert, as in moe_decode_mma: 8 warps take the tile's 64-byte K steps in turn (warp w:
// steps w, w + 8, ...; K ≤ 3,072 in one round of loads, all issued before any math), lane (g, t)
// bytes 16t .. 16t + 15 of each step of rows g and g + 8; word j of those feeds MMA j, bytes (0, 1)
// at logical k (2t, 2t + 1) and (2, 3) at (2t + 8, 2t + 9). The tile's rows share one 128-row block
// scale a step (16 | 128), applied to each step's MMA sums in fp32. The MMA columns are the tile's
// assignments (≤ 8), their input rows (gate_up: the token's h; down: the assignment's act) rounded
// to bf16 as moe_decode_mma rounds them, then staged once a CTA in shared memory as f16 (exact for
// bf16 values of [2^-14, 65504]; a row reaching 65504 is staged again scaled down by a power of two
// and its sums scaled back: moe_common.cuh f16_stage_rows). The FP8 copy is MXFP4's values exactly
// (model/fp8_convert.h), so the products are moe_decode_mma's; only the order of the fp32 sums differs. Epilogues as
// moe_decode_mma's.
constexpr int kF8Warps = 8;
constexpr int kF8Steps = 6;                         // 64-byte K steps a warp
constexpr int kF8MaxK = kF8Warps * kF8Steps * 64;   // 3,072
constexpr int kF8MaxRows = kMoeDecodeMmaMaxTokens;  // staged input rows (assignments) a tile
__host__ __device__ __forceinline__ int f8_pitch_words(int k) { return k / 2 + 4; }  // 16 bytes of padding a row

template <bool kGateUp>
__global__ void __launch_bounds__(kF8Warps * 32, 3) moe_decode_fp8_kernel(const __grid_constant__ MoeMxfp4Args a) {
    extern __shared__ uint32_t xs[];  // [rows][f8_pitch_words(K)]: the tile's input rows as f16 pairs
    __shared__ float red[kF8Warps][kRows][8];
    __shared__ int s_info[4];
    __shared__ int s_as[kF8MaxRows];
    __shared__ int s_col[kF8MaxRows];
    __shared__ F16StageShared s_stage;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int H = a.hidden_size, I = a.intermediate_size;
    const int K = kGateUp ? H : I, rows = kGateUp ? 2 * I : H;
    const int k_pad = kGateUp ? a.gate_up_k_pad : a.down_k_pad;
    const int tiles = rows / kRows, slot = blockIdx.x / tiles, row0 = (blockIdx.x % tiles) * kRows;
    const int S = K / 64, kb = k_pad / 128;

    // The tile. gate_up: the plan comes from the kernel just before. down: it was complete before
    // the gate_up launch passed its wait (so before this launch began): the tile and its weight
    // loads come before pdl_wait, which only act needs.
    if constexpr (kGateUp) pdl_wait();
    if (warp == 0) find_slot(a.expert_offsets, a.num_experts, slot, s_info);
    __syncthreads();
    const int e = s_info[0];
    if (e < 0) {
        if constexpr (!kGateUp) pdl_wait();
        pdl_trigger();
        return;
    }
    const int tok0 = s_info[1], ntok = min(s_info[2], kF8MaxRows);

    // This warp's weights and block scales: all of them, now.
    const uint8_t* wq =
        (kGateUp ? a.gate_up_f8 : a.down_f8) + (static_cast<int64_t>(e) * rows + row0 + g) * k_pad + 16 * t;
    const float* wsc = (kGateUp ? a.gate_up_f8_scale : a.down_f8_scale) +
                       (static_cast<int64_t>(e) * ((rows + 127) / 128) + row0 / 128) * kb;
    uint4 wl[kF8Steps], wh[kF8Steps];
    float sc[kF8Steps];
#pragma unroll
    for (int i = 0; i < kF8Steps; ++i) {
        const int s = warp + kF8Warps * i;
        if (s < S) {
            wl[i] = ldg_stream(wq + s * 64);
            wh[i] = ldg_stream(wq + 8 * static_cast<int64_t>(k_pad) + s * 64);
            sc[i] = __ldg(wsc + (s >> 1));
        }
    }
    if (threadIdx.x < ntok) {
        s_as[threadIdx.x] = __ldcg(a.sorted_assignments + tok0 + threadIdx.x);
        s_col[threadIdx.x] = threadIdx.x;
    }
    if constexpr (!kGateUp) pdl_wait();  // act is the gate_up kernel's output
    pdl_trigger();                       // after the wait: at most this kernel and the next in flight
    __syncthreads();                     // s_as

    // The input rows, staged (moe_common.cuh f16_stage_rows: again, scaled down, for a row beyond f16).
    const bool f32 = !kGateUp || a.h_f32 != nullptr;
    const auto row_ptr = [&](int j) -> const void* {
        if constexpr (kGateUp) {
            const int64_t tok = s_as[j] / a.experts_per_token;
            return f32 ? static_cast<const void*>(a.h_f32 + tok * H)
                       : static_cast<const void*>(static_cast<const __nv_bfloat16*>(a.h) + tok * H);
        } else {
            return a.act + static_cast<int64_t>(s_as[j]) * I;
        }
    };
    const uint32_t down = f16_stage_rows(xs, f8_pitch_words(K), ntok, K, f32, row_ptr, s_stage);

    // Rows g, g + 8 × assignments 2t, 2t + 1 (lanes g ≥ ntok feed zero columns).
    const bool has_x = g < ntok;
    const uint32_t* xrow = xs + (has_x ? g : 0) * f8_pitch_words(K) + 8 * t;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kF8Steps; ++i) {
        const int s = warp + kF8Warps * i;
        if (s >= S) break;
        uint32_t xw[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        if (has_x) {
            const uint4 x0 = *reinterpret_cast<const uint4*>(xrow + 32 * s);
            const uint4 x1 = *reinterpret_cast<const uint4*>(xrow + 32 * s + 4);
            xw[0] = x0.x, xw[1] = x0.y, xw[2] = x0.z, xw[3] = x0.w;
            xw[4] = x1.x, xw[5] = x1.y, xw[6] = x1.z, xw[7] = x1.w;
        }
        const uint32_t lo[4] = {wl[i].x, wl[i].y, wl[i].z, wl[i].w};
        const uint32_t hi[4] = {wh[i].x, wh[i].y, wh[i].z, wh[i].w};
        float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 4; ++j)
            mma_f16(tmp, cvt_e4m3x2_f16x2_lo(lo[j]), cvt_e4m3x2_f16x2_lo(hi[j]), cvt_e4m3x2_f16x2_hi(lo[j]),
                    cvt_e4m3x2_f16x2_hi(hi[j]), xw[2 * j], xw[2 * j + 1]);
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[r] = fmaf(sc[i], tmp[r], acc[r]);
    }

    // The warps' sums meet in shared memory, in warp order: moe_decode_mma's epilogue, the MMA column
    // of assignment j being j, and the staging's scale undone.
    decode_epilogue<kGateUp, kF8Warps>(a, acc, red, e, row0, ntok, s_as, s_col, s_info[3],
                                       [&](float v, int j) { return f16_unstage(v, down, j, s_stage); });
}

template <bool kGateUp>
void launch_fp8(const MoeMxfp4Args& a, cudaStream_t stream) {
    const int rows = kGateUp ? 2 * a.intermediate_size : a.hidden_size;
    const int K = kGateUp ? a.hidden_size : a.intermediate_size;
    const int64_t experts = std::min(a.num_experts, a.num_tokens * a.experts_per_token);
    const int64_t grid = experts * (rows / kRows);
    // An expert has at most one assignment of each token: num_tokens input rows at most.
    const size_t smem = static_cast<size_t>(std::min(a.num_tokens, kF8MaxRows)) * f8_pitch_words(K) * 4;
    fit_dynamic_smem(moe_decode_fp8_kernel<kGateUp>, smem);
    launch_pdl(moe_decode_fp8_kernel<kGateUp>, static_cast<int>(grid), kF8Warps * 32, smem, stream, a);
}
// MoeResidualTail without a ticket: CTA j the tile j (after kernels without the in-kernel tail).
__global__ void __launch_bounds__(32) moe_residual_tail_kernel(const MoeResidualTail t, const float* y, int H, int K) {
    pdl_wait();  // y comes from the kernel just before
    pdl_trigger();
    if (threadIdx.x < kMoeTailTile) residual_tail_tile(t, y, H, K, static_cast<int>(blockIdx.x));
}
}  // namespace

void moe_residual_tail(const MoeResidualTail& t, const float* y, int hidden_size, int experts_per_token,
                       cudaStream_t stream) {
    ENGINE_CHECK(t.x != nullptr && t.weights != nullptr && t.gain != nullptr && t.h != nullptr &&
                     t.ss_parts != nullptr && hidden_size > 0 && hidden_size % kMoeTailTile == 0 &&
                     experts_per_token >= 1,
                 "moe_residual_tail: hidden %d, k %d unsupported", hidden_size, experts_per_token);
    launch_pdl(moe_residual_tail_kernel, hidden_size / kMoeTailTile, 32, 0, stream, t, y, hidden_size,
               experts_per_token);
}

bool moe_decode_mma_supported(const MoeMxfp4Args& a) {
    const int G_h = a.hidden_size / 32, G_i = a.intermediate_size / 32;
    return a.num_tokens >= 1 && a.num_tokens <= kMoeDecodeMmaMaxTokens && a.hidden_size % 32 == 0 &&
           a.intermediate_size % 32 == 0 && (2 * a.intermediate_size) % kRows == 0 && a.hidden_size % kRows == 0 &&
           (G_h + 3) / 4 <= kStepsPerTile && (G_i + 3) / 4 <= kStepsPerTile && a.num_experts <= kMaxExpertsScan;
}

void moe_decode_mma(const MoeMxfp4Args& a, cudaStream_t stream) {
    ENGINE_CHECK(moe_decode_mma_supported(a), "moe_decode_mma: %d tokens, sizes %d/%d, %d experts unsupported",
                 a.num_tokens, a.hidden_size, a.intermediate_size, a.num_experts);
    ENGINE_CHECK(a.tail.x == nullptr || (a.num_tokens == 1 && a.tail.counters != nullptr),
                 "moe_decode_mma: the residual tail needs one token and its counters");
    launch<true, 4>(a, stream);
    launch<false, 4>(a, stream);
}

// One thread a (row, group): its 16 code bytes (each word in the decode bit order) and its scale byte to their
// places in the decode layout (moe.h).
__global__ void moe_pack_decode_kernel(const uint4* blocks, const uint8_t* scales, int64_t n, int G, uint4* pblocks,
                                       uint8_t* pscales) {
    const int S = (G + 3) / 4;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / G;
        const int q = static_cast<int>(i - row * G), rr = static_cast<int>(row & 15), h = rr >> 3;
        const int lane = 4 * (rr & 7) + (q & 3);
        const int64_t step = (row >> 4) * S + (q >> 2);
        const uint4 b = blocks[i];
        pblocks[64 * step + 32 * h + lane] = make_uint4(e2m1x8_to_decode_bits(b.x), e2m1x8_to_decode_bits(b.y),
                                                        e2m1x8_to_decode_bits(b.z), e2m1x8_to_decode_bits(b.w));
        pscales[64 * step + 2 * lane + h] = scales[i];
    }
}

int64_t moe_packed_decode_bytes(int64_t rows, int groups, bool scales) {
    return rows / 16 * ((groups + 3) / 4) * (scales ? 64 : 1024);
}

void moe_pack_decode(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int groups, uint8_t* packed_blocks,
                     uint8_t* packed_scales, cudaStream_t stream) {
    ENGINE_CHECK(rows % kRows == 0 && groups > 0, "moe_pack_decode: %lld rows (a multiple of %d), %d groups",
                 static_cast<long long>(rows), kRows, groups);
    const int64_t n = rows * groups;
    if (n == 0) return;
    // The slots past the last group of a step are never read; zero them so that the buffers are deterministic.
    CUDA_CHECK(cudaMemsetAsync(packed_blocks, 0, moe_packed_decode_bytes(rows, groups, false), stream));
    CUDA_CHECK(cudaMemsetAsync(packed_scales, 0, moe_packed_decode_bytes(rows, groups, true), stream));
    const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 1 << 16));
    moe_pack_decode_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<const uint4*>(blocks), scales, n, groups,
                                                     reinterpret_cast<uint4*>(packed_blocks), packed_scales);
    CUDA_CHECK_LAUNCH();
}

bool moe_decode_fp8_shapes_ok(int hidden, int inter, int num_experts) {
    return hidden % 64 == 0 && inter % 64 == 0 && hidden > 0 && inter > 0 && hidden <= kF8MaxK && inter <= kF8MaxK &&
           num_experts >= 1 && num_experts <= kMaxExpertsScan;
}

bool moe_decode_fp8_supported(const MoeMxfp4Args& a) {
    const int H = a.hidden_size, I = a.intermediate_size;
    return moe_decode_fp8_shapes_ok(H, I, a.num_experts) && a.gate_up_f8 != nullptr && a.gate_up_f8_scale != nullptr &&
           a.down_f8 != nullptr && a.down_f8_scale != nullptr && a.num_tokens >= 1 &&
           a.num_tokens <= kMoeDecodeMmaMaxTokens && a.gate_up_k_pad >= H && a.gate_up_k_pad % 128 == 0 &&
           a.down_k_pad >= I && a.down_k_pad % 128 == 0;
}

void moe_decode_fp8(const MoeMxfp4Args& a, cudaStream_t stream) {
    ENGINE_CHECK(moe_decode_fp8_supported(a), "moe_decode_fp8: %d tokens, sizes %d/%d, %d experts unsupported",
                 a.num_tokens, a.hidden_size, a.intermediate_size, a.num_experts);
    ENGINE_CHECK(a.tail.x == nullptr || (a.num_tokens == 1 && a.tail.counters != nullptr),
                 "moe_decode_fp8: the residual tail needs one token and its counters");
    launch_fp8<true>(a, stream);
    launch_fp8<false>(a, stream);
}

bool moe_decode_wg_supported(const MoeMxfp4Args& a) {
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return moe_decode_mma_supported(a) && aligned16(a.gate_up_scales) && aligned16(a.down_scales) &&
           (2 * a.intermediate_size) % kWgRows == 0 && a.hidden_size % kWgRows == 0 && a.hidden_size % 32 == 0 &&
           a.intermediate_size % 32 == 0 && (a.hidden_size / 32 + 3) / 4 <= kWgMaxBlocks &&
           (a.intermediate_size / 32 + 3) / 4 <= kWgMaxBlocks;
}

void moe_decode_wg(const MoeMxfp4Args& a, cudaStream_t stream) {
    ENGINE_CHECK(moe_decode_wg_supported(a), "moe_decode_wg: %d tokens, sizes %d/%d, %d experts unsupported",
                 a.num_tokens, a.hidden_size, a.intermediate_size, a.num_experts);
    launch_wg<true>(a, stream);
    launch_wg<false>(a, stream);
    if (a.tail.x != nullptr) moe_residual_tail(a.tail, a.y, a.hidden_size, a.experts_per_token, stream);
}

}  // namespace gptoss::kernels::cuda
