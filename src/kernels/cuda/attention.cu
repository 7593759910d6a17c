// Paged bf16 attention with sinks (MODEL.md §4.4) on the CUDA backend: a FlashAttention-2 style
// prefill kernel on tensor cores, a split-KV decode kernel plus its combine step, and a simple
// reference kernel (the second oracle of STYLE.md rule 3).
//
// Shapes are gpt-oss's (head_dim 64, 8 query heads per kv head). Every kernel gathers keys through
// the block table one key row at a time (a row = the 64 bf16 of one kv head = 128 contiguous
// bytes), so any power-of-two block_size works with the 64-key tiles, and table entries of keys
// outside a query's visible range are never read (sliding layers may hold −1 there).
//
// Numerics. Scores s = q·k · scale are computed from bf16 operands with fp32 accumulation; the
// softmax runs in base 2 (s·log2e) in fp32 with ex2.approx, which is the same function as
// MODEL.md's e^{s − M}. The sink enters the denominator only, exactly as the CPU reference: the
// prefill kernel starts each row's running max at the sink logit (sum 0) and adds e^{sink − m} at
// the end; the decode splits keep sink-free partials (m, l, acc) and the sink is added once, by
// whichever step finalises the row (the decode CTA itself when a sequence uses one split, the
// combine kernel otherwise). Probabilities are rounded to bf16 for the P·V product (as in
// FlashAttention; f16 in the decode kernel's FP8-direct variant); the denominator sums the fp32
// values. An FP8 (e4m3) cache is widened exactly: to bf16 in shared memory, or (fp8_direct) to f16
// fragments with Q in f16 too.
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_quant.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "kernels/cuda/cuda_check.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kHeadDim = 64;
constexpr int kGroup = 8;                        // query heads per kv head
constexpr int kKvTile = 64;                      // keys per KV tile
constexpr int kRowBytes = kHeadDim * 2;          // one key row of one kv head: 128 B = 8 chunks of 16 B
constexpr int kTileBytes = kKvTile * kRowBytes;  // 8 KB: the K (or V) half of a KV tile
constexpr float kLog2e = 1.4426950408889634f;
// A finite stand-in for −inf as a running max: e^{kNegBig − x} is 0 for any real x, and
// kNegBig − kNegBig = 0 gives factor 1 instead of the NaN that −inf − (−inf) would.
constexpr float kNegBig = -1.0e30f;

// ---- prefill configuration -----------------------------------------------------------------
// A CTA owns 16 query tokens × the 8 query heads of one kv head = 128 rows (row r = token·8 +
// head, which is also the memory order of q/out), 4 warps × 32 rows. Every K/V tile staged in
// shared memory serves all 128 rows: GQA sharing for free, and 32 rows per warp give 32 FLOP per
// byte of ldmatrix traffic (enough to keep the tensor cores ahead of shared memory).
constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillTokens = 16;
constexpr int kPrefillRows = kPrefillTokens * kGroup;  // 128
constexpr int kPrefillStages = 2;
constexpr int kPrefillSmem = kPrefillRows * kRowBytes + kPrefillStages * 2 * kTileBytes;  // 16 + 32 KB
// The warpgroup variant (PagedAttentionArgs::prefill_wgmma): the same 128 rows a CTA, as 2
// warpgroups × 64 rows (8 warps × 16 rows: tokens 2w and 2w + 1), both GEMMs on wgmma; plus 1 KB
// of slack to align the K/V tiles to 1 KB for the 128-byte-swizzle descriptors.
constexpr int kWgPrefillThreads = 256;
constexpr int kWgPrefillSmem = kPrefillSmem + 1024;
static_assert(kPrefillRows == kPrefillWarps * 32, "one warp = two m16 tiles of rows");

// ---- decode configuration ------------------------------------------------------------------
// A CTA owns (sequence, kv head, split): the 8 query heads of the kv head against the split's key
// range, in one pass (each K/V byte is read once for all 8 heads). The 4 warps take 16 keys each
// of every 64-key tile; tiles stream through a 4-stage cp.async ring (48 KB in flight per CTA).
constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeStages = 4;
constexpr int kDecodeSmem = kDecodeStages * 2 * kTileBytes;  // 64 KB → 3 CTAs per SM
constexpr int kDecodeCtasPerSm = 3;
// r43 (efedcfb) ran the cluster variant (<= 2 sequences, about one CTA an SM) on a 7-stage ring
// (96 KB in flight, 112 KB of shared memory): slower everywhere (attention_bench one sequence 8k
// 11.0 -> 13.1 us, 32k 28.7 -> 30.5; 20b batch 1 at 1k 1.620 -> 1.645 ms a step, batch 2 at 32k
// 2.61 -> 2.86), so the 2.17 TB/s ncu measured at one sequence, 32k, is not for want of bytes in flight.
constexpr int kMinTilesPerSplit = 2;          // ≥ 128 keys (32 KB of K/V) per split against 2 KB of partials
constexpr int kRedStride = kHeadDim + 4;      // per (warp, head) row of the merge scratch: acc[64], m, l, pad
constexpr int kCombineThreads = kGroup * 32;  // one warp per query head
static_assert(kDecodeWarps * 16 == kKvTile, "each decode warp takes 16 keys of a tile");
static_assert(kDecodeWarps * kGroup * kRedStride * 4 <= kDecodeSmem, "merge scratch reuses the ring");

constexpr int kRefWarps = 4;  // reference kernel: one warp per (token, head)

// ---- small device helpers ------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a [rows][64] bf16 tile. The XOR
// swizzle puts the 8 rows that one ldmatrix phase reads (same logical chunk) in 8 different bank
// groups; without it a 128-byte row pitch would make every ldmatrix an 8-way conflict.
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
    return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// 16-byte async copy global → shared; when !valid nothing is read and the 16 bytes are zeroed
// (keys outside the visible range must be finite in shared memory: P = 0 times garbage could be
// 0 · NaN).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// D += A·B, m16n8k16, bf16 operands, fp32 accumulators. Fragments (PTX ISA, g = lane/4,
// t = lane%4): A a0 = (row g, k 2t..2t+1), a1 = (g+8, 2t), a2 = (g, 2t+8), a3 = (g+8, 2t+8);
// B b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g); C c0,c1 = (row g, cols 2t, 2t+1),
// c2,c3 = (row g+8, same cols).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x; ex2.approx(−inf) = +0, which is how masked scores drop out.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float warp_max_all(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum_all(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Where one sequence's keys for one kv head live.
struct KvSource {
    const uint8_t* k;  // bf16 or (PagedAttentionArgs::kv_fp8) e4m3 elements
    const uint8_t* v;
    bool fp8;
    const int32_t* table;  // this sequence's row of block_tables
    int64_t slot_stride;   // elements from one slot to the next: num_kv_heads · 64
    int head_offset;       // kv_head · 64
    int bs_shift;          // log2(block_size)
    int bs_mask;           // block_size − 1
};

__device__ __forceinline__ KvSource make_kv_source(const PagedAttentionArgs& a, int seq, int kv_head) {
    KvSource s;
    s.k = static_cast<const uint8_t*>(a.k_cache);
    s.v = static_cast<const uint8_t*>(a.v_cache);
    s.fp8 = a.kv_fp8;
    s.table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
    s.slot_stride = static_cast<int64_t>(a.num_kv_heads) * kHeadDim;
    s.head_offset = kv_head * kHeadDim;
    s.bs_shift = __ffs(a.block_size) - 1;
    s.bs_mask = a.block_size - 1;
    return s;
}

// Element offset of column `col` of key j's row for this kv head; 0 when !valid (nothing read,
// the block table included).
__device__ __forceinline__ int64_t kv_offset(const KvSource& src, int j, bool valid, int col) {
    if (!valid) return 0;
    const int64_t block = __ldg(src.table + (j >> src.bs_shift));
    const int64_t slot = (block << src.bs_shift) + (j & src.bs_mask);
    return slot * src.slot_stride + src.head_offset + col;
}

// Stages keys [tile·64, tile·64 + 64) of an e4m3 cache as [64 keys][64 bytes] tiles at k_dst and
// v_dst (128 threads: 2 rows × one 16-byte chunk each, for K and for V); invalid keys: zeros.
// kSwizzled: chunk c of row r at chunk c ^ ((r >> 1) & 3) (the fragment-direct decode kernel's
// layout); else in order (the layout convert_fp8_kv_tile reads).
template <bool kSwizzled, int kThreads = 128>
__device__ __forceinline__ void load_kv_tile_e4m3(const KvSource& src, int tile, int lo, int hi, uint32_t k_dst,
                                                  uint32_t v_dst, int tid) {
    const int q = tid & 3;
#pragma unroll
    for (int i = 0; i < kKvTile / (kThreads / 4); ++i) {
        const int row = (tid >> 2) + i * (kThreads / 4);
        const int j = tile * kKvTile + row;
        const bool valid = j >= lo && j <= hi;
        const int64_t off = kv_offset(src, j, valid, q * 16);
        const uint32_t d = static_cast<uint32_t>(row * kHeadDim + (kSwizzled ? (q ^ ((row >> 1) & 3)) << 4 : q * 16));
        cp_async_16(k_dst + d, src.k + off, valid);
        cp_async_16(v_dst + d, src.v + off, valid);
    }
}

// Stages keys [tile·64, tile·64 + 64) of K and V into swizzled [64][64] bf16 tiles (kThreads
// threads: 64 · 8 / kThreads rows × one 16-byte chunk each, twice). Keys outside [lo, hi] are zero-filled without
// touching the block table or the cache. FP8 cache: the e4m3 rows (64 bytes) land unswizzled in the upper half of the V
// tile (K's at v_dst, V's at v_dst + 4 KB); convert_fp8_kv_tile then writes both bf16 tiles.
template <int kThreads = 128>
__device__ __forceinline__ void load_kv_tile(const KvSource& src, int tile, int lo, int hi, uint32_t k_dst,
                                             uint32_t v_dst, int tid) {
    if (src.fp8) {
        load_kv_tile_e4m3<false, kThreads>(src, tile, lo, hi, v_dst, v_dst + kTileBytes / 2, tid);
        return;
    }
    const int chunk = tid & 7;
#pragma unroll
    for (int i = 0; i < kKvTile / (kThreads / 8); ++i) {
        const int row = (tid >> 3) + i * (kThreads / 8);
        const int j = tile * kKvTile + row;
        const bool valid = j >= lo && j <= hi;
        const int64_t off = kv_offset(src, j, valid, chunk * 8);
        const uint32_t s = swizzle(row, chunk);
        cp_async_16(k_dst + s, src.k + 2 * off, valid);
        cp_async_16(v_dst + s, src.v + 2 * off, valid);
    }
}

// 8 e4m3 bytes -> 8 bf16 (exact: every e4m3 value is a bf16), as one 16-byte chunk.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 w) {
    uint32_t r[4];
    const uint32_t in[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>((in[i >> 1] >> (16 * (i & 1))) & 0xffffu), __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
        r[i] = pack_bf16x2(f.x, f.y);
    }
    return make_uint4(r[0], r[1], r[2], r[3]);
}

// The FP8 tile pair staged by load_kv_tile (its own copies complete and visible to every thread:
// after cp_async_wait and a barrier) into the swizzled bf16 K and V tiles. Every thread reads its
// share first and writes after a barrier, since V's bf16 tile overlaps both e4m3 tiles. The caller
// puts a barrier between this and the first read of the tiles.
template <int kThreads = 128>
__device__ __forceinline__ void convert_fp8_kv_tile(uint32_t k_dst, uint32_t v_dst, int tid) {
    constexpr int kPasses = kKvTile / (kThreads / 4);
    uint4 kv[2][kPasses];  // [K, V][pass]: this thread's 16 e4m3 bytes of rows tid / 4 + (kThreads / 4)·i
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
            const uint32_t a =
                v_dst + t * (kTileBytes / 2) + ((tid >> 2) + (kThreads / 4) * i) * kHeadDim + (tid & 3) * 16;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(kv[t][i].x), "=r"(kv[t][i].y), "=r"(kv[t][i].z), "=r"(kv[t][i].w)
                         : "r"(a));
        }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
            const int row = (tid >> 2) + (kThreads / 4) * i, q = tid & 3;
            const uint32_t base = t == 0 ? k_dst : v_dst;
            const uint4 lo = e4m3x8_to_bf16x8(make_uint2(kv[t][i].x, kv[t][i].y));
            const uint4 hi = e4m3x8_to_bf16x8(make_uint2(kv[t][i].z, kv[t][i].w));
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + swizzle(row, 2 * q)), "r"(lo.x),
                         "r"(lo.y), "r"(lo.z), "r"(lo.w)
                         : "memory");
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(base + swizzle(row, 2 * q + 1)), "r"(hi.x),
                         "r"(hi.y), "r"(hi.z), "r"(hi.w)
                         : "memory");
        }
}

// ---- FP8 cache, decode, straight into fragments (PagedAttentionArgs::fp8_direct; session 7, not yet
// run) --------------------------------------------------------------------------------------------
// The widening pass above is bound by shared memory: per 8 KB of e4m3 from DRAM a tile moves 48 KB
// through shared memory (cp.async 8, widening 8 + 16, ldmatrix 16) against 32 per 16 KB for bf16,
// so it stops near 128 B/clk ÷ 6 ≈ 2.8 TB/s (measured 2.5, r22). Here the MMAs run in f16 and take
// their K and V operands from the e4m3 tile, one cvt.rn.f16x2.e4m3x2 per pair, exact:
// - The tile: [64 keys][64 bytes] each for K and V, 16-byte chunk c of row r at chunk
//   c ^ ((r >> 1) & 3) (conflict-free for the 32-bit K reads and the 8-row ldmatrix phases).
// - Q·Kᵀ: the head dimension is permuted, the same way for Q and K: within a 16-dim chunk kc, the
//   MMA's k (2t, 2t + 1, 2t + 8, 2t + 9) are dims 16kc + 4t + (0, 1, 2, 3), so lane (g, t) reads
//   K's 4 bytes at (key g, 16kc + 4t) in one 32-bit load; Q is widened to f16 once.
// - P·V: ldmatrix.trans on the e4m3 tile read as b16 pairs gives lane (g, t) the bytes
//   V[2t][2g], V[2t][2g + 1], V[2t + 1][2g], V[2t + 1][2g + 1] of a 16-dim block: a prmt and a cvt
//   make the B operands of the even-dim MMA (output dim 2g) and the odd-dim one (2g + 1). So the
//   accumulators hold, per 16-dim block, dims 4t .. 4t + 3 as (even c0, odd c0, even c1, odd c1).
// - Q in f16: exact for 2^-14 ≤ |q| < 65504 (smaller values lose bits as subnormals, larger ones
//   become inf: post-RoPE q of gpt-oss is far inside); P ∈ [0, 1] rounds to f16 (11 bits, where
//   bf16 keeps 8; below 2^-14 as subnormals).

