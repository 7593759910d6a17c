// Grouped MoE GEMMs on Hopper's warpgroup tensor cores (wgmma), MXFP4 weights dequantized in
// registers (W4A16): kernels/cuda/moe.h moe_wgmma. Design (bench/NOTES.md r19):
//
// - Swapped operands: D[feature, token] = W[feature, :] · X[token, :]. The weights are wgmma's A
//   operand, which may come from registers, so the MXFP4 bytes go global -> shared (raw, 4.25 bits)
//   -> registers (bf16 fragments) and never back to shared memory; the activations are the B
//   operand, read by the tensor cores straight from shared memory (128-byte swizzled K-major
//   tiles filled by cp.async, gathered by token).
// - A CTA: 3 warpgroups × 64 weight rows = 192 output features (5760 and 2880 are multiples) ×
//   BT tokens of one expert (16, 32, 64 or 128: wgmma's N), the tile list from moe_mma_tiles. K
//   advances 64 at a time (two MXFP4 groups) through a 5-stage ring: filled by every thread's
//   cp.async (moe_wgmma_kernel, measured in r19), or by a producer warp's TMA with per-stage
//   mbarriers (moe_wgmma_ws_kernel, below; not yet run on a GPU).
// - The fragment of mma m16n8k16 (and of a register-A wgmma, per warp) pairs elements 2t, 2t + 1 of
//   a k16 step: exactly byte t of an MXFP4 group's words, as in moe_mma.cu, so a lane's registers
//   are byte t of each of the group's four words, moved into bf16 bit patterns and scaled by one
//   exact multiply.
// - The fragments are double-buffered in registers: a warpgroup dequantizes step s + 1 while its
//   wgmmas of step s run (wgmma.wait_group 1 keeps one group in flight).
// - gate_up rows are taken in the order (gate j, ..., up j, ...) within each 16-row slab, so a lane
//   holds gate and up of the same j and applies the clamped SwiGLU without a shuffle.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_common.cuh"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kWarpgroups = 3;
constexpr int kRowsW = 64 * kWarpgroups;  // output features per CTA
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kStages = 5;
constexpr int kMaxGroups = 128;  // K / 32

template <int N>
struct Wgmma;
template <>
struct Wgmma<16> {
    __device__ __forceinline__ static void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7}, "
            "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};

template <>
struct Wgmma<32> {
    __device__ __forceinline__ static void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
            "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};

template <>
struct Wgmma<64> {
    __device__ __forceinline__ static void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
            "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};

template <>
struct Wgmma<128> {
    __device__ __forceinline__ static void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
            "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
            "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};

template <int BT>
struct Cfg {
    static constexpr int kAct = BT * 128;       // BT token rows × 64 bf16 (one K step)
    static constexpr int kRaw = kRowsW * 32;    // 2 groups × 16 bytes per weight row, [group][row]
    static constexpr int kStage = kAct + kRaw;  // a multiple of 1024: every activation tile 1 KB-aligned
    static_assert(kStage % 1024 == 0, "stage alignment");
    static size_t smem_bytes(int groups) {
        return 1024 + static_cast<size_t>(kStages) * kStage + static_cast<size_t>(kRowsW) * groups;
    }
};

// Row of the CTA's weight slice held at shared row rs: gate_up interleaves (gate, up) pairs, and
// slab rows s < 8 take the gates 2·(8·slab + s), rows s ≥ 8 the ups.
template <bool kGateUp>
__device__ __forceinline__ int weight_row(int rs) {
    if constexpr (kGateUp) {
        const int slab = rs >> 4, s = rs & 15;
        return slab * 16 + 2 * (s & 7) + (s >> 3);
    } else {
        return rs;
    }
}

// The CTA's work: tile blockIdx.y of the list (expert e, its rows row0 .. row0 + rows) times the
// features n0 .. n0 + kRowsW. e = -1: past the list (the grid is an upper bound).
struct TileWork {
    int e, row0, rows, n0;
};
__device__ __forceinline__ TileWork tile_work(const MoeMmaArgs& a, int bt) {
    const int tile = blockIdx.y;
    if (tile >= *a.tile_count) return {-1, 0, 0, 0};
    const int e = a.tiles[2 * tile], rt = a.tiles[2 * tile + 1];
    const int row0 = a.expert_offsets[e] + rt * bt;
    return {e, row0, min(bt, a.expert_offsets[e + 1] - row0), static_cast<int>(blockIdx.x) * kRowsW};
}

// Step `step` of this lane's two weight rows (raw rows rr0, rr1 of the stage, [group][row][16 B];
// scales at scale0/scale1 [G]) into bf16x2 fragments: frag[gi·8 + h·4 + q] holds byte t of word q of
// group gi of row h, scaled.
__device__ __forceinline__ void dequant_step(const uint8_t* raw, int rr0, int rr1, const uint8_t* scale0,
                                             const uint8_t* scale1, int step, int ng, int t, bool one_mul,
                                             uint32_t (&frag)[16]) {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
        if (gi >= ng) break;
        const int grp = 2 * step + gi;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4 v = *reinterpret_cast<const uint4*>(raw + gi * kRowsW * 16 + (h ? rr1 : rr0) * 16);
            const uint32_t sb = (h ? scale1 : scale0)[grp];
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const uint32_t r = e2m1x2_raw(__byte_perm(w[q], 0u, 0x4440u | t));
                uint32_t f;
                if (one_mul) {
                    f = bf16x2_mul(r, ((sb + 126u) << 7) * 0x10001u);
                } else if (sb <= 128u) {
                    f = bf16x2_mul(r, ((sb + 126u) << 7) * 0x10001u);
                } else {  // 2^126 first, then 2^(s - 127) (s = 255: inf, as e8m0_to_f32 gives)
                    f = bf16x2_mul(bf16x2_mul(r, (253u << 7) * 0x10001u), (sb << 7) * 0x10001u);
                }
                frag[gi * 8 + h * 4 + q] = f;
            }
        }
    }
}

