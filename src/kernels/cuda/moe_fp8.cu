// Grouped MoE GEMMs with FP8 weights and FP8 activations on Hopper's warpgroup tensor cores
// (kernels/cuda/moe.h moe_fp8; sm_90a): prefill-sized batches of a model whose experts are held as
// e4m3 with 128×128 block scales (CudaModelOptions::fp8 with the FP8 expert copy, as the published
// H200 account serves gpt-oss). Design (bench/NOTES.md r23):
//
// - D[feature, token] = W[feature, :] · X[token, :] with both operands read by the tensor cores from
//   shared memory (wgmma m64n128k32 e4m3 × e4m3, fp32 accumulation): no dequantization at all.
// - A CTA: W consumer warpgroups × 64 features (W = 2: 128 features, one weight-scale block row;
//   W = 3: 192, where each warpgroup's 64 rows still lie in one scale block) × 128 tokens of one
//   expert (a tile of moe_mma_tiles' list, rows in tile-row order). K advances 128 at a time, one
//   weight-scale block: a stage is the weight tile [64·W features × 128 bytes] and the activation
//   tile [128 tokens × 128 bytes], both 128-byte swizzled K-major boxes brought by one producer
//   lane's TMA (per-stage full/empty mbarriers; 6 stages for W = 2, 5 for W = 3). W = 3 is the
//   default (r23: 620 against 511 TFLOP/s).
// - FP8 wgmma accumulates with limited precision (~14 bits, r22), so each 128-K block goes to a
//   scratch accumulator (scale-d 0 on its first k32 step) that is added to the tile's in fp32 times
//   the block's weight scale (DeepGEMM's promotion); a warpgroup's promotion overlaps the other
//   warpgroups' tensor work. The activation rows' scales (one per row, moe_fp8_quant_rows) apply in the
//   epilogue, with the bias.
// - K not a multiple of 128 (2880 = 22.5 blocks): the activation box past K is zero-filled by TMA
//   and the weights' padding columns are zeros (Fp8Weight's k_pad). Tiles past an expert's rows or
//   features (down: 2880 = 22.5 feature blocks) compute on neighbouring rows and are not stored.
// - Epilogues: gate_up rows are (gate j, up j) pairs, 2j and 2j + 1: lanes g and g ^ 1 (lane ^ 4)
//   hold them, so one shuffle pairs them for the clamped SwiGLU, written as e4m3 act rows with one
//   scale (act_q; the model's path) or as bf16; down writes fp32 rows of y at the assignment's
//   index (as the other grouped kernels).
// - Also here, compiled only (session 8): a persistent variant of the kernel and the same
//   structure on bf16 experts (moe_bf16_grouped).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_common.cuh"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kTokens = kMoeFp8BlockTokens;  // tokens per CTA (wgmma N)
constexpr int kKBlock = 128;                 // K per stage (bytes of e4m3)
constexpr int kXTile = kTokens * kKBlock;    // 16 KB
constexpr int kMaxKBlocks = 64;              // k ≤ 8,192

constexpr int kConsumerRegsW3 = 152, kProducerRegsW3 = 40;  // setmaxnreg for W = 3 (Shape below)

// The CTA shape for W consumer warpgroups.
template <int W>
struct Shape {
    static constexpr int kFeatures = 64 * W;  // features per CTA
    // + the producer: a warp for W = 2; a whole warpgroup for W = 3, so that it can hand registers
    // to the consumers (setmaxnreg works per warpgroup): 512 threads start at 128 registers each,
    // too few for the 128 accumulators (ptxas spilled), then the producer drops to 40 and the
    // consumers rise to 152.
    static constexpr int kThreads = 128 * W + (W == 2 ? 32 : 128);
    static constexpr int kStages = W == 2 ? 6 : 5;
    static constexpr int kWTile = kFeatures * kKBlock;
    static constexpr int kStageBytes = kWTile + kXTile;  // a multiple of 1024: every tile 1 KB-aligned
    static_assert(kStageBytes % 1024 == 0, "stage alignment");
    // + the weight scales of the (at most 2) scale blocks the CTA's features touch, + barriers (full,
    // empty), + the epilogue's row inputs (EpilogueRows: 2 buffers a consumer warpgroup).
    static constexpr size_t kRowsOffset =
        (static_cast<size_t>(kStages) * kStageBytes + 2 * kMaxKBlocks * 4 + 2 * kStages * 8 + 15) / 16 * 16;
    static_assert(kRowsOffset % 16 == 0, "row inputs alignment");
    static constexpr size_t kSmemBytes = 1024 + kRowsOffset + static_cast<size_t>(W) * 2 * kTokens * 8;
};

// A persistent kernel's work item it: tile it / nblk of the tile list (an expert's rows row0 ..
// row0 + rows) × feature block it % nblk (features n0 ..), feature blocks fastest.
struct WorkItem {
    int e, row0, rows, n0;
};
__device__ __forceinline__ WorkItem work_item(const MoeFp8Args& a, int it, int nblk, int features) {
    const int tile = it / nblk;
    const int e = a.tiles[2 * tile], rt = a.tiles[2 * tile + 1];
    const int row0 = a.expert_offsets[e] + rt * kTokens;
    return WorkItem{e, row0, min(kTokens, a.expert_offsets[e + 1] - row0), (it % nblk) * features};
}

// The persistent kernels' activation maps, one a tile width (item_width: 8, 16, 32, 64, 96, 128):
// an item of width N loads only its N rows a K block (box N rows × 128 bytes), where a 128-row box
// brought 128 − N unused rows (r48: 120b's third tiles an expert are mostly 32 wide: 12 of a stage's
// 40 KB). A box of N rows fills the first N rows of the stage's x tile, in the same 1 KB swizzle
// atoms as a 128-row box, which is all an m64nN wgmma reads. GPTOSS_MOE_NARROW_X=0: all six are
// 128-row maps (the old loads; A/B). Measured (r48 call 6, 120b --fp8-experts 8k): MoE stage
// 76.30 -> 75.55 ms, about the spread between repeats; kept as the bytes it saves are certain.
struct XMaps {
    CUtensorMap m[6];
    int rows[6];  // m[i]'s box rows (the bytes its load brings: rows · 128)
};
__device__ __forceinline__ int x_map_index(int width) {
    switch (width) {
        case 8: return 0;
        case 16: return 1;
        case 32: return 2;
        case 64: return 3;
        case 96: return 4;
        default: return 5;
    }
}
constexpr int kXMapRows[6] = {8, 16, 32, 64, 96, 128};

// The epilogue's per-row inputs of an item in shared memory: the activation rows' scales (0 past the
// item's rows) and, for down, the assignment each row's result goes to. Before r27 every lane loaded
// its 32 rows' scales from global memory in the epilogue, with all three warpgroups (so the tensor
// cores) waiting: those loads were 19% of the gate_up kernel's stall samples (ncu source page).
// Each consumer thread loads one row's inputs before the K loop and stores them after it.
struct RowInputs {
    float xs = 0.0f;
    int assignment = 0;
};
__device__ __forceinline__ RowInputs load_row_inputs(const MoeFp8Args& a, bool gate_up, int row0, int rows, int q) {
    RowInputs r;
    if (q < rows) {
        r.xs = a.x_scale != nullptr ? __ldg(a.x_scale + row0 + q) : a.x_scale_value;
        if (!gate_up) r.assignment = __ldg(a.sorted_assignments + row0 + q);
    }
    return r;
}
// This lane's two features' biases (f0 = n0 + 64·wg + 16·warp + g and f0 + 8; 0 past n).
__device__ __forceinline__ float2 load_bias_pair(const MoeFp8Args& a, int e, int n0, int wg, int warp, int g) {
    const int N = a.n, f0 = n0 + wg * 64 + warp * 16 + g, f1 = f0 + 8;
    const float* bias = a.bias + static_cast<int64_t>(e) * N;
    return make_float2(f0 < N ? __ldg(bias + f0) : 0.0f, f1 < N ? __ldg(bias + f1) : 0.0f);
}
// Named barrier `id` (1..15) over `threads` threads (a warpgroup: 128).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The 64 fp32 accumulators of an m64n128 wgmma as asm operands %0..%63 (shared by the two wrappers).
#define GPTOSS_ACC64_REGS                                                                                        \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "  \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define GPTOSS_ACC64_OPERANDS                                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// m64n128k32, e4m3 × e4m3 → f32, both operands from shared memory; scale_d = 0 overwrites d.
__device__ __forceinline__ void wgmma_e4m3_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " GPTOSS_ACC64_REGS "%64, %65, p, 1, 1;\n}\n"
        : GPTOSS_ACC64_OPERANDS
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// m64n128k32 e4m3 × e4m3 → f32 with A (4 registers of 4 e4m3 bytes) from registers, B by
// descriptor; scale_d = 0 overwrites d.
__device__ __forceinline__ void wgmma_e4m3_n128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " GPTOSS_ACC64_REGS
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : GPTOSS_ACC64_OPERANDS
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// m64nNk32 e4m3 × e4m3 → f32 for N = 8, 16, 32, 64, 96 (the narrow tail tiles, MoeFp8Args::narrow_min):
// both operands from shared memory (ss) or A from registers (rs, as wgmma_e4m3_n128_rs). d[N / 2]
// has the m64n128 fragment's layout cut at N tokens (d[4j + ..]: tokens 8j .. 8j + 7). N = 128: the
// n128 wrappers.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <int N>
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<8>(float (&d)[4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3}, "
        "%4, %5, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_rs<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_ss<16>(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "%8, %9, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_rs<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_ss<32>(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_rs<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b,
                                                  int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_rs<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                  int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<96>(float (&d)[48], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47}, "
        "%48, %49, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3_rs<96>(float (&d)[48], const uint32_t (&a)[4], uint64_t desc_b,
                                                  int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47}, "
        "{%48, %49, %50, %51}, %52, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void wgmma_e4m3_ss<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    wgmma_e4m3_n128(d, desc_a, desc_b, scale_d);
}
template <>
__device__ __forceinline__ void wgmma_e4m3_rs<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int scale_d) {
    wgmma_e4m3_n128_rs(d, a, desc_b, scale_d);
}