// Byte offset of 16-byte chunk c of row r in a direct e4m3 tile.
__device__ __forceinline__ uint32_t fp8_tile_offset(int row, int chunk) {
    return static_cast<uint32_t>(row * kHeadDim + ((chunk ^ ((row >> 1) & 3)) << 4));
}

// Two e4m3 in the low 16 bits -> f16x2 (the low byte in the low half), exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xffffu), __NV_E4M3);
    return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t x) {
    const __half2 h = __floats2half2_rn(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}

// D += A·B, m16n8k16, f16 operands, fp32 accumulators (fragments as mma_bf16's).
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The Q tile from the QKV projection's rows (PagedAttentionArgs::q_raw), with the global loads kept
// asynchronous (r34 call 3: loading and rotating in registers at the tile's start cost the 8k
// layer ~47 us more than the RoPE kernel's q write saved): load_q_tile copies the raw chunks into
// the tile by cp.async as it does q's; once the tile's K/V loads are issued too, q_tile_cos_sin puts
// its 16 tokens' cos and sin (rope_cos_sin; shared by the 8 heads) in q_rope_cs while the copies
// fly; after the caller's wait and barrier, rotate_q_tile adds the bias (the CTA's 8 heads', staged
// once in q_rope_bias by stage_q_bias) and rotates pairs (i, i + 32) in place (rope_rotate: the RoPE
// kernel's arithmetic, so the same bf16 bits as its q), a thread an item (row, chunk c < 4: chunks
// c and c + 4 of the row), then a barrier. Rows of tokens past n_valid stay zero.
__device__ __forceinline__ float2 (*q_rope_cs())[kHeadDim / 2] {
    __shared__ __align__(16) float2 cs[kPrefillTokens][kHeadDim / 2];  // 16: cp.async from the table
    return cs;
}
__device__ __forceinline__ float* q_rope_bias() {
    __shared__ __align__(16) float bias[kGroup * kHeadDim];
    return bias;
}
template <int kThreads>
__device__ __forceinline__ void rotate_q_tile(const PagedAttentionArgs& a, int n_valid, int kv_head, uint32_t q_smem,
                                              int tid) {
    constexpr int kHalf = kHeadDim / 2;
    float2(*cs)[kHalf] = q_rope_cs();
#pragma unroll
    for (int k = 0; k < kPrefillRows * 4 / kThreads; ++k) {
        const int it = tid + k * kThreads;
        const int r = it >> 2, c = it & 3, tok = r >> 3;
        if (tok >= n_valid) continue;
        const uint32_t lo_addr = q_smem + swizzle(r, c), hi_addr = q_smem + swizzle(r, c + 4);
        uint32_t x1w[4], x2w[4];
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(x1w[0]), "=r"(x1w[1]), "=r"(x1w[2]), "=r"(x1w[3])
                     : "r"(lo_addr)
                     : "memory");
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(x2w[0]), "=r"(x2w[1]), "=r"(x2w[2]), "=r"(x2w[3])
                     : "r"(hi_addr)
                     : "memory");
        const float4* bias = reinterpret_cast<const float4*>(q_rope_bias() + (r & 7) * kHeadDim + c * 8);
        const float4 b1v[2] = {bias[0], bias[1]}, b2v[2] = {bias[8], bias[9]};
        const float b1[8] = {b1v[0].x, b1v[0].y, b1v[0].z, b1v[0].w, b1v[1].x, b1v[1].y, b1v[1].z, b1v[1].w};
        const float b2[8] = {b2v[0].x, b2v[0].y, b2v[0].z, b2v[0].w, b2v[1].x, b2v[1].y, b2v[1].z, b2v[1].w};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float y1[2], y2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = 2 * j + e;
                const float x1 = __uint_as_float(e ? x1w[j] & 0xffff0000u : x1w[j] << 16) + b1[i];
                const float x2 = __uint_as_float(e ? x2w[j] & 0xffff0000u : x2w[j] << 16) + b2[i];
                const float2 t = cs[tok][c * 8 + i];
                rope_rotate(x1, x2, t.x, t.y, y1[e], y2[e]);
            }
            lo[j] = pack_bf16x2(y1[0], y1[1]);
            hi[j] = pack_bf16x2(y2[0], y2[1]);
        }
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(lo_addr), "r"(lo[0]), "r"(lo[1]), "r"(lo[2]),
                     "r"(lo[3])
                     : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(hi_addr), "r"(hi[0]), "r"(hi[1]), "r"(hi[2]),
                     "r"(hi[3])
                     : "memory");
    }
    __syncthreads();
}

// The prefill kernels' Q tile: 16 tokens from row `first` × the 8 query heads of kv_head, as 128
// swizzled rows (row = token · 8 + head) of 8 chunks by cp.async; rows of tokens past n_valid are
// zero-filled. With q_raw, the chunks of the QKV rows and the tile's cos / sin (see above): the
// caller then runs rotate_q_tile after its wait and barrier.
template <int kThreads>
__device__ __forceinline__ void load_q_tile(const PagedAttentionArgs& a, const __nv_bfloat16* q, int first, int n_valid,
                                            int kv_head, uint32_t q_smem, int tid) {
    const bool raw = a.q_raw != nullptr;
    const __nv_bfloat16* src = raw ? static_cast<const __nv_bfloat16*>(a.q_raw) : q;
    const int64_t stride = raw ? a.q_raw_stride : static_cast<int64_t>(a.num_heads) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kPrefillRows * 8 / kThreads; ++i) {
        const int c = tid + i * kThreads;
        const int r = c >> 3, chunk = c & 7;
        const int tok = r >> 3;
        const bool valid = tok < n_valid;
        const int64_t off =
            valid ? static_cast<int64_t>(first + tok) * stride + (kv_head * kGroup + (r & 7)) * kHeadDim + chunk * 8
                  : 0;
        cp_async_16(q_smem + swizzle(r, chunk), src + off, valid);
    }
}

// With q_raw: the tile's cos / sin into q_rope_cs (after the tile's copies and KV loads are issued,
// so that the positions' round trip is not in front of them; r34 call 4 had it before the TMA issue
// and the 8k layers 30 us slower).
template <int kThreads>
__device__ __forceinline__ void q_tile_cos_sin(const PagedAttentionArgs& a, int first, int n_valid, int tid) {
    if (a.q_raw == nullptr) return;
    constexpr int kHalf = kHeadDim / 2;
    float2(*cs)[kHalf] = q_rope_cs();
    if (a.q_rope_cs != nullptr) {  // the table's rows by cp.async, a group of their own (the caller waits for all)
        constexpr int kChunks = kPrefillTokens * kHalf * 8 / 16;  // 16-byte pieces of the tile's rows
        const uint32_t base = smem_addr(&cs[0][0]);
        for (int c = tid; c < kChunks; c += kThreads) {
            const int tok = c / (kHalf * 8 / 16);
            const bool valid = tok < n_valid;  // rows past n_valid: zeros (rotate_q_tile skips them)
            cp_async_16(base + 16 * c, a.q_rope_cs + (valid ? (static_cast<int64_t>(first) * kHalf * 2 + 4 * c) : 0),
                        valid);
        }
        cp_async_commit();
        return;
    }
    for (int c = tid; c < kPrefillTokens * kHalf; c += kThreads) {
        const int tok = c / kHalf, i = c % kHalf;
        float co = 1.0f, si = 0.0f;
        if (tok < n_valid) rope_cos_sin(a.q_positions[first + tok], a.rope_inv_freq[i], a.rope_scaling, co, si);
        cs[tok][i] = make_float2(co, si);
    }
}

// With q_raw: the CTA's 8 heads' q bias into shared memory once (kv_head is the CTA's for its
// life), published by the first barrier of the query-tile loop.
template <int kThreads>
__device__ __forceinline__ void stage_q_bias(const PagedAttentionArgs& a, int kv_head, int tid) {
    if (a.q_raw == nullptr) return;
    float* b = q_rope_bias();
    for (int i = tid; i < kGroup * kHeadDim; i += kThreads) b[i] = a.q_bias[kv_head * kGroup * kHeadDim + i];
}

// ================================================================================================
// Prefill: FlashAttention-2 on mma.sync.
//
// Grid (num_kv_heads, query tiles counted from the END of the sequence so the longest causal rows
// start first, num_seqs); a grid-stride loop over query tiles makes any grid height correct.
// Per query tile: KV tiles from floor(kv_lo/64) to floor(p_last/64), where kv_lo = 0 (full) or
// p0 − window + 1 (sliding), i.e. a sliding layer visits ⌈(window + 15)/64⌉ + 1 ≤ 4 tiles; only the
// tiles that cross the causal diagonal or the window's lower edge evaluate the per-element mask.
//
// Work: 4·64 FLOP per visible (query head, key) pair (q·k and p·v, 2 FLOP per MAC); a full 8k
// layer is 64 heads · 8192²/2 · 256 ≈ 0.55 TFLOP. Bytes: q, out and each cache row once from HBM
// (a few MB); K/V tiles are re-read from L2 by every query tile (16 KB per 128 rows × 64 keys).
// ================================================================================================
__global__ void __launch_bounds__(kPrefillThreads)
    bf16_paged_attention_prefill_kernel(const __grid_constant__ PagedAttentionArgs a) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int kv_head = blockIdx.x, seq = blockIdx.z;
    stage_q_bias<kPrefillThreads>(a, kv_head, tid);  // with q_raw; published by the loop's first barrier

    const int q_begin = a.query_start[seq];
    const int n_q = a.query_start[seq + 1] - q_begin;
    const int n_qtiles = (n_q + kPrefillTokens - 1) / kPrefillTokens;
    if (static_cast<int>(blockIdx.y) >= n_qtiles) return;
    const int start_pos = a.seq_start_pos[seq];
    const int window = a.sliding_window;
    const KvSource src = make_kv_source(a, seq, kv_head);
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
    // Every row this thread owns is query head kv_head·8 + g (rows g and g+8 of each m16 tile are
    // tokens 2·(2·warp + mt) + {0,1}, head g): one sink per thread. Base-2 domain throughout.
    const float sink = fmaxf(a.sinks[kv_head * kGroup + g] * kLog2e, kNegBig);
    const float qk_scale = a.scale * kLog2e;

    const uint32_t q_smem = smem_addr(smem);
    const uint32_t kv_smem = q_smem + kPrefillRows * kRowBytes;  // stage s: K at +s·16 KB, V 8 KB later

    for (int rev = blockIdx.y; rev < n_qtiles; rev += gridDim.y) {
        const int t0 = (n_qtiles - 1 - rev) * kPrefillTokens;  // first token of this tile in the sequence
        const int n_valid = min(kPrefillTokens, n_q - t0);
        const int p0 = start_pos + t0;                               // position of the tile's first token
        const int p_last = p0 + n_valid - 1;                         // position of its last valid token
        const int kv_lo = window > 0 ? max(0, p0 - window + 1) : 0;  // oldest key any row sees
        const int tile_first = kv_lo / kKvTile, tile_last = p_last / kKvTile;

        __syncthreads();  // the previous query tile (grid-stride loop) is done with shared memory
                          // Q tile: 128 rows × 8 chunks; rows of tokens past the sequence's end are zero-filled.
        load_q_tile<kPrefillThreads>(a, q, q_begin + t0, n_valid, kv_head, q_smem, tid);
        load_kv_tile(src, tile_first, kv_lo, p_last, kv_smem, kv_smem + kTileBytes, tid);
        cp_async_commit();
        if (a.q_raw != nullptr) {  // q from the QKV rows: rotated in place once it has landed
            q_tile_cos_sin<kPrefillThreads>(a, q_begin + t0, n_valid, tid);
            cp_async_wait<0>();
            __syncthreads();
            rotate_q_tile<kPrefillThreads>(a, n_valid, kv_head, q_smem, tid);
        }

        uint32_t qa[2][4][4];  // Q A-fragments [m16 tile][16-wide k chunk]
        float o[2][8][4];      // O accumulators [m16 tile][8-wide d tile]
        float m[2][2], l[2][2];
        int row_pos[2][2];  // [mt][half]: position of row g (half 0) / g+8 (half 1)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                m[mt][h] = sink;  // the running max starts at the sink logit (MODEL.md §4.4)
                l[mt][h] = 0.0f;
                // Rows past the end behave like the last valid token (finite, never stored).
                row_pos[mt][h] = min(p0 + warp * 4 + mt * 2 + h, p_last);
            }
#pragma unroll
            for (int dt = 0; dt < 8; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
        }

        for (int tile = tile_first; tile <= tile_last; ++tile) {
            const int stage = (tile - tile_first) & 1;
            cp_async_wait<0>();  // this thread's copies of `tile` (and Q) have landed
            __syncthreads();     // everyone's have; everyone is done reading the other stage
            if (tile == tile_first) {
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int kc = 0; kc < 4; ++kc)
                        ldmatrix_x4(qa[mt][kc],
                                    q_smem + swizzle(warp * 32 + mt * 16 + (lane & 15), kc * 2 + (lane >> 4)));
            }
            if (tile < tile_last) {
                const uint32_t next = kv_smem + (stage ^ 1) * 2 * kTileBytes;
                load_kv_tile(src, tile + 1, kv_lo, p_last, next, next + kTileBytes, tid);
            }
            cp_async_commit();
            const uint32_t k_s = kv_smem + stage * 2 * kTileBytes;
            const uint32_t v_s = k_s + kTileBytes;
            if (src.fp8) {
                convert_fp8_kv_tile(k_s, v_s, tid);
                __syncthreads();
            }

            // S = Q·Kᵀ: 32 rows × 64 keys per warp. B-fragments of K come straight from the [key][d]
            // tile (non-transposed ldmatrix): lanes 0-7 address keys 0-7 at chunk 2kc (→ b0 of the
            // even n-tile), 8-15 the same keys at 2kc+1 (b1), 16-31 keys 8-15 (the odd n-tile).
            float s[2][8][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
#pragma unroll
                for (int np = 0; np < 4; ++np) {
                    uint32_t kb[4];
                    ldmatrix_x4(kb,
                                k_s + swizzle(np * 16 + (lane & 7) + ((lane >> 4) << 3), kc * 2 + ((lane >> 3) & 1)));
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_bf16(s[mt][2 * np], qa[mt][kc], kb[0], kb[1]);
                        mma_bf16(s[mt][2 * np + 1], qa[mt][kc], kb[2], kb[3]);
                    }
                }
            }

            // Mask (only tiles that cross the diagonal or the window's lower edge): key j is
            // visible from position i iff j ≤ i and (no window or j > i − window). Zero-filled
            // keys outside [kv_lo, p_last] fall under the same test.
            const int key0 = tile * kKvTile;
            const bool need_mask = key0 + kKvTile - 1 > p0 || (window > 0 && key0 <= p_last - window);
            if (need_mask) {
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int key = key0 + nt * 8 + tig * 2 + (e & 1);
                            const int pos = row_pos[mt][e >> 1];
                            if (key > pos || (window > 0 && key <= pos - window)) s[mt][nt][e] = -INFINITY;
                        }
            }

            // Online softmax in base 2 on raw scores: m is kept scaled (·scale·log2e), so
            // p = 2^(s·qk_scale − m) is one FFMA + one MUFU per element. The l partial sums stay
            // per thread (the quad's 4 threads share m and the correction) until the end.
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                    mx = quad_max(mx);
                    const float m_new = fmaxf(m[mt][h], mx * qk_scale);  // ≥ sink: finite
                    const float corr = fast_exp2(m[mt][h] - m_new);
                    m[mt][h] = m_new;
                    float sum = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; ++e) {
                            const float p = fast_exp2(fmaf(s[mt][nt][e], qk_scale, -m_new));
                            s[mt][nt][e] = p;
                            sum += p;
                        }
                    }
                    l[mt][h] = l[mt][h] * corr + sum;
