// FP8 block-scaled experts: the quantizer (power-of-two scales, partial blocks), the converter's
// on-disk format, and the CPU forward on converted checkpoints against the source.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "kernels/cpu/cpu_common.h"
#include "model/fp8_convert.h"
#include "model/gpt_oss_forward.h"
#include "model/gpt_oss_weights.h"
#include "model/safetensors_file.h"

namespace gptoss::model {
namespace {

namespace fs = std::filesystem;

TEST(Fp8Convert, BlockScalesArePowersOfTwoAndFit) {
    for (float amax : {1e-6f, 0.3f, 1.0f, 448.0f, 449.0f, 896.0f, 3.5e4f}) {
        const float s = fp8_block_scale(amax);
        int e = 0;
        EXPECT_EQ(std::frexp(s, &e), 0.5f) << amax;  // a power of two
        EXPECT_LE(amax / s, 448.0f) << amax;
        EXPECT_GT(amax / s, 224.0f) << amax;  // the smallest such power
    }
    EXPECT_EQ(fp8_block_scale(0.0f), 1.0f);
    // Below 448 · 2^-126 the scale stays at 2^-126 (kFp8MinScale), so that 1 / s is finite: a subnormal
    // scale made it inf, zeros quantized to NaN (0 · inf) and the rest saturated (a checkpoint with MXFP4
    // scale bytes ≤ 4 converted to NaN logits).
    for (float amax : {6.0f * 0x1p-123f, 0x1p-140f, 1e-45f}) {
        EXPECT_EQ(fp8_block_scale(amax), kFp8MinScale) << amax;
        EXPECT_TRUE(std::isfinite(1.0f / fp8_block_scale(amax)));
    }
    EXPECT_EQ(fp8_block_scale(448.0f * 0x1p-126f), kFp8MinScale);
    EXPECT_EQ(fp8_block_scale(449.0f * 0x1p-126f), 0x1p-125f);
    // A block of tiny MXFP4-like values (codes times 2^-123) with zeros: every byte finite, the values exact.
    std::vector<float> w(128 * 128);
    for (size_t i = 0; i < w.size(); ++i) w[i] = (i % 3 == 0 ? 0.0f : (i % 7) * 0.5f) * 0x1p-123f;
    std::vector<uint8_t> q(w.size());
    float scale = 0.0f;
    quantize_fp8_blocks(w.data(), 128, 128, q.data(), &scale);
    EXPECT_EQ(scale, kFp8MinScale);
    for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_NE(q[i] & 0x7f, 0x7f) << i << ": NaN";
        EXPECT_EQ(fp8e4m3_to_f32(q[i]) * scale, w[i]) << i;
    }
}

TEST(Fp8Convert, PartialBlocksAndRoundTripError) {
    // 200 × 160: blocks of 128 plus a 72-row and a 32-column remainder, each scaled on its own.
    const int rows = 200, cols = 160;
    std::mt19937 rng(1);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::vector<float> w(rows * cols);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
            w[r * cols + c] = n(rng) * (c >= 128 ? 100.0f : 1.0f) * (r >= 128 ? 0.01f : 1.0f);
    std::vector<uint8_t> q(w.size());
    std::vector<float> s(2 * 2);
    quantize_fp8_blocks(w.data(), rows, cols, q.data(), s.data());
    double num = 0, den = 0;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            const float back = fp8e4m3_to_f32(q[r * cols + c]) * s[(r / 128) * 2 + c / 128];
            const float ref = w[r * cols + c];
            // e4m3 keeps 3 mantissa bits: relative rounding ≤ 2^-4 for normal values; values far
            // below their block's maximum lose more (subnormals), bounded by half the smallest step.
            EXPECT_LE(std::fabs(back - ref), std::fabs(ref) / 16 + s[(r / 128) * 2 + c / 128] * std::ldexp(1.0f, -10))
                << r << "," << c;
            num += (back - ref) * (back - ref);
            den += ref * ref;
        }
    EXPECT_LT(std::sqrt(num / den), 0.04);  // ~2.5% RMS for Gaussian weights
    // Each block was scaled by its own maximum: the small bottom-left block is not crushed.
    EXPECT_LT(s[1 * 2 + 0], s[0 * 2 + 0] / 32);
}