// The stage ring's barriers, initialised by thread 0: full[s] completes on the producer's
// expect_tx and the stage's bytes, empty[s] on one arrival from each of the W consumer warpgroups.
template <int kStages, int W>
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], W);
        }
        mbar_init_fence();
    }
}

// The producer lane's loads of one work item: K blocks 0 .. nkb − 1 (`step` elements of K each) of
// the weight rows from wy and the activation rows from row0, into the ring from its position gkb
// (K blocks issued before); returns the position after. A slot is refilled once the consumers
// released its previous use. Boxes are always whole (zero-filled past the tensor) and count in full.
// w_step: the weight map's x advance a block where it differs from step (0: step; MXFP4: bytes).
// x_rows: the rows of x_map's box (kTokens, or an item's width with the narrow maps, XMaps).
template <int kStages, int kStageBytes, int kWTile>
__device__ __forceinline__ int produce_item(uint8_t* smem, uint64_t* full, uint64_t* empty, const CUtensorMap* w_map,
                                            const CUtensorMap* x_map, int wy, int row0, int nkb, int step, int gkb,
                                            int w_step = 0, int x_rows = kTokens) {
    if (w_step == 0) w_step = step;
    const uint32_t bytes = kStageBytes - (kTokens - x_rows) * kKBlock;
    for (int kb = 0; kb < nkb; ++kb, ++gkb) {
        const int slot = gkb % kStages;
        if (gkb >= kStages) mbar_wait(&empty[slot], ((gkb / kStages) & 1) ^ 1);
        mbar_expect_tx(&full[slot], bytes);
        tma_load_2d(smem + slot * kStageBytes, w_map, kb * w_step, wy, &full[slot]);
        tma_load_2d(smem + slot * kStageBytes + kWTile, x_map, kb * step, row0, &full[slot]);
    }
    return gkb;
}

// The epilogue of one work item (tile rows row0 .. row0 + rows of expert e × features n0 ..),
// from this lane's accumulators: gate_up's SwiGLU into act (bf16) or act_q (e4m3), down's rows of
// y. Shared by both kernels below.
// s_xs / s_asg: the item's RowInputs in shared memory (kTokens each); bias: load_bias_pair's.
// kMx: act_q rows in the MX K order (MoeFp8Args::act_mx_order, act_q_stride bytes a row).
template <bool kGateUp, bool kMx = false>
__device__ __forceinline__ void fp8_epilogue(const MoeFp8Args& a, const float (&acc)[64], int row0, int rows, int n0,
                                             int wg, int warp, int g, int t, float2 bias, const float* s_xs,
                                             const int* s_asg) {
    const int N = a.n;
    // acc[4j + 2h + u]: feature f_h = n0 + 64·wg + 16·warp + g + 8h, token 8j + 2t + u of the tile.
    const int f0 = n0 + wg * 64 + warp * 16 + g, f1 = f0 + 8;
    const float b0 = bias.x, b1 = bias.y;
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) {
        const float2 xs2 = *reinterpret_cast<const float2*>(s_xs + 8 * j + 2 * t);  // rows 8j + 2t, + 1
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int m = 8 * j + 2 * t + u;
            const float xs = u == 0 ? xs2.x : xs2.y;
            const float v0 = fmaf(acc[4 * j + u], xs, b0), v1 = fmaf(acc[4 * j + 2 + u], xs, b1);
            if constexpr (kGateUp) {
                // Even g holds gates 2i (f0) and 2i + 8 (f1); its partner g + 1 the ups f0 + 1, f1 + 1.
                // The even lane finishes pair f0 / 2, the odd one pair (f1 - 1) / 2.
                const bool odd = g & 1;
                const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
                const float gate = odd ? other : v0, up = odd ? v1 : other;
                const int jf = odd ? (f1 - 1) / 2 : f0 / 2;
                if (m < rows && 2 * jf < N) {
                    const float v = swiglu(gate, up, a.swiglu_limit, a.swiglu_alpha);
                    const int64_t o = kMx ? static_cast<int64_t>(row0 + m) * a.act_q_stride + moe_mx_k_position(jf)
                                          : static_cast<int64_t>(row0 + m) * (N / 2) + jf;
                    if (a.act_q != nullptr)  // e4m3 for the down launch, one scale for all rows
                        a.act_q[o] = __nv_cvt_float_to_fp8(v * a.act_q_inv_scale, __NV_SATFINITE, __NV_E4M3);
                    else
                        static_cast<__nv_bfloat16*>(a.act)[o] = __float2bfloat16(v);
                }
            } else {
                if (a.y_bf16) {
                    // Feature pairs as bf16x2, as gate_up pairs (gate, up): the even-g lane writes
                    // (f0, f0 + 1), its odd partner (f1 - 1, f1); a store covers 32 bytes of a row.
                    // n % 16 == 0: a 16-feature block is wholly in or out.
                    const bool odd = g & 1;
                    const float other = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
                    if (m < rows && f0 < N) {
                        const int64_t r = static_cast<int64_t>(s_asg[m]) * N;
                        __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(a.y) + r + (odd ? f1 - 1 : f0);
                        *reinterpret_cast<uint32_t*>(dst) = odd ? pack_bf16x2(other, v1) : pack_bf16x2(v0, other);
                    }
                } else if (m < rows) {
                    const int64_t r = static_cast<int64_t>(s_asg[m]) * N;
                    if (f0 < N) a.y[r + f0] = v0;
                    if (f1 < N) a.y[r + f1] = v1;
                }
            }
        }
    }
}

