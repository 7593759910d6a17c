// Grouped MoE GEMMs on the tensor cores with MXFP4 weights dequantized in registers (W4A16):
// kernels/cuda/moe.h moe_mma_tiles / moe_mma. Design (bench/NOTES.md, issue 6):
//
// - Work items: (64 output columns) × (a tile of BM rows of one expert). moe_mma_tiles lists the
//   row tiles from the routing plan on the device, so the grid is an upper bound that depends on
//   the batch size only (graph-capturable, no host synchronisation); CTAs past the list exit.
// - Per 32-wide K step (one MXFP4 group): cp.async brings the BM activation rows (bf16, 64 bytes
//   each, XOR-swizzled 16-byte chunks: conflict-free ldmatrix) and the 64 weight rows' 16 packed
//   bytes into a 4-stage ring; scales for the CTA's 64 rows and every group are staged once.
// - B fragments of mma.m16n8k16 come straight from the packed bytes: byte j of a group holds
//   elements 2j (low nibble) and 2j + 1 (high), which is exactly a fragment register's pair, so a
//   lane's four registers for 32 k are byte (lane % 4) of the group's four words. A nibble becomes
//   a bf16 by moving its bits (sign to 15, exponent to 8:7, mantissa to 6): that bf16 is the e2m1
//   value times 2^-126, subnormals included, and one bf16x2 multiply by 2^(s - 1) (exact: a power
//   of two) applies both the 2^126 and the group scale 2^(s - 127).
// - Epilogues: gate_up adds the bias and applies the clamped SwiGLU to each (gate, up) column pair
//   (a lane holds both) and writes bf16 act rows; down adds the bias and writes fp32 rows of y at
//   their assignment index (the scatter of the bf16 path).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_common.cuh"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kBN = 64;          // output columns per CTA (the down projection's small tiles: 32)
constexpr int kMaxGroups = 128;  // K / 32 (K ≤ 4096)
constexpr int kThreads = 128;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte `t` of each of the four words -> the four B registers of two k16 steps, scaled.
struct GroupScale {
    uint32_t first, second;  // multiply by first, then (if second != 0) by second
};
__device__ __forceinline__ GroupScale group_scale(uint32_t s) {
    // 2^(s - 1) as a bf16 (exponent field s + 126) when representable; else 2^126, then 2^(s - 127).
    if (s <= 128u) {
        const uint32_t h = (s + 126u) << 7;
        return {h | (h << 16), 0u};
    }
    const uint32_t h1 = 253u << 7, h2 = s << 7;  // s = 255: inf, as e8m0_to_f32 gives
    return {h1 | (h1 << 16), h2 | (h2 << 16)};
}

// WM × WN warps; a warp owns MF m16 fragments × NF n8 fragments: BM = WM·MF·16 rows, BN = WN·NF·8
// columns. A stage holds GPS groups (32·GPS of K); kStages stages in the ring. Dynamic shared
// memory (smem_bytes): the A and B rings, the scales of the CTA's BN rows for every group, the
// tile rows' source offsets.
template <int WM, int WN, int MF, int NF, int kStages, int GPS>
struct Tile {
    static constexpr int BM = WM * MF * 16, BN = WN * NF * 8;
    static constexpr int kRowA = 64 * GPS;  // bytes of one activation row in a stage
    static constexpr int kA = BM * kRowA, kB = BN * 16 * GPS;
    static size_t smem_bytes(int groups) {
        return static_cast<size_t>(kStages) * (kA + kB) + ((static_cast<size_t>(BN) * groups + 15) & ~size_t{15}) +
               BM * 8;
    }
    // 16-byte chunk q of row r: XOR-swizzled so that 8 consecutive rows at one q hit 8 distinct
    // 16-byte bank groups (ldmatrix reads 8 rows × 16 bytes).
    __device__ static int a_offset(int r, int q) {
        if constexpr (GPS == 1)
            return r * kRowA + ((q ^ ((r >> 1) & 3)) << 4);  // 64-byte rows: two rows per 128 bytes
        else
            return r * kRowA + ((q ^ (r & 7)) << 4);
    }
};