#pragma unroll
                    for (int dt = 0; dt < 8; ++dt) {
                        o[mt][dt][2 * h] *= corr;
                        o[mt][dt][2 * h + 1] *= corr;
                    }
                }
            }

            // O += P·V. The C-fragments of S for keys 16kc..16kc+15 (n-tiles 2kc, 2kc+1) are exactly
            // the A-fragment of P for that k chunk. V's B-fragments need (key pair, d) per register:
            // transposed ldmatrix of the [key][d] tile; lanes 0-7 keys 0-7 at d chunk 2dp (b0 of the
            // even d-tile), 8-15 keys 8-15 (b1), 16-31 the same at chunk 2dp+1 (odd d-tile).
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
                uint32_t pa[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    pa[mt][0] = pack_bf16x2(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                    pa[mt][1] = pack_bf16x2(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                    pa[mt][2] = pack_bf16x2(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                    pa[mt][3] = pack_bf16x2(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < 4; ++dp) {
                    uint32_t vb[4];
                    ldmatrix_x4_trans(
                        vb, v_s + swizzle(kc * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        mma_bf16(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
                        mma_bf16(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
        }

        // out = O / (Σ_j 2^(s_j − m) + 2^(sink − m)).
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float denom = quad_sum(l[mt][h]) + fast_exp2(sink - m[mt][h]);
                const float inv = 1.0f / denom;
                const int tok = warp * 4 + mt * 2 + h;
                if (tok < n_valid) {
                    __nv_bfloat16* dst =
                        out +
                        (static_cast<int64_t>(q_begin + t0 + tok) * a.num_heads + kv_head * kGroup + g) * kHeadDim +
                        tig * 2;
#pragma unroll
                    for (int dt = 0; dt < 8; ++dt)
                        *reinterpret_cast<uint32_t*>(dst + dt * 8) =
                            pack_bf16x2(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
                }
            }
        }
    }
}

// ================================================================================================
// Prefill on warpgroup MMAs (PagedAttentionArgs::prefill_wgmma; session 9).
//
// The FA2 kernel above with both products as wgmma m64n64k16 (fp32 accumulators): S = Q·Kᵀ takes Q
// from registers (the ldmatrix A-fragments above) and the K tile from shared memory as a K-major
// B operand; O += P·V takes P from registers (the S accumulators packed to bf16, the same
// fragment as mma.sync's) and the V tile as an MN-major B operand (imm-trans-b). The K/V tiles'
// swizzle (chunk ^ (row & 7), 128-byte rows) is the hardware's 128-byte swizzle once a tile starts
// on a 1 KB boundary, so the cp.async staging, the masks and the online softmax are the FA2
// kernel's; a warp's accumulators are laid out as its m16n8 C-fragments (d[4·nt + e]).
// A CTA is 256 threads, 2 CTAs an SM: while one warpgroup runs its softmax another's wgmma runs.
// ================================================================================================
// D (+)= A·B, m64n64k16, bf16, A from registers, B by descriptor (kTransB: B is MN-major).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d), "n"(kTransB));
}

// The masks, the row max and the exponentials of a finished S: P (unnormalized) in s, m updated, o's
// correction factors in corr (moved: the max moved). Row max as a tree (depth 4, not a chain of 16:
// r25 ncu had "wait", fixed-latency dependencies, as the largest stall).
__device__ __forceinline__ void tile_mask_max_exp(float (&s)[32], int key0, int p0, int p_last, int window, int tig,
                                                  const int (&row_pos)[2], float qk_scale, float (&m)[2],
                                                  float (&corr)[2], bool (&moved)[2]) {
    const bool need_mask = key0 + kKvTile - 1 > p0 || (window > 0 && key0 <= p_last - window);
    if (need_mask) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + nt * 8 + tig * 2 + (e & 1);
                const int pos = row_pos[e >> 1];
                if (key > pos || (window > 0 && key <= pos - window)) s[4 * nt + e] = -INFINITY;
            }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float t8[8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) t8[nt] = fmaxf(s[4 * nt + 2 * h], s[4 * nt + 2 * h + 1]);
#pragma unroll
        for (int w = 4; w > 0; w >>= 1)
#pragma unroll
            for (int i = 0; i < w; ++i) t8[i] = fmaxf(t8[i], t8[i + w]);
        const float mx = quad_max(t8[0]);
        const float m_new = fmaxf(m[h], mx * qk_scale);
        moved[h] = m_new != m[h];
        corr[h] = fast_exp2(m[h] - m_new);
        m[h] = m_new;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; ++e) s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], qk_scale, -m_new));
        }
    }
}
// The masks and the online softmax of a finished S, without touching o: P in s, the row max and sum
// updated (the sum as a tree too), o's correction factors in corr.
__device__ __forceinline__ void tile_softmax(float (&s)[32], int key0, int p0, int p_last, int window, int tig,
                                             const int (&row_pos)[2], float qk_scale, float (&m)[2], float (&l)[2],
                                             float (&corr)[2], bool (&moved)[2]) {
    tile_mask_max_exp(s, key0, p0, p_last, window, tig, row_pos, qk_scale, m, corr, moved);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float t8[8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) t8[nt] = s[4 * nt + 2 * h] + s[4 * nt + 2 * h + 1];
#pragma unroll
        for (int w = 4; w > 0; w >>= 1)
#pragma unroll
            for (int i = 0; i < w; ++i) t8[i] += t8[i + w];
        l[h] = l[h] * corr[h] + t8[0];
    }
}
// o rescaled only where the row max moved (corr is then exactly 1 elsewhere: skipping the
// multiplies changes no bit), then P packed to bf16 A fragments (keys 16kc..16kc+15 are S's
// n-tiles 2kc and 2kc + 1).
__device__ __forceinline__ void tile_rescale_pack(const float (&s)[32], const float (&corr)[2], const bool (&moved)[2],
                                                  float (&o)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
        if (moved[h]) {
#pragma unroll
            for (int dt = 0; dt < 8; ++dt) {
                o[4 * dt + 2 * h] *= corr[h];
                o[4 * dt + 2 * h + 1] *= corr[h];
            }
        }
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
        pa[kc][0] = pack_bf16x2(s[8 * kc + 0], s[8 * kc + 1]);
        pa[kc][1] = pack_bf16x2(s[8 * kc + 2], s[8 * kc + 3]);
        pa[kc][2] = pack_bf16x2(s[8 * kc + 4], s[8 * kc + 5]);
        pa[kc][3] = pack_bf16x2(s[8 * kc + 6], s[8 * kc + 7]);
    }
}

// The pipelined kernels' softmax of S(t) while P(t - 1)·V still runs (session 32; r48 call 2:
// full 8k 1,267 -> 1,258-1,266 us, sliding 8k 146.2-146.4 -> 143.2-144.0, 675 -> 642 M
// instructions, tests the same bits): the masks, the row max, the exponentials, then P(t) packed into pn (a second
// register set: P(t - 1)'s is still the in-flight wgmma's A operand), then the row sums reduced in place in s (dead
// once packed) instead of in fresh temporaries. r47 call 7's SASS had ptxas put the row-sum tree in P(t - 1)'s
// registers, so it waited for that P·V before the softmax. tile_mask_max_exp, then tile_softmax's sum tree and
// tile_rescale_pack's packing: the same bits; o's rescale (tile_rescale) after the wait.
__device__ __forceinline__ void tile_softmax_pack(float (&s)[32], int key0, int p0, int p_last, int window, int tig,
                                                  const int (&row_pos)[2], float qk_scale, float (&m)[2], float (&l)[2],
                                                  float (&corr)[2], bool (&moved)[2], uint32_t (&pn)[4][4]) {
    tile_mask_max_exp(s, key0, p0, p_last, window, tig, row_pos, qk_scale, m, corr, moved);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) {
        pn[kc][0] = pack_bf16x2(s[8 * kc + 0], s[8 * kc + 1]);
        pn[kc][1] = pack_bf16x2(s[8 * kc + 2], s[8 * kc + 3]);
        pn[kc][2] = pack_bf16x2(s[8 * kc + 4], s[8 * kc + 5]);
        pn[kc][3] = pack_bf16x2(s[8 * kc + 6], s[8 * kc + 7]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // tile_softmax's sum tree (t8[i] += t8[i + w]), its t8[nt] kept in s[4·nt + 2h].
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) s[4 * nt + 2 * h] = s[4 * nt + 2 * h] + s[4 * nt + 2 * h + 1];
#pragma unroll
        for (int w = 4; w > 0; w >>= 1)
#pragma unroll
            for (int i = 0; i < w; ++i) s[4 * i + 2 * h] += s[4 * (i + w) + 2 * h];
        l[h] = l[h] * corr[h] + s[2 * h];
    }
}
__device__ __forceinline__ void tile_rescale(const float (&corr)[2], const bool (&moved)[2], float (&o)[32]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
        if (moved[h]) {
#pragma unroll
            for (int dt = 0; dt < 8; ++dt) {
                o[4 * dt + 2 * h] *= corr[h];
                o[4 * dt + 2 * h + 1] *= corr[h];
            }
        }
}

// One KV tile of a query tile in both wgmma prefill kernels (the K and V tiles in shared memory,
// visible to the async proxy): S = Q·Kᵀ, the masks, the online softmax, O += P·V.
__device__ __forceinline__ void wgmma_prefill_tile(const uint32_t (&qa)[4][4], uint32_t k_s, uint32_t v_s, int key0,
                                                   int p0, int p_last, int window, int tig, const int (&row_pos)[2],
                                                   float qk_scale, float (&s)[32], float (&o)[32], float (&m)[2],
                                                   float (&l)[2]) {
    // S = Q·Kᵀ (64 rows × 64 keys a warpgroup); s's last reads (P's packing) before the fence.
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(s[i]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma_m64n64k16_rs<0>(s, qa[kc], desc_sw128(k_s + kc * 32), kc);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(s[i]);

    float corr[2];
    bool moved[2];
    tile_softmax(s, key0, p0, p_last, window, tig, row_pos, qk_scale, m, l, corr, moved);
    uint32_t pa[4][4];
    tile_rescale_pack(s, corr, moved, o, pa);
    // The register fences first: the rescaled o and the packed P must be written before
    // wgmma.fence (the compiler may otherwise sink the multiplies past it, and the
    // asynchronous wgmma then reads o unscaled: r24 call 4, wrong from the second KV tile).
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(o[i]);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) reg_fence(pa[kc][i]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma_m64n64k16_rs<1>(o, pa[kc], desc_sw128(v_s + kc * 2048), 1);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(o[i]);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) reg_fence(pa[kc][i]);
}

__global__ void __launch_bounds__(kWgPrefillThreads, 2)
    bf16_paged_attention_prefill_wgmma_kernel(const __grid_constant__ PagedAttentionArgs a) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform for the compiler
    const int g = lane >> 2, tig = lane & 3;
    const int kv_head = blockIdx.x, seq = blockIdx.z;
    stage_q_bias<kWgPrefillThreads>(a, kv_head, tid);  // with q_raw; published by the loop's first barrier

    const int q_begin = a.query_start[seq];
    const int n_q = a.query_start[seq + 1] - q_begin;
    const int n_qtiles = (n_q + kPrefillTokens - 1) / kPrefillTokens;
    if (static_cast<int>(blockIdx.y) >= n_qtiles) return;
    const int start_pos = a.seq_start_pos[seq];
    const int window = a.sliding_window;
    const KvSource src = make_kv_source(a, seq, kv_head);
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
    // Rows g and g + 8 of this warp are tokens 2·warp and 2·warp + 1, query head kv_head·8 + g.
    const float sink = fmaxf(a.sinks[kv_head * kGroup + g] * kLog2e, kNegBig);
    const float qk_scale = a.scale * kLog2e;

    const uint32_t q_smem = (smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t kv_smem = q_smem + kPrefillRows * kRowBytes;  // stage s: K at +s·16 KB, V 8 KB later

    for (int rev = blockIdx.y; rev < n_qtiles; rev += gridDim.y) {
        const int t0 = (n_qtiles - 1 - rev) * kPrefillTokens;
        const int n_valid = min(kPrefillTokens, n_q - t0);
        const int p0 = start_pos + t0;
        const int p_last = p0 + n_valid - 1;
        const int kv_lo = window > 0 ? max(0, p0 - window + 1) : 0;
        const int tile_first = kv_lo / kKvTile, tile_last = p_last / kKvTile;

        __syncthreads();  // the previous query tile is done with shared memory
        load_q_tile<kWgPrefillThreads>(a, q, q_begin + t0, n_valid, kv_head, q_smem, tid);
        load_kv_tile<kWgPrefillThreads>(src, tile_first, kv_lo, p_last, kv_smem, kv_smem + kTileBytes, tid);
        cp_async_commit();
        if (a.q_raw != nullptr) {  // q from the QKV rows: rotated in place once it has landed
            q_tile_cos_sin<kWgPrefillThreads>(a, q_begin + t0, n_valid, tid);
            cp_async_wait<0>();
            __syncthreads();
            rotate_q_tile<kWgPrefillThreads>(a, n_valid, kv_head, q_smem, tid);
        }

        uint32_t qa[4][4];  // Q A-fragments [16-wide k chunk]
        float s[32];        // S accumulators, then P (layout as o's, keys for dims)
        float o[32];        // O accumulators: d[4·dt + e], dims 8dt + 2tig + (e & 1), row g + 8·(e >> 1)
        float m[2], l[2];
        int row_pos[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m[h] = sink;
            l[h] = 0.0f;
            row_pos[h] = min(p0 + warp * 2 + h, p_last);
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) o[i] = s[i] = 0.0f;

        for (int tile = tile_first; tile <= tile_last; ++tile) {
            const int stage = (tile - tile_first) & 1;
            cp_async_wait<0>();
            fence_proxy_async();  // this thread's cp.async bytes, visible to wgmma's async proxy
            __syncthreads();
            // Q's fragments, every tile: kept in registers from the first tile on (as the FA2 kernel
            // does), the S products were wrong from the second tile (r24 calls 4-7; a reload every
            // tile passes). Suspected: ptxas moving the loop-carried wgmma A operands after
            // wgmma.fence. The reload is 2 KB of shared memory a warp a tile, against 16 KB of K/V
            // a warpgroup.
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                ldmatrix_x4(qa[kc], q_smem + swizzle(warp * 16 + (lane & 15), kc * 2 + (lane >> 4)));
            if (tile < tile_last) {
                const uint32_t next = kv_smem + (stage ^ 1) * 2 * kTileBytes;
                load_kv_tile<kWgPrefillThreads>(src, tile + 1, kv_lo, p_last, next, next + kTileBytes, tid);
            }
            cp_async_commit();
            const uint32_t k_s = kv_smem + stage * 2 * kTileBytes;
            const uint32_t v_s = k_s + kTileBytes;
            if (src.fp8) {
                convert_fp8_kv_tile<kWgPrefillThreads>(k_s, v_s, tid);
                fence_proxy_async();
                __syncthreads();
            }

            const int key0 = tile * kKvTile;
            wgmma_prefill_tile(qa, k_s, v_s, key0, p0, p_last, window, tig, row_pos, qk_scale, s, o, m, l);
        }

#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float denom = quad_sum(l[h]) + fast_exp2(sink - m[h]);
            const float inv = 1.0f / denom;
            const int tok = warp * 2 + h;
            if (tok < n_valid) {
                __nv_bfloat16* dst =
                    out + (static_cast<int64_t>(q_begin + t0 + tok) * a.num_heads + kv_head * kGroup + g) * kHeadDim +
                    tig * 2;
#pragma unroll
                for (int dt = 0; dt < 8; ++dt)
                    *reinterpret_cast<uint32_t*>(dst + dt * 8) =
                        pack_bf16x2(o[4 * dt + 2 * h] * inv, o[4 * dt + 2 * h + 1] * inv);
            }
        }
    }
}