template <bool kGateUp, int W>
__global__ void __launch_bounds__(Shape<W>::kThreads, 1)
    moe_fp8_kernel(const MoeFp8Args a, const __grid_constant__ CUtensorMap x_map,
                   const __grid_constant__ CUtensorMap w_map) {
    using S = Shape<W>;
    constexpr int kFeatures = S::kFeatures, kThreads = S::kThreads, kStages = S::kStages;
    constexpr int kWTile = S::kWTile, kStageBytes = S::kStageBytes;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    // [2][k blocks]: the weight scales of scale blocks n0 / 128 and n0 / 128 + 1
    float* s_wscale = reinterpret_cast<float*>(smem + kStages * kStageBytes);
    uint64_t* full = reinterpret_cast<uint64_t*>(s_wscale + 2 * kMaxKBlocks);
    uint64_t* empty = full + kStages;
    float* s_xs = reinterpret_cast<float*>(smem + S::kRowsOffset);  // the item's RowInputs
    int* s_asg = reinterpret_cast<int*>(s_xs + kTokens);
    auto s_w = [&](int slot) { return smem + slot * kStageBytes; };
    auto s_x = [&](int slot) { return smem + slot * kStageBytes + kWTile; };

    pdl_wait();
    const int tile = blockIdx.y;
    if (tile >= *a.tile_count) return;
    const int e = a.tiles[2 * tile], rt = a.tiles[2 * tile + 1];
    const int row0 = a.expert_offsets[e] + rt * kTokens;
    const int rows = min(kTokens, a.expert_offsets[e + 1] - row0);
    const int n0 = blockIdx.x * kFeatures;
    const int N = a.n, nkb = (a.k + kKBlock - 1) / kKBlock;
    const int tid = threadIdx.x;
    init_ring<kStages, W>(full, empty);
    {  // the weight scales of the scale blocks this CTA's features touch, one per K block
        const int nb = (N + kKBlock - 1) / kKBlock, kbp = a.k_pad / kKBlock, b0 = n0 / kKBlock;
        const float* ws = a.w_scale + static_cast<int64_t>(e) * nb * kbp;
        for (int i = tid; i < 2 * nkb; i += kThreads) {
            const int b = b0 + i / nkb;
            s_wscale[(i / nkb) * kMaxKBlocks + i % nkb] = b < nb ? ws[static_cast<int64_t>(b) * kbp + i % nkb] : 0.0f;
        }
    }
    if (tid < kTokens) {
        const RowInputs r = load_row_inputs(a, kGateUp, row0, rows, tid);
        s_xs[tid] = r.xs;
        s_asg[tid] = r.assignment;
    }
    __syncthreads();  // barriers initialised, scales and row inputs in; no CTA-wide barrier after the role split

    // The role through a shuffle: warp-uniform for the compiler (no serialized wgmma, ptxas C7520).
    const int role = __shfl_sync(0xffffffffu, tid / 128, 0);
    if (role >= W) {  // the producer: one lane issues every copy
        if constexpr (W == 3) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegsW3));
        if (tid == 128 * W) {
            // the CTA's first weight row in [E·n, k_pad]
            produce_item<kStages, kStageBytes, kWTile>(smem, full, empty, &w_map, &x_map, e * N + n0, row0, nkb,
                                                       kKBlock, 0);
        }
        return;
    }

    if constexpr (W == 3) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegsW3));
    const int wg = role, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    // This warpgroup's 64 rows lie in one scale block (n0 and 64·wg are multiples of 64).
    const float* wscale = s_wscale + ((n0 + 64 * wg) / kKBlock - n0 / kKBlock) * kMaxKBlocks;
    const float2 bias = load_bias_pair(a, e, n0, wg, warp, g);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    const uint32_t w_base = smem_addr(s_w(0)) + wg * 64 * kKBlock;  // this warpgroup's 64 weight rows
    const uint32_t x_base = smem_addr(s_x(0));
    // K block kb's four k32 wgmmas into d (scale-d 0 on the first), once its stage has landed.
    auto issue = [&](float(&d)[64], int kb) {
        const int slot = kb % kStages;
        mbar_wait(&full[slot], (kb / kStages) & 1);
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(d[i]);
#pragma unroll
        for (int kk = 0; kk < kKBlock / 32; ++kk)
            wgmma_e4m3_n128(d, desc_sw128(w_base + slot * kStageBytes + kk * 32),
                            desc_sw128(x_base + slot * kStageBytes + kk * 32), kk);
        wgmma_commit();
    };
    // After K block kb's group completed: free its stage, add its sums times the block's scale.
    auto promote = [&](float(&d)[64], int kb) {
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(d[i]);
        if ((tid & 127) == 0) mbar_arrive(&empty[kb % kStages]);  // this warpgroup's reads are done
        const float ws = wscale[kb];
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = fmaf(ws, d[i], acc[i]);
    };
    // One K block in flight a warpgroup: promoting block kb while block kb + 1's wgmmas run would
    // need 192 accumulator registers, and ptxas then serializes the wgmmas anyway (C7514: the
    // promotion reads accumulators of a wgmma group between issue and wait). The other warpgroups'
    // wgmmas fill the tensor pipe meanwhile.
    {
        float tmp[64];
        for (int kb = 0; kb < nkb; ++kb) {
            issue(tmp, kb);
            wgmma_wait<0>();
            promote(tmp, kb);
        }
    }
    pdl_trigger();

    fp8_epilogue<kGateUp>(a, acc, row0, rows, n0, wg, warp, g, t, bias, s_xs, s_asg);
}

// The wgmma width for an item of `rows` tile rows: the smallest of 8, 16, 32, 64, 96 and 128 tokens
// that holds them, not below MoeFp8Args::narrow_min (0: always 128). An expert's last tile is partial (120b at
// 8k tokens: ~256 ± 16 rows an expert, so half the experts' third tile has a few rows in 128); its
// narrower wgmmas do that much less tensor work (the stage's loads are the same). Decode batches
// (an expert's few rows) take 8 or 16.
__device__ __forceinline__ int item_width(const MoeFp8Args& a, int rows) {
    if (a.narrow_min <= 0) return 128;
    if (rows <= 8 && a.narrow_min <= 8) return 8;
    if (rows <= 16 && a.narrow_min <= 16) return 16;
    return min(128, max((rows + 31) / 32 * 32, (a.narrow_min + 31) / 32 * 32));
}
// Calls f(std::integral_constant<int, N>) for the item width n (item_width's).
template <typename F>
__device__ __forceinline__ void with_width(int n, const F& f) {
    switch (n) {
        case 8: f(std::integral_constant<int, 8>{}); break;
        case 16: f(std::integral_constant<int, 16>{}); break;
        case 32: f(std::integral_constant<int, 32>{}); break;
        case 64: f(std::integral_constant<int, 64>{}); break;
        case 96: f(std::integral_constant<int, 96>{}); break;
        default: f(std::integral_constant<int, 128>{}); break;
    }
}

// A consumer's position in the stage ring across items: the slot and the phase parity its full
// barrier completes next (the producer's K block gkb is slot gkb % kStages, parity (gkb / kStages)
// & 1). Kept as two counters rather than derived from gkb: the divisions by kStages (7 or 5) cost
// ~8 instructions a K block in the consumers' loops (r43 ncu of the MX kernel).
template <int kStages>
struct RingPos {
    int slot = 0;
    uint32_t phase = 0;
    __device__ __forceinline__ void next() {
        if (++slot == kStages) {
            slot = 0;
            phase ^= 1u;
        }
    }
};

// One work item's K loop in a consumer warpgroup of the persistent kernels: K block kb's four k32
// wgmmas (kN tokens wide, item_width) into tmp once its stage (running index gkb) has landed, the
// stage released, its sums added to acc times the block's weight scale (DeepGEMM's promotion); acc
// past kN tokens stays 0. One K block in flight a warpgroup: promoting block kb while kb + 1's
// wgmmas run would need 192 accumulator registers, and ptxas then serializes the wgmmas anyway
// (C7514); the other warpgroups' wgmmas fill the tensor pipe meanwhile.
// Descriptors: the tiles' slot-0 descriptors plus the slot's and the k32 step's offset in 16-byte
// units (addresses stay below 2^18, so the sum never leaves the descriptor's address field).
template <int kN, int kStages, int kStageBytes, typename Release>
__device__ __forceinline__ void consume_item(float (&acc)[64], uint64_t* full, uint32_t w_base, uint32_t x_base,
                                             const float* wscale, int nkb, RingPos<kStages>& pos,
                                             const Release& release) {
    const uint64_t w_desc0 = desc_sw128(w_base), x_desc0 = desc_sw128(x_base);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // The block's weight scale, loaded one K block ahead (r27 ncu: the load right before its use
    // stalled each block on memory latency).
    float ws_next = __ldg(wscale);
    // The block's sums, declared here: the wgmmas' "+f" operands read them, so a tmp outside the
    // item would be live across items and its registers held through narrower items (ptxas then
    // serialized the wgmmas, C7511).
    float tmp[kN / 2];
    for (int kb = 0; kb < nkb; ++kb, pos.next()) {
        const float ws = ws_next;
        ws_next = __ldg(wscale + min(kb + 1, nkb - 1));
        const int slot = pos.slot;
        mbar_wait(&full[slot], pos.phase);
        const uint64_t off = static_cast<uint64_t>(slot * (kStageBytes >> 4));
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) reg_fence(tmp[i]);
#pragma unroll
        for (int kk = 0; kk < kKBlock / 32; ++kk)
            wgmma_e4m3_ss<kN>(tmp, w_desc0 + off + 2 * kk, x_desc0 + off + 2 * kk, kk);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) reg_fence(tmp[i]);
        release(slot);
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) acc[i] = fmaf(ws, tmp[i], acc[i]);
    }
}