template <bool kGateUp, int WM, int WN, int MF, int NF, int kStages, int GPS>
__global__ void __launch_bounds__(kThreads) moe_mma_kernel(const MoeMmaArgs a) {
    using TT = Tile<WM, WN, MF, NF, kStages, GPS>;
    static_assert(WM * WN * 32 == kThreads, "tile shape");
    constexpr int BM = TT::BM, kBN = TT::BN;
    extern __shared__ __align__(128) uint8_t smem[];
    auto s_a = [&](int slot) { return smem + slot * TT::kA; };
    auto s_b = [&](int slot) { return smem + kStages * TT::kA + slot * TT::kB; };
    uint8_t* s_scale = smem + kStages * (TT::kA + TT::kB);
    int64_t* s_src = reinterpret_cast<int64_t*>(s_scale + ((kBN * (a.k / 32) + 15) & ~15));

    pdl_wait();
    const int tile = blockIdx.y;
    if (tile >= *a.tile_count) return;
    const int e = a.tiles[2 * tile], rt = a.tiles[2 * tile + 1];
    const int row0 = a.expert_offsets[e] + rt * BM;
    const int rows = min(BM, a.expert_offsets[e + 1] - row0);
    const int n0 = blockIdx.x * kBN;
    const int K = a.k, G = K / 32, N = a.n;
    const int steps = (G + GPS - 1) / GPS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp % WM, wn = warp / WM;

    // Source row of each tile row (byte offset of its first element), and the scales.
    for (int r = tid; r < BM; r += kThreads) {
        int64_t src = -1;
        if (r < rows) {
            const int i = row0 + r;
            const int64_t row = a.x_by_token ? a.sorted_assignments[i] / a.experts_per_token : i;
            src = row * K * 2;
        }
        s_src[r] = src;
    }
    // The CTA's scales: BN rows × G bytes, contiguous and 16-byte aligned ((e·N + n0) is a multiple
    // of 32); 16-byte loads, all issued before any is used.
    const uint4* scales = reinterpret_cast<const uint4*>(a.scales + (static_cast<int64_t>(e) * N + n0) * G);
    uint32_t big = 0;  // a scale byte above 128 (2^(s - 1) not a bf16): the two-multiply path
    for (int i = tid; i < kBN * G / 16; i += kThreads) {
        const uint4 v = __ldg(scales + i);
        big |= __vcmpgtu4(v.x, 0x80808080u) | __vcmpgtu4(v.y, 0x80808080u) | __vcmpgtu4(v.z, 0x80808080u) |
               __vcmpgtu4(v.w, 0x80808080u);
        reinterpret_cast<uint4*>(s_scale)[i] = v;
    }
    const bool one_mul = __syncthreads_or(big != 0) == 0;

    const uint8_t* xb = static_cast<const uint8_t*>(a.x);
    const uint8_t* wb = a.blocks + (static_cast<int64_t>(e) * N + n0) * G * 16;
    // Adjacent threads take adjacent 16-byte pieces of a row: GPS pieces of weights (16·GPS
    // contiguous bytes) and 4·GPS pieces of activations per row and stage. Groups past G (the last
    // stage when GPS does not divide G) are not loaded and not used.
    auto load_stage = [&](int step, int slot) {
        const int g0 = step * GPS, ng = min(GPS, G - g0);
        // Only the tile's real rows: a padding row's A values only reach its own (discarded)
        // output row, so its shared memory is left as it is.
        for (int c = tid; c < rows * 4 * GPS; c += kThreads) {
            const int r = c / (4 * GPS), q = c % (4 * GPS);
            if (q >= 4 * ng) continue;
            cp_async16(s_a(slot) + TT::a_offset(r, q), xb + s_src[r] + g0 * 64 + q * 16, true);
        }
        for (int c = tid; c < kBN * GPS; c += kThreads) {
            const int r = c / GPS, q = c % GPS;
            if (q >= ng) continue;
            cp_async16(s_b(slot) + c * 16, wb + (static_cast<int64_t>(r) * G + g0 + q) * 16, true);
        }
    };

    float acc[MF][NF][4];
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < steps) load_stage(s, s);
        cp_async_commit();
    }
    for (int step = 0; step < steps; ++step) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        {
            const int next = step + kStages - 1;
            if (next < steps) load_stage(next, next % kStages);
            cp_async_commit();
        }
        const int slot = step % kStages;