// ================================================================================================
// Prefill on wgmma with the K/V tiles by TMA (PagedAttentionArgs::prefill_tma; session 10, opt-in).
//
// The kernel above loads each KV tile by cp.async from all 256 threads and meets at a __syncthreads
// every tile (r25 ncu at 8k: 1.34 warps stalled at the barrier per issued instruction, the two
// warpgroups in lock step, so one's softmax does not overlap the other's MMAs). Here a tile comes
// as eight TMA boxes (K and V, 16 rows × 64 bf16 of one block each, 128-byte swizzled: the layout
// the cp.async path writes, the tiles starting on 1 KB) into a 3-stage ring, issued by one
// warpgroup's four lane 0s (two boxes each; the warpgroups alternate by tile). A stage's full
// mbarrier completes on those 4 arrivals and its 16 KB; its empty one on the 8 warps' arrivals
// after their P·V. Tile t + 2 is issued as tile t starts, so a warpgroup may run a tile ahead of
// the other. Pieces outside [kv_lo, p_last] load the block of the nearest visible key instead (the
// table is only read for visible keys); those rows are masked in S, and every V row outside the
// range is zeroed in shared memory before the P·V (P = 0 times a non-finite cache row would be
// NaN), by each warpgroup for itself (both write the same zeros: a benign race). The stage's
// refill waits for both warpgroups' arrivals, so no TMA overwrites a tile in use.
// ================================================================================================
constexpr int kTmaStages = 3;
constexpr int kTmaStageBytes = 2 * kTileBytes;  // K, then V
constexpr int kPipeStages = 4;                  // the pipelined variant's ring (kPipe)
// kPingPong's ring: one stage more. With 4, warpgroup 0 issuing tile t + 2 waits for
// warpgroup 1 to release tile t - 2, which it does after its softmax of t - 1, so warpgroup 0
// could not issue before the other's softmax ended: the overlap the turns are for (a review's
// point). With 5 the stage of t - 3 is reused, released half an iteration earlier.
constexpr int kPingPongStages = 5;
constexpr int tma_prefill_smem(int stages) {
    return 1024 + kPrefillRows * kRowBytes + stages * kTmaStageBytes + 16 * stages + 16;  // + kOrder's scratch
}
constexpr int kTmaPrefillSmem = tma_prefill_smem(kTmaStages);
constexpr int kPipePrefillSmem = tma_prefill_smem(kPipeStages);
constexpr int kPingPongPrefillSmem = tma_prefill_smem(kPingPongStages);
static_assert(2 * (kPingPongPrefillSmem + 1024) <= 227 * 1024, "two ping-pong CTAs an SM (1 KB reserved each)");

__device__ __forceinline__ void attn_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void attn_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void attn_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void attn_mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void attn_tma_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}
// Barrier 1 + wg for the 128 threads of warpgroup wg (immediate ids: ptxas then reserves 3, not 16).
__device__ __forceinline__ void warpgroup_barrier(int wg) {
    if (wg == 0)
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
}

// kPingPong: the CTA's two warpgroups take turns at issuing their wgmmas (named barriers 3: warpgroup
// 0's turn, 4: warpgroup 1's), so that one's softmax runs while the other's products occupy the
// tensor cores (FlashAttention-3's inter-warpgroup schedule). Predicated, not branched: a branch
// between a wgmma issue and its wait makes ptxas wait at the branch (C7517).
__device__ __forceinline__ void turn_wait(int wg) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.s32 p, %0, 0;\n@p bar.sync 3, 256;\n@!p bar.sync 4, 256;\n}\n" ::"r"(wg)
                 : "memory");
}
__device__ __forceinline__ void turn_pass(int wg) {
    asm volatile("{\n.reg .pred p;\nsetp.eq.s32 p, %0, 0;\n@p bar.arrive 4, 256;\n@!p bar.arrive 3, 256;\n}\n" ::"r"(wg)
                 : "memory");
}

// ---- The pieces of the pipelined tile loop (kPipe below): S(t) and P(t - 1)·V(t - 1) issued
// together, the softmax of S(t) while P·V runs. Issue functions only issue: the caller waits and
// then fences the operand registers (qa after S, pa and o after P·V), which keeps the compiler from
// reusing or touching them while the asynchronous wgmma still reads or writes them.
// The issue functions take the K (or V) tile's descriptor; k16 step kc is at + 2·kc (32 bytes, K)
// or + 128·kc (2 KB, V) in 16-byte units (session 32: desc_sw128 of each step's address was ~5
// uniform instructions a wgmma, 40 of the ~315 a warp issued a tile in r32's ncu).
__device__ __forceinline__ void pipe_issue_s(uint32_t (&qa)[4][4], uint64_t k_desc, float (&s)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(s[i]);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) reg_fence(qa[kc][i]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma_m64n64k16_rs<0>(s, qa[kc], k_desc + 2 * kc, kc);
    wgmma_commit();
}
__device__ __forceinline__ void pipe_issue_pv(uint32_t (&pa)[4][4], uint64_t v_desc, float (&o)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) reg_fence(o[i]);
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) reg_fence(pa[kc][i]);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma_m64n64k16_rs<1>(o, pa[kc], v_desc + 128 * kc, 1);
    wgmma_commit();
}
// Both at once: one wgmma.fence for the two groups, no other instruction between them (ptxas
// serializes wgmmas when a non-wgmma instruction touches an accumulator inside the pipeline stage,
// C7514: the register fences of a second issue call did).
__device__ __forceinline__ void pipe_issue_s_pv(uint32_t (&qa)[4][4], uint64_t k_desc, float (&s)[32],
                                                uint32_t (&pa)[4][4], uint64_t v_desc, float (&o)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        reg_fence(s[i]);
        reg_fence(o[i]);
    }
#pragma unroll
    for (int kc = 0; kc < 4; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            reg_fence(qa[kc][i]);
            reg_fence(pa[kc][i]);
        }
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma_m64n64k16_rs<0>(s, qa[kc], k_desc + 2 * kc, kc);
    wgmma_commit();