TEST(Fp8Convert, Mxfp4ValuesConvertExactly) {
    // e2m1 codes times power-of-two group scales spanning 2^-3 .. 2^3 inside one block.
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    std::vector<float> w(128 * 128);
    std::mt19937 rng(2);
    for (size_t i = 0; i < w.size(); ++i) {
        const int group_exp = static_cast<int>((i / 32) % 7) - 3;
        w[i] = (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(e2m1[rng() % 8], group_exp);
    }
    std::vector<uint8_t> q(w.size());
    float s = 0;
    quantize_fp8_blocks(w.data(), 128, 128, q.data(), &s);
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(fp8e4m3_to_f32(q[i]) * s, w[i]) << i;
}

class Fp8CheckpointTest : public ::testing::Test {
protected:
    static std::string out_dir(const char* name) {
        return (fs::temp_directory_path() / ("gptoss_fp8_" + std::string(name) + "_" + std::to_string(::getpid())))
            .string();
    }
};

// Source vs converted logits on the committed fixtures (MXFP4 layout, sharded, and transformers'
// bf16 layout of the same MXFP4-representable values): the conversion is lossless (power-of-two
// scales, see fp8_convert.h), so logits agree to fp32 summation noise (measured ≤ 3e-7). Lossy
// conversion of arbitrary weights is bounded by PartialBlocksAndRoundTripError.
TEST_F(Fp8CheckpointTest, ConvertedFixturesMatchTheirSource) {
    for (const auto& [name, tol] :
         {std::pair<const char*, double>{"tiny_a", 1e-5}, {"tiny_b", 1e-5}, {"tiny_a_bf16", 1e-5}}) {
        const std::string src = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/" + name;
        const std::string dst = out_dir(name);
        Status st = convert_to_fp8(src, dst);
        ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
        auto a = GptOssWeights::load(src);
        auto b = GptOssWeights::load(dst);
        ASSERT_TRUE(a.ok() && b.ok()) << name << ": " << b.status().to_string();
        EXPECT_EQ((*b)->layers[0].expert_format, kernels::ExpertFormat::kFp8Block);
        ASSERT_TRUE((*b)->config.quantization.has_value());
        EXPECT_EQ((*b)->config.quantization->quant_method, kFp8QuantMethod);
        std::vector<int32_t> ids(40);
        for (int i = 0; i < 40; ++i) ids[i] = (i * 37 + 11) % (*a)->config.vocab_size;
        SingleSequence sa(**a, 64), sb(**b, 64);
        std::vector<float> la, lb;
        ASSERT_TRUE(sa.append(ids, true, &la).ok());
        ASSERT_TRUE(sb.append(ids, true, &lb).ok());
        ASSERT_EQ(la.size(), lb.size());
        double num = 0, den = 0;
        for (size_t i = 0; i < la.size(); ++i) {
            num += (la[i] - lb[i]) * (la[i] - lb[i]);
            den += la[i] * la[i];
        }
        std::printf("  %s -> fp8: logits relative L2 %.3g (tolerance %.0e)\n", name, std::sqrt(num / den), tol);
        EXPECT_LE(std::sqrt(num / den), tol) << name;
        // The same model in other expert bytes: the same fingerprint (a prefill worker on either serves the other).
        EXPECT_EQ(model_fingerprint(**a), model_fingerprint(**b)) << name;
        std::error_code ec;
        fs::remove_all(dst, ec);
    }
}

// model_fingerprint (the prefill/decode handoff's KvFormat::model_id): one model in MXFP4 or transformers' bf16 layout
// gives one fingerprint; another checkpoint of the same shapes, another rope or eps, or attention weights rounded to
// FP8 (--dense) give others. A prefill worker on a model of another seed had been accepted (the shapes match) and its
// KV gave wrong tokens without an error.
TEST_F(Fp8CheckpointTest, ModelFingerprintTellsCheckpointsApart) {
    const std::string dir = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/";
    auto a = GptOssWeights::load(dir + "tiny_a");
    auto a16 = GptOssWeights::load(dir + "tiny_a_bf16");
    auto b = GptOssWeights::load(dir + "tiny_b");
    ASSERT_TRUE(a.ok() && a16.ok() && b.ok());
    const uint64_t fa = model_fingerprint(**a);
    EXPECT_NE(fa, 0u);
    EXPECT_EQ(fa, model_fingerprint(**a16));
    EXPECT_NE(fa, model_fingerprint(**b));
    auto again = GptOssWeights::load(dir + "tiny_a");
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(fa, model_fingerprint(**again));
    (*again)->config.rope_theta *= 2;
    EXPECT_NE(fa, model_fingerprint(**again));
    (*again)->config.rope_theta = (*a)->config.rope_theta;
    (*again)->config.rms_norm_eps *= 10;
    EXPECT_NE(fa, model_fingerprint(**again));
    (*again)->config.rms_norm_eps = (*a)->config.rms_norm_eps;
    (*again)->layers.back().sinks[0] += 1.0f;  // one value of one small vector
    EXPECT_NE(fa, model_fingerprint(**again));
    const std::string dst = out_dir("fingerprint_dense");
    ASSERT_TRUE(convert_to_fp8(dir + "tiny_a", dst, /*dense=*/true).ok());
    auto d = GptOssWeights::load(dst);
    ASSERT_TRUE(d.ok());
    EXPECT_NE(fa, model_fingerprint(**d));
    std::error_code ec;
    fs::remove_all(dst, ec);
}

// --dense: the attention projections (and an untied lm_head) become FP8 blocks too. Loading
// dequantizes them to bf16, which must equal the block quantization of the source weights (the
// rule --fp8 applies at load on CUDA) to the bit; the experts stay lossless. The logits move by the
// FP8 rounding of those weights (e4m3: 2^-4 relative): measured 0.052 (tiny_a) and 0.057 (tiny_b)
// relative L2, top-1 on 39 of 40 positions each, as --fp8 on CUDA (median 0.056 at real widths).
// Bounds with room for other seeds: 0.1 and 90%.
TEST_F(Fp8CheckpointTest, DenseConversionQuantizesAttentionAndLmHead) {
    for (const char* name : {"tiny_a", "tiny_b"}) {
        const std::string src = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/" + name;
        const std::string dst = out_dir((std::string(name) + "_dense").c_str());
        Status st = convert_to_fp8(src, dst, /*dense=*/true);
        ASSERT_TRUE(st.ok()) << name << ": " << st.to_string();
        auto a = GptOssWeights::load(src);
        auto b = GptOssWeights::load(dst);
        ASSERT_TRUE(a.ok()) << a.status().to_string();
        ASSERT_TRUE(b.ok()) << name << ": " << b.status().to_string();
        auto ckpt = SafetensorsCheckpoint::open_dir(dst);
        ASSERT_TRUE(ckpt.ok());
        EXPECT_NE((*ckpt)->find("model.layers.0.self_attn.q_proj.weight_fp8"), nullptr);
        EXPECT_EQ((*ckpt)->find("model.layers.0.self_attn.q_proj.weight"), nullptr);
        EXPECT_NE((*ckpt)->find("model.layers.0.mlp.router.weight"), nullptr);  // not converted
        ASSERT_TRUE((*b)->config.quantization.has_value());
        EXPECT_EQ((*b)->config.quantization->extra.value("dense_fp8", false), true);
        // Every converted matrix: loaded bf16 == quantize_fp8_blocks(source) dequantized, exactly.
        const auto check = [&](const DenseWeight& src_w, const DenseWeight& got, const std::string& what) {
            const int rows = src_w.rows, cols = src_w.cols;
            std::vector<float> f(static_cast<size_t>(rows) * cols), g(f.size());
            for (int r = 0; r < rows; ++r) {
                kernels::cpu::row_to_f32(
                    static_cast<const uint8_t*>(src_w.data) + static_cast<size_t>(r) * cols * dtype_size(src_w.dtype),
                    src_w.dtype, cols, f.data() + static_cast<size_t>(r) * cols);
                kernels::cpu::row_to_f32(
                    static_cast<const uint8_t*>(got.data) + static_cast<size_t>(r) * cols * dtype_size(got.dtype),
                    got.dtype, cols, g.data() + static_cast<size_t>(r) * cols);
            }
            const int bc = (cols + 127) / 128;
            std::vector<uint8_t> q(f.size());
            std::vector<float> sc(static_cast<size_t>((rows + 127) / 128) * bc);
            quantize_fp8_blocks(f.data(), rows, cols, q.data(), sc.data());
            size_t bad = 0;
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c) {
                    const size_t i = static_cast<size_t>(r) * cols + c;
                    bad += g[i] != fp8e4m3_to_f32(q[i]) * sc[static_cast<size_t>(r / 128) * bc + c / 128];
                }
            EXPECT_EQ(bad, 0u) << name << " " << what;
        };
        for (size_t l = 0; l < (*a)->layers.size(); ++l) {
            check((*a)->layers[l].q_proj, (*b)->layers[l].q_proj, "q_proj " + std::to_string(l));
            check((*a)->layers[l].k_proj, (*b)->layers[l].k_proj, "k_proj " + std::to_string(l));
            check((*a)->layers[l].v_proj, (*b)->layers[l].v_proj, "v_proj " + std::to_string(l));
            check((*a)->layers[l].o_proj, (*b)->layers[l].o_proj, "o_proj " + std::to_string(l));
        }
        if ((*ckpt)->find("lm_head.weight_fp8") != nullptr) check((*a)->lm_head, (*b)->lm_head, "lm_head");
        std::vector<int32_t> ids(40);
        for (int i = 0; i < 40; ++i) ids[i] = (i * 37 + 11) % (*a)->config.vocab_size;
        SingleSequence sa(**a, 64), sb(**b, 64);
        std::vector<float> la, lb;
        ASSERT_TRUE(sa.append(ids, true, &la).ok());
        ASSERT_TRUE(sb.append(ids, true, &lb).ok());
        ASSERT_EQ(la.size(), lb.size());
        const int V = (*a)->config.vocab_size;
        double num = 0, den = 0;
        int same = 0, rows = static_cast<int>(la.size() / V);
        for (int r = 0; r < rows; ++r) {
            const float* x = la.data() + static_cast<size_t>(r) * V;
            const float* y = lb.data() + static_cast<size_t>(r) * V;
            same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
            for (int i = 0; i < V; ++i) {
                num += (x[i] - y[i]) * (x[i] - y[i]);
                den += x[i] * x[i];
            }
        }
        std::printf("  %s -> fp8 --dense: logits relative L2 %.3g, top-1 %d/%d\n", name, std::sqrt(num / den), same,
                    rows);
        EXPECT_LE(std::sqrt(num / den), 0.1) << name;
        EXPECT_GE(same * 100, rows * 90) << name;
        std::error_code ec;
        fs::remove_all(dst, ec);
    }
}