// The persistent variant (MoeFp8Args::persistent; session 8, compiled only): one CTA an SM takes
// work items (tile, feature block) blockIdx.x, + gridDim.x, ...; its producer fills the next
// item's first stages while the consumers run the previous item's epilogue, the stage ring running
// on across items. The weight scales come through the cache, each loaded before its K block's
// wgmmas are issued (the shared-memory copy would have to be double-buffered across items).
template <bool kGateUp, int W>
__global__ void __launch_bounds__(Shape<W>::kThreads, 1)
    moe_fp8_persistent_kernel(const MoeFp8Args a, const __grid_constant__ XMaps x_maps,
                              const __grid_constant__ CUtensorMap w_map) {
    using S = Shape<W>;
    constexpr int kFeatures = S::kFeatures, kStages = S::kStages;
    constexpr int kWTile = S::kWTile, kStageBytes = S::kStageBytes;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes + 2 * kMaxKBlocks * 4);
    uint64_t* empty = full + kStages;
    // [W][2][kTokens] scales then [W][2][kTokens] assignments: a warpgroup's RowInputs, buffer by
    // the parity of its item count.
    float* s_xs_all = reinterpret_cast<float*>(smem + S::kRowsOffset);
    int* s_asg_all = reinterpret_cast<int*>(s_xs_all + W * 2 * kTokens);
    auto s_w = [&](int slot) { return smem + slot * kStageBytes; };
    auto s_x = [&](int slot) { return smem + slot * kStageBytes + kWTile; };

    pdl_wait();
    // Items in the one-CTA-an-item kernel's order: feature blocks fastest.
    const int nblk = (a.n + kFeatures - 1) / kFeatures;
    const int items = *a.tile_count * nblk;
    if (static_cast<int>(blockIdx.x) >= items) return;
    const int N = a.n, nkb = (a.k + kKBlock - 1) / kKBlock;
    const int tid = threadIdx.x;
    init_ring<kStages, W>(full, empty);
    __syncthreads();  // barriers initialised; no CTA-wide barrier after the role split
    auto item_at = [&](int it) { return work_item(a, it, nblk, kFeatures); };

    const int role = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform (ptxas C7520)
    if (role >= W) {                                          // the producer: one lane issues every copy
        if constexpr (W == 3) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegsW3));
        if (tid == 128 * W) {
            int gkb = 0;  // K blocks issued so far (all items)
            for (int it = blockIdx.x; it < items; it += gridDim.x) {
                const WorkItem w = item_at(it);
                const int xi = x_map_index(item_width(a, w.rows));
                gkb =
                    produce_item<kStages, kStageBytes, kWTile>(smem, full, empty, &w_map, &x_maps.m[xi], w.e * N + w.n0,
                                                               w.row0, nkb, kKBlock, gkb, 0, x_maps.rows[xi]);
            }
        }
        return;
    }

    if constexpr (W == 3) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegsW3));
    const int wg = role, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int nbs = (N + kKBlock - 1) / kKBlock, kbp = a.k_pad / kKBlock;  // weight-scale blocks
    const uint32_t w_base = smem_addr(s_w(0)) + wg * 64 * kKBlock;
    const uint32_t x_base = smem_addr(s_x(0));
    float acc[64];
    RingPos<kStages> pos;
    int parity = 0;
    for (int it = blockIdx.x; it < items; it += gridDim.x, parity ^= 1) {
        const WorkItem w = item_at(it);
        // The epilogue's inputs, loaded now and landing under the K loop: this thread's row of the
        // item (RowInputs) and this lane's biases.
        const RowInputs row = load_row_inputs(a, kGateUp, w.row0, w.rows, tid & 127);
        const float2 bias = load_bias_pair(a, w.e, w.n0, wg, warp, g);
        // A warpgroup past the last feature (n not a multiple of 64·W) reads block nbs − 1's scales:
        // its rows are never stored, but the read must stay inside w_scale.
        const int sb = min((w.n0 + 64 * wg) / kKBlock, nbs - 1);
        const float* wscale = a.w_scale + (static_cast<int64_t>(w.e) * nbs + sb) * static_cast<int64_t>(kbp);
        with_width(item_width(a, w.rows), [&](auto width) {
            consume_item<decltype(width)::value, kStages, kStageBytes>(
                acc, full, w_base, x_base, wscale, nkb, pos, [&](int slot) {
                    if ((tid & 127) == 0) mbar_arrive(&empty[slot]);  // this warpgroup's reads are done
                });
        });
        // Buffer `parity` was last read in the epilogue two items ago, which every warp of this
        // warpgroup finished before the barrier of the item in between.
        float* s_xs = s_xs_all + (wg * 2 + parity) * kTokens;
        int* s_asg = s_asg_all + (wg * 2 + parity) * kTokens;
        s_xs[tid & 127] = row.xs;
        s_asg[tid & 127] = row.assignment;
        named_barrier_sync(1 + wg, 128);
        if (it + static_cast<int>(gridDim.x) >= items) pdl_trigger();
        fp8_epilogue<kGateUp>(a, acc, w.row0, w.rows, w.n0, wg, warp, g, t, bias, s_xs, s_asg);
    }
}

// ---- The MXFP4 experts as they are (moe_mxfp4_fp8; session 12, compiled only) -------------------
// Why: without an FP8 copy of the experts (120b: it would not fit beside MXFP4) each prefill layer
// converted its active experts to FP8 first (r27: ~36–42 of the 120b 8k MoE's 142 ms) and the
// grouped GEMMs then read 3.2 GB of e4m3 a layer. Here the persistent kernel's structure (3
// consumer warpgroups × 64 features, 128 tokens of one expert, a producer warpgroup, the same items,
// epilogue and promotion) takes the codes themselves: a stage is 192 rows × 64 bytes of codes (12
// KB) + the 128 × 128 activation tile, so 7 stages.
// - wgmma with A from registers: lane (g, t) of warp w holds rows 16w + g and + 8 at k 4t .. 4t + 3
//   (a0, a1) and 16 + 4t .. (a2, a3) of each k32 step. In the MX K order (moe_mx_k_position) those
//   are the codes 32t .. 32t + 31 of the block: bytes 16t .. 16t + 15 of the row, one 16-byte shared
//   load a row and block, and one MXFP4 group (4·kb + t) a lane and row.
// - Scales: a group 2^d below the row's largest in the block (a quad max) is folded into the e4m3
//   values (the 8 magnitudes × 2^-d by one byte permute from a table per d: exact for d ≤ 8, e4m3's
//   subnormals reach 2^-9; rounded past that); the block's sums of a row are promoted with its
//   2^(max − 127), two per lane (rows g and g + 8), as the FP8 kernel's block scale.
constexpr int kMxStages = 7;
constexpr int kMxFeatures = 192;                            // 3 warpgroups × 64 rows
constexpr int kMxWTile = kMxFeatures * kKBlock / 2;         // 12 KB of codes
constexpr int kMxStageBytes = kMxWTile + kXTile;            // 28 KB
constexpr int kMxThreads = 512;                             // + the producer warpgroup
constexpr int kMxConsumerRegs = 160, kMxProducerRegs = 24;  // 3·128·160 + 128·24 ≤ 64 K
constexpr size_t kMxBarOffset = static_cast<size_t>(kMxStages) * kMxStageBytes;
constexpr size_t kMxLutOffset = kMxBarOffset + 2 * kMxStages * 8;  // [32] uint2: the magnitudes at d
constexpr size_t kMxRowsOffset = kMxLutOffset + 32 * 8;            // RowInputs: [3][2][kTokens] × 2
constexpr size_t kMxSmemBytes = 1024 + kMxRowsOffset + 3 * 2 * kTokens * 8;
static_assert(kMxStageBytes % 1024 == 0 && kMxWTile % 1024 == 0, "stage alignment (128-byte swizzled x tile)");
static_assert(kMxRowsOffset % 16 == 0, "row inputs alignment");

// Four e2m1 codes (16 bits, the first in the low nibble) as four e4m3 bytes: the magnitudes' bytes
// from lut (8 bytes: the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 at this lane's shift) by one byte
// permute, and the codes' signs by another.
__device__ __forceinline__ uint32_t mx_codes_to_e4m3(uint32_t codes, uint2 lut) {
    const uint32_t mag = __byte_perm(lut.x, lut.y, codes & 0x7777u);
    const uint32_t sgn = __byte_perm(0u, 0x80808080u, (codes >> 1) & 0x4444u);
    return mag | sgn;
}
// 2^(e − 127) for an e8m0 scale byte (e = 0: 2^-127, a subnormal float).
__device__ __forceinline__ float e8m0_value(uint32_t e) { return __uint_as_float(e > 0 ? e << 23 : 0x00400000u); }