#pragma unroll
    for (int kc = 0; kc < 4; ++kc) wgmma_m64n64k16_rs<1>(o, pa[kc], v_desc + 128 * kc, 1);
    wgmma_commit();
}
// kPipe (PagedAttentionArgs::prefill_pipe; session 11, compiled only): the tile loop above with the
// P·V of tile t - 1 issued right after S(t) and running under S(t)'s masks and softmax (the
// FlashAttention-3 intra-warpgroup overlap); o is rescaled and P(t) packed once that P·V is done.
// The operations on o, m and l are wgmma_prefill_tile's in the same order, so the output is the
// same bits. Each P is held as packed bf16 (16 registers) from one iteration to the next instead
// of S, so the live set stays about the kernel's. A stage is now busy until the P·V of the next
// iteration: 4 stages, tile t + 2 issued as tile t starts (its stage held tile t - 2, released
// during iteration t - 1, so thread 0 never waits on its own warp).
// kOutQ (PagedAttentionArgs::out_q): the epilogue writes the rows quantized for the O projection's
// FP8 GEMM instead of bf16 (a separate instantiation, so the bf16 kernel's code stays as measured:
// r35 saw a dead block in the epilogue cost the ping-pong kernel 15%).
// kOrder (PagedAttentionArgs::prefill_softmax_order; session 34): the pipelined loop stores its row
// sums to a scratch word of shared memory right before the P·V wait. r48's SASS had ptxas schedule
// that wait (WARPGROUP.DEPBAR 0x0) ahead of the row-max tree and all MUFUs, though none of them
// touched a register of the in-flight P·V (s34a call 1). The store depends on every exponential and
// stays before the wait (memory order), so the softmax runs under the P·V. attention_bench (s34b
// call 2, interleaved, two passes): full 8k 1,268 -> 1,247 us (-1.7%), 32k 20,070 -> 19,880 (-1%),
// 1k and sliding unchanged. (Q by descriptor from shared memory for S, with or without it: full 8k
// +0.3% alone, +2% with it; not kept.)
template <bool kPipe, bool kPingPong = false, bool kOutQ = false, bool kOrder = true>
__global__ void __launch_bounds__(kWgPrefillThreads, 2)
    bf16_paged_attention_prefill_tma_kernel(const __grid_constant__ PagedAttentionArgs a,
                                            const __grid_constant__ CUtensorMap k_map,
                                            const __grid_constant__ CUtensorMap v_map) {
    constexpr int kStages = kPingPong ? kPingPongStages : kPipe ? kPipeStages : kTmaStages;
    constexpr int kAhead = 2;  // tiles in flight ahead of the one in use (see kPipe above)
    // kPipe holds a stage one iteration longer: thread 0 must never wait for a stage its own warp
    // releases later in the same iteration.
    static_assert(kAhead <= kStages - (kPipe ? 2 : 1), "the ring is too short for the lookahead");
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform for the compiler
    const int wg = warp >> 2;
    const int g = lane >> 2, tig = lane & 3;
    const int kv_head = blockIdx.x, seq = blockIdx.z;
    stage_q_bias<kWgPrefillThreads>(a, kv_head, tid);  // with q_raw; published by the loop's first barrier

    const int q_begin = a.query_start[seq];
    const int n_q = a.query_start[seq + 1] - q_begin;
    const int n_qtiles = (n_q + kPrefillTokens - 1) / kPrefillTokens;
    if (static_cast<int>(blockIdx.y) >= n_qtiles) return;
    const int start_pos = a.seq_start_pos[seq];
    const int window = a.sliding_window;
    const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
    const int bs_shift = __ffs(a.block_size) - 1, bs_mask = a.block_size - 1;
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
    // Rows g and g + 8 of this warp are tokens 2·warp and 2·warp + 1, query head kv_head·8 + g.
    const float sink = fmaxf(a.sinks[kv_head * kGroup + g] * kLog2e, kNegBig);
    const float qk_scale = a.scale * kLog2e;

    const uint32_t q_smem = (smem_addr(smem) + 1023u) & ~1023u;
    const uint32_t kv_smem = q_smem + kPrefillRows * kRowBytes;  // stage s: K at +s·16 KB, V 8 KB later
    const uint32_t bars = kv_smem + kStages * kTmaStageBytes;
    const uint32_t scratch = bars + 16u * kStages;  // kOrder's 8 bytes, never read
    const auto full_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(s); };
    const auto empty_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(kStages + s); };
    // A tile's eight 16-row boxes are issued by one warpgroup's four lane 0s, warpgroup idx & 1 for
    // the tile of running index idx: warp w's lane 0 the K and V boxes of piece w & 3, with one
    // expect_tx for its two boxes. A stage's full barrier counts those 4 arrivals and its 16 KB.
    // Session 32: until r46 thread 0 issued all eight, and r32's ncu of the 8k full layer had its
    // ~135 extra instructions a tile (four table reads, eight TMAs) holding its warpgroup's first
    // wgmma ("barrier" stalls on it, 15% of the samples) and, through the turns, the other
    // warpgroup. attention_bench, same run (r47 call 6): thread 0 / eight warps a box each / this,
    // full 8k 1,472-1,491 / 1,346-1,353 / 1,283-1,286 us, sliding 8k 154-155 / 155-156 / 146 (the
    // thread-0 form was 1,438-1,444 in its own binary, call 4, without the switch between forms).
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            attn_mbar_init(full_bar(s), 4);
            attn_mbar_init(empty_bar(s), kWgPrefillThreads / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const uint64_t k_desc0 = desc_sw128(kv_smem);  // stage 0's K tile

    // KV tile `tile` into the stage of running index idx (phases run on across query tiles), once
    // every warp has released that stage's previous tile. Called by every thread at the same points.
    const auto issue = [&](int idx, int tile, int kv_lo, int p_last) {
        if (lane != 0 || (warp >> 2) != (idx & 1)) return;
        const int s = idx % kStages, pc = warp & 3;
        // The piece's first key, or the nearest visible one (its rows are then all masked).
        const int j = min(max(tile * kKvTile + 16 * pc, kv_lo), p_last);
        const int y = __ldg(table + (j >> bs_shift)) * a.block_size + ((j & bs_mask) & ~15);
        if (idx >= kStages) attn_mbar_wait(empty_bar(s), static_cast<uint32_t>((idx / kStages - 1) & 1));
        attn_mbar_expect_tx(full_bar(s), 2 * 16 * kRowBytes);
        const uint32_t dst = kv_smem + s * kTmaStageBytes + pc * 16 * kRowBytes;
        attn_tma_2d(dst, &k_map, kv_head * kHeadDim, y, full_bar(s));
        attn_tma_2d(dst + kTileBytes, &v_map, kv_head * kHeadDim, y, full_bar(s));
    };

    static_assert(kPipe || !kPingPong, "turns are the pipelined loop's");
    // kPingPong: warpgroup 0 issues first (each warpgroup issues n_tiles + 1 groups a query tile, so
    // the turns stay balanced across query tiles; warpgroup 0 takes the last pass after the loop).
    if (kPingPong && wg == 1) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    int idx0 = 0;
    for (int rev = blockIdx.y; rev < n_qtiles; rev += gridDim.y) {
        const int t0 = (n_qtiles - 1 - rev) * kPrefillTokens;
        const int n_valid = min(kPrefillTokens, n_q - t0);
        const int p0 = start_pos + t0;
        const int p_last = p0 + n_valid - 1;
        const int kv_lo = window > 0 ? max(0, p0 - window + 1) : 0;
        const int tile_first = kv_lo / kKvTile, tile_last = p_last / kKvTile;
        const int n_tiles = tile_last - tile_first + 1;
        // The tile's pieces are 16 keys of one block (block_size % 16 == 0), clamped into [kv_lo,
        // p_last]: every loaded row is a key of this sequence in [kv_lo & ~15, p_last | 15], written
        // (earlier positions, or this batch's by the RoPE kernel) unless past the sequence's last key.
        const bool may_hold_unwritten = a.prefill_zero_all_rows || (p_last | 15) > start_pos + n_q - 1;

        __syncthreads();  // the previous query tile is done with Q
        load_q_tile<kWgPrefillThreads>(a, q, q_begin + t0, n_valid, kv_head, q_smem, tid);
        cp_async_commit();
        for (int i = 0; i < min(kAhead, n_tiles); ++i) issue(idx0 + i, tile_first + i, kv_lo, p_last);
        q_tile_cos_sin<kWgPrefillThreads>(a, q_begin + t0, n_valid, tid);
        cp_async_wait<0>();
        __syncthreads();  // Q from every thread's cp.async
        if (a.q_raw != nullptr) rotate_q_tile<kWgPrefillThreads>(a, n_valid, kv_head, q_smem, tid);

        float s[32];  // S accumulators, then P (layout as o's, keys for dims)
        float o[32];  // O accumulators: d[4·dt + e], dims 8dt + 2tig + (e & 1), row g + 8·(e >> 1)
        float m[2], l[2];
        int row_pos[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            m[h] = sink;
            l[h] = 0.0f;
            row_pos[h] = min(p0 + warp * 2 + h, p_last);
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) o[i] = s[i] = 0.0f;

        // Tile it's front: tile it + kAhead issued, its stage landed, V rows outside [kv_lo, p_last]
        // zeroed, Q's fragments reloaded (see above); returns the stage's K address and first key.
        const auto tile_front = [&](int it, uint32_t(&qa)[4][4], int& key0) {
            const int tile = tile_first + it, idx = idx0 + it, stage = idx % kStages;
            if (it + kAhead < n_tiles) issue(idx + kAhead, tile + kAhead, kv_lo, p_last);
            attn_mbar_wait(full_bar(stage), static_cast<uint32_t>((idx / kStages) & 1));
            const uint32_t k_s = kv_smem + stage * kTmaStageBytes;
            const uint32_t v_s = k_s + kTileBytes;
            key0 = tile * kKvTile;
            // V rows outside [kv_lo, p_last] to zero, where one may be a slot past the sequence's
            // last key (PagedAttentionArgs::prefill_zero_all_rows).
            if ((key0 < kv_lo || key0 + kKvTile - 1 > p_last) && may_hold_unwritten) {
                for (int c = tid & 127; c < kKvTile * 8; c += 128) {
                    const int j = key0 + (c >> 3);
                    if (j < kv_lo || j > p_last)
                        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(v_s + (c >> 3) * kRowBytes +
                                                                                        (c & 7) * 16),
                                     "r"(0u)
                                     : "memory");
                }
                fence_proxy_async();  // the zeros, visible to this warpgroup's wgmma
                warpgroup_barrier(wg);
            }
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                ldmatrix_x4(qa[kc], q_smem + swizzle(warp * 16 + (lane & 15), kc * 2 + (lane >> 4)));
            return k_s;
        };
        // The descriptors of tile it's K and V (stage (idx0 + it) % kStages): one base, the stage's
        // offset in 16-byte units (shared addresses stay below 2^18, inside the address field).
        const auto k_desc = [&](int it) {
            return k_desc0 + static_cast<uint64_t>(((idx0 + it) % kStages) * (kTmaStageBytes >> 4));
        };
        const auto v_desc = [&](int it) { return k_desc(it) + static_cast<uint64_t>(kTileBytes >> 4); };
        const auto release = [&](int it) {  // this warp is done with tile it's stage
            __syncwarp();
            if (lane == 0) attn_mbar_arrive(empty_bar((idx0 + it) % kStages));
        };

        if constexpr (!kPipe) {
            for (int it = 0; it < n_tiles; ++it) {
                uint32_t qa[4][4];  // Q A-fragments [16-wide k chunk]
                int key0;
                const uint32_t k_s = tile_front(it, qa, key0);
                wgmma_prefill_tile(qa, k_s, k_s + kTileBytes, key0, p0, p_last, window, tig, row_pos, qk_scale, s, o, m,
                                   l);
                release(it);
            }
        } else {
            // The first tile alone (no P·V before it), then S(t) with P(t - 1)·V(t - 1) behind it and
            // the softmax of S(t) while that P·V runs. The first tile is peeled so that the loop has
            // no branch between an issue and its wait (ptxas then serializes the wgmmas, C7514).
            // P alternates between two register sets (pa0, pa1): P(t) is packed while P(t - 1)'s
            // set is still the running P·V's A operand (tile_softmax_pack), so the loop runs two
            // tiles an iteration with the sets swapped.
            float corr[2];
            bool moved[2];
            uint32_t pa0[4][4], pa1[4][4];
            {
                uint32_t qa[4][4];
                int key0;
                tile_front(0, qa, key0);
                if constexpr (kPingPong) turn_wait(wg);
                pipe_issue_s(qa, k_desc(0), s);
                if constexpr (kPingPong) turn_pass(wg);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < 32; ++i) reg_fence(s[i]);
#pragma unroll
                for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                    for (int i = 0; i < 4; ++i) reg_fence(qa[kc][i]);
                tile_softmax_pack(s, key0, p0, p_last, window, tig, row_pos, qk_scale, m, l, corr, moved, pa0);
                tile_rescale(corr, moved, o);
            }
            // Tile it: S(it) and P(it - 1)·V (pu) issued, the softmax of S(it) packed into pn, then
            // the P·V's wait, its stage released and o rescaled.
            const auto step = [&](int it, uint32_t(&pu)[4][4], uint32_t(&pn)[4][4]) {
                uint32_t qa[4][4];
                int key0;
                tile_front(it, qa, key0);
                if constexpr (kPingPong) turn_wait(wg);
                pipe_issue_s_pv(qa, k_desc(it), s, pu, v_desc(it - 1), o);
                if constexpr (kPingPong) turn_pass(wg);
                wgmma_wait<1>();  // S(t) (committed first) is done
#pragma unroll
                for (int i = 0; i < 32; ++i) reg_fence(s[i]);
#pragma unroll
                for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                    for (int i = 0; i < 4; ++i) reg_fence(qa[kc][i]);
                tile_softmax_pack(s, key0, p0, p_last, window, tig, row_pos, qk_scale, m, l, corr, moved, pn);
#pragma unroll
                for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                    for (int i = 0; i < 4; ++i) reg_fence(pn[kc][i]);
                if constexpr (kOrder)  // the softmax before the wait (see kOrder)
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(scratch), "f"(l[0]), "f"(l[1]) : "memory");
                wgmma_wait<0>();  // P(t - 1)·V(t - 1) is done: o final for it, its stage free
#pragma unroll
                for (int i = 0; i < 32; ++i) reg_fence(o[i]);
#pragma unroll
                for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                    for (int i = 0; i < 4; ++i) reg_fence(pu[kc][i]);
                release(it - 1);
                tile_rescale(corr, moved, o);
            };
            // The last tile's P·V, from set pl.
            const auto last_pv = [&](uint32_t(&pl)[4][4]) {
                if constexpr (kPingPong) turn_wait(wg);
                pipe_issue_pv(pl, v_desc(n_tiles - 1), o);
                if constexpr (kPingPong) turn_pass(wg);
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < 32; ++i) reg_fence(o[i]);
#pragma unroll
                for (int kc = 0; kc < 4; ++kc)
#pragma unroll
                    for (int i = 0; i < 4; ++i) reg_fence(pl[kc][i]);
            };
            int it = 1;
            for (; it + 1 < n_tiles; it += 2) {
                step(it, pa0, pa1);
                step(it + 1, pa1, pa0);
            }
            if (it < n_tiles) {
                step(it, pa0, pa1);
                last_pv(pa1);
            } else {
                last_pv(pa0);
            }
            release(n_tiles - 1);
        }
        idx0 += n_tiles;

#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float denom = quad_sum(l[h]) + fast_exp2(sink - m[h]);
            const float inv = 1.0f / denom;
            const int tok = warp * 2 + h;
            if constexpr (kOutQ) {
                // The bf16 row's bytes through quantize_act_fp8_bf16: a 128-wide group is heads g
                // and g ^ 1 of the token (lanes l and l ^ 4), amax of the bf16 values, a power-of-two
                // scale, e4m3 of value / scale. tok < n_valid is warp-uniform (the shuffles).
                if (tok < n_valid) {
                    float b[16];
                    float amax = 0.0f;
#pragma unroll
                    for (int dt = 0; dt < 8; ++dt) {
                        const uint32_t p = pack_bf16x2(o[4 * dt + 2 * h] * inv, o[4 * dt + 2 * h + 1] * inv);
                        b[2 * dt] = __uint_as_float(p << 16);
                        b[2 * dt + 1] = __uint_as_float(p & 0xffff0000u);
                        amax = fmaxf(amax, fmaxf(fabsf(b[2 * dt]), fabsf(b[2 * dt + 1])));
                    }
                    amax = quad_max(amax);
                    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
                    const float sc = fp8_pow2_scale(amax);
                    const float r = fp8_pow2_inverse(sc);  // exact: sc is a power of two
                    const int64_t row = q_begin + t0 + tok;
                    const int col = (kv_head * kGroup + g) * kHeadDim;
                    uint8_t* dq = a.out_q + row * (a.num_heads * kHeadDim) + col + tig * 2;
#pragma unroll
                    for (int dt = 0; dt < 8; ++dt)
                        *reinterpret_cast<uint16_t*>(dq + dt * 8) = static_cast<uint16_t>(
                            to_e4m3(b[2 * dt] * r) | static_cast<uint32_t>(to_e4m3(b[2 * dt + 1] * r)) << 8);
                    if (tig == 0 && (g & 1) == 0)
                        a.out_q_scale[static_cast<int64_t>(col / 128) * a.out_q_m_pad + row] = sc;
                }
            } else if (tok < n_valid) {
                __nv_bfloat16* dst =
                    out + (static_cast<int64_t>(q_begin + t0 + tok) * a.num_heads + kv_head * kGroup + g) * kHeadDim +
                    tig * 2;
#pragma unroll
                for (int dt = 0; dt < 8; ++dt)
                    *reinterpret_cast<uint32_t*>(dst + dt * 8) =
                        pack_bf16x2(o[4 * dt + 2 * h] * inv, o[4 * dt + 2 * h + 1] * inv);
            }
        }
    }
    if (kPingPong && wg == 0) asm volatile("bar.sync 3, 256;\n" ::: "memory");  // warpgroup 1's last pass
}

// ================================================================================================
// Decode: split-KV flash-decoding.
//
// The split rule is a function of device-side data only (the sequence's position) and the grid's
// split count, shared by the decode and combine kernels: the visible keys [kv_lo, pos] cover
// 64-key tiles first..last (absolute tile indices, so tiles stay 64-aligned); each split takes
// tiles_per_split = max(kMinTilesPerSplit, ⌈n_tiles / num_splits⌉) consecutive tiles and
// num_active = ⌈n_tiles / tiles_per_split⌉ ≤ num_splits splits have work. CTAs with
// split ≥ num_active exit without writing anything: the combine kernel derives num_active from the
// same rule and reads only those partials, so no neutral partial is needed. Any host
// max_context_len is therefore only a grid-size hint; correctness never depends on it.
//
// The merge of num_active > 1 partials runs in the combine kernel (a second launch).
//
// Work per sequence at context C: K and V rows read once (C · num_kv_heads · 256 B), 4·64 FLOP per
// (query head, key); at 8 FLOP per byte this is bandwidth-bound by two orders of magnitude.
// ================================================================================================
struct DecodeSplit {
    int kv_lo;       // oldest visible key
    int tile_begin;  // this split's tiles [tile_begin, tile_end)
    int tile_end;
    int num_active;  // splits that have work for this sequence
};

__device__ __forceinline__ DecodeSplit decode_split(int pos, int window, int num_splits, int split) {
    DecodeSplit d;
    d.kv_lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int first = d.kv_lo / kKvTile, last = pos / kKvTile;
    const int n_tiles = last - first + 1;
    const int per_split = max(kMinTilesPerSplit, (n_tiles + num_splits - 1) / num_splits);
    d.num_active = (n_tiles + per_split - 1) / per_split;
    d.tile_begin = first + split * per_split;
    d.tile_end = min(d.tile_begin + per_split, last + 1);
    return d;
}

// Workspace layout for num_splits > 1: acc [num_seqs, num_heads, num_splits, 64] (unnormalised,
// relative to the split's max m), then ml [num_seqs, num_heads, num_splits, 2] = (m, l), base 2.
// Total num_seqs · num_heads · num_splits · 66 floats ≤ the documented workspace size.
__device__ __forceinline__ int64_t ws_index(const PagedAttentionArgs& a, int seq, int head, int num_splits, int split) {
    return (static_cast<int64_t>(seq) * a.num_heads + head) * num_splits + split;
}
__device__ __forceinline__ float* ws_ml(const PagedAttentionArgs& a, int num_splits) {
    return a.workspace + static_cast<int64_t>(a.num_seqs) * a.num_heads * num_splits * kHeadDim;
}