#pragma unroll
        for (int gi = 0; gi < GPS; ++gi) {
            const int grp = step * GPS + gi;
            if (GPS > 1 && grp >= G) break;
            // B: this lane's bytes of its NF weight rows, dequantized for both k16 halves.
            uint32_t bfr[NF][4];
#pragma unroll
            for (int j = 0; j < NF; ++j) {
                const int n = wn * NF * 8 + j * 8 + g;
                const uint4 v = *reinterpret_cast<const uint4*>(s_b(slot) + (n * GPS + gi) * 16);
                const uint32_t sb = s_scale[n * G + grp];
                const uint32_t raw[4] = {
                    e2m1x2_raw(__byte_perm(v.x, 0u, 0x4440u | t)), e2m1x2_raw(__byte_perm(v.y, 0u, 0x4440u | t)),
                    e2m1x2_raw(__byte_perm(v.z, 0u, 0x4440u | t)), e2m1x2_raw(__byte_perm(v.w, 0u, 0x4440u | t))};
                if (one_mul) {  // every real checkpoint (CTA-uniform): one exact multiply by 2^(s - 1)
                    const uint32_t m = ((sb + 126u) << 7) * 0x10001u;
#pragma unroll
                    for (int q = 0; q < 4; ++q) bfr[j][q] = bf16x2_mul(raw[q], m);
                } else {
                    const GroupScale gs = group_scale(sb);
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        bfr[j][q] = gs.second ? bf16x2_mul(bf16x2_mul(raw[q], gs.first), gs.second)
                                              : bf16x2_mul(raw[q], gs.first);
                }
            }
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
                for (int i = 0; i < MF; ++i) {
                    // ldmatrix.x4: lane L addresses row (L % 8) + 8·((L / 8) & 1), chunk 2·kk + L / 16
                    // of this group.
                    const int r = wm * MF * 16 + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    const int q = gi * 4 + kk * 2 + (lane >> 4);
                    uint32_t afr[4];
                    ldmatrix_x4(afr, s_a(slot) + TT::a_offset(r, q));
#pragma unroll
                    for (int j = 0; j < NF; ++j) mma_bf16(acc[i][j], afr, bfr[j][2 * kk], bfr[j][2 * kk + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();
    pdl_trigger();

    // Epilogue. acc[i][j]: rows m = base + g (v 0, 1) and + 8 (v 2, 3), columns c, c + 1.
#pragma unroll
    for (int i = 0; i < MF; ++i) {
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            const int c = n0 + wn * NF * 8 + j * 8 + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = wm * MF * 16 + i * 16 + g + 8 * h;
                if (m >= rows) continue;
                const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                const int64_t row = row0 + m;
                if constexpr (kGateUp) {
                    const float* b = a.bias + static_cast<int64_t>(e) * N + c;
                    static_cast<__nv_bfloat16*>(a.act)[row * (N / 2) + c / 2] =
                        __float2bfloat16(swiglu(v0 + b[0], v1 + b[1], a.swiglu_limit, a.swiglu_alpha));
                } else {
                    const float* b = a.bias + static_cast<int64_t>(e) * N + c;
                    float* dst = a.y + static_cast<int64_t>(a.sorted_assignments[row]) * N + c;
                    *reinterpret_cast<float2*>(dst) = make_float2(v0 + b[0], v1 + b[1]);
                }
            }
        }
    }
}

// ---- decode-sized tiles, weights straight into registers ("v4") --------------------------------
// For tiles of ≤ 16 rows the weights are the traffic and the instruction count per weight byte
// decides the speed (the kernel above: ~350 warp instructions per KB, 1.5 TB/s). Here:
// - Tile: 16 rows of one expert × 192 columns (6 warps × 4 n8 fragments). Stage: 4 MXFP4 groups
//   (128 of K).
// - Lane (g, t) owns, per fragment, weight row (fragment base + g) and group (4·stage + t): one
//   16-byte load straight into registers, two stages ahead, and that group's scale byte. No shared
//   memory, cp.async or ldmatrix for the weights.
// - K order inside an MMA is free as long as A and B agree. A word of 8 codes gives four B
//   registers, register i holding codes (i, i + 4) (e2m1x8_raw: a mask, a multiply and a mask
//   each); the A register holds the same two activations (one PRMT of a 16-byte shared-memory
//   read, shared by the warp's 4 fragments).
// - Activations: a cp.async ring of 4 stages (16 rows × 256 bytes each, chunks XOR-swizzled so
//   that a warp's 16-byte reads of rows g and g + 8 are conflict-free).
constexpr int kV4Warps = 6, kV4NF = 4, kV4BN = kV4Warps * kV4NF * 8;  // 192 columns
constexpr int kV4Threads = kV4Warps * 32, kV4Stages = 4, kV4BM = 16;
constexpr int kV4StageBytes = kV4BM * 256;

// Physical 16-byte chunk of chunk c (8 elements; c = 4·group + word) of tile row r in a stage.
__device__ __forceinline__ int v4_chunk(int r, int c) { return c ^ ((((c >> 3) & 1) << 1) | (r & 1)); }

// kMinBlocks 2: 123 registers, no spills, 12 warps an SM; 3: 96 registers with a few spills, 18.
// kBSmem (mode 5, not yet measured): the weights land by cp.async in a per-lane shared-memory slot
// (3 stages, A and B in one ring) instead of registers: 90 registers, no spills, 3 CTAs (18 warps) an SM.
template <bool kBSmem>
struct V4Ring {
    static constexpr int kStages = kBSmem ? 3 : kV4Stages;
    static constexpr int kB = kBSmem ? kV4Warps * kV4NF * 32 * 16 : 0;  // bytes of weights a stage
    static constexpr size_t smem_bytes() { return static_cast<size_t>(kStages) * (kV4StageBytes + kB) + kV4BM * 8; }
};

template <bool kGateUp, int kMinBlocks, bool kBSmem>
__global__ void __launch_bounds__(kV4Threads, kMinBlocks) moe_mma_v4_kernel(const MoeMmaArgs a) {
    using Ring = V4Ring<kBSmem>;
    constexpr int kStages = Ring::kStages;
    extern __shared__ __align__(128) uint8_t v4_smem[];
    auto s_a = [&](int slot) { return v4_smem + slot * kV4StageBytes; };
    auto s_b = [&](int slot, int j) {  // this lane's 16 bytes of fragment j
        return v4_smem + kStages * kV4StageBytes + slot * Ring::kB +
               (((threadIdx.x >> 5) * kV4NF + j) * 32 + (threadIdx.x & 31)) * 16;
    };
    int64_t* s_src = reinterpret_cast<int64_t*>(v4_smem + kStages * (kV4StageBytes + Ring::kB));

    pdl_wait();
    const int tile = blockIdx.y;
    if (tile >= *a.tile_count) return;
    const int e = a.tiles[2 * tile], rt = a.tiles[2 * tile + 1];
    const int row0 = a.expert_offsets[e] + rt * kV4BM;
    const int rows = min(kV4BM, a.expert_offsets[e + 1] - row0);
    const int n0 = blockIdx.x * kV4BN;
    const int K = a.k, G = K / 32, N = a.n;
    const int steps = (G + 3) / 4;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    if (tid < kV4BM) {
        int64_t src = -1;
        if (tid < rows) {
            const int i = row0 + tid;
            const int64_t row = a.x_by_token ? a.sorted_assignments[i] / a.experts_per_token : i;
            src = row * K * 2;
        }
        s_src[tid] = src;
    }
    __syncthreads();

    const uint8_t* xb = static_cast<const uint8_t*>(a.x);
    // Activations of stage `step` (its real rows and groups) into ring slot `slot`.
    auto load_a = [&](int step, int slot) {
        for (int c = tid; c < rows * 16; c += kV4Threads) {
            const int r = c >> 4, q = c & 15;
            if (step * 4 + (q >> 2) >= G) continue;
            cp_async16(s_a(slot) + r * 256 + v4_chunk(r, q) * 16, xb + s_src[r] + (step * 128 + q * 8) * 2);
        }
    };
    // This lane's weight rows (one per fragment) and scale rows.
    const int64_t row_base = static_cast<int64_t>(e) * N + n0 + warp * kV4NF * 8 + g;
    // kBSmem: the weights of stage `step` into ring slot `slot` (zeros past G), scales separately.
    auto load_b_async = [&](int step, int slot) {
        const int grp = step * 4 + t;
#pragma unroll
        for (int j = 0; j < kV4NF; ++j) {
            const int64_t row = row_base + j * 8;
            const bool ok = grp < G;
            cp_async16(s_b(slot, j), a.blocks + (row * G + (ok ? grp : 0)) * 16, ok);
        }
    };
    auto load_scales = [&](int step, uint32_t(&sc)[kV4NF]) {
        const int grp = step * 4 + t;
#pragma unroll
        for (int j = 0; j < kV4NF; ++j) sc[j] = grp < G ? __ldg(a.scales + (row_base + j * 8) * G + grp) : 127u;
    };
    auto load_b = [&](int step, uint4(&w)[kV4NF], uint32_t(&sc)[kV4NF]) {
        const int grp = step * 4 + t;
#pragma unroll
        for (int j = 0; j < kV4NF; ++j) {
            const int64_t row = row_base + j * 8;
            if (grp < G) {
                w[j] = ldg_stream(a.blocks + (row * G + grp) * 16);
                sc[j] = __ldg(a.scales + row * G + grp);
            } else {
                w[j] = make_uint4(0u, 0u, 0u, 0u);
                sc[j] = 127u;
            }
        }
    };

    float acc[kV4NF][4];
#pragma unroll
    for (int j = 0; j < kV4NF; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[j][v] = 0.0f;

    // One stage, word by word: the A registers of word q of this lane's group (zero past G), then
    // that word of every fragment's group, two MMAs each. The scale 2^(s - 1) (= 2^126 · 2^(s - 127))
    // is one bf16x2 multiplier, or two (`two`) where it is past bf16 (a scale byte above 128, which
    // no real checkpoint has; chosen per warp and stage). Called with a constant `two`, so each call
    // site inlines one path.
    auto compute = [&](int step, int slot, const uint4(&w)[kV4NF], const uint32_t(&sc)[kV4NF], const bool two) {
        const bool valid = step * 4 + t < G;
        uint32_t m1[kV4NF], m2[kV4NF];
#pragma unroll
        for (int j = 0; j < kV4NF; ++j) {
            if (two) {
                const GroupScale gs = group_scale(sc[j]);
                m1[j] = gs.first;
                m2[j] = gs.second ? gs.second : 0x3F803F80u;  // 1.0
            } else {
                m1[j] = ((sc[j] + 126u) << 7) * 0x10001u;
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint4 x0 = make_uint4(0u, 0u, 0u, 0u), x1 = x0;
            if (valid) {
                const int c = 4 * t + q;
                x0 = *reinterpret_cast<const uint4*>(s_a(slot) + g * 256 + v4_chunk(g, c) * 16);
                x1 = *reinterpret_cast<const uint4*>(s_a(slot) + (g + 8) * 256 + v4_chunk(g + 8, c) * 16);
            }
            // Pair i = elements (i, i + 4) of the 8: pairs 0, 1 from words x/z, 2, 3 from y/w. MMA
            // (q, 0) takes pairs 0 and 1 (a0, a2: row g; a1, a3: row g + 8), MMA (q, 1) pairs 2 and 3.
            const uint32_t a0[4] = {__byte_perm(x0.x, x0.z, 0x5410), __byte_perm(x1.x, x1.z, 0x5410),
                                    __byte_perm(x0.x, x0.z, 0x7632), __byte_perm(x1.x, x1.z, 0x7632)};
            const uint32_t a1[4] = {__byte_perm(x0.y, x0.w, 0x5410), __byte_perm(x1.y, x1.w, 0x5410),
                                    __byte_perm(x0.y, x0.w, 0x7632), __byte_perm(x1.y, x1.w, 0x7632)};
#pragma unroll
            for (int j = 0; j < kV4NF; ++j) {
                const uint32_t word = q == 0 ? w[j].x : q == 1 ? w[j].y : q == 2 ? w[j].z : w[j].w;
                uint32_t r[4];
                e2m1x8_raw(word, r);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    r[i] = bf16x2_mul(r[i], m1[j]);
                    if (two) r[i] = bf16x2_mul(r[i], m2[j]);
                }
                mma_bf16(acc[j], a0, r[0], r[1]);
                mma_bf16(acc[j], a1, r[2], r[3]);
            }
        }
    };

    // Prologue: A (and with kBSmem B) of stages 0 .. kStages - 2 in flight; B (or only the scales)
    // of stages 0 and 1 in registers.
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
        if (st < steps) {
            load_a(st, st);
            if constexpr (kBSmem) load_b_async(st, st);
        }
        cp_async_commit();
    }
    uint4 wb0[kV4NF], wb1[kV4NF];
    uint32_t sc0[kV4NF], sc1[kV4NF];
    if constexpr (kBSmem) {
        load_scales(0, sc0);
        if (steps > 1) load_scales(1, sc1);
    } else {
        load_b(0, wb0, sc0);
        if (steps > 1) load_b(1, wb1, sc1);
    }
    // Each stage: wait for its A (and B), queue stage + kStages - 1, take the B registers (or read
    // this lane's slot) and refill the registers with stage + 2 before the math (the copy keeps
    // the loads in flight during it).
    auto stage = [&](int step, uint4(&wb)[kV4NF], uint32_t(&sc)[kV4NF]) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        {
            const int next = step + kStages - 1;
            if (next < steps) {
                load_a(next, next % kStages);
                if constexpr (kBSmem) load_b_async(next, next % kStages);
            }
            cp_async_commit();
        }
        uint4 w[kV4NF];
        uint32_t s[kV4NF];
#pragma unroll
        for (int j = 0; j < kV4NF; ++j) {
            if constexpr (kBSmem)
                w[j] = *reinterpret_cast<const uint4*>(s_b(step % kStages, j));
            else
                w[j] = wb[j];
            s[j] = sc[j];
        }
        if (step + 2 < steps) {
            if constexpr (kBSmem)
                load_scales(step + 2, sc);
            else
                load_b(step + 2, wb, sc);
        }
        uint32_t big = 0;
#pragma unroll
        for (int j = 0; j < kV4NF; ++j) big |= s[j] > 128u;
        if (__any_sync(0xffffffffu, big != 0))
            compute(step, step % kStages, w, s, true);
        else
            compute(step, step % kStages, w, s, false);
    };
    for (int step = 0; step < steps; step += 2) {
        stage(step, wb0, sc0);
        if (step + 1 < steps) stage(step + 1, wb1, sc1);
    }
    cp_async_wait<0>();
    pdl_trigger();

    // Epilogue as moe_mma: acc[j] rows g (v 0, 1) and g + 8 (v 2, 3), columns c, c + 1.
#pragma unroll
    for (int j = 0; j < kV4NF; ++j) {
        const int c = n0 + warp * kV4NF * 8 + j * 8 + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = g + 8 * h;
            if (m >= rows) continue;
            const float v0 = acc[j][2 * h], v1 = acc[j][2 * h + 1];
            const int64_t row = row0 + m;
            const float* b = a.bias + static_cast<int64_t>(e) * N + c;
            if constexpr (kGateUp) {
                static_cast<__nv_bfloat16*>(a.act)[row * (N / 2) + c / 2] =
                    __float2bfloat16(swiglu(v0 + b[0], v1 + b[1], a.swiglu_limit, a.swiglu_alpha));
            } else {
                float* dst = a.y + static_cast<int64_t>(a.sorted_assignments[row]) * N + c;
                *reinterpret_cast<float2*>(dst) = make_float2(v0 + b[0], v1 + b[1]);
            }
        }
    }
}

