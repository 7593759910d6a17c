// The parallel forward's small CUDA kernels against host loops (exact: integer remaps and copies;
// fp32 sums in the same slot order).
#include <gtest/gtest.h>

#include <random>

#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parallel_ops.h"

namespace gptoss::kernels::cuda {
namespace {

using gptoss::kernels::cuda::DeviceBuffer;

template <typename T>
std::vector<T> download(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

TEST(ParallelOps, EpLocalize) {
    REQUIRE_GPU();
    std::mt19937 rng(3);
    for (int n : {1, 4, 32, 1000, 65536}) {
        std::vector<int32_t> ids(n);
        for (auto& i : ids) i = static_cast<int32_t>(rng() % 128);
        DeviceBuffer d = DeviceBuffer::from_host(ids.data(), ids.size() * 4);
        ep_localize(d.as<int32_t>(), n, 32, 32, nullptr);
        auto got = download<int32_t>(d, n);
        for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], ids[i] >= 32 && ids[i] < 64 ? ids[i] - 32 : 32) << i;
    }
}

TEST(ParallelOps, MoeCombine) {
    REQUIRE_GPU();
    for (int T : {1, 3, 64}) {
        for (int H : {64, 2880}) {
            const int K = 4;
            auto y = test::randn(static_cast<size_t>(T) * K * H, 1 + T);
            auto w = test::randn(static_cast<size_t>(T) * K, 2 + T);
            DeviceBuffer dy = DeviceBuffer::from_host(y.data(), y.size() * 4);
            DeviceBuffer dw = DeviceBuffer::from_host(w.data(), w.size() * 4);
            DeviceBuffer out(static_cast<size_t>(T) * H * 4);
            moe_combine(dy.as<float>(), dw.as<float>(), T, K, H, out.as<float>(), nullptr);
            auto got = download<float>(out, static_cast<size_t>(T) * H);
            for (int t = 0; t < T; ++t)
                for (int i = 0; i < H; ++i) {
                    float acc = 0;
                    for (int s = 0; s < K; ++s) acc += w[t * K + s] * y[(static_cast<size_t>(t) * K + s) * H + i];
                    // Same order, but the device may contract into FMAs: a few ulps.
                    ASSERT_NEAR(got[static_cast<size_t>(t) * H + i], acc, 1e-5f * (1.0f + std::fabs(acc)));
                }
        }
    }
}

TEST(ParallelOps, VocabInterleave) {
    REQUIRE_GPU();
    for (int tp : {1, 2, 4, 8}) {
        for (int V : {997, 201088}) {
            const int rows = 3, chunk = (V + tp - 1) / tp;
            std::vector<float> g(static_cast<size_t>(tp) * rows * chunk);
            for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
            DeviceBuffer dg = DeviceBuffer::from_host(g.data(), g.size() * 4);
            DeviceBuffer out(static_cast<size_t>(rows) * V * 4);
            vocab_interleave(dg.as<float>(), tp, rows, chunk, V, out.as<float>(), nullptr);
            auto got = download<float>(out, static_cast<size_t>(rows) * V);
            for (int r = 0; r < rows; ++r)
                for (int v = 0; v < V; ++v)
                    ASSERT_EQ(got[static_cast<size_t>(r) * V + v],
                              g[(static_cast<size_t>(v / chunk) * rows + r) * chunk + v % chunk]);
        }
    }
}

}  // namespace
}  // namespace gptoss::kernels::cuda