// Merges a sequence's active splits for one query head and adds the sink once (one warp, 2 dims a
// lane; see bf16_paged_attention_decode_combine_kernel below).
__device__ __forceinline__ void combine_head(const PagedAttentionArgs& a, int seq, int head, int q_row, int num_splits,
                                             int active, int lane) {
    const int64_t idx0 = ws_index(a, seq, head, num_splits, 0);
    const float* acc = a.workspace + idx0 * kHeadDim;
    const float* ml = ws_ml(a, num_splits) + idx0 * 2;
    const float sink = fmaxf(a.sinks[head] * kLog2e, kNegBig);

    float mx = sink;
    float den = 0.0f;
    float2 o = make_float2(0.0f, 0.0f);
    if (active <= 64) {
        // (r28) Lane s holds splits s and s + 32 ((m, l) loaded once, not once a pass), each split's
        // weight reaches the others by a shuffle, and the partials' loads go out 8 at a time (split
        // clamped): ~2 L2 round trips instead of ~5. The same expressions in the same order.
        const bool v0 = lane < active, v1 = lane + 32 < active;
        const float2 ml0 = __ldcg(reinterpret_cast<const float2*>(ml) + min(lane, active - 1));
        const float2 ml1 = __ldcg(reinterpret_cast<const float2*>(ml) + min(lane + 32, active - 1));
        if (v0) mx = fmaxf(mx, ml0.x);
        if (v1) mx = fmaxf(mx, ml1.x);
        mx = warp_max_all(mx);
        const float f0 = v0 ? fast_exp2(ml0.x - mx) : 0.0f, f1 = v1 ? fast_exp2(ml1.x - mx) : 0.0f;
        if (v0) den += ml0.y * f0;
        if (v1) den += ml1.y * f1;
        den = warp_sum_all(den) + fast_exp2(sink - mx);
        for (int sb = 0; sb < active; sb += 8) {
            float2 v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q)
                v[q] = __ldcg(reinterpret_cast<const float2*>(acc + min(sb + q, active - 1) * kHeadDim + lane * 2));
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int s = sb + q;
                if (s < active) {  // warp-uniform
                    const float f = __shfl_sync(0xffffffffu, s < 32 ? f0 : f1, s & 31);
                    o.x += f * v[q].x;
                    o.y += f * v[q].y;
                }
            }
        }
    } else {
        for (int s = lane; s < active; s += 32) mx = fmaxf(mx, __ldcg(ml + 2 * s));
        mx = warp_max_all(mx);
        for (int s = lane; s < active; s += 32) den += __ldcg(ml + 2 * s + 1) * fast_exp2(__ldcg(ml + 2 * s) - mx);
        den = warp_sum_all(den) + fast_exp2(sink - mx);
        for (int s = 0; s < active; ++s) {
            const float f = fast_exp2(__ldcg(ml + 2 * s) - mx);
            const float2 v = __ldcg(reinterpret_cast<const float2*>(acc + s * kHeadDim + lane * 2));
            o.x += f * v.x;
            o.y += f * v.y;
        }
    }
    const float inv = 1.0f / den;
    __nv_bfloat16* dst =
        static_cast<__nv_bfloat16*>(a.out) + (static_cast<int64_t>(q_row) * a.num_heads + head) * kHeadDim;
    *reinterpret_cast<uint32_t*>(dst + lane * 2) = pack_bf16x2(o.x * inv, o.y * inv);
}

// The cluster variant (session 22, kCluster): a sequence's splits of one kv head form one thread-block
// cluster (cluster dims 1 × num_splits, at most 16), and the merge runs in split 0's CTA on the
// partials the others leave in their own shared memory (DSMEM reads), between two cluster
// barriers, instead of through the global workspace and the combine launch (~5 µs a layer at
// batch 1 in r36's trace). CTAs without work (split ≥ num_active) still take part in the barriers.
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Bytes into the decode smem of a split's partial ([head][64] acc, then [head] (m, l)): past the
// merge scratch of kWarps warps (16 KB for 4 warps, 18 KB for 8).
__host__ __device__ constexpr int decode_part_offset(int warps) {
    return warps <= kDecodeWarps ? 16 * 1024 : 18 * 1024;
}
constexpr int kMaxClusterSplits = 16;  // a non-portable cluster size (Hopper allows 16)

// r78 read a bf16 cache's block-table entries a ring round before their copies (fdce2f7): the entry's first use
// after the ring's barrier had been 23-60% of the kernel's stall samples at 32k (ncu), but with it the stall moved to
// the tile's first HMMA (waiting for the copies) and no time changed (H100: one sequence 32k 33.9 / 34.6 µs, eight
// 180.0 / 179.6; 20b batch 1 at 32k within its noise). The warps wait for the KV bytes, wherever they wait. Removed.
//
// r41 requested the KV tiles of earlier steps before pdl_wait (0ec3d19): no measurable change (20b
// batch 1 1.650-1.658 ms a step against 1.650-1.655): the kernel starts only ~1.4 µs before the QKV
// GEMV it waits for ends (r39's trace), so there is little to hide the loads behind. Removed.
//
// kWarps = 8 (session 29, the cluster variant at one or two sequences): two streams of 4 warps, stream
// s taking tiles s, s + 2, ... of the split, so that two tiles' chains run at once on an SM that
// holds one CTA (r43: one CTA an SM issues ~340 instructions a 64-key tile a warp at ~5 cycles each;
// more bytes in flight did not help). The ring's kSlots tile slots then hold kSlots / 2 rounds of
// two tiles. Not for an e4m3 cache converted to bf16 in shared memory (convert_fp8_kv_tile's CTA-wide
// barriers): that case keeps 4 warps (the launch's choice). Two CTAs an SM (128 registers): at 179
// registers, one CTA an SM, s29 call 1 ran 8k one sequence 11.1 -> 19.9 us and two sequences at
// 1k 5.9 -> 10.3 (a 16-CTA cluster then needs 16 free SMs of a GPC: r39's lesson). At 128 (calls
// 2-3) one sequence runs 32k in 28.0-28.4 us against 28.9-29.0 on 6 slots, 8k 11.7-11.8 against
// 11.1-11.2: so the per-tile chain was not what held one sequence at ~2.3 TB/s, and neither was the
// cache layout (call 3: kv heads' keys contiguous per block, same times).
template <bool kFp8Direct, bool kCluster = false, int kWarps = kDecodeWarps, int kSlots = kDecodeStages>
__global__ void __launch_bounds__(kWarps * 32, kWarps == kDecodeWarps ? 0 : 2)
    bf16_paged_attention_decode_kernel(const __grid_constant__ PagedAttentionArgs a) {
    constexpr int kStreams = kWarps / kDecodeWarps;
    constexpr int kRoundSlots = kSlots / kStreams;  // rounds of kStreams tiles the ring holds
    static_assert(kStreams * kDecodeWarps == kWarps && kRoundSlots * kStreams == kSlots && kRoundSlots >= 2,
                  "decode ring shape");
    static_assert(kWarps * kGroup * kRedStride * 4 <= decode_part_offset(kWarps) &&
                      decode_part_offset(kWarps) + kGroup * (kHeadDim + 2) * 4 <= kSlots * 2 * kTileBytes,
                  "the merge scratch and the partial fit in the ring");
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    // This warp's stream (which tiles of the split) and its 16 keys of each 64-key tile.
    const int stream = warp / kDecodeWarps, wq = warp % kDecodeWarps, stid = tid % kDecodeThreads;
    // kv head fastest: the 8 CTAs that read the 8 interleaved 128-byte rows of the same cache
    // slots run side by side, so each 1 KB slot is fetched from DRAM in one visit.
    const int kv_head = blockIdx.x, split = blockIdx.y, seq = blockIdx.z;
    const int num_splits = gridDim.y;

    const int q_row = a.query_start[seq];
    if (a.query_start[seq + 1] - q_row != 1) return;  // padding sequence (or not a decode batch)
    const int pos = a.seq_start_pos[seq];
    const DecodeSplit sp = decode_split(pos, a.sliding_window, num_splits, split);
    if (split >= sp.num_active) {
        if (kCluster && sp.num_active > 1) {  // the merge's two barriers (cluster-uniform condition)
            cluster_sync_all();
            cluster_sync_all();
        }
        return;
    }
    const KvSource src = make_kv_source(a, seq, kv_head);
    const float qk_scale = a.scale * kLog2e;

    // Q as the A operand with the 8 heads in rows 0-7 (rows 8-15 zero: half of each MMA is
    // wasted, irrelevant at 8 FLOP/byte). Thread (g, t) holds head g, dims 16kc + 2t (+8); in the
    // FP8-direct variant dims 16kc + 4t .. + 3 (the permuted k of its K reads), in f16.
    uint32_t qa[4][4];
    {
        const uint32_t* qh = reinterpret_cast<const uint32_t*>(
            static_cast<const __nv_bfloat16*>(a.q) +
            (static_cast<int64_t>(q_row) * a.num_heads + kv_head * kGroup + g) * kHeadDim);
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            if constexpr (kFp8Direct) {  // dims 16kc + 4t .. + 3 (the permuted k), in f16
                qa[kc][0] = bf16x2_to_f16x2(qh[kc * 8 + 2 * tig]);
                qa[kc][2] = bf16x2_to_f16x2(qh[kc * 8 + 2 * tig + 1]);
            } else {
                qa[kc][0] = qh[kc * 8 + tig];
                qa[kc][2] = qh[kc * 8 + 4 + tig];
            }
            qa[kc][1] = 0u;
            qa[kc][3] = 0u;
        }
    }

    // [d tile][c]: c0, c1 = head g, dims 8dt + 2t, +1 (c2, c3 stay 0). FP8-direct: acc[2b] and
    // acc[2b + 1] are the even- and odd-dim MMAs of 16-dim block b, c0, c1 = dims 16b + 4t (+1 odd), + 2.
    float acc[8][4];
#pragma unroll
    for (int dt = 0; dt < 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
    float m = kNegBig, l = 0.0f;  // sink-free partial softmax state of head g (scaled, base 2)

    const uint32_t ring = smem_addr(smem);
    const int n_tiles = sp.tile_end - sp.tile_begin;
    const int n_rounds = (n_tiles + kStreams - 1) / kStreams;
    // Round r's tile of this stream (split-relative r·kStreams + stream) into round slot rs.
    auto load_round = [&](int r, int rs) {
        const int tl = r * kStreams + stream;
        if (tl < n_tiles) {
            const uint32_t dst = ring + (rs * kStreams + stream) * 2 * kTileBytes;
            if constexpr (kFp8Direct)
                load_kv_tile_e4m3<true>(src, sp.tile_begin + tl, sp.kv_lo, pos, dst, dst + kTileBytes, stid);
            else
                load_kv_tile(src, sp.tile_begin + tl, sp.kv_lo, pos, dst, dst + kTileBytes, stid);
        }
    };
#pragma unroll
    for (int st = 0; st < kRoundSlots - 1; ++st) {
        if (st < n_rounds) load_round(st, st);
        cp_async_commit();  // always commit so that group r is round r
    }

    for (int r = 0; r < n_rounds; ++r) {
        cp_async_wait<kRoundSlots - 2>();  // groups 0..r complete for this thread
        __syncthreads();                   // for all threads; and round slot (r−1) % kRoundSlots is free again
        {
            const int next = r + kRoundSlots - 1;
            if (next < n_rounds) load_round(next, next % kRoundSlots);
            cp_async_commit();
        }
        const int tl = r * kStreams + stream;  // this stream's tile of the round (split-relative)
        const uint32_t k_s = ring + ((r % kRoundSlots) * kStreams + stream) * 2 * kTileBytes;
        const uint32_t v_s = k_s + kTileBytes;
        if constexpr (!kFp8Direct && kStreams == 1) {
            if (src.fp8) {
                convert_fp8_kv_tile(k_s, v_s, tid);
                __syncthreads();
            }
        }
        if (kStreams > 1 && tl >= n_tiles) continue;  // an odd tile count: the last round's second stream

        // S (8 heads × this warp's 16 keys): n-tile 0 = keys 16w..16w+7, n-tile 1 = 16w+8..16w+15.
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            if constexpr (kFp8Direct) {
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {  // key warp·16 + 8nt + g, bytes 16kc + 4t .. + 3
                    const int row = wq * 16 + nt * 8 + g;
                    uint32_t w;
                    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w) : "r"(k_s + fp8_tile_offset(row, kc) + 4 * tig));
                    mma_f16(s[nt], qa[kc], e4m3x2_to_f16x2(w), e4m3x2_to_f16x2(w >> 16));
                }
            } else {
                uint32_t kb[4];
                ldmatrix_x4(kb, k_s + swizzle(wq * 16 + (lane & 7) + ((lane >> 4) << 3), kc * 2 + ((lane >> 3) & 1)));
                mma_bf16(s[0], qa[kc], kb[0], kb[1]);
                mma_bf16(s[1], qa[kc], kb[2], kb[3]);
            }
        }
        const int key0 = (sp.tile_begin + tl) * kKvTile + wq * 16 + tig * 2;
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = key0 + nt * 8 + e;
                if (key < sp.kv_lo || key > pos) s[nt][e] = -INFINITY;
                mx = fmaxf(mx, s[nt][e]);
            }
        mx = quad_max(mx);
        const float m_new = fmaxf(m, mx * qk_scale);  // stays kNegBig while all keys are masked
        const float corr = fast_exp2(m - m_new);
        m = m_new;
        float p[2][2], sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                p[nt][e] = fast_exp2(fmaf(s[nt][e], qk_scale, -m_new));
                sum += p[nt][e];
            }
        l = l * corr + sum;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt) {
            acc[dt][0] *= corr;
            acc[dt][1] *= corr;
        }
        // P as the A operand (rows 0-7 = heads, k = this warp's 16 keys), V via transposed ldmatrix.
        if constexpr (kFp8Direct) {
            const uint32_t pa[4] = {pack_f16x2(p[0][0], p[0][1]), 0u, pack_f16x2(p[1][0], p[1][1]), 0u};
#pragma unroll
            for (int bb = 0; bb < 2; ++bb) {  // 16-dim blocks 2bb and 2bb + 1
                // Lanes 0-7 / 8-15: keys 0-7 / 8-15 of this warp in block 2bb; 16-31 the same in 2bb + 1.
                const int row = wq * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, v_s + fp8_tile_offset(row, 2 * bb + (lane >> 4)));
#pragma unroll
                for (int h = 0; h < 2; ++h) {  // vb[2h]: keys 2t, 2t + 1; vb[2h + 1]: keys 8 + 2t, 9 + 2t
                    const uint32_t lo = vb[2 * h], hi = vb[2 * h + 1];
                    mma_f16(acc[4 * bb + 2 * h], pa, e4m3x2_to_f16x2(__byte_perm(lo, 0u, 0x0020)),
                            e4m3x2_to_f16x2(__byte_perm(hi, 0u, 0x0020)));  // dims 2g (even)
                    mma_f16(acc[4 * bb + 2 * h + 1], pa, e4m3x2_to_f16x2(__byte_perm(lo, 0u, 0x0031)),
                            e4m3x2_to_f16x2(__byte_perm(hi, 0u, 0x0031)));  // dims 2g + 1 (odd)
                }
            }
        } else {
            const uint32_t pa[4] = {pack_bf16x2(p[0][0], p[0][1]), 0u, pack_bf16x2(p[1][0], p[1][1]), 0u};
#pragma unroll
            for (int dp = 0; dp < 4; ++dp) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb,
                                  v_s + swizzle(wq * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
                mma_bf16(acc[2 * dp], pa, vb[0], vb[1]);
                mma_bf16(acc[2 * dp + 1], pa, vb[2], vb[3]);
            }
        }
    }

    // Merge the 4 warps' partials through shared memory (the ring is free once every copy landed
    // and every warp left the loop).
    cp_async_wait<0>();
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);  // [warp][head][kRedStride]
    l = quad_sum(l);
    {
        float* mine = red + (warp * kGroup + g) * kRedStride;
        if constexpr (kFp8Direct) {  // block b: dims 16b + 4t .. + 3 = (even c0, odd c0, even c1, odd c1)
#pragma unroll
            for (int b = 0; b < 4; ++b)
                *reinterpret_cast<float4*>(mine + b * 16 + tig * 4) =
                    make_float4(acc[2 * b][0], acc[2 * b + 1][0], acc[2 * b][1], acc[2 * b + 1][1]);
        } else {
#pragma unroll
            for (int dt = 0; dt < 8; ++dt)
                *reinterpret_cast<float2*>(mine + dt * 8 + tig * 2) = make_float2(acc[dt][0], acc[dt][1]);
        }
        if (tig == 0) {
            mine[kHeadDim] = m;
            mine[kHeadDim + 1] = l;
        }
    }
    __syncthreads();
    // The first 128 threads merge (head h, 4 dims each); with 8 warps the rest only take part in the
    // cluster barriers.
    const bool merger = tid < kDecodeThreads;
    const int h = (tid >> 4) & (kGroup - 1);  // head within the group
    const int d0 = (tid & 15) * 4;            // 4 output dims per thread
    float mw = kNegBig;
    float lw = 0.0f, o4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (merger) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) mw = fmaxf(mw, red[(w * kGroup + h) * kRedStride + kHeadDim]);
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float* r = red + (w * kGroup + h) * kRedStride;
            const float f = fast_exp2(r[kHeadDim] - mw);
            lw += f * r[kHeadDim + 1];