template <bool kGateUp>
__global__ void __launch_bounds__(kMxThreads, 1)
    moe_mx_persistent_kernel(const MoeFp8Args a, const __grid_constant__ XMaps x_maps,
                             const __grid_constant__ CUtensorMap w_map) {
    constexpr int W = 3, kStages = kMxStages, kStageBytes = kMxStageBytes;
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kMxBarOffset);
    uint64_t* empty = full + kStages;
    uint2* s_lut = reinterpret_cast<uint2*>(smem + kMxLutOffset);
    // [W][2][kTokens] scales then [W][2][kTokens] assignments (as the persistent FP8 kernel's)
    float* s_xs_all = reinterpret_cast<float*>(smem + kMxRowsOffset);
    int* s_asg_all = reinterpret_cast<int*>(s_xs_all + W * 2 * kTokens);

    pdl_wait();
    const int nblk = (a.n + kMxFeatures - 1) / kMxFeatures;
    const int items = *a.tile_count * nblk;
    if (static_cast<int>(blockIdx.x) >= items) return;
    const int N = a.n, nkb = a.k_pad / kKBlock, groups = a.k / 32;
    const int tid = threadIdx.x;
    init_ring<kStages, W>(full, empty);
    if (tid < 32) {  // the magnitudes' e4m3 bytes for a group 2^tid below its row's largest
        const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
        uint32_t b[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) b[i] = __nv_cvt_float_to_fp8(ldexpf(mag[i], -tid), __NV_SATFINITE, __NV_E4M3);
        s_lut[tid] = make_uint2(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24);
    }
    __syncthreads();  // barriers initialised, table in; no CTA-wide barrier after the role split
    auto item_at = [&](int it) { return work_item(a, it, nblk, kMxFeatures); };

    const int role = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform (ptxas C7520)
    if (role >= W) {                                          // the producer: one lane issues every copy
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kMxProducerRegs));
        if (tid == 128 * W) {
            int gkb = 0;
            for (int it = blockIdx.x; it < items; it += gridDim.x) {
                const WorkItem w = item_at(it);
                const int xi = x_map_index(item_width(a, w.rows));
                gkb = produce_item<kStages, kStageBytes, kMxWTile>(smem, full, empty, &w_map, &x_maps.m[xi],
                                                                   w.e * N + w.n0, w.row0, nkb, kKBlock, gkb,
                                                                   kKBlock / 2, x_maps.rows[xi]);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMxConsumerRegs));
    const int wg = role, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = 64 * wg + 16 * warp + g;                      // this lane's rows r0 and r0 + 8 of the CTA's 192
    const uint8_t* codes0 = smem + r0 * (kKBlock / 2) + 16 * t;  // its 16 bytes of row r0 in slot 0
    // The x tile's slot-0 descriptor; slot and k32 step add 16-byte units (consume_item).
    const uint64_t x_desc0 = desc_sw128(smem_addr(smem + kMxWTile));
    float acc[64];
    RingPos<kStages> pos;
    int parity = 0;
    for (int it = blockIdx.x; it < items; it += gridDim.x, parity ^= 1) {
        const WorkItem w = item_at(it);
        const RowInputs row = load_row_inputs(a, kGateUp, w.row0, w.rows, tid & 127);
        const float2 bias = load_bias_pair(a, w.e, w.n0, wg, warp, g);
        // The rows' scale bytes (a row past n, never stored, reads row n − 1's).
        const int64_t fr0 = static_cast<int64_t>(w.e) * N + min(w.n0 + r0, N - 1);
        const int64_t fr1 = static_cast<int64_t>(w.e) * N + min(w.n0 + r0 + 8, N - 1);
        const uint8_t* sc0 = a.w_mx_scale + fr0 * groups;
        const uint8_t* sc1 = a.w_mx_scale + fr1 * groups;
        // Group 4·kb + t of both rows (0 past the last group: its codes are TMA's zero fill).
        auto scales_of = [&](int kb) {
            const int gi = 4 * kb + t;
            return gi < groups ? make_uint2(__ldg(sc0 + gi), __ldg(sc1 + gi)) : make_uint2(0u, 0u);
        };
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
        uint2 sc_next = scales_of(0);                        // one K block ahead (as the FP8 kernel's weight scale)
        with_width(item_width(a, w.rows), [&](auto width) {  // kN tokens a wgmma (consume_item)
            constexpr int kN = decltype(width)::value;
            float tmp[kN / 2];  // the block's sums (local to the item: consume_item)
            for (int kb = 0; kb < nkb; ++kb, pos.next()) {
                const uint2 sc = sc_next;
                sc_next = scales_of(min(kb + 1, nkb - 1));
                // The rows' largest scale in the block: the quad's four groups.
                uint32_t m0 = max(sc.x, __shfl_xor_sync(0xffffffffu, sc.x, 1));
                uint32_t m1 = max(sc.y, __shfl_xor_sync(0xffffffffu, sc.y, 1));
                m0 = max(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
                m1 = max(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
                const uint2 lut0 = s_lut[min(m0 - sc.x, 31u)], lut1 = s_lut[min(m1 - sc.y, 31u)];
                const int slot = pos.slot;
                mbar_wait(&full[slot], pos.phase);
                const uint4 c0 = *reinterpret_cast<const uint4*>(codes0 + slot * kStageBytes);
                const uint4 c1 = *reinterpret_cast<const uint4*>(codes0 + slot * kStageBytes + 8 * (kKBlock / 2));
                uint32_t q0[4] = {c0.x, c0.y, c0.z, c0.w}, q1[4] = {c1.x, c1.y, c1.z, c1.w};
                const uint64_t x_desc = x_desc0 + static_cast<uint64_t>(slot * (kStageBytes >> 4));
                // k32 step s: word s of each row, its low half a0 / a1, its high half a2 / a3; each
                // step converted right before its wgmma, a fence between the fragment's writes and its
                // wgmma. The words of step s + 1 pass a register fence after wgmma s is issued, so that
                // the conversion overlaps the wgmmas: ptxas had hoisted all four steps' conversions
                // above the first wgmma (r43 call 3). The fence orders only the PTX: in the SASS (r43
                // call 8) the 8- to 96-token instantiations interleave, the 128-token one does not.
                uint32_t af[4][4];
#pragma unroll
                for (int i = 0; i < kN / 2; ++i) reg_fence(tmp[i]);
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    af[s][0] = mx_codes_to_e4m3(q0[s] & 0xffffu, lut0);
                    af[s][1] = mx_codes_to_e4m3(q1[s] & 0xffffu, lut1);
                    af[s][2] = mx_codes_to_e4m3(q0[s] >> 16, lut0);
                    af[s][3] = mx_codes_to_e4m3(q1[s] >> 16, lut1);
                    wgmma_fence();
                    wgmma_e4m3_rs<kN>(tmp, af[s], x_desc + 2 * s, s);
                    if (s + 1 < 4) {
                        reg_fence(q0[s + 1]);
                        reg_fence(q1[s + 1]);
                    }
                }
                wgmma_commit();
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < kN / 2; ++i) reg_fence(tmp[i]);
                if ((tid & 127) == 0) mbar_arrive(&empty[slot]);  // this warpgroup's reads are done
                const float rs0 = e8m0_value(m0), rs1 = e8m0_value(m1);
#pragma unroll
                for (int j = 0; j < kN / 8; ++j)
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        acc[4 * j + u] = fmaf(rs0, tmp[4 * j + u], acc[4 * j + u]);
                        acc[4 * j + 2 + u] = fmaf(rs1, tmp[4 * j + 2 + u], acc[4 * j + 2 + u]);
                    }
            }
        });
        float* s_xs = s_xs_all + (wg * 2 + parity) * kTokens;
        int* s_asg = s_asg_all + (wg * 2 + parity) * kTokens;
        s_xs[tid & 127] = row.xs;
        s_asg[tid & 127] = row.assignment;
        named_barrier_sync(1 + wg, 128);
        if (it + static_cast<int>(gridDim.x) >= items) pdl_trigger();
        fp8_epilogue<kGateUp, true>(a, acc, w.row0, w.rows, w.n0, wg, warp, g, t, bias, s_xs, s_asg);
    }
}