__global__ void moe_mma_tiles_kernel(const int32_t* offsets, int num_experts, int bm, int max_tiles, int32_t* tiles,
                                     int32_t* count) {
    __shared__ int start[kMaxMoeMmaExperts + 1];
    pdl_wait();  // the offsets come from the plan just before
    pdl_trigger();
    const int e = threadIdx.x;
    const int n = e < num_experts ? (offsets[e + 1] - offsets[e] + bm - 1) / bm : 0;
    if (e < num_experts) start[e + 1] = n;
    __syncthreads();
    if (e == 0) {
        start[0] = 0;
        for (int i = 1; i <= num_experts; ++i) start[i] += start[i - 1];
        *count = min(start[num_experts], max_tiles);
    }
    __syncthreads();
    if (e < num_experts)
        for (int i = 0; i < n && start[e] + i < max_tiles; ++i) {
            tiles[2 * (start[e] + i)] = e;
            tiles[2 * (start[e] + i) + 1] = i;
        }
}

template <bool kGateUp, int WM, int WN, int MF, int NF, int kStages, int GPS>
void launch(const MoeMmaArgs& a, cudaStream_t stream) {
    using TT = Tile<WM, WN, MF, NF, kStages, GPS>;
    const dim3 grid(a.n / TT::BN, a.max_tiles);
    const size_t smem = TT::smem_bytes(a.k / 32);
    auto kernel = moe_mma_kernel<kGateUp, WM, WN, MF, NF, kStages, GPS>;
    fit_dynamic_smem(kernel, smem);  // past the default limit (large k): opt in
    kernel<<<grid, kThreads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

// Small tiles: 4 groups a stage (64 contiguous bytes of a weight row per load round) unless
// GPTOSS_MOE_MMA_GPS=1 (one group a stage, 8 stages: the first design), for A/B runs.
bool wide_stages() {
    static const bool wide = [] {
        const char* v = std::getenv("GPTOSS_MOE_MMA_GPS");
        return v == nullptr || std::atoi(v) != 1;
    }();
    return wide;
}

template <int kMinBlocks, bool kBSmem>
void launch_v4(const MoeMmaArgs& a, bool gate_up, cudaStream_t stream) {
    const dim3 grid(a.n / kV4BN, a.max_tiles);
    const size_t smem = V4Ring<kBSmem>::smem_bytes();
    auto kernel = gate_up ? moe_mma_v4_kernel<true, kMinBlocks, kBSmem> : moe_mma_v4_kernel<false, kMinBlocks, kBSmem>;
    fit_dynamic_smem(kernel, smem);
    kernel<<<grid, kV4Threads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

// GPTOSS_MOE_MMA_V4 (A/B runs): 0 = 16-row tiles always by the shared-memory kernel; 2 = the
// register kernel for 2 CTAs an SM; 3 = the same built for 3 CTAs an SM; else (default 5) the
// variant with the weights landing per lane in shared memory (3 CTAs an SM). Measured in r21
// (moe_bench 20b shapes, 64 / 256 tokens): 2 = 266.8 / 584.0 µs, 5 = 246.6 / 515.1 µs; 120b
// decode step at batch 64 / 256: 31.0 / 41.2 ms against 28.0 / 37.1 ms.
int v4_mode() {
    static const int mode = [] {
        const char* v = std::getenv("GPTOSS_MOE_MMA_V4");
        return v == nullptr ? 5 : std::atoi(v);
    }();
    return mode;
}

}  // namespace

int moe_mma_block_rows(bool large) { return large ? 64 : 16; }

bool moe_mma_supported(int n, int k, int num_experts) {
    return n % kBN == 0 && k % 32 == 0 && k / 32 <= kMaxGroups && num_experts <= kMaxMoeMmaExperts && n > 0;
}

void moe_mma_tiles(const int32_t* expert_offsets, int num_experts, int block_rows, int max_tiles, int32_t* tiles,
                   int32_t* tile_count, cudaStream_t stream) {
    ENGINE_CHECK(num_experts >= 1 && num_experts <= kMaxMoeMmaExperts && block_rows > 0, "moe_mma_tiles: %d experts",
                 num_experts);
    launch_pdl(moe_mma_tiles_kernel, 1, kMaxMoeMmaExperts, 0, stream, expert_offsets, num_experts, block_rows,
               max_tiles, tiles, tile_count);
    CUDA_CHECK_LAUNCH();
}

void moe_mma(const MoeMmaArgs& a, bool gate_up, cudaStream_t stream) {
    ENGINE_CHECK(moe_mma_supported(a.n, a.k, a.num_experts) && (!gate_up || a.n % 2 == 0),
                 "moe_mma: n %d, k %d, %d experts unsupported", a.n, a.k, a.num_experts);
    if (a.max_tiles <= 0) return;
    // Small tiles (decode-sized batches: the weights are the traffic): 4 groups a stage, 128
    // columns for gate_up where they divide n (per-CTA costs over twice the weights), 64 for down.
    // GPTOSS_MOE_MMA_GPS=1: the first design (1 group a stage, 8 stages, 32-column down tiles).
    // Large tiles: BM 64, warps 2 × 2, each 32 × 32.
    const int small = a.small_kernel >= 0 ? a.small_kernel : v4_mode();
    if (!a.large && small != 0 && a.n % kV4BN == 0) {
        if (small == 3)
            launch_v4<3, false>(a, gate_up, stream);
        else if (small == 5)
            launch_v4<3, true>(a, gate_up, stream);
        else
            launch_v4<2, false>(a, gate_up, stream);
        return;
    }
    if (a.large) {
        if (gate_up)
            launch<true, 2, 2, 2, 4, 4, 1>(a, stream);
        else
            launch<false, 2, 2, 2, 4, 4, 1>(a, stream);
    } else if (wide_stages()) {
        if (gate_up && a.n % 128 == 0)
            launch<true, 1, 4, 1, 4, 3, 4>(a, stream);  // 3 stages: 48.5 KB at k = 2880
        else if (gate_up)
            launch<true, 1, 4, 1, 2, 4, 4>(a, stream);
        else
            launch<false, 1, 4, 1, 2, 4, 4>(a, stream);  // n % 64 == 0 (moe_mma_supported)
    } else if (gate_up) {
        launch<true, 1, 4, 1, 2, 8, 1>(a, stream);
    } else {
        launch<false, 1, 4, 1, 1, 8, 1>(a, stream);
    }
}

}  // namespace gptoss::kernels::cuda