#pragma unroll
            for (int k = 0; k < 4; ++k) o4[k] += f * r[d0 + k];
        }
    }
    const int head = kv_head * kGroup + h;
    if (sp.num_active == 1) {
        if (!merger) return;
        // The only split: finalise here, sink included (once).
        const float sink = fmaxf(a.sinks[head] * kLog2e, kNegBig);
        const float mx_all = fmaxf(mw, sink);
        const float f = fast_exp2(mw - mx_all);
        const float scale = f / (lw * f + fast_exp2(sink - mx_all));
        __nv_bfloat16* dst =
            static_cast<__nv_bfloat16*>(a.out) + (static_cast<int64_t>(q_row) * a.num_heads + head) * kHeadDim + d0;
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(pack_bf16x2(o4[0] * scale, o4[1] * scale), pack_bf16x2(o4[2] * scale, o4[3] * scale));
    } else if constexpr (kCluster) {
        // This split's partial into its own shared memory (past the merge scratch `red`), then split
        // 0 merges every active split's as combine_head does: M = max(sink, max_s m_s), out =
        // Σ_s 2^(m_s − M) acc_s / (Σ_s 2^(m_s − M) l_s + 2^(sink − M)).
        float* part = reinterpret_cast<float*>(smem + decode_part_offset(kWarps));  // [kGroup][64], [kGroup][2]
        if (merger) {
            *reinterpret_cast<float4*>(part + h * kHeadDim + d0) = make_float4(o4[0], o4[1], o4[2], o4[3]);
            if ((tid & 15) == 0) {
                part[kGroup * kHeadDim + 2 * h] = mw;
                part[kGroup * kHeadDim + 2 * h + 1] = lw;
            }
        }
        cluster_sync_all();  // every active split's partial is in its CTA's shared memory
        if (split == 0 && merger) {
            cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
            const int active = sp.num_active;
            const float sink = fmaxf(a.sinks[head] * kLog2e, kNegBig);
            float ms[kMaxClusterSplits], ls[kMaxClusterSplits];
            float4 os[kMaxClusterSplits];
#pragma unroll
            for (int s2 = 0; s2 < kMaxClusterSplits; ++s2) {
                if (s2 < active) {
                    const float* r = cluster.map_shared_rank(part, s2);
                    os[s2] = *reinterpret_cast<const float4*>(r + h * kHeadDim + d0);
                    ms[s2] = r[kGroup * kHeadDim + 2 * h];
                    ls[s2] = r[kGroup * kHeadDim + 2 * h + 1];
                }
            }
            float mx = sink;
#pragma unroll
            for (int s2 = 0; s2 < kMaxClusterSplits; ++s2)
                if (s2 < active) mx = fmaxf(mx, ms[s2]);
            float den = 0.0f;
            float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s2 = 0; s2 < kMaxClusterSplits; ++s2) {
                if (s2 < active) {
                    const float f = fast_exp2(ms[s2] - mx);
                    den += ls[s2] * f;
                    o[0] += f * os[s2].x;
                    o[1] += f * os[s2].y;
                    o[2] += f * os[s2].z;
                    o[3] += f * os[s2].w;
                }
            }
            den += fast_exp2(sink - mx);
            const float inv = 1.0f / den;
            __nv_bfloat16* dst =
                static_cast<__nv_bfloat16*>(a.out) + (static_cast<int64_t>(q_row) * a.num_heads + head) * kHeadDim + d0;
            *reinterpret_cast<uint2*>(dst) =
                make_uint2(pack_bf16x2(o[0] * inv, o[1] * inv), pack_bf16x2(o[2] * inv, o[3] * inv));
        }
        cluster_sync_all();  // the partials stay until split 0 has read them
    } else {
        if (!merger) return;
        const int64_t idx = ws_index(a, seq, head, num_splits, split);
        *reinterpret_cast<float4*>(a.workspace + idx * kHeadDim + d0) = make_float4(o4[0], o4[1], o4[2], o4[3]);
        if ((tid & 15) == 0) {
            float* ml = ws_ml(a, num_splits) + idx * 2;
            ml[0] = mw;
            ml[1] = lw;
        }
    }
}

// Merges a sequence's active splits and adds the sink once:
//   M = max(sink, max_s m_s);  out = Σ_s 2^(m_s − M) acc_s / (Σ_s 2^(m_s − M) l_s + 2^(sink − M)).
// One warp per query head, 2 dims per lane. Reads num_active · 66 floats per head.
__global__ void __launch_bounds__(kCombineThreads)
    bf16_paged_attention_decode_combine_kernel(const __grid_constant__ PagedAttentionArgs a, int num_splits) {
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kv_head = blockIdx.x, seq = blockIdx.y;
    const int q_row = a.query_start[seq];
    if (a.query_start[seq + 1] - q_row != 1) return;
    const int pos = a.seq_start_pos[seq];
    const int active = decode_split(pos, a.sliding_window, num_splits, 0).num_active;
    if (active <= 1) return;  // the decode CTA finalised this sequence itself
    combine_head(a, seq, kv_head * kGroup + warp, q_row, num_splits, active, lane);
}

// ================================================================================================
// Reference: one warp per (token, query head), lane owns dims 2·lane and 2·lane + 1; the same two
// passes as kernels::cpu::attention (max over sink and scores, then e^{s − M} sums with expf).
// ================================================================================================
__global__ void __launch_bounds__(kRefWarps * 32)
    bf16_paged_attention_reference_kernel(const __grid_constant__ PagedAttentionArgs a) {
    const int t = blockIdx.x;
    const int head = blockIdx.y * kRefWarps + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (head >= a.num_heads) return;
    int s = 0;
    while (s + 1 < a.num_seqs && a.query_start[s + 1] <= t) ++s;
    const int pos = a.seq_start_pos[s] + (t - a.query_start[s]);
    const int lo = a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) : 0;
    const int kv_head = head / (a.num_heads / a.num_kv_heads);
    const __nv_bfloat16* q =
        static_cast<const __nv_bfloat16*>(a.q) + (static_cast<int64_t>(t) * a.num_heads + head) * kHeadDim;
    const float q0 = __bfloat162float(q[2 * lane]), q1 = __bfloat162float(q[2 * lane + 1]);
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
    // Element r of a cache as fp32 (bf16, or e4m3 with kv_fp8).
    auto kv_at = [&](const void* cache, int64_t r) {
        if (a.kv_fp8) {
            const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(cache)[r], __NV_E4M3);
            return __half2float(*reinterpret_cast<const __half*>(&h));
        }
        return __bfloat162float(static_cast<const __nv_bfloat16*>(cache)[r]);
    };
    auto row = [&](int j) {
        const int64_t slot = static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
        return (slot * a.num_kv_heads + kv_head) * kHeadDim + 2 * lane;
    };
    auto score = [&](int j) {
        const int64_t r = row(j);
        return warp_sum_all(q0 * kv_at(a.k_cache, r) + q1 * kv_at(a.k_cache, r + 1)) * a.scale;
    };
    float mx = a.sinks[head];
    for (int j = lo; j <= pos; ++j) mx = fmaxf(mx, score(j));
    float den = expf(a.sinks[head] - mx), o0 = 0.0f, o1 = 0.0f;
    for (int j = lo; j <= pos; ++j) {
        const float p = expf(score(j) - mx);
        den += p;
        const int64_t r = row(j);
        o0 += p * kv_at(a.v_cache, r);
        o1 += p * kv_at(a.v_cache, r + 1);
    }
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(a.out) + (static_cast<int64_t>(t) * a.num_heads + head) * kHeadDim;
    dst[2 * lane] = __float2bfloat16(o0 / den);
    dst[2 * lane + 1] = __float2bfloat16(o1 / den);
}

// ---- host side ---------------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void validate(const PagedAttentionArgs& a, const char* who) {
    ENGINE_CHECK(a.head_dim == kHeadDim, "%s: head_dim %d, only %d is supported", who, a.head_dim, kHeadDim);
    ENGINE_CHECK(a.num_kv_heads > 0 && a.num_heads == kGroup * a.num_kv_heads,
                 "%s: %d query heads / %d kv heads, need exactly %d query heads per kv head", who, a.num_heads,
                 a.num_kv_heads, kGroup);
    ENGINE_CHECK(a.block_size > 0 && (a.block_size & (a.block_size - 1)) == 0,
                 "%s: block_size %d must be a power of two", who, a.block_size);
    ENGINE_CHECK(a.num_seqs >= 0 && a.num_seqs <= 65535, "%s: num_seqs %d out of range", who, a.num_seqs);
    ENGINE_CHECK(a.sliding_window >= 0 && a.scale > 0.0f, "%s: sliding_window %d, scale %g", who, a.sliding_window,
                 static_cast<double>(a.scale));
    ENGINE_CHECK((a.q || a.q_raw) && a.out && a.sinks && a.k_cache && a.v_cache && a.block_tables && a.seq_start_pos &&
                     a.query_start,
                 "%s: null pointer argument", who);
    ENGINE_CHECK(aligned16(a.q) && aligned16(a.out) && aligned16(a.k_cache) && aligned16(a.v_cache),
                 "%s: q/out/k_cache/v_cache must be 16-byte aligned", who);
    ENGINE_CHECK(a.q_raw == nullptr ||
                     (a.q_bias && a.q_positions && a.rope_inv_freq && aligned16(a.q_raw) && aligned16(a.q_bias) &&
                      a.q_raw_stride % 8 == 0 && a.q_raw_stride >= a.num_heads * a.head_dim),
                 "%s: q_raw needs q_bias, q_positions, rope_inv_freq, 16-byte alignment (q_raw, q_bias) and a row "
                 "stride (%d) that "
                 "is a multiple of 8 and at least num_heads · head_dim",
                 who, a.q_raw_stride);
    ENGINE_CHECK(
        a.out_q == nullptr || (a.out_q_scale != nullptr && aligned16(a.out_q) && a.num_heads * a.head_dim % 128 == 0 &&
                               a.out_q_m_pad == fp8_gemm_m_pad(a.num_tokens)),
        "%s: out_q needs scales, 16-byte alignment, num_heads · head_dim a multiple of 128 and out_q_m_pad "
        "%d = fp8_gemm_m_pad(%d)",
        who, a.out_q_m_pad, a.num_tokens);
}

// Rows [from, m_pad) of a quantized activation block (out_q's padding): zeros, scale 1, as
// quantize_act_fp8_bf16 writes them.
__global__ void act_q_pad_rows_kernel(uint8_t* q, float* scale, int from, int m_pad, int k_pad) {
    const int rows = m_pad - from;
    for (int i = threadIdx.x; i < rows * k_pad / 4; i += blockDim.x)
        reinterpret_cast<uint32_t*>(q + static_cast<int64_t>(from) * k_pad)[i] = 0u;
    for (int i = threadIdx.x; i < rows * (k_pad / 128); i += blockDim.x)
        scale[static_cast<int64_t>(i / rows) * m_pad + from + i % rows] = 1.0f;
}

// Per-device facts cached on first use, so that launches inside a graph capture make no CUDA call
// beyond cudaGetDevice and the launches themselves (the engine warms up before it captures).
constexpr int kMaxDevices = 64;

int current_device() {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    return dev;
}

int num_sms(int dev) {
    static std::atomic<int> cache[kMaxDevices];
    int n = dev < kMaxDevices ? cache[dev].load(std::memory_order_relaxed) : 0;
    if (n == 0) {
        CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
        if (dev < kMaxDevices) cache[dev].store(n, std::memory_order_relaxed);
    }
    return n;
}

// The cluster variant's shapes (bf16_paged_attention_decode_kernel's kWarps / kSlots): 1 = 4 warps,
// 4 tile slots (r37-r43); 2 = 8 warps in two streams on the same 64 KB; 3 = 8 warps on 6 slots (96
// KB). Default: 3 at one sequence, 1 at two (s29 calls 1-2, 20b --fp8 decode, ms a step, one pass
// each: batch 1 at 1k 1.622 / 1.606 / 1.607 for modes 1 / 2 / 3, at 32k 1.956 / 1.953 / 1.902;
// batch 2 at 1k 2.190 / 2.238 / 2.219, at 32k 2.614 / 2.918 / 2.815: two sequences' 256 CTAs of 8
// warps no longer fit in one wave of clusters). GPTOSS_ATTN_DECODE_STREAMS=1, 2 or 3 sets both. An
// e4m3 cache converted to bf16 in shared memory (kv_fp8 without fp8_direct) always takes 1.
struct DecodeClusterKernel {
    void (*kernel)(PagedAttentionArgs);
    int threads;
    int smem;
};
template <bool kFp8Direct, int kWarps, int kSlots>
constexpr DecodeClusterKernel decode_cluster_kernel() {
    return {bf16_paged_attention_decode_kernel<kFp8Direct, true, kWarps, kSlots>, kWarps * 32, kSlots * 2 * kTileBytes};
}
constexpr int kDecodeStreamModes = 3;
static DecodeClusterKernel decode_cluster_kernel_at(int mode, bool fp8_direct) {
    switch (mode) {
        case 1: return fp8_direct ? decode_cluster_kernel<true, 4, 4>() : decode_cluster_kernel<false, 4, 4>();
        case 3: return fp8_direct ? decode_cluster_kernel<true, 8, 6>() : decode_cluster_kernel<false, 8, 6>();
        default: return fp8_direct ? decode_cluster_kernel<true, 8, 4>() : decode_cluster_kernel<false, 8, 4>();
    }
}
static std::array<DecodeClusterKernel, 2 * kDecodeStreamModes> decode_cluster_kernels() {
    std::array<DecodeClusterKernel, 2 * kDecodeStreamModes> all{};
    for (int m = 1; m <= kDecodeStreamModes; ++m)
        for (int f = 0; f < 2; ++f) all[2 * (m - 1) + f] = decode_cluster_kernel_at(m, f == 1);
    return all;
}
// GPTOSS_ATTN_DECODE_STREAMS as a mode, or 0 (unset: the default by batch size).
static int decode_streams_override() {
    static const int mode = [] {
        const char* v = std::getenv("GPTOSS_ATTN_DECODE_STREAMS");
        if (v == nullptr || *v == '\0') return 0;
        const int m = std::atoi(v);
        if (m < 1 || m > kDecodeStreamModes) {
            std::fprintf(stderr, "GPTOSS_ATTN_DECODE_STREAMS=%s: expected 1, 2 or 3; using the default\n", v);
            return 0;
        }
        return m;
    }();
    return mode;
}
static DecodeClusterKernel decode_cluster_kernel_for(const PagedAttentionArgs& a) {
    int mode = decode_streams_override();
    if (mode == 0) mode = a.num_seqs == 1 ? 3 : 1;
    if (a.kv_fp8 && !a.fp8_direct) mode = 1;
    return decode_cluster_kernel_at(mode, a.kv_fp8 && a.fp8_direct);
}

