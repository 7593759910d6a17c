// Times the weight-only MXFP4 expert path of decode (moe_plan + moe_mxfp4: gate_up + SwiGLU, down)
// for gpt-oss-20b shapes (E = 32 experts, H = I = 2880, top-4) and prints
// `batch | µs | unique experts | bytes | GB/s | % of 4150`.
//
// Counting (the fewest bytes the step must move; METHOD.md "two numbers"): every chosen expert's
// MXFP4 weights once (13,219,200 B: blocks + scales of gate_up and down) plus its fp32 biases
// (46,080 B); inputs, act and outputs are a few KB per token and are not counted. The work is
// memory-bound at batch 1 (≈ 2 FLOP per 0.53 B of weights per token).
// Peak: 4150 GB/s, the device-to-device copy measured on the H200.
//
// Method: kLayers distinct weight sets (each a full layer of 32 experts, 423 MB) with their own
// random routing, so one rotation touches kLayers × (unique experts × 13.2 MB) — at batch 1
// 8 × 53 MB = 423 MB, 7× the L2. The kLayers (plan, experts) pairs are captured in one CUDA graph,
// warmed up, replayed kReps times; reported: median over replays of event time / kLayers.
// Usage: moe_bench [--mma | --wgmma] [batch ...]   (default 1 2 4 8 16 32)
//   --mma: the grouped tensor-core kernels (moe_plan, moe_mma_tiles, moe_mma gate_up + down, bf16
//   inputs) instead of the weight-only ones; same byte count.
//   --wgmma: the warpgroup grouped kernels (moe_wgmma, prefill-sized batches), same plan and tiles.
//   --wgmma-ws: their warp-specialized variant (TMA + mbarriers), x gathered first (timed too).
//   --w4a8: FP8 wgmma on e4m3 activation rows (moe_w4a8), the row quantization timed too.
//   --fp8: FP8 experts (e4m3, 128×128 block scales) and e4m3 activation rows (moe_fp8, 128-token
//   tiles), the row quantization of h timed too (act leaves gate_up as e4m3); the byte column then
//   counts the FP8 weights.
//   GPTOSS_MOE_FP8_WG=2|3: its consumer warpgroups a CTA (MoeFp8Args::warpgroups);
//   GPTOSS_MOE_FP8_PERSISTENT=0|1: one CTA an item, or one CTA an SM (MoeFp8Args::persistent,
//   the default as in the model).
// The last column is the work's rate, 2 · rows · (2I·H + H·I) FLOP per layer (bf16 peak 760).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda/moe.h"

