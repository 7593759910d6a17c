// Times the decode GEMVs (kernels/cuda/gemv.h gemv_bf16w) at gpt-oss shapes with FP8 (e4m3, 128×128
// block scales) or bf16 weights and prints `shape | weights | tokens | µs | GB/s | % of 4150`.
//
// Counting: the weight bytes once (FP8: n·k + the scales; bf16: 2·n·k); activations and outputs are
// a few KB. The work is memory-bound (2 FLOP per weight byte per token at FP8).
// Peak: 4150 GB/s, the device-to-device copy measured on the H200.
//
// Method: enough distinct weight copies that one rotation reads ≥ 400 MB (8× the L2), the launches
// of a rotation captured in one CUDA graph, warmed up, replayed kReps times; reported: the median
// over replays of event time / copies. Weight values do not matter for the time: every e4m3 byte
// is 0x38 (1.0), every scale 1.
//
// Rows: FP8 one warp per row, FP8 on the tensor cores (GemvFp8Kernel::kMma), its one-wave variant
// (kMmaOneWave, k ≤ 3,072 only), bf16. x is fp32.
// Usage: gemv_bench [tokens ...]   (default 1 2 4 8). For ncu: `-k regex:gemv_`.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernels/cuda/gemv.h"

namespace {

namespace cuda = gptoss::kernels::cuda;

constexpr int kWarmup = 3, kReps = 30;
constexpr double kPeakGBs = 4150.0;
constexpr size_t kRotationBytes = size_t{400} << 20;

struct Shape {
    const char* name;
    int n, k;
};

double time_shape(const Shape& s, bool fp8, cuda::GemvFp8Kernel kind, int tokens, cudaStream_t stream) {
    const int k_pad = (s.k + 127) / 128 * 128;
    const size_t w_bytes = fp8 ? static_cast<size_t>(s.n) * k_pad : static_cast<size_t>(s.n) * s.k * 2;
    const size_t sc_count = static_cast<size_t>((s.n + 127) / 128) * (k_pad / 128);
    const int copies = static_cast<int>(std::max<size_t>(1, (kRotationBytes + w_bytes - 1) / w_bytes));
    std::vector<void*> w(copies);
    for (auto& p : w) {
        CHECK_CUDA(cudaMalloc(&p, w_bytes));
        CHECK_CUDA(cudaMemset(p, fp8 ? 0x38 : 0x3f, w_bytes));  // e4m3 1.0; bf16 0x3f3f ≈ 0.75
    }
    float* scales = nullptr;
    CHECK_CUDA(cudaMalloc(&scales, sc_count * 4));
    const std::vector<float> ones(sc_count, 1.0f);
    CHECK_CUDA(cudaMemcpy(scales, ones.data(), sc_count * 4, cudaMemcpyHostToDevice));
    std::vector<float> xh(static_cast<size_t>(tokens) * s.k);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : xh) v = nd(rng);
    float *x = nullptr, *y = nullptr;
    CHECK_CUDA(cudaMalloc(&x, xh.size() * 4));
    CHECK_CUDA(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(tokens) * s.n * 4));

    auto args = [&](int c) {
        cuda::GemvArgs g;
        g.x = x;
        g.w = w[c];
        g.w_scale = fp8 ? scales : nullptr;
        g.w_ld = fp8 ? k_pad : 0;
        g.y = y;
        g.num_tokens = tokens;
        g.n = s.n;
        g.k = s.k;
        g.fp8_kernel = kind;
        return g;
    };
    // One launch outside the capture: the launchers' first calls set attributes and query occupancy.
    cuda::gemv_bf16w(args(0), stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < copies; ++c) cuda::gemv_bf16w(args(c), stream);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < kWarmup; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<float> ms;
    for (int i = 0; i < kReps; ++i) {
        CHECK_CUDA(cudaEventRecord(e0, stream));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double us = 1000.0 * ms[ms.size() / 2] / copies;
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    for (void* p : w) CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(scales));
    CHECK_CUDA(cudaFree(x));
    CHECK_CUDA(cudaFree(y));
    return us;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> tokens;
    for (int i = 1; i < argc; ++i) {
        const int t = std::atoi(argv[i]);
        if (t < 1 || t > cuda::kGemvMaxTokens) {
            std::fprintf(stderr, "gemv_bench: tokens must be 1..%d, got '%s'\n", cuda::kGemvMaxTokens, argv[i]);
            return 2;
        }
        tokens.push_back(t);
    }
    if (tokens.empty()) tokens = {1, 2, 4, 8};
    const Shape shapes[] = {{"lm_head", 201088, 2880}, {"qkv", 5120, 2880}, {"o_proj", 2880, 4096}};
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    std::printf("| shape | weights | tokens | µs | GB/s | %% of %.0f |\n|---|---|---:|---:|---:|---:|\n", kPeakGBs);
    for (const Shape& s : shapes)
        for (int kind = 0; kind < 4; ++kind)  // FP8 one warp per row, tensor cores, one-wave; bf16
            for (int t : tokens) {
                if (kind == 2 && s.k > 3072) continue;  // the one-wave variant takes k ≤ 3,072
                const bool fp8 = kind < 3;
                const cuda::GemvFp8Kernel kinds[] = {cuda::GemvFp8Kernel::kRowPerWarp, cuda::GemvFp8Kernel::kMma,
                                                     cuda::GemvFp8Kernel::kMmaOneWave, cuda::GemvFp8Kernel::kAuto};
                const double us = time_shape(s, fp8, kinds[kind], t, stream);
                const int k_pad = (s.k + 127) / 128 * 128;
                // Bytes read: FP8 rows read k of their k_pad columns, plus one scale per 128 × 128 block.
                const double bytes =
                    fp8 ? static_cast<double>(s.n) * s.k + (s.n + 127) / 128 * (k_pad / 128) * 4.0 : 2.0 * s.n * s.k;
                const double gbs = bytes / (us * 1e3);
                std::printf("| %s %d×%d | %s | %d | %.1f | %.0f | %.0f%% |\n", s.name, s.n, s.k,
                            kind == 0   ? "fp8 row"
                            : kind == 1 ? "fp8 mma"
                            : kind == 2 ? "fp8 mma1"
                                        : "bf16",
                            t, us, gbs, 100.0 * gbs / kPeakGBs);
            }
    CHECK_CUDA(cudaStreamDestroy(stream));
    return 0;
}
