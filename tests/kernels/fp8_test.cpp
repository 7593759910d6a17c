// FP8 block-scaled experts on the CUDA backend: the dequantization kernel against the CPU's
// decode (exact), and a converted checkpoint's logits against its MXFP4 source.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fp8.h"
#include "model/cuda_model.h"
#include "model/fp8_convert.h"

namespace gptoss::kernels::cuda {
namespace {

TEST(CudaFp8, BlockDequantMatchesCpu) {
    REQUIRE_GPU();
    for (auto [mats, rows, cols] : {std::tuple<int, int, int>{2, 200, 160}, {1, 5760, 2880}, {3, 64, 128}}) {
        std::mt19937 rng(rows + cols);
        std::vector<uint8_t> q(static_cast<size_t>(mats) * rows * cols);
        for (auto& b : q) {
            b = static_cast<uint8_t>(rng());
            if ((b & 0x7F) == 0x7F) b ^= 1;  // no NaN codes
        }
        const int br = (rows + 127) / 128, bc = (cols + 127) / 128;
        std::vector<float> s(static_cast<size_t>(mats) * br * bc);
        for (auto& v : s) v = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 15);
        DeviceBuffer dq = DeviceBuffer::from_host(q.data(), q.size());
        DeviceBuffer ds = DeviceBuffer::from_host(s.data(), s.size() * 4);
        DeviceBuffer out(q.size() * 2);
        fp8_block_to_bf16(dq.as<uint8_t>(), ds.as<float>(), mats, rows, cols, out.get(), nullptr);
        std::vector<uint16_t> got(q.size());
        CUDA_CHECK(cudaMemcpy(got.data(), out.get(), got.size() * 2, cudaMemcpyDeviceToHost));
        for (int m = 0; m < mats; ++m)
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c) {
                    const size_t i = (static_cast<size_t>(m) * rows + r) * cols + c;
                    const float want = fp8e4m3_to_f32(q[i]) * s[(static_cast<size_t>(m) * br + r / 128) * bc + c / 128];
                    ASSERT_EQ(got[i], f32_to_bf16(want)) << m << "," << r << "," << c;
                }
    }
}

// tiny_a converted to FP8 (lossless from MXFP4) on CUDA: a 100-token prefill takes the bf16 GEMM
// path in both models with identical bf16 weights (equal to fp32 noise); single-token decode steps
// compare the FP8 model's bf16 GEMMs with the MXFP4 model's weight-only kernels on fp32 inputs
// (bf16 input rounding: the kTolBf16In-level 1e-2).
TEST(CudaFp8, ConvertedCheckpointMatchesItsMxfp4Source) {
    REQUIRE_GPU();
    namespace fs = std::filesystem;
    const std::string src = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/tiny_a";
    const std::string dst = (fs::temp_directory_path() / ("gptoss_cuda_fp8_" + std::to_string(::getpid()))).string();
    ASSERT_TRUE(model::convert_to_fp8(src, dst).ok());
    auto a = model::GptOssWeights::load(src);
    auto b = model::GptOssWeights::load(dst);
    ASSERT_TRUE(a.ok() && b.ok());
    const int V = (*a)->config.vocab_size, T = 100;
    std::vector<int32_t> ids(T);
    for (int i = 0; i < T; ++i) ids[i] = (i * 61 + 5) % V;
    std::vector<int32_t> table(T / 16 + 4);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::vector<float> prefill[2], decode[2];
    for (int k = 0; k < 2; ++k) {
        model::CudaModelOptions o;
        o.max_tokens = 512;
        o.max_seqs = 4;
        o.num_blocks_full = 64;
        o.num_blocks_sliding = 64;
        auto m = model::CudaModel::create(k == 0 ? **a : **b, o);
        ASSERT_TRUE(m.ok()) << m.status().to_string();
        model::ForwardSequence s{ids, 0, table, table, false};
        ASSERT_TRUE((*m)->forward(std::span(&s, 1), &prefill[k]).ok());
        for (int t = 0; t < 4; ++t) {
            const int32_t tok = (t * 17 + 3) % V;
            model::ForwardSequence d{std::span(&tok, 1), T + t, table, table, false};
            ASSERT_TRUE((*m)->forward(std::span(&d, 1), &decode[k]).ok());
        }
    }
    auto rel = [](const std::vector<float>& x, const std::vector<float>& y) {
        double num = 0, den = 0;
        for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += y[i] * y[i];
        return std::sqrt(num / den);
    };
    std::printf("  FP8 vs MXFP4 on CUDA: prefill rel L2 %.3g, decode rel L2 %.3g\n", rel(prefill[1], prefill[0]),
                rel(decode[1], decode[0]));
    EXPECT_LE(rel(prefill[1], prefill[0]), 1e-6);
    EXPECT_LE(rel(decode[1], decode[0]), 1e-2);
    std::error_code ec;
    fs::remove_all(dst, ec);
}

}  // namespace
}  // namespace gptoss::kernels::cuda
