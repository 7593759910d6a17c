// The weight-only FP8 GEMV (gemv_bf16w with w_scale set, kernels/cuda/gemv.h) against a CPU loop on
// the same quantized weights: e4m3 bytes and 128×128 block scales from Fp8Weight::from_bf16, read
// back and dequantized on the host (core/dtype.h), times the fp32 (or bf16) activations in double.
// Only the summation order differs, so the fp32 tolerance applies. Shapes: the QKV (5120 × 2880),
// O (2880 × 4096) and a row count that leaves a partial 128-row block (700); also the cp.async ring
// kernel (GemvArgs::fp8_ring) at each.
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemv.h"

namespace gptoss::kernels::cuda {
namespace {

using test::close;
using test::kTolF32;

TEST(CudaFp8Gemv, MatchesCpuOnTheQuantizedWeights) {
    REQUIRE_GPU();
    // 20,000 × 512: enough rows that every ring warp wraps its 4 slots several times; 3 × 128: fewer
    // rows than warps, and lanes with no chunk.
    for (const auto& [n, k] : {std::pair{5120, 2880}, {2880, 4096}, {700, 2880}, {20000, 512}, {3, 128}}) {
        const auto wf = test::randn(static_cast<size_t>(n) * k, 21, 0.02f);
        DeviceBuffer dwb = DeviceBuffer::from_host(test::to_bf16(wf).data(), wf.size() * 2);
        const Fp8Weight f8 = Fp8Weight::from_bf16(dwb.get(), n, k, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto q = test::to_host<uint8_t>(f8.q, static_cast<size_t>(n) * f8.k_pad);
        const int kb = f8.k_pad / 128;
        const auto sc = test::to_host<float>(f8.scales, static_cast<size_t>((n + 127) / 128) * kb);
        const auto bias = test::randn(n, 22, 0.1f);
        DeviceBuffer db = DeviceBuffer::from_host(bias.data(), bias.size() * 4);
        for (int T : {1, 3, 8}) {
            for (bool xb : {false, true})
                for (bool ring : {false, true}) {
                    auto x = test::randn(static_cast<size_t>(T) * k, 23 + T);
                    if (xb) x = test::bf16_round(x);
                    std::vector<float> ref(static_cast<size_t>(T) * n);
                    for (int t = 0; t < T; ++t)
                        for (int r = 0; r < n; ++r) {
                            double acc = 0;
                            for (int c = 0; c < k; ++c)
                                acc += static_cast<double>(fp8e4m3_to_f32(q[static_cast<size_t>(r) * f8.k_pad + c])) *
                                       sc[static_cast<size_t>(r / 128) * kb + c / 128] *
                                       x[static_cast<size_t>(t) * k + c];
                            ref[static_cast<size_t>(t) * n + r] = static_cast<float>(acc + bias[r]);
                        }
                    auto dx = xb ? test::to_device(test::to_bf16(x)) : test::to_device(x);
                    auto dy = test::poisoned(ref.size() * 4);
                    GemvArgs g;
                    g.x = dx.get();
                    g.x_bf16 = xb;
                    g.w = f8.q.get();
                    g.w_scale = f8.scales.as<float>();
                    g.w_ld = f8.k_pad;
                    g.bias = db.as<float>();
                    g.y = dy.as<float>();
                    g.num_tokens = T;
                    g.n = n;
                    g.k = k;
                    g.fp8_ring = ring;
                    gemv_bf16w(g, nullptr);
                    EXPECT_TRUE(close(test::to_host<float>(dy, ref.size()), ref, kTolF32, "fp8 gemv"))
                        << "n " << n << " k " << k << " T " << T << " bf16 x " << xb << " ring " << ring;
                }
        }
    }
}

}  // namespace
}  // namespace gptoss::kernels::cuda