// The wgmmas of one step (2 · ng k16 steps) on the activation tile at act_base.
template <int BT>
__device__ __forceinline__ void mma_step(float (&acc)[BT / 2], const uint32_t (&frag)[16], uint32_t act_base, int ng) {
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < BT / 2; ++i) reg_fence(acc[i]);
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
        if (gi >= ng) break;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            // A fragment of k16 step 2·gi + kk: (row g, k 2t), (row g + 8, k 2t), (row g, k 2t + 8),
            // (row g + 8, k 2t + 8) = words 2kk and 2kk + 1 of both rows.
            const uint32_t af[4] = {frag[gi * 8 + 2 * kk], frag[gi * 8 + 4 + 2 * kk], frag[gi * 8 + 2 * kk + 1],
                                    frag[gi * 8 + 4 + 2 * kk + 1]};
            Wgmma<BT>::mma(acc, af, desc_sw128(act_base + (gi * 2 + kk) * 32));
        }
    }
    wgmma_commit();
}

// Epilogue. acc[4j + v]: token 8j + 2t + (v & 1) of the tile, this lane's weight rows wr0 (v < 2)
// and wr1 (CTA-local, global order): gate_up rows wr0 = 2·jf (gate) and wr1 = 2·jf + 1 (up).
template <bool kGateUp, int BT>
__device__ __forceinline__ void epilogue(const MoeMmaArgs& a, const float (&acc)[BT / 2], int e, int row0, int rows,
                                         int n0, int wr0, int wr1, int t) {
    const int N = a.n;
    const float* bias = a.bias + static_cast<int64_t>(e) * N + n0;
    const float b0 = bias[wr0], b1 = bias[wr1];
#pragma unroll
    for (int j = 0; j < BT / 8; ++j) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int m = 8 * j + 2 * t + u;
            if (m >= rows) continue;
            const int64_t row = row0 + m;
            const float v0 = acc[4 * j + u] + b0, v1 = acc[4 * j + 2 + u] + b1;
            if constexpr (kGateUp) {
                static_cast<__nv_bfloat16*>(a.act)[row * (N / 2) + (n0 + wr0) / 2] =
                    __float2bfloat16(swiglu(v0, v1, a.swiglu_limit, a.swiglu_alpha));
            } else {
                float* dst = a.y + static_cast<int64_t>(a.sorted_assignments[row]) * N + n0;
                dst[wr0] = v0;
                dst[wr1] = v1;
            }
        }
    }
}

// The CTA's scales (kRowsW × G contiguous bytes, 16-byte aligned: n0 and N multiples of 16) into
// shared memory; true when every one is ≤ 128 (one multiply per fragment register). Every thread of
// the CTA (kCtaThreads) takes part (a barrier).
template <int kCtaThreads>
__device__ __forceinline__ bool load_scales(const MoeMmaArgs& a, int e, int n0, uint8_t* s_scale) {
    const int G = a.k / 32;
    const uint4* scales = reinterpret_cast<const uint4*>(a.scales + (static_cast<int64_t>(e) * a.n + n0) * G);
    uint32_t big = 0;
    for (int i = threadIdx.x; i < kRowsW * G / 16; i += kCtaThreads) {
        const uint4 v = __ldg(scales + i);
        big |= __vcmpgtu4(v.x, 0x80808080u) | __vcmpgtu4(v.y, 0x80808080u) | __vcmpgtu4(v.z, 0x80808080u) |
               __vcmpgtu4(v.w, 0x80808080u);
        reinterpret_cast<uint4*>(s_scale)[i] = v;
    }
    return __syncthreads_or(big != 0) == 0;
}

