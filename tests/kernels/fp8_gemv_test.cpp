// The weight-only FP8 GEMV (gemv_bf16w with w_scale set, kernels/cuda/gemv.h) against a CPU loop on
// the same quantized weights: e4m3 bytes and 128×128 block scales from Fp8Weight::from_bf16, read
// back and dequantized on the host (core/dtype.h), times the fp32 (or bf16) activations in double.
// Only the summation order differs, so the fp32 tolerance applies; the tensor-core kernel
// (GemvFp8Kernel::kMma) rounds x to bf16, and its reference does too. Shapes: the QKV (5120 × 2880),
// O (2880 × 4096), a row count that leaves a partial 128-row block and a partial 16-row tile (700),
// many rows (20,000 × 512) and fewer rows than a tile (3 × 128). A second test feeds every e4m3
// code (subnormals included) with scales far from 1. The tensor-core kernels run with f16 MMAs (the
// default, GemvArgs::mma_f16) and bf16 ones; a third test covers the f16 path's x beyond f16's range.
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

// y = x · Wᵀ + bias for T tokens through `kind`, W the FP8 weight f8.
GemvArgs fp8_gemv_args(const Fp8Weight& f8, const DeviceBuffer& x, bool x_bf16, const DeviceBuffer& bias,
                       DeviceBuffer& y, int T, GemvFp8Kernel kind, bool f16 = true) {
    GemvArgs g;
    g.x = x.get();
    g.x_bf16 = x_bf16;
    g.w = f8.q.get();
    g.w_scale = f8.scales.as<float>();
    g.w_ld = f8.k_pad;
    g.bias = bias.as<float>();
    g.y = y.as<float>();
    g.num_tokens = T;
    g.n = f8.n;
    g.k = f8.k;
    g.fp8_kernel = kind;
    g.mma_f16 = f16;
    return g;
}