// The converted checkpoint `b` lists the same unread tensors as its source `a`, each under the same dtype (as the
// file names it) and shape, byte for byte.
void expect_unread_copied(const GptOssWeights& a, const GptOssWeights& b) {
    EXPECT_EQ(b.unused_tensors, a.unused_tensors);
    for (const std::string& n : a.unused_tensors) {
        const TensorInfo* x = a.checkpoint->find(n);
        const TensorInfo* y = b.checkpoint->find(n);
        ASSERT_NE(y, nullptr) << n;
        EXPECT_EQ(y->dtype_string(), x->dtype_string()) << n;
        EXPECT_TRUE(y->shape == x->shape) << n;
        EXPECT_TRUE(x->nbytes == y->nbytes && std::memcmp(x->data, y->data, x->nbytes) == 0) << n;
    }
}

// A config with fewer layers than the file: the layers it reads are converted, the rest copied as they are (the
// output held the unread layer's attention but not its experts: half a layer). The output lists the same unread
// tensors as its source, with --dense too.
TEST_F(Fp8CheckpointTest, UnreadTensorsAreCopiedWhole) {
    const std::string fixture = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/tiny_a";
    const std::string src = out_dir("short_src");
    fs::create_directories(src);
    fs::copy_file(fixture + "/model.safetensors", src + "/model.safetensors", fs::copy_options::overwrite_existing);
    auto full = GptOssConfig::from_file(fixture + "/config.json");
    ASSERT_TRUE(full.ok());
    GptOssConfig c = *full;
    c.num_hidden_layers -= 1;
    c.layer_types.pop_back();
    std::ofstream(src + "/config.json") << c.to_hf_json().dump();
    auto a = GptOssWeights::load(src);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    const std::string last = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    ASSERT_FALSE((*a)->unused_tensors.empty());
    for (const std::string& n : (*a)->unused_tensors) EXPECT_EQ(n.rfind(last, 0), 0u) << n;
    for (bool dense : {false, true}) {
        const std::string dst = out_dir(dense ? "short_dense" : "short");
        Status st = convert_to_fp8(src, dst, dense);
        ASSERT_TRUE(st.ok()) << st.to_string();
        auto b = GptOssWeights::load(dst);
        ASSERT_TRUE(b.ok()) << b.status().to_string();
        SCOPED_TRACE(dense ? "dense" : "experts only");
        expect_unread_copied(**a, **b);
        std::error_code ec;
        fs::remove_all(dst, ec);
    }
    std::error_code ec;
    fs::remove_all(src, ec);
}