template <bool kGateUp, int BT>
__global__ void __launch_bounds__(kThreads, BT <= 32 ? 2 : 1) moe_wgmma_kernel(const MoeMmaArgs a) {
    using C = Cfg<BT>;
    constexpr int kAcc = BT / 2;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int K = a.k, G = K / 32, N = a.n;
    uint8_t* s_scale = smem + kStages * C::kStage;  // [kRowsW][G], the CTA's rows in global order

    pdl_wait();
    const TileWork w = tile_work(a, BT);
    if (w.e < 0) return;
    const int e = w.e, row0 = w.row0, rows = w.rows, n0 = w.n0;
    const int steps = (G + 1) / 2;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    const bool one_mul = load_scales<kThreads>(a, e, n0, s_scale);

    // Every stage, a thread copies the same 16-byte chunks (at K offsets step · 128 bytes for the
    // activations, step · 32 for the weights): their addresses are computed once. Activations: chunk
    // c = tid + i·kThreads is (row c / 8, chunk c % 8) of the tile, only for the tile's real rows (a
    // padding row's values reach only its own discarded output column). Weights: chunk tid is (group
    // tid / kRowsW, shared row tid % kRowsW).
    constexpr int kActChunks = (BT * 8 + kThreads - 1) / kThreads;
    const uint8_t* act_src[kActChunks];
    uint32_t act_dst[kActChunks];
    int act_q[kActChunks];  // 16-byte chunk within the 128-byte row (-1: none)
    const uint8_t* xb = static_cast<const uint8_t*>(a.x);
#pragma unroll
    for (int i = 0; i < kActChunks; ++i) {
        const int c = tid + i * kThreads, r = c >> 3, q = c & 7;
        act_q[i] = -1;
        act_src[i] = xb;
        act_dst[i] = 0;
        if (c < BT * 8 && r < rows) {
            const int m = row0 + r;
            const int64_t row = a.x_by_token ? a.sorted_assignments[m] / a.experts_per_token : m;
            act_q[i] = q;
            act_src[i] = xb + row * K * 2 + q * 16;
            act_dst[i] = r * 128 + ((q ^ (r & 7)) << 4);
        }
    }
    const int raw_g = tid / kRowsW, raw_rs = tid % kRowsW;
    const uint8_t* raw_src =
        a.blocks + ((static_cast<int64_t>(e) * N + n0 + weight_row<kGateUp>(raw_rs)) * G + raw_g) * 16;
    const uint32_t raw_dst = raw_g * kRowsW * 16 + raw_rs * 16;
    auto s_act = [&](int slot) { return smem + slot * C::kStage; };
    auto s_raw = [&](int slot) { return smem + slot * C::kStage + C::kAct; };
    auto load_stage = [&](int step, int slot) {
        const int ng = min(2, G - 2 * step);
        uint8_t* act = s_act(slot);
#pragma unroll
        for (int i = 0; i < kActChunks; ++i)
            if (act_q[i] >= 0 && (act_q[i] >> 2) < ng) cp_async16(act + act_dst[i], act_src[i] + step * 128);
        if (raw_g < ng) cp_async16(s_raw(slot) + raw_dst, raw_src + step * 32);
    };

    // This lane's two weight rows (shared order) and their rows in the CTA's global order.
    const int rs0 = wg * 64 + warp * 16 + g, rs1 = rs0 + 8;
    const int wr0 = weight_row<kGateUp>(rs0), wr1 = weight_row<kGateUp>(rs1);
    const uint8_t* scale0 = s_scale + wr0 * G;
    const uint8_t* scale1 = s_scale + wr1 * G;

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    uint32_t frag[2][16];  // [parity][group·8 + row·4 + word], bf16x2

#pragma unroll
    for (int s = 0; s < kStages - 2; ++s) {
        if (s < steps) load_stage(s, s);
        cp_async_commit();
    }

    auto body = [&](auto parity, int step) {
        constexpr int P = decltype(parity)::value;
        cp_async_wait<kStages - 3>();
        fence_proxy_async();
        __syncthreads();  // stage `step` is in; every warpgroup is past the wgmmas of step - 2
        {
            const int next = step + kStages - 2;
            if (next < steps) load_stage(next, next % kStages);
            cp_async_commit();
        }
        const int slot = step % kStages;
        const int ng = min(2, G - 2 * step);
        dequant_step(s_raw(slot), rs0, rs1, scale0, scale1, step, ng, t, one_mul, frag[P]);
        mma_step<BT>(acc, frag[P], smem_addr(s_act(slot)), ng);
        wgmma_wait<1>();  // the previous step's group is done: its fragments and stage may be reused
#pragma unroll
        for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);
#pragma unroll
        for (int i = 0; i < 16; ++i) reg_fence(frag[P][i]);
    };
    for (int step = 0; step < steps; step += 2) {
        body(std::integral_constant<int, 0>{}, step);
        if (step + 1 < steps) body(std::integral_constant<int, 1>{}, step + 1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);
    cp_async_wait<0>();
    pdl_trigger();

    epilogue<kGateUp, BT>(a, acc, e, row0, rows, n0, wr0, wr1, t);
}