// A random n × k weight (N(0, 0.02)) quantized by Fp8Weight::from_bf16, and its dequantized values
// read back: e4m3 times a float scale is exact in double, the same products as decoding each element.
struct QuantizedWeight {
    Fp8Weight f8;
    std::vector<double> w;  // [n, k]
    QuantizedWeight(int n, int k, uint32_t seed) {
        const auto wf = test::randn(static_cast<size_t>(n) * k, seed, 0.02f);
        DeviceBuffer dwb = DeviceBuffer::from_host(test::to_bf16(wf).data(), wf.size() * 2);
        f8 = Fp8Weight::from_bf16(dwb.get(), n, k, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto q = test::to_host<uint8_t>(f8.q, static_cast<size_t>(n) * f8.k_pad);
        const int kb = f8.k_pad / 128;
        const auto sc = test::to_host<float>(f8.scales, static_cast<size_t>((n + 127) / 128) * kb);
        w.resize(static_cast<size_t>(n) * k);
        for (int r = 0; r < n; ++r)
            for (int c = 0; c < k; ++c)
                w[static_cast<size_t>(r) * k + c] =
                    static_cast<double>(fp8e4m3_to_f32(q[static_cast<size_t>(r) * f8.k_pad + c])) *
                    sc[static_cast<size_t>(r / 128) * kb + c / 128];
    }
};

TEST(CudaFp8Gemv, MatchesCpuOnTheQuantizedWeights) {
    REQUIRE_GPU();
    // 20,000 × 512: enough rows that every ring warp wraps its 4 slots several times; 3 × 128: fewer
    // rows than warps, and lanes with no chunk; k 3,072: the one-wave variant's largest k.
    for (const auto& [n, k] :
         {std::pair{5120, 2880}, {2880, 4096}, {700, 2880}, {20000, 512}, {3, 128}, {1000, 3072}}) {
        const QuantizedWeight qw(n, k, 21);
        const Fp8Weight& f8 = qw.f8;
        const std::vector<double>& wd = qw.w;
        const auto bias = test::randn(n, 22, 0.1f);
        DeviceBuffer db = DeviceBuffer::from_host(bias.data(), bias.size() * 4);
        // One reference per distinct input.
        const auto reference = [&](const std::vector<float>& xr, int T) {
            std::vector<float> ref(static_cast<size_t>(T) * n);
            for (int t = 0; t < T; ++t)
                for (int r = 0; r < n; ++r) {
                    const double* wr = wd.data() + static_cast<size_t>(r) * k;
                    const float* xt = xr.data() + static_cast<size_t>(t) * k;
                    double acc = 0;
                    for (int c = 0; c < k; ++c) acc += wr[c] * xt[c];
                    ref[static_cast<size_t>(t) * n + r] = static_cast<float>(acc + bias[r]);
                }
            return ref;
        };
        for (int T : {1, 3, 8}) {
            for (bool xb : {false, true}) {
                auto x = test::randn(static_cast<size_t>(T) * k, 23 + T);
                if (xb) x = test::bf16_round(x);
                const std::vector<float> ref_x = reference(x, T);  // the row kernel multiplies x
                const std::vector<float> ref_bf16 = xb ? ref_x : reference(test::bf16_round(x), T);  // the MMA ones
                // row; MMA, one-wave MMA with f16 MMAs (at one token), with bf16 MMAs; kAuto
                for (int variant = 0; variant < 6; ++variant) {
                    const GemvFp8Kernel kind = variant == 0       ? GemvFp8Kernel::kRowPerWarp
                                               : variant == 5     ? GemvFp8Kernel::kAuto
                                               : variant % 2 == 1 ? GemvFp8Kernel::kMma
                                                                  : GemvFp8Kernel::kMmaOneWave;
                    const bool mma = variant > 0, f16 = variant <= 2 || variant == 5;
                    const std::vector<float>& ref = mma ? ref_bf16 : ref_x;
                    auto dx = xb ? test::to_device(test::to_bf16(x)) : test::to_device(x);
                    auto dy = test::poisoned(ref.size() * 4);
                    gemv_bf16w(fp8_gemv_args(f8, dx, xb, db, dy, T, kind, f16), nullptr);
                    EXPECT_TRUE(close(test::to_host<float>(dy, ref.size()), ref, kTolF32, "fp8 gemv"))
                        << "n " << n << " k " << k << " T " << T << " bf16 x " << xb << " kernel "
                        << static_cast<int>(kind) << " f16 " << f16;
                }
            }
        }
    }
}

// Every byte but the two NaNs, block scales 2^-20 .. 2^20, a partial last K block and a partial
// 128-row block; rows r ≡ 5 (mod 16) hold subnormal codes only (exponent bits 0), so a kernel that
// flushed or misread them would lose those rows' whole sums. The check is per output: |Δ| ≤ 1e-4 ·
// Σ_k |w_k · x_k|, above fp32 summation's worst case (k · 2^-24 ≈ 2e-5 of that sum at k = 320) and
// far below any wrong code or scale. x is bf16, so both kernels multiply the same values.
TEST(CudaFp8Gemv, EveryCodeAndScale) {
    REQUIRE_GPU();
    const int n = 272, k = 320, k_pad = 384, kb = k_pad / 128, nb = (n + 127) / 128;
    std::vector<uint8_t> q(static_cast<size_t>(n) * k_pad);
    for (size_t i = 0; i < q.size(); ++i) {
        uint8_t b = static_cast<uint8_t>((i * 37 + i / 256) & 0xff);
        if ((i / k_pad) % 16 == 5) b &= 0x87;  // sign and mantissa: a subnormal (or zero)
        if ((b & 0x7f) == 0x7f) b ^= 1;        // 0x7f / 0xff are NaN
        q[i] = b;
    }
    std::vector<float> sc(static_cast<size_t>(nb) * kb);
    for (size_t i = 0; i < sc.size(); ++i) sc[i] = std::ldexp(1.0f, static_cast<int>(i * 7 % 41) - 20);
    const auto bias = test::randn(n, 31, 0.1f);
    Fp8Weight f8;
    f8.n = n;
    f8.k = k;
    f8.k_pad = k_pad;
    f8.q = test::to_device(q);
    f8.scales = test::to_device(sc);
    DeviceBuffer db = test::to_device(bias);
    for (int T : {1, 2, 5, 8}) {
        const auto x = test::bf16_round(test::randn(static_cast<size_t>(T) * k, 40 + T));
        std::vector<double> ref(static_cast<size_t>(T) * n), mag(ref.size());
        for (int t = 0; t < T; ++t)
            for (int r = 0; r < n; ++r) {
                double acc = 0, m = 0;
                for (int c = 0; c < k; ++c) {
                    const double p = static_cast<double>(fp8e4m3_to_f32(q[static_cast<size_t>(r) * k_pad + c])) *
                                     sc[static_cast<size_t>(r / 128) * kb + c / 128] *
                                     x[static_cast<size_t>(t) * k + c];
                    acc += p;
                    m += std::fabs(p);
                }
                ref[static_cast<size_t>(t) * n + r] = acc + bias[r];
                mag[static_cast<size_t>(t) * n + r] = m;
            }
        auto dx = test::to_device(test::to_bf16(x));
        for (int variant = 0; variant < 5; ++variant) {  // as above
            const GemvFp8Kernel kind = variant == 0       ? GemvFp8Kernel::kRowPerWarp
                                       : variant % 2 == 1 ? GemvFp8Kernel::kMma
                                                          : GemvFp8Kernel::kMmaOneWave;
            auto dy = test::poisoned(ref.size() * 4);
            gemv_bf16w(fp8_gemv_args(f8, dx, true, db, dy, T, kind, variant <= 2), nullptr);
            const auto got = test::to_host<float>(dy, ref.size());
            int bad = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
                const double tol = 1e-4 * mag[i] + 1e-6 * std::fabs(ref[i]);  // + bias rounding
                if (!(std::fabs(got[i] - ref[i]) <= tol) && ++bad <= 5)
                    ADD_FAILURE() << "T " << T << " variant " << variant << " token " << i / n << " row " << i % n
                                  << ": " << got[i] << " vs " << ref[i] << " (tol " << tol << ")";
            }
            EXPECT_EQ(bad, 0) << "T " << T << " variant " << variant;
        }
    }
}