// m64n128k16, bf16 × bf16 → f32, both operands from shared memory (K-major); scale_d = 0 overwrites d.
__device__ __forceinline__ void wgmma_bf16_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " GPTOSS_ACC64_REGS "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : GPTOSS_ACC64_OPERANDS
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// The same grouped GEMMs on the experts' bf16 copy (moe_bf16_grouped; session 8, compiled only):
// a stage is 64 of K (128 bytes a row, the same swizzled tiles), four k16 wgmmas accumulate
// straight into the tile's registers (bf16 products are exact and summed in fp32: no promotion),
// and a warpgroup keeps one stage's group in flight, releasing the stage before it.
template <bool kGateUp, int W>
__global__ void __launch_bounds__(Shape<W>::kThreads, 1)
    moe_bf16_kernel(const MoeFp8Args a, const __grid_constant__ CUtensorMap x_map,
                    const __grid_constant__ CUtensorMap w_map) {
    using S = Shape<W>;
    constexpr int kFeatures = S::kFeatures, kStages = S::kStages;
    constexpr int kWTile = S::kWTile, kStageBytes = S::kStageBytes;
    constexpr int kKElems = kKBlock / 2;  // bf16 elements a stage
    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes + 2 * kMaxKBlocks * 4);
    uint64_t* empty = full + kStages;
    float* s_xs = reinterpret_cast<float*>(smem + S::kRowsOffset);  // the item's RowInputs
    int* s_asg = reinterpret_cast<int*>(s_xs + kTokens);
    auto s_w = [&](int slot) { return smem + slot * kStageBytes; };
    auto s_x = [&](int slot) { return smem + slot * kStageBytes + kWTile; };

    pdl_wait();
    const int tile = blockIdx.y;
    if (tile >= *a.tile_count) return;
    const int e = a.tiles[2 * tile], rt = a.tiles[2 * tile + 1];
    const int row0 = a.expert_offsets[e] + rt * kTokens;
    const int rows = min(kTokens, a.expert_offsets[e + 1] - row0);
    const int n0 = blockIdx.x * kFeatures;
    const int N = a.n, nkb = (a.k + kKElems - 1) / kKElems;
    const int tid = threadIdx.x;
    init_ring<kStages, W>(full, empty);
    if (tid < kTokens) {
        const RowInputs r = load_row_inputs(a, kGateUp, row0, rows, tid);
        s_xs[tid] = r.xs;
        s_asg[tid] = r.assignment;
    }
    __syncthreads();  // barriers initialised, row inputs in; no CTA-wide barrier after the role split

    const int role = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform (ptxas C7520)
    if (role >= W) {                                          // the producer: one lane issues every copy
        if constexpr (W == 3) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegsW3));
        if (tid == 128 * W) {
            produce_item<kStages, kStageBytes, kWTile>(smem, full, empty, &w_map, &x_map, e * N + n0, row0, nkb,
                                                       kKElems, 0);
        }
        return;
    }

    if constexpr (W == 3) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegsW3));
    const int wg = role, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t w_base = smem_addr(s_w(0)) + wg * 64 * kKBlock;  // this warpgroup's 64 weight rows
    const uint32_t x_base = smem_addr(s_x(0));
    const float2 bias = load_bias_pair(a, e, n0, wg, warp, g);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int kb = 0; kb < nkb; ++kb) {
        const int slot = kb % kStages;
        mbar_wait(&full[slot], (kb / kStages) & 1);
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
#pragma unroll
        for (int kk = 0; kk < kKBlock / 32; ++kk)
            wgmma_bf16_n128(acc, desc_sw128(w_base + slot * kStageBytes + kk * 32),
                            desc_sw128(x_base + slot * kStageBytes + kk * 32), 1);
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's group is done: release it
#pragma unroll
        for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
        if (kb > 0 && (tid & 127) == 0) mbar_arrive(&empty[(kb - 1) % kStages]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < 64; ++i) reg_fence(acc[i]);
    // The last stage too (no one waits for it in this one-item kernel; a persistent loop would).
    if ((tid & 127) == 0) mbar_arrive(&empty[(nkb - 1) % kStages]);
    pdl_trigger();
    fp8_epilogue<kGateUp>(a, acc, row0, rows, n0, wg, warp, g, t, bias, s_xs, s_asg);
}

// Rows of x (bf16 [*, dim]; row i of the output is sorted[i] / experts_per_token when by_token,
// else i) as e4m3 [rows, dim] with one scale per row (amax / 448). One warp a row, its 16-byte
// chunks all loaded before the reduction (r23: a 256-thread CTA a row took ~170 µs for 32k rows of
// 2880, twice the bytes' time).
constexpr int kQuantWarps = 8;
constexpr int kQuantMaxChunks = 32;  // 8-element chunks a lane: dim ≤ 32 · 32 · 8 = 8,192
// kMx: rows of dim_pad bytes in the MX K order (moe_mx_k_position), 0 at the positions past dim.
template <int kQuantChunks, bool kMx>  // 12 where dim ≤ 3,072 (fewer registers), else kQuantMaxChunks
__global__ void __launch_bounds__(kQuantWarps * 32)
    quant_rows_e4m3_kernel(const __nv_bfloat16* __restrict__ x, bool by_token, const int32_t* __restrict__ sorted,
                           int experts_per_token, int rows, int dim, int dim_pad, uint8_t* __restrict__ xq,
                           float* __restrict__ xs) {
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * kQuantWarps + (threadIdx.x >> 5);
    if (i >= rows) return;
    const int64_t src_row = by_token ? sorted[i] / experts_per_token : i;
    const uint4* src = reinterpret_cast<const uint4*>(x + src_row * dim);  // 8 bf16 a chunk (dim % 16 == 0)
    const int chunks = dim / 8;
    uint4 v[kQuantChunks];
    float m = 0.0f;
#pragma unroll
    for (int c = 0; c < kQuantChunks; ++c) {
        const int idx = lane + c * 32;
        v[c] = idx < chunks ? __ldg(src + idx) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int c = 0; c < kQuantChunks; ++c) {
        const uint32_t w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
            m = fmaxf(m, fmaxf(fabsf(__uint_as_float(w[q] << 16)), fabsf(__uint_as_float(w[q] & 0xffff0000u))));
    }
    m = warp_max(m);
    // inv is capped: a row whose amax is below ~1.3e-36 would overflow 448 / amax (its values then
    // saturate instead of becoming inf · 0 = NaN).
    const float scale = m > 0.0f ? m / 448.0f : 1.0f;
    const float inv = m > 0.0f ? fminf(448.0f / m, 3.0e38f) : 1.0f;
    if (lane == 0) xs[i] = scale;
    uint2* dst = reinterpret_cast<uint2*>(xq + static_cast<int64_t>(i) * dim);
    uint8_t* row_mx = xq + static_cast<int64_t>(i) * dim_pad;
    const int out_chunks = kMx ? dim_pad / 8 : chunks;  // chunks past dim: zeros (v = 0)
#pragma unroll
    for (int c = 0; c < kQuantChunks; ++c) {
        const int idx = lane + c * 32;
        if (idx >= out_chunks) break;
        const uint32_t w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
        uint32_t out[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float2 lo =
                make_float2(__uint_as_float(w[2 * h] << 16) * inv, __uint_as_float(w[2 * h] & 0xffff0000u) * inv);
            const float2 hi = make_float2(__uint_as_float(w[2 * h + 1] << 16) * inv,
                                          __uint_as_float(w[2 * h + 1] & 0xffff0000u) * inv);
            // Round to nearest even, saturating to ±448 (NaN stays NaN), as __nv_fp8_e4m3.
            const uint32_t q01 = __nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3);
            const uint32_t q23 = __nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3);
            out[h] = q01 | (q23 << 16);
        }
        if constexpr (kMx) {
            // Elements 8·idx .. + 7: p = 32t + 8s + {0..3} (h = 0) and + {4..7} (h = 1) of block
            // idx / 16 (t, s from idx % 16): 4 bytes each at moe_mx_k_position.
            const int cc = idx & 15, t = cc >> 2, s = cc & 3;
            uint32_t* o = reinterpret_cast<uint32_t*>(row_mx + (idx >> 4) * 128 + 32 * s + 4 * t);
            o[0] = out[0];
            o[4] = out[1];
        } else {
            dst[idx] = make_uint2(out[0], out[1]);
        }
    }
}

