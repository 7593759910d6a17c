// Conditioning of the random checkpoints `gptoss init-model` writes (issue 5): a bf16 forward must
// agree with an fp32 one as it would on a trained model, so that the CUDA backend (bf16 GEMM inputs
// and KV cache, fp32 residual) can be held to transformers fp32 at last-position relative L2
// <= 2e-2 and top-1 agreement >= 99%. The CUDA path matches CpuForward(emulate_bf16) to ~1e-3
// (tests/kernels), so this checks the precision gap itself on the CPU: fp32 vs emulate_bf16 on a
// small model written by write_random_checkpoint. It also checks that the conditioning did not make
// the model degenerate: the SwiGLU clamp, the sinks and the biases must still move the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "model/gpt_oss_forward.h"
#include "model/random_checkpoint.h"

namespace gptoss::model {
namespace {

namespace fs = std::filesystem;

// Issue 5's acceptance thresholds, applied to the bf16-emulating CPU forward against the fp32 one.
// Measured on this model: top-1 100%, last-position relative L2 ~2.5e-3 (bench/NOTES.md, "Accuracy
// conditioning (session 2)"); the previous init gave 95-96% and up to 5e-2 on 24 layers, so these
// fail if the conditioning regresses, while leaving the CUDA path (another ~1e-3 away from the
// emulation) inside the limits.
constexpr double kMaxLastRelL2 = 2e-2;
constexpr double kMinTop1Agreement = 0.99;
// A model feature "still matters" when removing it moves the fp32 logits by 10× the fp32 engine vs
// transformers tolerance (1e-4, tests/golden), so an fp32 check sees a bug in it. Measured here:
// clamp 5e-3, sinks 6e-2, down biases 0.13, router biases 1.6e-2.
constexpr double kMinFeatureEffect = 1e-3;

// Small but structured like gpt-oss: 8:1 GQA with head_dim 64, top-4 of 16 experts, alternating
// sliding (window 16) and full layers, 8 layers deep (depth is what amplifies rounding).
GptOssConfig conditioning_config() {
    auto c = GptOssConfig::preset("tiny");
    EXPECT_TRUE(c.ok());
    GptOssConfig cfg = *c;
    cfg.hidden_size = 256;
    cfg.intermediate_size = 256;
    cfg.num_hidden_layers = 8;
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = 1;
    cfg.num_experts = 16;
    cfg.vocab_size = 4096;
    cfg.sliding_window = 16;
    cfg.max_position_embeddings = 4096;
    cfg.layer_types.clear();
    for (int l = 0; l < cfg.num_hidden_layers; ++l)
        cfg.layer_types.push_back(l % 2 ? LayerType::kFullAttention : LayerType::kSlidingAttention);
    cfg.eos_token_ids = {1};
    cfg.pad_token_id = 2;
    cfg.bos_token_id.reset();
    return cfg;
}

class ConditioningTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = (fs::temp_directory_path() / ("gptoss_conditioning_test_" + std::to_string(::getpid()))).string();
        RandomCheckpointOptions opt;
        opt.seed = 21;
        Status st = write_random_checkpoint(conditioning_config(), dir_, opt);
        ASSERT_TRUE(st.ok()) << st.to_string();
        auto w = GptOssWeights::load(dir_);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        weights_ = std::move(*w).release();
    }
    static void TearDownTestSuite() {
        delete weights_;
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    // Logits [ids.size(), vocab] for every position of one prompt.
    static std::vector<float> run(const std::vector<int32_t>& ids, bool emulate_bf16) {
        const int n = static_cast<int>(ids.size()), bs = 16, blocks = (n + bs - 1) / bs;
        CpuForward fwd(*weights_, emulate_bf16);
        CpuKvCache kv(weights_->config, bs, blocks, blocks);
        std::vector<int32_t> table(blocks);
        for (int b = 0; b < blocks; ++b) table[b] = b;
        ForwardSequence s{ids, 0, table, table, true};
        std::vector<float> logits;
        Status st = fwd.forward(std::span<const ForwardSequence>(&s, 1), kv, &logits);
        EXPECT_TRUE(st.ok()) << st.to_string();
        return logits;
    }
    static std::vector<int32_t> prompt(int n, uint32_t seed) {
        std::mt19937 rng(seed);
        std::vector<int32_t> ids(n);
        for (auto& id : ids) id = static_cast<int32_t>(rng() % weights_->config.vocab_size);
        return ids;
    }
    static double rel_l2(const float* a, const float* ref, int n) {
        double d = 0, r = 0;
        for (int i = 0; i < n; ++i) {
            d += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
            r += static_cast<double>(ref[i]) * ref[i];
        }
        return std::sqrt(d / r);
    }
    static int argmax(const float* a, int n) { return static_cast<int>(std::max_element(a, a + n) - a); }

    static inline std::string dir_;
    static inline GptOssWeights* weights_ = nullptr;
};

TEST_F(ConditioningTest, Bf16ForwardAgreesWithFp32) {
    const int V = weights_->config.vocab_size;
    int agree = 0, positions = 0;
    // A short prompt, one a few windows long and one of 20 windows.
    for (int n : {9, 64, 320}) {
        auto ids = prompt(n, 100 + n);
        auto ref = run(ids, false), bf = run(ids, true);
        int a = 0;
        for (int t = 0; t < n; ++t) {
            const size_t off = static_cast<size_t>(t) * V;
            a += argmax(bf.data() + off, V) == argmax(ref.data() + off, V);
        }
        const double last =
            rel_l2(bf.data() + static_cast<size_t>(n - 1) * V, ref.data() + static_cast<size_t>(n - 1) * V, V);
        std::printf("[conditioning] %d tokens: top-1 agreement %.2f%%, last-position rel L2 %.2e\n", n, 100.0 * a / n,
                    last);
        EXPECT_LE(last, kMaxLastRelL2) << n << " tokens";
        agree += a;
        positions += n;
    }
    EXPECT_GE(static_cast<double>(agree) / positions, kMinTop1Agreement);
}

TEST_F(ConditioningTest, NextTokenDistributionIsPeakedButNotOneHot) {
    // A trained LM's top-1 probability is often above 0.3; the plain init's is ~1/V.
    const int V = weights_->config.vocab_size, n = 64;
    auto logits = run(prompt(n, 7), false);
    std::vector<double> p1;
    for (int t = 0; t < n; ++t) {
        const float* l = logits.data() + static_cast<size_t>(t) * V;
        const float mx = l[argmax(l, V)];
        double sum = 0;
        for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(l[v]) - mx);
        p1.push_back(1.0 / sum);
    }
    std::sort(p1.begin(), p1.end());
    std::printf("[conditioning] top-1 probability: 10th percentile %.3f, median %.3f\n", p1[n / 10], p1[n / 2]);
    EXPECT_GE(p1[n / 2], 0.3);
    EXPECT_LE(p1[n / 10], 0.99);  // the context still matters: not every position is certain
}