// Warp-specialized variant: a producer warp (warp 12) issues the TMA loads of each stage (the
// activation tile, 128-byte swizzled, from x in tile-row order, and the CTA's 192 weight rows'
// two MXFP4 groups) and the three consumer warpgroups only dequantize and issue wgmma, meeting the
// producer at per-stage mbarriers (full: the stage's bytes landed; empty: all three warpgroups'
// wgmmas that read it are done) instead of a CTA-wide barrier every step.
constexpr int kWsThreads = kThreads + 32;

template <int BT>
size_t ws_smem_bytes(int groups) {
    return Cfg<BT>::smem_bytes(groups) + 8 + 2 * kStages * 8;  // + the barriers (8-byte aligned)
}

template <bool kGateUp, int BT>
__global__ void __launch_bounds__(kWsThreads, BT <= 16 ? 2 : 1)
    moe_wgmma_ws_kernel(const MoeMmaArgs a, const __grid_constant__ CUtensorMap act_map,
                        const __grid_constant__ CUtensorMap raw_map) {
    using C = Cfg<BT>;
    constexpr int kAcc = BT / 2;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int K = a.k, G = K / 32, N = a.n;
    uint8_t* s_scale = smem + kStages * C::kStage;  // [kRowsW][G], the CTA's rows in global order
    uint64_t* full = reinterpret_cast<uint64_t*>(s_scale + ((kRowsW * G + 7) & ~7));
    uint64_t* empty = full + kStages;
    auto s_act = [&](int slot) { return smem + slot * C::kStage; };
    auto s_raw = [&](int slot) { return smem + slot * C::kStage + C::kAct; };

    pdl_wait();
    const TileWork w = tile_work(a, BT);
    if (w.e < 0) return;
    const int e = w.e, row0 = w.row0, rows = w.rows, n0 = w.n0;
    const int steps = (G + 1) / 2;
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kWarpgroups);
        }
        mbar_init_fence();
    }
    const bool one_mul = load_scales<kWsThreads>(a, e, n0, s_scale);  // its barrier also publishes the inits

    // Roles split here: no CTA-wide barrier may follow (the producer warp leaves early). The role
    // comes through a shuffle so the compiler knows it is warp-uniform: on `tid >= kThreads` it
    // treated the consumers' wgmmas as divergent and serialized them (ptxas C7520), as CUTLASS's
    // canonical warp-group index avoids.
    const int role = __shfl_sync(0xffffffffu, tid / 128, 0);
    if (role >= kWarpgroups) {  // the producer warp: one lane issues every copy
        if (tid == kThreads) {
            const int wy = e * N + n0;  // the CTA's first weight row
            for (int step = 0; step < steps; ++step) {
                const int slot = step % kStages;
                if (step >= kStages) mbar_wait(&empty[slot], ((step / kStages) & 1) ^ 1);
                const int ng = min(2, G - 2 * step);
                // The activation box is always whole (columns past K and rows past the tensor are
                // zero-filled and still counted).
                mbar_expect_tx(&full[slot], C::kAct + ng * kRowsW * 16);
                tma_load_2d(s_act(slot), &act_map, step * 64, row0, &full[slot]);
                for (int gi = 0; gi < ng; ++gi)
                    tma_load_2d(s_raw(slot) + gi * kRowsW * 16, &raw_map, (2 * step + gi) * 16, wy, &full[slot]);
            }
        }
        return;
    }

    const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int rs0 = wg * 64 + warp * 16 + g;
    // The stage holds the weight rows in global order: read this lane's rows where they are.
    const int wr0 = weight_row<kGateUp>(rs0), wr1 = weight_row<kGateUp>(rs0 + 8);
    const uint8_t* scale0 = s_scale + wr0 * G;
    const uint8_t* scale1 = s_scale + wr1 * G;

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    uint32_t frag[2][16];
    auto body = [&](auto parity, int step) {
        constexpr int P = decltype(parity)::value;
        const int slot = step % kStages;
        mbar_wait(&full[slot], (step / kStages) & 1);
        const int ng = min(2, G - 2 * step);
        dequant_step(s_raw(slot), wr0, wr1, scale0, scale1, step, ng, t, one_mul, frag[P]);
        mma_step<BT>(acc, frag[P], smem_addr(s_act(slot)), ng);
        wgmma_wait<1>();  // this warpgroup's wgmmas of step - 1 are done: release that stage
#pragma unroll
        for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);