// moe_fp8_gather_rows: one warp a row, every load of a lane issued before its stores.
constexpr int kGatherChunks16 = 16;  // 16-byte chunks a lane: dim ≤ 32 · 16 · 16 = 8,192
constexpr int kGatherChunks8 = 32;   // the MX form's 8-byte chunks a lane: dim_pad ≤ 8,192
template <bool kMx>
__global__ void __launch_bounds__(kQuantWarps * 32)
    gather_rows_e4m3_kernel(const uint8_t* __restrict__ xq_tok, const float* __restrict__ xs_tok,
                            const int32_t* __restrict__ sorted, int experts_per_token, int rows, int dim, int dim_pad,
                            uint8_t* __restrict__ xq, float* __restrict__ xs) {
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * kQuantWarps + (threadIdx.x >> 5);
    if (i >= rows) return;
    const int64_t src_row = sorted[i] / experts_per_token;
    if (lane == 0) xs[i] = xs_tok[src_row];
    const uint8_t* src = xq_tok + src_row * dim;
    if constexpr (kMx) {
        // Chunk idx = elements 8·idx .. + 7 go where quant_rows_e4m3_kernel<*, true> puts them.
        const int in_chunks = dim / 8, out_chunks = dim_pad / 8;
        uint2 v[kGatherChunks8];
#pragma unroll
        for (int c = 0; c < kGatherChunks8; ++c) {
            const int idx = lane + c * 32;
            v[c] = idx < in_chunks ? __ldg(reinterpret_cast<const uint2*>(src) + idx) : make_uint2(0u, 0u);
        }
        uint8_t* row_mx = xq + static_cast<int64_t>(i) * dim_pad;
#pragma unroll
        for (int c = 0; c < kGatherChunks8; ++c) {
            const int idx = lane + c * 32;
            if (idx >= out_chunks) break;
            const int cc = idx & 15, t = cc >> 2, s = cc & 3;
            uint32_t* o = reinterpret_cast<uint32_t*>(row_mx + (idx >> 4) * 128 + 32 * s + 4 * t);
            o[0] = v[c].x;
            o[4] = v[c].y;
        }
    } else {
        const int chunks = dim / 16;
        uint4 v[kGatherChunks16];
#pragma unroll
        for (int c = 0; c < kGatherChunks16; ++c) {
            const int idx = lane + c * 32;
            v[c] = idx < chunks ? __ldg(reinterpret_cast<const uint4*>(src) + idx) : make_uint4(0u, 0u, 0u, 0u);
        }
        uint4* dst = reinterpret_cast<uint4*>(xq + static_cast<int64_t>(i) * dim);
#pragma unroll
        for (int c = 0; c < kGatherChunks16; ++c) {
            const int idx = lane + c * 32;
            if (idx < chunks) dst[idx] = v[c];
        }
    }
}

// x as [num_rows, k] e4m3 in boxes of 128 bytes × kTokens rows, the weights as [E·n, k_pad] in boxes
// of 128 bytes × `features` rows, both 128-byte swizzled (w_map null: x only). False if encoding fails.
// bf16: both hold bf16 elements (boxes of 64 elements, the same 128 bytes), the weights' rows k long.
bool make_maps(const MoeFp8Args& a, int features, CUtensorMap* x_map, CUtensorMap* w_map, bool bf16 = false,
               int x_rows = kTokens) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint32_t unit[2] = {1, 1};
    const CUtensorMapDataType type = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    const cuuint32_t elem = bf16 ? 2 : 1, box_k = kKBlock / elem;
    const cuuint64_t x_dims[2] = {static_cast<cuuint64_t>(a.k), static_cast<cuuint64_t>(a.num_rows)};
    const cuuint64_t x_strides[1] = {static_cast<cuuint64_t>(a.k) * elem};
    const cuuint32_t x_box[2] = {box_k, static_cast<cuuint32_t>(x_rows)};
    if (encode(x_map, type, 2, const_cast<uint8_t*>(a.xq), x_dims, x_strides, x_box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    if (w_map == nullptr) return true;  // x only (make_x_maps' narrow boxes)
    const cuuint64_t w_dims[2] = {static_cast<cuuint64_t>(a.k_pad), static_cast<cuuint64_t>(a.num_experts) * a.n};
    const cuuint64_t w_strides[1] = {static_cast<cuuint64_t>(a.k_pad) * elem};
    const cuuint32_t w_box[2] = {box_k, static_cast<cuuint32_t>(features)};
    return encode(w_map, type, 2, const_cast<uint8_t*>(a.wq), w_dims, w_strides, w_box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// moe_mxfp4_fp8's maps: x as [num_rows, k_pad] e4m3 (the MX K order) in 128-byte swizzled boxes of
// 128 bytes × kTokens rows, the codes as [E·n, k/2] bytes in unswizzled boxes of 64 bytes (a 128-K
// block) × kMxFeatures rows.
bool make_maps_mx(const MoeFp8Args& a, CUtensorMap* x_map, CUtensorMap* w_map, int x_rows = kTokens) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (encode == nullptr) return false;
    const cuuint32_t unit[2] = {1, 1};
    const cuuint64_t x_dims[2] = {static_cast<cuuint64_t>(a.k_pad), static_cast<cuuint64_t>(a.num_rows)};
    const cuuint64_t x_strides[1] = {static_cast<cuuint64_t>(a.k_pad)};
    const cuuint32_t x_box[2] = {kKBlock, static_cast<cuuint32_t>(x_rows)};
    if (encode(x_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(a.xq), x_dims, x_strides, x_box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    if (w_map == nullptr) return true;  // x only (make_x_maps' narrow boxes)
    const cuuint64_t w_dims[2] = {static_cast<cuuint64_t>(a.k / 2), static_cast<cuuint64_t>(a.num_experts) * a.n};
    const cuuint64_t w_strides[1] = {static_cast<cuuint64_t>(a.k / 2)};
    const cuuint32_t w_box[2] = {kKBlock / 2, kMxFeatures};
    return encode(w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(a.w_mx), w_dims, w_strides, w_box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// GPTOSS_MOE_NARROW_X (XMaps): 1 (default) narrow boxes, 0 every box 128 rows.
bool narrow_x_boxes() {
    static const bool on = [] {
        const char* v = std::getenv("GPTOSS_MOE_NARROW_X");
        return v == nullptr || std::atoi(v) != 0;
    }();
    return on;
}
// The persistent kernels' XMaps and their weight map (encoded once, with the first x map) by
// make_maps / make_maps_mx.
bool make_x_maps(const MoeFp8Args& a, int features, bool mx, XMaps* x, CUtensorMap* w_map) {
    const bool narrow = narrow_x_boxes();
    for (int i = 0; i < 6; ++i) {
        const int rows = narrow ? kXMapRows[i] : kTokens;
        x->rows[i] = rows;
        CUtensorMap* w = i == 0 ? w_map : nullptr;
        if (!(mx ? make_maps_mx(a, &x->m[i], w, rows) : make_maps(a, features, &x->m[i], w, false, rows))) return false;
    }
    return true;
}
// The SM count of the current device (a launch's grid for the persistent kernels).
int device_sms() {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
}

}  // namespace

bool moe_mxfp4_fp8_supported(int n, int k, int num_experts) {
    return n > 0 && n % 16 == 0 && k > 0 && k % 32 == 0 && (k + kKBlock - 1) / kKBlock <= kMaxKBlocks &&
           num_experts >= 1 && num_experts <= kMaxMoeMmaExperts && tensor_map_encoder() != nullptr;
}

void moe_mxfp4_fp8(const MoeFp8Args& a, bool gate_up, cudaStream_t stream) {
    const int k_pad = (a.k + kKBlock - 1) / kKBlock * kKBlock;
    ENGINE_CHECK(moe_mxfp4_fp8_supported(a.n, a.k, a.num_experts) && a.num_rows > 0 && a.k_pad == k_pad &&
                     a.w_mx != nullptr && a.w_mx_scale != nullptr && reinterpret_cast<uintptr_t>(a.xq) % 16 == 0,
                 "moe_mxfp4_fp8: n %d, k %d (k_pad %d), %d experts, %d rows unsupported", a.n, a.k, a.k_pad,
                 a.num_experts, a.num_rows);
    ENGINE_CHECK(!gate_up || (a.n % 2 == 0 && a.act_q != nullptr && a.act_mx_order && a.act_q_inv_scale > 0.0f &&
                              a.act_q_stride >= (a.n / 2 + kKBlock - 1) / kKBlock * kKBlock),
                 "moe_mxfp4_fp8: gate_up writes e4m3 act_q in the MX K order (n %d, stride %d)", a.n, a.act_q_stride);
    ENGINE_CHECK(gate_up || a.y != nullptr, "moe_mxfp4_fp8: down writes y");
    if (a.max_tiles <= 0) return;
    XMaps x_maps;
    CUtensorMap w_map;
    ENGINE_CHECK(make_x_maps(a, kMxFeatures, true, &x_maps, &w_map), "moe_mxfp4_fp8: tensor maps could not be encoded");
    const int sms = a.persistent_ctas > 0 ? a.persistent_ctas : device_sms();
    const int64_t items = static_cast<int64_t>((a.n + kMxFeatures - 1) / kMxFeatures) * a.max_tiles;
    auto kernel = gate_up ? moe_mx_persistent_kernel<true> : moe_mx_persistent_kernel<false>;
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kMxSmemBytes)));
    kernel<<<static_cast<int>(std::min<int64_t>(items, sms)), kMxThreads, kMxSmemBytes, stream>>>(a, x_maps, w_map);
    CUDA_CHECK_LAUNCH();
}

bool moe_fp8_supported(int n, int k, int k_pad, int num_experts) {
    return n > 0 && n % 16 == 0 && k > 0 && k % 16 == 0 && k_pad >= k && k_pad % kKBlock == 0 &&
           (k + kKBlock - 1) / kKBlock <= kMaxKBlocks && num_experts >= 1 && num_experts <= kMaxMoeMmaExperts &&
           tensor_map_encoder() != nullptr;
}

void moe_fp8_quant_rows(const void* x, bool by_token, const int32_t* sorted, int experts_per_token, int rows, int dim,
                        uint8_t* xq, float* xs, cudaStream_t stream) {
    ENGINE_CHECK(dim % 16 == 0 && dim <= 8 * 32 * kQuantMaxChunks && rows >= 0, "moe_fp8_quant_rows: dim %d", dim);
    if (rows == 0) return;
    auto kernel =
        dim <= 8 * 32 * 12 ? quant_rows_e4m3_kernel<12, false> : quant_rows_e4m3_kernel<kQuantMaxChunks, false>;
    kernel<<<(rows + kQuantWarps - 1) / kQuantWarps, kQuantWarps * 32, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), by_token, sorted, experts_per_token, rows, dim, dim, xq, xs);
    CUDA_CHECK_LAUNCH();
}