// The f16 MMAs' overflow path (one token): x reaching f16's range (|x| ≥ 65504) is staged again scaled
// down by 2^s (its largest magnitude then below 2^15) and the sums scaled back. Cases: every value
// × 2^17 (a third beyond the range), one value of 2^20 among plain ones, every value × 2^100 (far past
// any fixed scale), and plain x (the normal path). Reference as above (x rounded to bf16, double
// sums). Tolerance per output: the fp32 one of EveryCodeAndScale, 1e-4 · Σ|w·x|, plus for the scaled
// cases Σ|w| · 2^-9 (a bound on the rounding of their small values: f16's subnormal step is then
// max|x| · 2^-38, at most 2^-17 here but for the 2^100 case, whose Σ|w·x| term dominates). A
// scaling missed (inf) or not undone (2^s off) fails by orders of magnitude.
TEST(CudaFp8Gemv, F16ScalesXBeyondItsRange) {
    REQUIRE_GPU();
    for (const auto& [n, k] : {std::pair{700, 2880}, {256, 4096}}) {
        const QuantizedWeight qw(n, k, 51);
        const Fp8Weight& f8 = qw.f8;
        const auto bias = test::randn(n, 52, 0.1f);
        DeviceBuffer db = DeviceBuffer::from_host(bias.data(), bias.size() * 4);
        for (int c = 0; c < 4; ++c) {
            auto x = test::randn(static_cast<size_t>(k), 53 + c);
            if (c == 0)
                for (float& v : x) v *= 131072.0f;
            if (c == 1) x[k / 3] = 1048576.0f;
            if (c == 2)
                for (float& v : x) v = std::ldexp(v, 100);
            x = test::bf16_round(x);
            for (GemvFp8Kernel kind : {GemvFp8Kernel::kMma, GemvFp8Kernel::kMmaOneWave}) {
                if (kind == GemvFp8Kernel::kMmaOneWave && f8.k_pad > 3072) continue;  // kMma then
                for (bool xb : {false, true}) {
                    auto dx = xb ? test::to_device(test::to_bf16(x)) : test::to_device(x);
                    auto dy = test::poisoned(static_cast<size_t>(n) * 4);
                    gemv_bf16w(fp8_gemv_args(f8, dx, xb, db, dy, 1, kind, true), nullptr);
                    const auto got = test::to_host<float>(dy, static_cast<size_t>(n));
                    int bad = 0;
                    for (int r = 0; r < n; ++r) {
                        double acc = 0, mag = 0, wsum = 0;
                        for (int i = 0; i < k; ++i) {
                            const double w = qw.w[static_cast<size_t>(r) * k + i];
                            acc += w * x[i];
                            mag += std::fabs(w * x[i]);
                            wsum += std::fabs(w);
                        }
                        const double ref = acc + bias[r];
                        const double tol = 1e-4 * mag + 1e-6 * std::fabs(ref) + (c < 3 ? wsum / 512.0 : 0.0);
                        if (!(std::fabs(got[r] - ref) <= tol) && ++bad <= 5)
                            ADD_FAILURE() << "n " << n << " k " << k << " case " << c << " kernel "
                                          << static_cast<int>(kind) << " bf16 x " << xb << " row " << r << ": "
                                          << got[r] << " vs " << ref << " (tol " << tol << ")";
                    }
                    EXPECT_EQ(bad, 0) << "case " << c;
                }
            }
        }
    }
}

}  // namespace
}  // namespace gptoss::kernels::cuda