// The decode kernel needs 64 KB of dynamic shared memory (over the 48 KB default).
void ensure_decode_smem(int dev) {
    static std::atomic<bool> done[kMaxDevices];
    if (dev < kMaxDevices && done[dev].load(std::memory_order_acquire)) return;
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_decode_kernel<false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_decode_kernel<true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmem));
    for (const DecodeClusterKernel& k : decode_cluster_kernels()) {
        CUDA_CHECK(cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem));
        CUDA_CHECK(cudaFuncSetAttribute(k.kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    if (dev < kMaxDevices) done[dev].store(true, std::memory_order_release);
}

// The warpgroup prefill kernel's 49 KB of dynamic shared memory (over the 48 KB default).
void ensure_prefill_smem(int dev) {
    static std::atomic<bool> done[kMaxDevices];
    if (dev < kMaxDevices && done[dev].load(std::memory_order_acquire)) return;
    // The mma.sync kernel too: its 48 KB plus the static 4 KB of q_rope_cs (the q_raw tile's cos / sin) pass
    // the default 48 KB.
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kPrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_wgmma_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kWgPrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kTmaPrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPipePrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPingPongPrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, false, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPipePrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, true, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPingPongPrefillSmem));
    // kOrder off (GPTOSS_ATTN_SOFTMAX_ORDER=0: A/B runs).
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, false, false, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPipePrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, true, false, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPingPongPrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, false, true, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPipePrefillSmem));
    CUDA_CHECK(cudaFuncSetAttribute(bf16_paged_attention_prefill_tma_kernel<true, true, true, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kPingPongPrefillSmem));
    if (dev < kMaxDevices) done[dev].store(true, std::memory_order_release);
}

// The TMA maps of a bf16 cache pair, [slots, num_kv_heads · 64] in boxes of 16 slots × 64 elements
// (one kv head's rows of one 16-slot piece), 128-byte swizzled; encoded once per (k, v, heads) and
// kept (host memory only). The slot count is not known here: the maps' row extent is a bound
// (2^31 − 1), and the kernel only asks for pieces of blocks in the table. False if encoding fails.
bool kv_tensor_maps(const PagedAttentionArgs& a, CUtensorMap* k_map, CUtensorMap* v_map) {
    static std::mutex mu;
    static std::map<std::tuple<const void*, const void*, int>, std::pair<CUtensorMap, CUtensorMap>> cache;
    const auto key = std::make_tuple(a.k_cache, a.v_cache, a.num_kv_heads);
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) {
        *k_map = it->second.first;
        *v_map = it->second.second;
        return true;
    }
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.num_kv_heads) * kHeadDim, static_cast<cuuint64_t>(INT_MAX)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.num_kv_heads) * kHeadDim * 2};
    const cuuint32_t box[2] = {kHeadDim, 16}, unit[2] = {1, 1};
    std::pair<CUtensorMap, CUtensorMap> maps;
    for (int i = 0; i < 2; ++i) {
        CUtensorMap* m = i == 0 ? &maps.first : &maps.second;
        void* base = const_cast<void*>(i == 0 ? a.k_cache : a.v_cache);
        if (encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, unit,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return false;
    }
    cache.emplace(key, maps);
    *k_map = maps.first;
    *v_map = maps.second;
    return true;
}

}  // namespace

int choose_decode_splits(int num_seqs, int num_kv_heads, int max_context_len, int sliding_window, int max_splits,
                         int sm_count) {
    if (num_seqs <= 0 || num_kv_heads <= 0 || max_splits <= 1) return 1;
    // Tiles the longest visible range can touch (a sliding range is not 64-aligned: one more).
    const int keys =
        sliding_window > 0 ? std::min(std::max(max_context_len, 1), sliding_window) : std::max(max_context_len, 1);
    const int max_tiles = (keys + kKvTile - 1) / kKvTile + (sliding_window > 0 ? 1 : 0);
    // A range of at most this many tiles in one split, without the combine launch (A/B runs:
    // GPTOSS_ATTN_SINGLE_SPLIT_TILES, e.g. 3 for the 128-key sliding window; default 0, off).
    static const int single_split_tiles = [] {
        const char* v = std::getenv("GPTOSS_ATTN_SINGLE_SPLIT_TILES");
        return v != nullptr ? std::max(0, std::atoi(v)) : 0;
    }();
    if (max_tiles <= single_split_tiles) return 1;
    const int useful = (max_tiles + kMinTilesPerSplit - 1) / kMinTilesPerSplit;
    // One wave: as many CTAs as fit at once (3 per SM at 64 KB of shared memory each). Rounding
    // down keeps long splits from spilling a small second wave; at large batch (≥ 50 sequences of
    // 8 kv heads) the grid is several waves of whole sequences and one split suffices.
    const int ctas_per_split = num_seqs * num_kv_heads;
    const int slots = std::max(sm_count, 1) * kDecodeCtasPerSm;
    const int splits = std::max(1, slots / ctas_per_split);
    return std::max(1, std::min({splits, useful, max_splits}));
}

// PagedAttentionArgs::prefill_softmax_order = -1: on unless GPTOSS_ATTN_SOFTMAX_ORDER=0.
static bool prefill_softmax_order_default() {
    static const bool on = [] {
        const char* v = std::getenv("GPTOSS_ATTN_SOFTMAX_ORDER");
        return v == nullptr || std::atoi(v) != 0;
    }();
    return on;
}

void paged_attention_prefill(const PagedAttentionArgs& a, cudaStream_t stream) {
    validate(a, "paged_attention_prefill");
    if (a.num_seqs == 0 || a.max_query_len <= 0) return;
    const int qtiles = std::min((a.max_query_len + kPrefillTokens - 1) / kPrefillTokens, 65535);
    const dim3 grid(a.num_kv_heads, qtiles, a.num_seqs);
    CUtensorMap k_map, v_map;
    if (a.prefill_wgmma && a.prefill_tma && !a.kv_fp8 && a.block_size % 16 == 0 && kv_tensor_maps(a, &k_map, &v_map)) {
        ensure_prefill_smem(current_device());
        const bool order = a.prefill_softmax_order < 0 ? prefill_softmax_order_default() : a.prefill_softmax_order != 0;
        const size_t pipe_smem = a.prefill_pingpong ? kPingPongPrefillSmem : kPipePrefillSmem;
        // The pipelined kernels by (ping-pong, quantizing epilogue, kOrder).
        const auto pipe_kernel = [&](auto pp, auto oq) {
            constexpr bool kPP = decltype(pp)::value, kOQ = decltype(oq)::value;
            return order ? bf16_paged_attention_prefill_tma_kernel<true, kPP, kOQ, true>
                         : bf16_paged_attention_prefill_tma_kernel<true, kPP, kOQ, false>;
        };
        using T = std::true_type;
        using F = std::false_type;
        if (a.prefill_pipe && a.out_q != nullptr) {  // the epilogue quantizes (PagedAttentionArgs::out_q)
            auto kernel = a.prefill_pingpong ? pipe_kernel(T{}, T{}) : pipe_kernel(F{}, T{});
            kernel<<<grid, kWgPrefillThreads, pipe_smem, stream>>>(a, k_map, v_map);
            CUDA_CHECK_LAUNCH();
            if (a.out_q_m_pad > a.num_tokens) {
                act_q_pad_rows_kernel<<<1, 256, 0, stream>>>(a.out_q, a.out_q_scale, a.num_tokens, a.out_q_m_pad,
                                                             a.num_heads * kHeadDim);
                CUDA_CHECK_LAUNCH();
            }
            return;
        }
        if (a.prefill_pipe) {
            auto kernel = a.prefill_pingpong ? pipe_kernel(T{}, F{}) : pipe_kernel(F{}, F{});
            kernel<<<grid, kWgPrefillThreads, pipe_smem, stream>>>(a, k_map, v_map);
        } else
            bf16_paged_attention_prefill_tma_kernel<false>
                <<<grid, kWgPrefillThreads, kTmaPrefillSmem, stream>>>(a, k_map, v_map);
    } else if (a.prefill_wgmma) {
        ensure_prefill_smem(current_device());
        bf16_paged_attention_prefill_wgmma_kernel<<<grid, kWgPrefillThreads, kWgPrefillSmem, stream>>>(a);
    } else {
        ensure_prefill_smem(current_device());
        bf16_paged_attention_prefill_kernel<<<grid, kPrefillThreads, kPrefillSmem, stream>>>(a);
    }
    CUDA_CHECK_LAUNCH();
    if (a.out_q != nullptr)  // the kernels without the quantizing epilogue: bf16 rows, then the quantizer
        quantize_act_fp8_bf16(a.out, a.num_tokens, a.num_heads * kHeadDim, a.num_heads * kHeadDim, a.out_q,
                              a.out_q_scale, stream);
}

// The most sequences a decode batch may have for the cluster merge: 2 (r37: batch 1 faster, batch
// 8 slower; r38 call 1, 20b: batch 2 2.248 / 2.236 → 2.225 / 2.204 ms a step, batch 4 3.215 / 3.202
// → 3.261 / 3.237); GPTOSS_ATTN_DECODE_CLUSTER=all: any batch (A/B runs).
static int max_cluster_seqs() {
    static const int n = [] {
        const char* v = std::getenv("GPTOSS_ATTN_DECODE_CLUSTER");
        return v != nullptr && std::strcmp(v, "all") == 0 ? INT_MAX : 2;
    }();
    return n;
}

// The largest split count the cluster variant launches with: 16 where the device schedules a
// 16-CTA cluster of the decode kernel, else 8 (the portable size); 0 with GPTOSS_ATTN_DECODE_CLUSTER=0.
static int max_cluster_splits() {
    static const int n = [] {
        const char* v = std::getenv("GPTOSS_ATTN_DECODE_CLUSTER");
        if (v != nullptr && std::strcmp(v, "0") == 0) return 0;
        ensure_decode_smem(current_device());
        // Every shape the launch may pick must schedule 16-CTA clusters.
        for (const DecodeClusterKernel& k : decode_cluster_kernels())
            if (max_active_clusters(k.kernel, dim3(1, kMaxClusterSplits, 1), dim3(k.threads), k.smem) <= 0) return 8;
        return kMaxClusterSplits;
    }();
    return n;
}

void paged_attention_decode_splits(const PagedAttentionArgs& a, int num_splits, cudaStream_t stream) {
    validate(a, "paged_attention_decode");
    ENGINE_CHECK(a.q_raw == nullptr && a.q != nullptr, "paged_attention_decode: q is required (q_raw is prefill's)");
    ENGINE_CHECK(num_splits >= 1 && num_splits <= std::max(a.max_splits, 1) && num_splits <= 65535,
                 "paged_attention_decode: %d splits (max_splits %d)", num_splits, a.max_splits);
    ENGINE_CHECK(num_splits == 1 || (a.workspace != nullptr && aligned16(a.workspace)),
                 "paged_attention_decode: %d splits need a 16-byte aligned workspace", num_splits);
    if (a.num_seqs == 0) return;
    ensure_decode_smem(current_device());
    const dim3 grid(a.num_kv_heads, num_splits, a.num_seqs);
    // One or two sequences: r37 call 4 measured the cluster merge at batch 1 (20b 1k: 1.678 →
    // 1.646-1.653 ms a step; 120b 2.551 → 2.493; 20b 8k context 1.786 → 1.728) and at batch 8 (6
    // splits: 5.25-5.28 → 5.30-5.31 ms, slower), r38 call 1 at 2 (faster) and 4 (slower), so larger
    // batches keep the combine launch.
    if (a.num_seqs <= max_cluster_seqs() && num_splits > 1 && num_splits <= max_cluster_splits()) {
        const DecodeClusterKernel k = decode_cluster_kernel_for(a);
        launch_pdl_cluster(k.kernel, grid, dim3(1, num_splits, 1), dim3(k.threads), k.smem, stream, a);
        CUDA_CHECK_LAUNCH();
        return;
    }
    if (a.kv_fp8 && a.fp8_direct)
        launch_pdl(bf16_paged_attention_decode_kernel<true>, grid, kDecodeThreads, kDecodeSmem, stream, a);
    else
        launch_pdl(bf16_paged_attention_decode_kernel<false>, grid, kDecodeThreads, kDecodeSmem, stream, a);
    if (num_splits > 1) {
        const dim3 cgrid(a.num_kv_heads, a.num_seqs);
        launch_pdl(bf16_paged_attention_decode_combine_kernel, cgrid, kCombineThreads, 0, stream, a, num_splits);
    }
}

int paged_attention_decode_split_count(const PagedAttentionArgs& a) {
    int splits = choose_decode_splits(a.num_seqs, a.num_kv_heads, a.max_context_len, a.sliding_window, a.max_splits,
                                      num_sms(current_device()));
    // One or two sequences: at most a cluster's worth of splits (16: 128 CTAs, about one an SM) so that the
    // merge runs inside the decode kernel (r37 call 4: 49 → 16 splits at 8k context, 1.786 → 1.728 ms
    // a 20b step, the combine launch gone with them).
    if (const int c = max_cluster_splits(); a.num_seqs <= max_cluster_seqs() && c > 1) splits = std::min(splits, c);
    return splits;
}

void paged_attention_decode(const PagedAttentionArgs& a, cudaStream_t stream) {
    paged_attention_decode_splits(a, paged_attention_decode_split_count(a), stream);
}

void paged_attention_reference_cuda(const PagedAttentionArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.head_dim == kHeadDim && a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 &&
                     a.num_heads % kRefWarps == 0 && a.block_size > 0,
                 "paged_attention_reference_cuda: unsupported shape");
    ENGINE_CHECK(a.q != nullptr, "paged_attention_reference_cuda: q is required (q_raw is the prefill kernels')");
    if (a.num_seqs == 0 || a.num_tokens == 0) return;
    const dim3 grid(a.num_tokens, a.num_heads / kRefWarps);
    bf16_paged_attention_reference_kernel<<<grid, kRefWarps * 32, 0, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