void moe_fp8_quant_rows_mx(const void* x, bool by_token, const int32_t* sorted, int experts_per_token, int rows,
                           int dim, int dim_pad, uint8_t* xq, float* xs, cudaStream_t stream) {
    ENGINE_CHECK(dim % 16 == 0 && dim_pad == (dim + 127) / 128 * 128 && dim_pad <= 8 * 32 * kQuantMaxChunks &&
                     rows >= 0 && reinterpret_cast<uintptr_t>(xq) % 16 == 0,
                 "moe_fp8_quant_rows_mx: dim %d, dim_pad %d", dim, dim_pad);
    if (rows == 0) return;
    auto kernel =
        dim_pad <= 8 * 32 * 12 ? quant_rows_e4m3_kernel<12, true> : quant_rows_e4m3_kernel<kQuantMaxChunks, true>;
    kernel<<<(rows + kQuantWarps - 1) / kQuantWarps, kQuantWarps * 32, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), by_token, sorted, experts_per_token, rows, dim, dim_pad, xq, xs);
    CUDA_CHECK_LAUNCH();
}

void moe_fp8_gather_rows(const uint8_t* xq_tok, const float* xs_tok, const int32_t* sorted, int experts_per_token,
                         int rows, int dim, bool mx, int dim_pad, uint8_t* xq, float* xs, cudaStream_t stream) {
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    ENGINE_CHECK(dim % 16 == 0 && dim <= 32 * kGatherChunks16 * 16 && rows >= 0 && experts_per_token >= 1 &&
                     aligned16(xq_tok) && aligned16(xq) &&
                     (!mx || (dim_pad == (dim + 127) / 128 * 128 && dim_pad <= 32 * kGatherChunks8 * 8)),
                 "moe_fp8_gather_rows: dim %d, dim_pad %d", dim, dim_pad);
    if (rows == 0) return;
    const int grid = (rows + kQuantWarps - 1) / kQuantWarps;
    if (mx)
        launch_pdl(gather_rows_e4m3_kernel<true>, grid, kQuantWarps * 32, 0, stream, xq_tok, xs_tok, sorted,
                   experts_per_token, rows, dim, dim_pad, xq, xs);
    else
        launch_pdl(gather_rows_e4m3_kernel<false>, grid, kQuantWarps * 32, 0, stream, xq_tok, xs_tok, sorted,
                   experts_per_token, rows, dim, dim, xq, xs);
    CUDA_CHECK_LAUNCH();
}

float moe_fp8_act_scale(float swiglu_limit) {
    // |SwiGLU| = |(up + 1) · gate · σ(α · gate)| ≤ (limit + 1) · limit with gate ≤ limit and
    // |up| ≤ limit (gate · σ(α · gate) > -0.3 below 0): the smallest power of two that maps that
    // bound inside e4m3's ±448.
    if (!(swiglu_limit > 0.0f) || !std::isfinite(swiglu_limit)) return 0.0f;
    const double bound = (static_cast<double>(swiglu_limit) + 1.0) * swiglu_limit;
    return static_cast<float>(std::exp2(std::ceil(std::log2(std::max(bound, 1.0) / 448.0))));
}

void moe_fp8(const MoeFp8Args& a, bool gate_up, cudaStream_t stream) {
    ENGINE_CHECK(moe_fp8_supported(a.n, a.k, a.k_pad, a.num_experts) && a.num_rows > 0,
                 "moe_fp8: n %d, k %d (k_pad %d), %d experts, %d rows unsupported", a.n, a.k, a.k_pad, a.num_experts,
                 a.num_rows);
    ENGINE_CHECK(!gate_up || a.n % 2 == 0, "moe_fp8: gate_up needs (gate, up) row pairs (n %d)", a.n);
    ENGINE_CHECK(!gate_up || a.act_q == nullptr || a.act_q_inv_scale > 0.0f, "moe_fp8: act_q without a scale");
    ENGINE_CHECK(a.warpgroups == 0 || a.warpgroups == 2 || a.warpgroups == 3, "moe_fp8: %d warpgroups", a.warpgroups);
    if (a.max_tiles <= 0) return;
    auto run = [&](auto w) {
        constexpr int W = decltype(w)::value;
        using S = Shape<W>;
        CUtensorMap x_map, w_map;
        if (a.persistent) {  // one CTA an SM (at most one an item)
            XMaps x_maps;
            ENGINE_CHECK(make_x_maps(a, S::kFeatures, false, &x_maps, &w_map),
                         "moe_fp8: tensor maps could not be encoded");
            const int sms = a.persistent_ctas > 0 ? a.persistent_ctas : device_sms();
            const int64_t items = static_cast<int64_t>((a.n + S::kFeatures - 1) / S::kFeatures) * a.max_tiles;
            auto kernel = gate_up ? moe_fp8_persistent_kernel<true, W> : moe_fp8_persistent_kernel<false, W>;
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(S::kSmemBytes)));
            kernel<<<static_cast<int>(std::min<int64_t>(items, sms)), S::kThreads, S::kSmemBytes, stream>>>(a, x_maps,
                                                                                                            w_map);
            CUDA_CHECK_LAUNCH();
            return;
        }
        ENGINE_CHECK(make_maps(a, S::kFeatures, &x_map, &w_map), "moe_fp8: tensor maps could not be encoded");
        const dim3 grid((a.n + S::kFeatures - 1) / S::kFeatures, a.max_tiles);
        auto kernel = gate_up ? moe_fp8_kernel<true, W> : moe_fp8_kernel<false, W>;
        CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(S::kSmemBytes)));
        kernel<<<grid, S::kThreads, S::kSmemBytes, stream>>>(a, x_map, w_map);
        CUDA_CHECK_LAUNCH();
    };
    if (a.warpgroups == 2)
        run(std::integral_constant<int, 2>{});
    else
        run(std::integral_constant<int, 3>{});
}

void moe_bf16_grouped(const MoeFp8Args& a, bool gate_up, cudaStream_t stream) {
    ENGINE_CHECK(a.n > 0 && a.n % 16 == 0 && a.k > 0 && a.k % 8 == 0 && a.k_pad == a.k && a.num_rows > 0 &&
                     a.num_experts >= 1 && a.num_experts <= kMaxMoeMmaExperts && tensor_map_encoder() != nullptr,
                 "moe_bf16_grouped: n %d, k %d (k_pad %d), %d experts, %d rows unsupported", a.n, a.k, a.k_pad,
                 a.num_experts, a.num_rows);
    ENGINE_CHECK(!gate_up || (a.n % 2 == 0 && a.act != nullptr && a.act_q == nullptr),
                 "moe_bf16_grouped: gate_up writes bf16 act from (gate, up) row pairs");
    ENGINE_CHECK(a.x_scale == nullptr && a.x_scale_value == 1.0f, "moe_bf16_grouped: bf16 rows carry no scale");
    if (a.max_tiles <= 0) return;
    using S = Shape<3>;
    CUtensorMap x_map, w_map;
    ENGINE_CHECK(make_maps(a, S::kFeatures, &x_map, &w_map, true),
                 "moe_bf16_grouped: tensor maps could not be encoded");
    const dim3 grid((a.n + S::kFeatures - 1) / S::kFeatures, a.max_tiles);
    auto kernel = gate_up ? moe_bf16_kernel<true, 3> : moe_bf16_kernel<false, 3>;
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(S::kSmemBytes)));
    kernel<<<grid, S::kThreads, S::kSmemBytes, stream>>>(a, x_map, w_map);
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