#pragma unroll
        for (int i = 0; i < 16; ++i) reg_fence(frag[P][i]);
        // The stage's weights were read with ordinary loads; TMA (the async proxy) refills it next.
        if (step > 0 && (tid & 127) == 0) {
            fence_proxy_async();
            mbar_arrive(&empty[(step - 1) % kStages]);
        }
    };
    for (int step = 0; step < steps; step += 2) {
        body(std::integral_constant<int, 0>{}, step);
        if (step + 1 < steps) body(std::integral_constant<int, 1>{}, step + 1);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) reg_fence(acc[i]);
    pdl_trigger();
    epilogue<kGateUp, BT>(a, acc, e, row0, rows, n0, wr0, wr1, t);
}

// The two maps of a launch: x as [num_rows, k] bf16 in boxes of 64 × BT (128-byte swizzle), the
// weights as [E·n rows, k/32·16 bytes] in boxes of 16 bytes × kRowsW rows. False if encoding fails.
bool make_maps(const MoeMmaArgs& a, int bt, CUtensorMap* act, CUtensorMap* raw) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint32_t unit[2] = {1, 1};
    const cuuint64_t act_dims[2] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(a.num_rows)};
    const cuuint64_t act_strides[1] = {static_cast<cuuint64_t>(a.k) * 2};
    const cuuint32_t act_box[2] = {64, static_cast<cuuint32_t>(bt)};
    if (encode(act, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a.x), act_dims, act_strides, act_box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    const cuuint64_t row_bytes = static_cast<cuuint64_t>(a.k / 32) * 16;
    const cuuint64_t raw_dims[2] = {row_bytes, static_cast<cuuint64_t>(a.num_experts) * a.n};
    const cuuint64_t raw_strides[1] = {row_bytes};
    const cuuint32_t raw_box[2] = {16, kRowsW};
    return encode(raw, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(a.blocks), raw_dims, raw_strides, raw_box,
                  unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool kGateUp, int BT>
bool launch_ws(const MoeMmaArgs& a, cudaStream_t stream) {
    CUtensorMap act, raw;
    if (!make_maps(a, BT, &act, &raw)) return false;
    const dim3 grid(a.n / kRowsW, a.max_tiles);
    const size_t smem = ws_smem_bytes<BT>(a.k / 32);
    auto kernel = moe_wgmma_ws_kernel<kGateUp, BT>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kWsThreads, smem, stream>>>(a, act, raw);
    CUDA_CHECK_LAUNCH();
    return true;
}

template <bool kGateUp, int BT>
void launch(const MoeMmaArgs& a, cudaStream_t stream) {
    const dim3 grid(a.n / kRowsW, a.max_tiles);
    const size_t smem = Cfg<BT>::smem_bytes(a.k / 32);
    auto kernel = moe_wgmma_kernel<kGateUp, BT>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kThreads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

// ---- W4A8: FP8 activations, MXFP4 weights dequantized to e4m3 in registers (not yet run) ------
// The same CTA shape (3 warpgroups × 64 weight rows, BT tokens of one expert), with FP8 wgmma
// (m64nBTk32: one MXFP4 group per instruction). Design (bench/NOTES.md, session 5):
// - An e2m1 code s·e1·e0·m is the e4m3 byte s·0·0·e1·e0·m·0·0 worth value · 2^-6 (subnormal 0.5
//   included): a word of 8 codes gives two registers of 4 bytes, the low nibbles (codes 0, 2, 4, 6
//   of the word) and the high ones (1, 3, 5, 7), with two or three integer ops each.
// - The register A fragment of an 8-bit wgmma holds, per lane (g, t), rows g and g + 8 at k 4t..4t+3
//   (a0, a1) and 16 + 4t..16 + 4t + 3 (a2, a3). Lane t takes word t of its rows' group: a0/a1 its low
//   nibbles, a2/a3 its high ones. So logical k L of a group holds element 8·((L % 16) / 4) +
//   2·(L % 4) + L / 16; moe_quant_rows_fp8 writes the activations in that order.
// - Each group's product goes to a scratch accumulator (scale-d 0) and is added to the tile's with
//   the rows' group scale 2^(s - 127) (one FFMA per element per group); the activation rows' scales
//   (one per row) and the codes' 2^6 apply in the epilogue.
// - Stages of 4 groups (128 bytes of K per activation row: the 128-byte swizzle as in the bf16
//   kernel); every group waits for its wgmma (no overlap inside a warpgroup yet).
constexpr int kStages8 = 4;

template <int N>
struct Wgmma8;
template <>
struct Wgmma8<32> {
    __device__ __forceinline__ static void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
        asm volatile(
            "{\n"
            "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
            "{%16, %17, %18, %19}, %20, 0, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    }
};
template <>
struct Wgmma8<64> {
    __device__ __forceinline__ static void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
        asm volatile(
            "{\n"
            "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
            "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "{%32, %33, %34, %35}, %36, 0, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    }
};

template <int BT>
struct Cfg8 {
    static constexpr int kAct = BT * 128;       // BT rows × 128 e4m3 (one 4-group step)
    static constexpr int kRaw = kRowsW * 64;    // 4 groups × 16 bytes per weight row, [group][row]
    static constexpr int kStage = kAct + kRaw;  // a multiple of 1024
    static_assert(kStage % 1024 == 0, "stage alignment");
    static size_t smem_bytes(int groups) {
        return 1024 + static_cast<size_t>(kStages8) * kStage + static_cast<size_t>(kRowsW) * groups;
    }
};

template <bool kGateUp, int BT>
__global__ void __launch_bounds__(kThreads, 1) moe_w4a8_kernel(const MoeMmaArgs a) {
    using C = Cfg8<BT>;
    constexpr int kAcc = BT / 2;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    const int K = a.k, G = K / 32, N = a.n;
    uint8_t* s_scale = smem + kStages8 * C::kStage;  // [kRowsW][G], the CTA's rows in global order

    pdl_wait();
    const TileWork w = tile_work(a, BT);
    if (w.e < 0) return;
    const int e = w.e, row0 = w.row0, rows = w.rows, n0 = w.n0;
    const int steps = (G + 3) / 4;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    load_scales<kThreads>(a, e, n0, s_scale);  // (a barrier; any scale byte works here)

    // Activation chunk c = tid + i·kThreads: (row c / 8, 16-byte chunk c % 8) of the tile's real
    // rows; x is e4m3 [rows, K] in tile-row order (moe_quant_rows_fp8).
    constexpr int kActChunks = (BT * 8 + kThreads - 1) / kThreads;
    const uint8_t* xb = static_cast<const uint8_t*>(a.x);
    int act_q[kActChunks];
    const uint8_t* act_src[kActChunks];
    uint32_t act_dst[kActChunks];
#pragma unroll
    for (int i = 0; i < kActChunks; ++i) {
        const int c = tid + i * kThreads, r = c >> 3, q = c & 7;
        act_q[i] = -1;
        act_src[i] = xb;
        act_dst[i] = 0;
        if (c < BT * 8 && r < rows) {
            act_q[i] = q;
            act_src[i] = xb + static_cast<int64_t>(row0 + r) * K + q * 16;
            act_dst[i] = r * 128 + ((q ^ (r & 7)) << 4);
        }
    }
    // Weight chunks: c = tid + i·kThreads is (group c / kRowsW, shared row c % kRowsW).
    const uint8_t* raw_src[2];
    uint32_t raw_dst[2];
    int raw_g[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int c = tid + i * kThreads;
        raw_g[i] = c / kRowsW;
        const int rs = c % kRowsW;
        raw_src[i] = a.blocks + ((static_cast<int64_t>(e) * N + n0 + weight_row<kGateUp>(rs)) * G + raw_g[i]) * 16;
        raw_dst[i] = raw_g[i] * kRowsW * 16 + rs * 16;
    }
    auto s_act = [&](int slot) { return smem + slot * C::kStage; };
    auto s_raw = [&](int slot) { return smem + slot * C::kStage + C::kAct; };
    auto load_stage = [&](int step, int slot) {
        const int ng = min(4, G - 4 * step);
        uint8_t* act = s_act(slot);
#pragma unroll
        for (int i = 0; i < kActChunks; ++i)
            if (act_q[i] >= 0 && (act_q[i] >> 1) < ng) cp_async16(act + act_dst[i], act_src[i] + step * 128);
#pragma unroll
        for (int i = 0; i < 2; ++i)
            if (raw_g[i] < ng) cp_async16(s_raw(slot) + raw_dst[i], raw_src[i] + step * 64);
    };

    const int rs0 = wg * 64 + warp * 16 + g, rs1 = rs0 + 8;
    const int wr0 = weight_row<kGateUp>(rs0), wr1 = weight_row<kGateUp>(rs1);
    const uint8_t* scale0 = s_scale + wr0 * G;
    const uint8_t* scale1 = s_scale + wr1 * G;

    float acc[kAcc], tmp[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = tmp[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages8 - 1; ++s) {
        if (s < steps) load_stage(s, s);
        cp_async_commit();
    }
    for (int step = 0; step < steps; ++step) {
        cp_async_wait<kStages8 - 2>();
        fence_proxy_async();
        __syncthreads();  // stage `step` is in; every wgmma of step - 1 is done (waited below)
        {
            const int next = step + kStages8 - 1;
            if (next < steps) load_stage(next, next % kStages8);
            cp_async_commit();
        }
        const int slot = step % kStages8;
        const int ng = min(4, G - 4 * step);
        const uint8_t* raw = s_raw(slot);
        const uint32_t act_base = smem_addr(s_act(slot));
        for (int gi = 0; gi < ng; ++gi) {
            const uint32_t w0 = *reinterpret_cast<const uint32_t*>(raw + gi * kRowsW * 16 + rs0 * 16 + 4 * t);
            const uint32_t w1 = *reinterpret_cast<const uint32_t*>(raw + gi * kRowsW * 16 + rs1 * 16 + 4 * t);
            uint32_t af[4] = {e2m1_lo_to_e4m3(w0), e2m1_lo_to_e4m3(w1), e2m1_hi_to_e4m3(w0), e2m1_hi_to_e4m3(w1)};
#pragma unroll
            for (int i = 0; i < 4; ++i) reg_fence(af[i]);  // written before the fence, as PTX requires
            wgmma_fence();
#pragma unroll
            for (int i = 0; i < kAcc; ++i) reg_fence(tmp[i]);
            Wgmma8<BT>::mma(tmp, af, desc_sw128(act_base + gi * 32));
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int i = 0; i < kAcc; ++i) reg_fence(tmp[i]);
            // 2^(s - 127), exact for every byte (s = 0: the subnormal 2^-127; 255: inf, as e8m0_to_f32);
            // the codes' 2^-6 is undone in the epilogue.
            const int grp = 4 * step + gi;
            const uint32_t s0 = scale0[grp], s1 = scale1[grp];
            const float f0 = __uint_as_float(s0 ? s0 << 23 : 0x00400000u);
            const float f1 = __uint_as_float(s1 ? s1 << 23 : 0x00400000u);
#pragma unroll
            for (int j = 0; j < BT / 8; ++j) {
                acc[4 * j] = fmaf(f0, tmp[4 * j], acc[4 * j]);
                acc[4 * j + 1] = fmaf(f0, tmp[4 * j + 1], acc[4 * j + 1]);
                acc[4 * j + 2] = fmaf(f1, tmp[4 * j + 2], acc[4 * j + 2]);
                acc[4 * j + 3] = fmaf(f1, tmp[4 * j + 3], acc[4 * j + 3]);
            }
        }
    }
    cp_async_wait<0>();
    pdl_trigger();

    // The activation rows' scales and the codes' 2^6, then the bf16 kernel's epilogue.
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int m = 8 * j + 2 * t + u;
            const float xs = m < rows ? a.x_scale[row0 + m] * 64.0f : 0.0f;
            acc[4 * j + u] *= xs;
            acc[4 * j + 2 + u] *= xs;
        }
    epilogue<kGateUp, BT>(a, acc, e, row0, rows, n0, wr0, wr1, t);
}

template <bool kGateUp, int BT>
void launch_w4a8(const MoeMmaArgs& a, cudaStream_t stream) {
    const dim3 grid(a.n / kRowsW, a.max_tiles);
    const size_t smem = Cfg8<BT>::smem_bytes(a.k / 32);
    auto kernel = moe_w4a8_kernel<kGateUp, BT>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kThreads, smem, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

// Rows of x (bf16 [*, dim]; row i of the output is sorted[i] / experts_per_token when by_token,
// else i) as e4m3 with one scale per row (amax / 448), elements in the W4A8 kernel's order within
// each 32-element group.
constexpr int kQuantThreads = 256;
__global__ void __launch_bounds__(kQuantThreads)
    quant_rows_fp8_kernel(const __nv_bfloat16* __restrict__ x, bool by_token, const int32_t* __restrict__ sorted,
                          int experts_per_token, int dim, uint8_t* __restrict__ xq, float* __restrict__ xs) {
    __shared__ float s_max[kQuantThreads / 32];
    const int i = blockIdx.x;
    const int64_t src_row = by_token ? sorted[i] / experts_per_token : i;
    const __nv_bfloat16* src = x + src_row * dim;
    float m = 0.0f;
    for (int k = threadIdx.x; k < dim; k += kQuantThreads) m = fmaxf(m, fabsf(__bfloat162float(src[k])));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
    __syncthreads();
    m = s_max[0];
#pragma unroll
    for (int w = 1; w < kQuantThreads / 32; ++w) m = fmaxf(m, s_max[w]);
    // inv is capped: a row whose amax is below ~1.3e-36 would overflow 448 / amax (its values then
    // saturate instead of becoming inf · 0 = NaN).
    const float scale = m > 0.0f ? m / 448.0f : 1.0f;
    const float inv = m > 0.0f ? fminf(448.0f / m, 3.0e38f) : 1.0f;
    if (threadIdx.x == 0) xs[i] = scale;
    uint8_t* dst = xq + static_cast<int64_t>(i) * dim;
    for (int k = threadIdx.x; k < dim; k += kQuantThreads) {
        const int r = k & 31;
        const int pos = (k - r) + (r & 1) * 16 + (r >> 3) * 4 + ((r & 7) >> 1);
        __nv_fp8_e4m3 q(__bfloat162float(src[k]) * inv);  // round to nearest, saturating to ±448
        dst[pos] = q.__x;
    }
}

}  // namespace

bool moe_wgmma_supported(int n, int k, int num_experts) {
    return n > 0 && n % kRowsW == 0 && k % 32 == 0 && k / 32 <= kMaxGroups && num_experts >= 1 &&
           num_experts <= kMaxMoeMmaExperts;
}

int moe_wgmma_block_tokens(int assignments, int num_experts) {
    if (assignments >= 96 * num_experts) return 128;
    if (assignments > 32 * num_experts) return 64;
    return assignments > 16 * num_experts ? 32 : 16;  // decode-sized batches: a few rows per expert
}

void moe_wgmma(const MoeMmaArgs& a, bool gate_up, int block_tokens, cudaStream_t stream, bool warp_specialized) {
    ENGINE_CHECK(moe_wgmma_supported(a.n, a.k, a.num_experts), "moe_wgmma: n %d, k %d, %d experts unsupported", a.n,
                 a.k, a.num_experts);
    ENGINE_CHECK(block_tokens == 16 || block_tokens == 32 || block_tokens == 64 || block_tokens == 128,
                 "moe_wgmma: %d tokens a tile", block_tokens);
    ENGINE_CHECK(!warp_specialized || (!a.x_by_token && a.num_rows > 0),
                 "moe_wgmma: the warp-specialized kernel reads x in tile-row order (num_rows %d)", a.num_rows);
    if (a.max_tiles <= 0) return;
    // Warp-specialized: falls back to the other kernel (same arguments) if the tensor maps cannot be
    // made (no driver entry point).
    // Both kernels come in four tile heights; the warp-specialized one falls back to the other
    // (same tiles) if its tensor maps cannot be made (no driver entry point).
    auto run = [&](auto bt) {
        constexpr int BT = decltype(bt)::value;
        if (warp_specialized && (gate_up ? launch_ws<true, BT>(a, stream) : launch_ws<false, BT>(a, stream))) return;
        if (gate_up)
            launch<true, BT>(a, stream);
        else
            launch<false, BT>(a, stream);
    };
    switch (block_tokens) {
        case 16: run(std::integral_constant<int, 16>{}); break;
        case 32: run(std::integral_constant<int, 32>{}); break;
        case 64: run(std::integral_constant<int, 64>{}); break;
        default: run(std::integral_constant<int, 128>{});
    }
}

void moe_quant_rows_fp8(const void* x, bool by_token, const int32_t* sorted, int experts_per_token, int rows, int dim,
                        uint8_t* xq, float* xs, cudaStream_t stream) {
    ENGINE_CHECK(dim % 32 == 0 && rows >= 0, "moe_quant_rows_fp8: dim %d", dim);
    if (rows == 0) return;
    quant_rows_fp8_kernel<<<rows, kQuantThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), by_token, sorted,
                                                              experts_per_token, dim, xq, xs);
    CUDA_CHECK_LAUNCH();
}

void moe_w4a8(const MoeMmaArgs& a, bool gate_up, int block_tokens, cudaStream_t stream) {
    ENGINE_CHECK(moe_wgmma_supported(a.n, a.k, a.num_experts) && !a.x_by_token && a.x_scale != nullptr,
                 "moe_w4a8: n %d, k %d, %d experts unsupported, or x not quantized rows", a.n, a.k, a.num_experts);
    ENGINE_CHECK(block_tokens == 32 || block_tokens == 64, "moe_w4a8: %d tokens a tile", block_tokens);
    if (a.max_tiles <= 0) return;
    if (block_tokens == 32)
        gate_up ? launch_w4a8<true, 32>(a, stream) : launch_w4a8<false, 32>(a, stream);
    else
        gate_up ? launch_w4a8<true, 64>(a, stream) : launch_w4a8<false, 64>(a, stream);
}

}  // namespace gptoss::kernels::cuda