// Tensors of dtypes the engine does not compute with (F64, BOOL, sub-byte F4) beside the model's, in a second shard
// of an indexed checkpoint: the model loads (they are unread) and convert writes them back as they were.
TEST_F(Fp8CheckpointTest, ForeignDtypeTensorsLoadAndAreCopied) {
    const std::string fixture = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/tiny_a";
    const std::string src = out_dir("foreign_src");
    fs::create_directories(src);
    fs::copy_file(fixture + "/config.json", src + "/config.json", fs::copy_options::overwrite_existing);
    fs::copy_file(fixture + "/model.safetensors", src + "/model-00001-of-00002.safetensors",
                  fs::copy_options::overwrite_existing);
    std::string header = R"({"extra.f64":{"dtype":"F64","shape":[2,2],"data_offsets":[0,32]},)"
                         R"("extra.mask":{"dtype":"BOOL","shape":[3],"data_offsets":[32,35]},)"
                         R"("extra.f4":{"dtype":"F4","shape":[2,4],"data_offsets":[35,39]}})";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header;
    for (int i = 0; i < 39; ++i) bytes.push_back(static_cast<char>(i * 37 + 5));
    std::ofstream(src + "/model-00002-of-00002.safetensors", std::ios::binary) << bytes;
    nlohmann::json index;
    {
        auto fx = SafetensorsCheckpoint::open_dir(fixture);
        ASSERT_TRUE(fx.ok()) << fx.status().to_string();
        for (const std::string& n : (*fx)->names()) index["weight_map"][n] = "model-00001-of-00002.safetensors";
    }
    for (const char* n : {"extra.f64", "extra.mask", "extra.f4"})
        index["weight_map"][n] = "model-00002-of-00002.safetensors";
    std::ofstream(src + "/model.safetensors.index.json") << index.dump();

    auto a = GptOssWeights::load(src);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ((*a)->unused_tensors, (std::vector<std::string>{"extra.f4", "extra.f64", "extra.mask"}));
    const std::string dst = out_dir("foreign_dst");
    Status st = convert_to_fp8(src, dst, false);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto b = GptOssWeights::load(dst);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    expect_unread_copied(**a, **b);
    std::error_code ec;
    fs::remove_all(dst, ec);
    fs::remove_all(src, ec);
}

TEST_F(Fp8CheckpointTest, RejectsBadInvocations) {
    const std::string src = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/checkpoints/tiny_a";
    EXPECT_FALSE(convert_to_fp8(src, src).ok());  // in place
    EXPECT_FALSE(convert_to_fp8("/nonexistent/model", out_dir("x")).ok());
    const std::string once = out_dir("twice");
    ASSERT_TRUE(convert_to_fp8(src, once).ok());
    EXPECT_FALSE(convert_to_fp8(once, out_dir("twice2")).ok());  // already FP8
    std::error_code ec;
    fs::remove_all(once, ec);
}

}  // namespace
}  // namespace gptoss::model
