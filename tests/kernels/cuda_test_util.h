// Helpers for CUDA-vs-CPU kernel tests: device presence, buffers, random data, comparisons.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/device_buffer.h"

namespace gptoss::test {

// Every CUDA test starts with this: a clear skip where no GPU is present (CI, dev machines).
#define REQUIRE_GPU()                                                         \
    do {                                                                      \
        int _n = 0;                                                           \
        if (cudaGetDeviceCount(&_n) != cudaSuccess || _n == 0)                \
            GTEST_SKIP() << "no CUDA device: GPU tests run on the H200 only"; \
    } while (0)

// Tolerances, one table (STYLE.md §13), each with its reason:
struct Tol {
    double rel_l2;
    double max_abs_frac;  // max |Δ| as a fraction of max |ref|
};
// fp32 arithmetic on identical inputs; only summation order differs.
inline constexpr Tol kTolF32{1e-5, 1e-4};
// bf16 outputs (8 significant bits: 2^-9 relative rounding) of fp32-accumulated math.
inline constexpr Tol kTolBf16Out{5e-3, 1e-2};
// bf16 activations feeding further fp32 math (GEMM inputs rounded to bf16 once).
inline constexpr Tol kTolBf16In{1e-2, 3e-2};

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = offset + scale * d(rng);
    return v;
}

// Rounds through bf16 so CPU and GPU see the same values.
inline std::vector<float> bf16_round(std::vector<float> v) {
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
    return v;
}
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    return b;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& b) {
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
    return v;
}

template <typename T>
kernels::cuda::DeviceBuffer to_device(const std::vector<T>& v) {
    return kernels::cuda::DeviceBuffer::from_host(v.data(), v.size() * sizeof(T));
}
template <typename T>
std::vector<T> to_host(const kernels::cuda::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
}
// Poison (NaN bytes) so unwritten outputs fail the comparison.
inline kernels::cuda::DeviceBuffer poisoned(size_t bytes) {
    kernels::cuda::DeviceBuffer b(bytes);
    cudaMemset(b.get(), 0xff, bytes);
    return b;
}

// Compares got to ref; prints the worst element and the first mismatches on failure.
inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, Tol tol,
                                        const char* what) {
    if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
    double num = 0, den = 0, max_ref = 0, worst = 0;
    size_t worst_i = 0, nan = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) {
            ++nan;
            continue;
        }
        const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
        num += d * d;
        den += static_cast<double>(ref[i]) * ref[i];
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%s: rel L2 %.3g (tol %.1g), worst |Δ| %.3g at %zu (got %g, ref %g; tol %.3g), %zu non-finite", what,
                  rel, tol.rel_l2, worst, worst_i, got.empty() ? 0.0 : got[worst_i], ref.empty() ? 0.0 : ref[worst_i],
                  tol.max_abs_frac * max_ref, nan);
    std::printf("  %s\n", buf);
    if (nan == 0 && rel <= tol.rel_l2 && worst <= tol.max_abs_frac * max_ref + 1e-30)
        return ::testing::AssertionSuccess();
    auto f = ::testing::AssertionFailure() << buf << "; first mismatches:";
    int shown = 0;
    for (size_t i = 0; i < ref.size() && shown < 5; ++i) {
        const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
        if (!std::isfinite(got[i]) || d > tol.max_abs_frac * max_ref) {
            f << " [" << i << "] " << got[i] << " vs " << ref[i];
            ++shown;
        }
    }
    return f;
}

}  // namespace gptoss::test