namespace {

namespace cuda = gptoss::kernels::cuda;

constexpr int kExperts = 32, kHidden = 2880, kInter = 2880, kTopK = 4;
constexpr int kLayers = 8, kWarmup = 5, kReps = 60;
constexpr double kPeakGBs = 4150.0;
constexpr size_t kGuBlocks = size_t{2} * kInter * kHidden / 2, kGuScales = size_t{2} * kInter * kHidden / 32;
constexpr size_t kDownBlocks = size_t{kHidden} * kInter / 2, kDownScales = size_t{kHidden} * kInter / 32;
constexpr size_t kExpertBytes = kGuBlocks + kGuScales + kDownBlocks + kDownScales + (2 * kInter + kHidden) * 4;

struct DevBuf {
    void* p = nullptr;
    DevBuf() = default;
    explicit DevBuf(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
    ~DevBuf() {
        if (p) cudaFree(p);
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;
    DevBuf(DevBuf&& o) noexcept : p(o.p) { o.p = nullptr; }
    DevBuf& operator=(DevBuf&& o) noexcept {
        std::swap(p, o.p);
        return *this;
    }
    template <typename T>
    T* as() const {
        return static_cast<T*>(p);
    }
};

template <typename T>
DevBuf upload(const std::vector<T>& v) {
    DevBuf b(v.size() * sizeof(T));
    CHECK_CUDA(cudaMemcpy(b.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return b;
}

// Random bytes: full-range codes, scales in 118..122 (the range of real weights).
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed, bool scales) {
    std::vector<uint8_t> v(n);
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < n; i += 8) {
        const uint64_t r = rng();
        for (size_t j = 0; j < 8 && i + j < n; ++j) {
            const auto b = static_cast<uint8_t>(r >> (8 * j));
            v[i + j] = scales ? static_cast<uint8_t>(118 + b % 5) : b;
        }
    }
    return v;
}

std::vector<float> randn(size_t n, uint32_t seed, float scale) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

struct Layer {
    DevBuf gu_blocks, gu_scales, down_blocks, down_scales, gu_bias, down_bias;
    DevBuf gu_q, gu_s, down_q, down_s;  // --fp8: e4m3 [E, n, k_pad] and block scales
};
constexpr int kKPad = 3072;  // fp8_gemm_k_pad(2880)
constexpr size_t kGuQ = size_t{kExperts} * 2 * kInter * kKPad, kDownQ = size_t{kExperts} * kHidden * kKPad;
constexpr size_t kGuS = size_t{kExperts} * ((2 * kInter + 127) / 128) * (kKPad / 128);
constexpr size_t kDownS = size_t{kExperts} * ((kHidden + 127) / 128) * (kKPad / 128);

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> batches;
    bool mma = false, wgmma = false, ws = false, w4a8 = false, fp8 = false;
    for (int i = 1; i < argc; ++i) {
        if (std::string(argv[i]) == "--mma")
            mma = true;
        else if (std::string(argv[i]) == "--wgmma")
            mma = wgmma = true;
        else if (std::string(argv[i]) == "--wgmma-ws")
            mma = wgmma = ws = true;
        else if (std::string(argv[i]) == "--w4a8")
            mma = wgmma = w4a8 = true;
        else if (std::string(argv[i]) == "--fp8")
            mma = fp8 = true;
        else
            batches.push_back(std::atoi(argv[i]));
    }
    if (batches.empty()) batches = {1, 2, 4, 8, 16, 32};
    const int max_t = *std::max_element(batches.begin(), batches.end());

    // One layer's worth of random weights on the host, uploaded kLayers times (distinct addresses
    // are what matters for the cache; the data is random, never zeros).
    std::printf("preparing %d layers x %d experts (%.0f MB each)...\n", kLayers, kExperts,
                kExpertBytes * kExperts / 1e6);
    const auto gub = random_bytes(kGuBlocks * kExperts, 1, false), gus = random_bytes(kGuScales * kExperts, 2, true);
    const auto db = random_bytes(kDownBlocks * kExperts, 3, false), ds = random_bytes(kDownScales * kExperts, 4, true);
    const auto gubias = randn(size_t{2} * kInter * kExperts, 5, 0.5f),
               dbias = randn(size_t{kHidden} * kExperts, 6, 0.1f);
    std::vector<Layer> layers(kLayers);
    std::vector<uint8_t> f8q;
    std::vector<float> f8s;
    if (fp8) {  // e4m3 bytes that are never NaN (bit 3 clear: exponent ≤ 14), scales ~ 1/√K
        f8q = random_bytes(std::max(kGuQ, kDownQ), 8, false);
        for (auto& b : f8q) b &= 0xF7;
        f8s.assign(std::max(kGuS, kDownS), 1.0f / 64.0f);
    }
    for (auto& L : layers) {
        if (fp8) {
            L.gu_q = DevBuf(kGuQ);
            L.down_q = DevBuf(kDownQ);
            CHECK_CUDA(cudaMemcpy(L.gu_q.p, f8q.data(), kGuQ, cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(L.down_q.p, f8q.data(), kDownQ, cudaMemcpyHostToDevice));
            L.gu_s = DevBuf(kGuS * 4);
            L.down_s = DevBuf(kDownS * 4);
            CHECK_CUDA(cudaMemcpy(L.gu_s.p, f8s.data(), kGuS * 4, cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(L.down_s.p, f8s.data(), kDownS * 4, cudaMemcpyHostToDevice));
        }
        L.gu_blocks = upload(gub);
        L.gu_scales = upload(gus);
        L.down_blocks = upload(db);
        L.down_scales = upload(ds);
        L.gu_bias = upload(gubias);
        L.down_bias = upload(dbias);
    }
    DevBuf h32 = upload(randn(static_cast<size_t>(max_t) * kHidden, 7, 1.0f));
    DevBuf act(static_cast<size_t>(max_t) * kTopK * kInter * 4), y(static_cast<size_t>(max_t) * kTopK * kHidden * 4);
    std::vector<uint16_t> h16(static_cast<size_t>(max_t) * kHidden);
    {
        const auto hf = randn(h16.size(), 7, 1.0f);
        for (size_t i = 0; i < h16.size(); ++i) {
            uint32_t u;
            std::memcpy(&u, &hf[i], 4);
            h16[i] = static_cast<uint16_t>(u >> 16);
        }
    }
    DevBuf hb = upload(h16);
    DevBuf xg(ws ? static_cast<size_t>(max_t) * kTopK * kHidden * 2 : 16);  // gathered x (--wgmma-ws)
    DevBuf xq(w4a8 || fp8 ? static_cast<size_t>(max_t) * kTopK * std::max(kHidden, kInter) : 16);  // e4m3 rows
    DevBuf xs(w4a8 || fp8 ? static_cast<size_t>(max_t) * kTopK * 4 : 16);
    const int max_tiles_cap = max_t * kTopK / cuda::moe_mma_block_rows(false) + kExperts + 1;
    DevBuf tiles(static_cast<size_t>(2 * max_tiles_cap) * 4), tile_count(4);
    std::vector<DevBuf> ids(kLayers), offsets(kLayers), sorted(kLayers);
    for (int l = 0; l < kLayers; ++l) {
        ids[l] = DevBuf(static_cast<size_t>(max_t) * kTopK * 4);
        offsets[l] = DevBuf((kExperts + 1) * 4);
        sorted[l] = DevBuf(static_cast<size_t>(max_t) * kTopK * 4);
    }

    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t ev0, ev1;
    CHECK_CUDA(cudaEventCreate(&ev0));
    CHECK_CUDA(cudaEventCreate(&ev1));

    std::printf(
        "\n| batch | µs | unique experts | bytes | GB/s | %% of %.0f | TFLOP/s |\n|---|---|---|---|---|---|---|\n",
        kPeakGBs);
    for (const int T : batches) {
        // Random top-4 per token and layer; unique experts averaged over the layers.
        std::mt19937 rng(1000 + T);
        double unique = 0;
        for (int l = 0; l < kLayers; ++l) {
            std::vector<int32_t> v(static_cast<size_t>(T) * kTopK);
            std::set<int> used;
            for (int t = 0; t < T; ++t) {
                std::vector<int> perm(kExperts);
                std::iota(perm.begin(), perm.end(), 0);
                std::shuffle(perm.begin(), perm.end(), rng);
                for (int k = 0; k < kTopK; ++k) {
                    v[t * kTopK + k] = perm[k];
                    used.insert(perm[k]);
                }
            }
            unique += static_cast<double>(used.size()) / kLayers;
            CHECK_CUDA(cudaMemcpy(ids[l].p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
        }
        auto enqueue = [&] {
            for (int l = 0; l < kLayers && fp8; ++l) {
                const int A = T * kTopK, bm = cuda::kMoeFp8BlockTokens;
                const int max_tiles = (A + bm - 1) / bm + kExperts;
                cuda::moe_plan(ids[l].as<int32_t>(), A, kExperts, offsets[l].as<int32_t>(), sorted[l].as<int32_t>(),
                               stream);
                cuda::moe_mma_tiles(offsets[l].as<int32_t>(), kExperts, bm, max_tiles, tiles.as<int32_t>(),
                                    tile_count.as<int32_t>(), stream);
                cuda::moe_fp8_quant_rows(hb.p, true, sorted[l].as<int32_t>(), kTopK, A, kHidden, xq.as<uint8_t>(),
                                         xs.as<float>(), stream);
                cuda::MoeFp8Args m;
                m.xq = xq.as<uint8_t>();
                m.x_scale = xs.as<float>();
                m.num_rows = A;
                m.expert_offsets = offsets[l].as<int32_t>();
                m.sorted_assignments = sorted[l].as<int32_t>();
                m.tiles = tiles.as<int32_t>();
                m.tile_count = tile_count.as<int32_t>();
                m.max_tiles = max_tiles;
                m.wq = layers[l].gu_q.as<uint8_t>();
                m.w_scale = layers[l].gu_s.as<float>();
                m.bias = layers[l].gu_bias.as<float>();
                m.act = act.p;
                m.n = 2 * kInter;
                m.k = kHidden;
                m.k_pad = kKPad;
                m.num_experts = kExperts;
                if (const char* v = std::getenv("GPTOSS_MOE_FP8_WG")) m.warpgroups = std::atoi(v);
                m.persistent = true;  // as the model (r24)
                if (const char* v = std::getenv("GPTOSS_MOE_FP8_PERSISTENT")) m.persistent = std::atoi(v) != 0;
                const float act_scale = cuda::moe_fp8_act_scale(m.swiglu_limit);  // as the model
                m.act_q = static_cast<uint8_t*>(act.p);
                m.act_q_inv_scale = 1.0f / act_scale;
                cuda::moe_fp8(m, true, stream);
                m.xq = static_cast<uint8_t*>(act.p);
                m.x_scale = nullptr;
                m.x_scale_value = act_scale;
                m.act_q = nullptr;
                m.wq = layers[l].down_q.as<uint8_t>();
                m.w_scale = layers[l].down_s.as<float>();
                m.bias = layers[l].down_bias.as<float>();
                m.act = nullptr;
                m.y = y.as<float>();
                m.n = kHidden;
                m.k = kInter;
                cuda::moe_fp8(m, false, stream);
            }
            for (int l = 0; l < kLayers && mma && !fp8; ++l) {
                const int A = T * kTopK;
                const bool large = A >= 64 * kExperts;  // the model's rule (cuda_model.cpp)
                int bm = wgmma ? cuda::moe_wgmma_block_tokens(A, kExperts) : cuda::moe_mma_block_rows(large);
                if (w4a8) bm = bm <= 32 ? 32 : 64;
                const int max_tiles = (A + bm - 1) / bm + kExperts;
                cuda::moe_plan(ids[l].as<int32_t>(), A, kExperts, offsets[l].as<int32_t>(), sorted[l].as<int32_t>(),
                               stream);
                cuda::moe_mma_tiles(offsets[l].as<int32_t>(), kExperts, bm, max_tiles, tiles.as<int32_t>(),
                                    tile_count.as<int32_t>(), stream);
                cuda::MoeMmaArgs m;
                m.x = hb.p;
                m.x_by_token = true;
                m.experts_per_token = kTopK;
                m.expert_offsets = offsets[l].as<int32_t>();
                m.sorted_assignments = sorted[l].as<int32_t>();
                m.tiles = tiles.as<int32_t>();
                m.tile_count = tile_count.as<int32_t>();
                m.max_tiles = max_tiles;
                m.large = large;
                m.blocks = layers[l].gu_blocks.as<uint8_t>();
                m.scales = layers[l].gu_scales.as<uint8_t>();
                m.bias = layers[l].gu_bias.as<float>();
                m.act = act.p;
                m.n = 2 * kInter;
                m.k = kHidden;
                m.num_experts = kExperts;
                if (ws) {
                    cuda::moe_gather(hb.p, sorted[l].as<int32_t>(), A, kTopK, kHidden, xg.p, stream);
                    m.x = xg.p;
                    m.x_by_token = false;
                    m.num_rows = A;
                }
                if (w4a8) {
                    cuda::moe_quant_rows_fp8(hb.p, true, sorted[l].as<int32_t>(), kTopK, A, kHidden, xq.as<uint8_t>(),
                                             xs.as<float>(), stream);
                    m.x = xq.p;
                    m.x_by_token = false;
                    m.x_scale = xs.as<float>();
                }
                auto run = [&](bool gate_up) {
                    if (w4a8)
                        cuda::moe_w4a8(m, gate_up, bm, stream);
                    else if (wgmma)
                        cuda::moe_wgmma(m, gate_up, bm, stream, ws);
                    else
                        cuda::moe_mma(m, gate_up, stream);
                };
                run(true);
                m.x = act.p;
                m.x_by_token = false;
                m.blocks = layers[l].down_blocks.as<uint8_t>();
                m.scales = layers[l].down_scales.as<uint8_t>();
                m.bias = layers[l].down_bias.as<float>();
                m.y = y.as<float>();
                m.n = kHidden;
                m.k = kInter;
                if (w4a8) {
                    cuda::moe_quant_rows_fp8(act.p, false, nullptr, kTopK, A, kInter, xq.as<uint8_t>(), xs.as<float>(),
                                             stream);
                    m.x = xq.p;
                }
                run(false);
            }
            for (int l = 0; l < kLayers && !mma; ++l) {
                cuda::moe_plan(ids[l].as<int32_t>(), T * kTopK, kExperts, offsets[l].as<int32_t>(),
                               sorted[l].as<int32_t>(), stream);
                cuda::MoeMxfp4Args a;
                a.h_f32 = h32.as<float>();
                a.expert_offsets = offsets[l].as<int32_t>();
                a.sorted_assignments = sorted[l].as<int32_t>();
                a.gate_up_blocks = layers[l].gu_blocks.as<uint8_t>();
                a.gate_up_scales = layers[l].gu_scales.as<uint8_t>();
                a.gate_up_bias = layers[l].gu_bias.as<float>();
                a.down_blocks = layers[l].down_blocks.as<uint8_t>();
                a.down_scales = layers[l].down_scales.as<uint8_t>();
                a.down_bias = layers[l].down_bias.as<float>();
                a.act = act.as<float>();
                a.y = y.as<float>();
                a.num_tokens = T;
                a.hidden_size = kHidden;
                a.intermediate_size = kInter;
                a.num_experts = kExperts;
                a.experts_per_token = kTopK;
                cuda::moe_mxfp4(a, stream);
            }
        };
        enqueue();  // first launches outside the capture: one-time attribute and occupancy queries
        CHECK_CUDA(cudaStreamSynchronize(stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        enqueue();
        CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < kWarmup; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
        std::vector<float> ms(kReps);
        for (int i = 0; i < kReps; ++i) {
            CHECK_CUDA(cudaEventRecord(ev0, stream));
            CHECK_CUDA(cudaGraphLaunch(exec, stream));
            CHECK_CUDA(cudaEventRecord(ev1, stream));
            CHECK_CUDA(cudaEventSynchronize(ev1));
            CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev0, ev1));
        }
        CHECK_CUDA(cudaGetLastError());
        std::sort(ms.begin(), ms.end());
        const double us = ms[kReps / 2] * 1e3 / kLayers;
        const double bytes = unique * (fp8 ? static_cast<double>(kGuQ + kDownQ) / kExperts : kExpertBytes);
        const double gbs = bytes / (us * 1e3);
        const double flops = 2.0 * T * kTopK * 3.0 * kInter * kHidden;
        std::printf("| %d | %.1f | %.2f | %.1f MB | %.0f | %.0f%% | %.0f |\n", T, us, unique, bytes / 1e6, gbs,
                    100.0 * gbs / kPeakGBs, flops / (us * 1e6));
        std::fflush(stdout);
        CHECK_CUDA(cudaGraphExecDestroy(exec));
        CHECK_CUDA(cudaGraphDestroy(graph));
    }
    CHECK_CUDA(cudaEventDestroy(ev0));
    CHECK_CUDA(cudaEventDestroy(ev1));
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
}