TEST_F(ConditioningTest, ClampSinksAndBiasesStillMatter) {
    const int V = weights_->config.vocab_size, n = 64;
    auto ids = prompt(n, 3);
    auto base = run(ids, false);
    auto effect = [&](const char* what) {
        auto other = run(ids, false);
        const double e = rel_l2(other.data(), base.data(), n * V);
        std::printf("[conditioning] without %s: logits move by rel L2 %.3f\n", what, e);
        return e;
    };
    GptOssConfig& c = weights_->config;
    const double limit = c.swiglu_limit;
    c.swiglu_limit = 1e30;
    EXPECT_GE(effect("the SwiGLU clamp"), kMinFeatureEffect);
    c.swiglu_limit = limit;

    const std::vector<LayerWeights> saved = weights_->layers;
    for (auto& L : weights_->layers) std::fill(L.sinks.begin(), L.sinks.end(), -1e30f);
    EXPECT_GE(effect("sinks"), kMinFeatureEffect);
    weights_->layers = saved;
    for (auto& L : weights_->layers) std::fill(L.down_bias.begin(), L.down_bias.end(), 0.0f);
    EXPECT_GE(effect("expert down biases"), kMinFeatureEffect);
    weights_->layers = saved;
    for (auto& L : weights_->layers) std::fill(L.router_bias.begin(), L.router_bias.end(), 0.0f);
    EXPECT_GE(effect("router biases"), kMinFeatureEffect);
    weights_->layers = saved;
}

}  // namespace
}  // namespace gptoss::model
