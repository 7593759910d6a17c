// The CPU reference against transformers: every committed checkpoint under tests/data/checkpoints
// (made by tools/make_test_checkpoints.py) must reproduce the reference logits and greedy
// continuations written by transformers (fp32, eager attention).
//
// Tolerance: relative L2 error ≤ 1e-4 per position. Both sides compute in fp32 on identical
// (dequantized) weights; the measured differences are ~1e-6 (summation order only), so 1e-4 leaves
// room for order changes while any real bug (window off by one, a missing bias: MODEL.md §0 lists
// errors of size 1-4) is orders of magnitude larger.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gpt_oss_forward.h"
#include "model/safetensors_file.h"

namespace gptoss::model {
namespace {

namespace fs = std::filesystem;
constexpr double kMaxRelL2 = 1e-4;

std::vector<std::string> checkpoint_dirs() {
    std::vector<std::string> dirs;
    fs::path root = fs::path(GPTOSS_SOURCE_DIR) / "tests/data/checkpoints";
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return dirs;
    for (const auto& e : fs::directory_iterator(root))
        if (fs::exists(e.path() / "config.json")) dirs.push_back(e.path().string());
    std::sort(dirs.begin(), dirs.end());
    return dirs;
}

// The reference for a checkpoint: its own reference.safetensors, or for a re-export of another
// checkpoint (name_bf16), the original's.
std::string reference_file(const std::string& dir) {
    fs::path own = fs::path(dir) / "reference.safetensors";
    if (fs::exists(own)) return own.string();
    std::string name = fs::path(dir).filename().string();
    auto cut = name.rfind('_');
    if (cut != std::string::npos) {
        fs::path sibling = fs::path(dir).parent_path() / name.substr(0, cut) / "reference.safetensors";
        if (fs::exists(sibling)) return sibling.string();
    }
    return "";
}

std::vector<int32_t> as_ids(const TensorInfo& t) {
    const auto* p = reinterpret_cast<const int32_t*>(t.data);
    return std::vector<int32_t>(p, p + t.shape.numel());
}

struct Compare {
    double rel_l2;
    int argmax_ours, argmax_ref;
};

Compare compare_row(const float* ours, const float* ref, int n) {
    double num = 0, den = 0;
    int a = 0, b = 0;
    for (int i = 0; i < n; ++i) {
        double d = static_cast<double>(ours[i]) - ref[i];
        num += d * d;
        den += static_cast<double>(ref[i]) * ref[i];
        if (ours[i] > ours[a]) a = i;
        if (ref[i] > ref[b]) b = i;
    }
    return {std::sqrt(num / std::max(den, 1e-30)), a, b};
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, LogitsGreedyAndIncrementalMatchTransformers) {
    const std::string dir = GetParam();
    const std::string ref_path = reference_file(dir);
    ASSERT_FALSE(ref_path.empty()) << "no reference.safetensors for " << dir;
    auto ref = SafetensorsFile::open(ref_path);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto weights = GptOssWeights::load(dir);
    ASSERT_TRUE(weights.ok()) << weights.status().to_string();
    const int V = (*weights)->config.vocab_size;

    int prompts = 0;
    for (int i = 0;; ++i) {
        const TensorInfo* ids_t = (*ref)->find("prompt" + std::to_string(i) + ".ids");
        const TensorInfo* logits_t = (*ref)->find("prompt" + std::to_string(i) + ".logits");
        if (!ids_t || !logits_t) break;
        ++prompts;
        std::vector<int32_t> ids = as_ids(*ids_t);
        const int T = static_cast<int>(ids.size());
        ASSERT_EQ(logits_t->shape, (Shape{T, V}));
        const auto* want = reinterpret_cast<const float*>(logits_t->data);

        // Whole prompt at once.
        SingleSequence full(**weights, T);
        std::vector<float> got;
        ASSERT_TRUE(full.append(ids, true, &got).ok());
        double worst = 0;
        for (int t = 0; t < T; ++t) {
            Compare c = compare_row(got.data() + static_cast<size_t>(t) * V, want + static_cast<size_t>(t) * V, V);
            worst = std::max(worst, c.rel_l2);
            EXPECT_LE(c.rel_l2, kMaxRelL2) << dir << " prompt " << i << " position " << t;
            EXPECT_EQ(c.argmax_ours, c.argmax_ref) << dir << " prompt " << i << " position " << t;
        }
        // Prefill half, then one token at a time through the KV cache.
        SingleSequence inc(**weights, T);
        std::vector<float> got_inc;
        const int half = T / 2;
        if (half > 0) {
            ASSERT_TRUE(inc.append(std::span(ids).first(half), true, &got_inc).ok());
        }
        for (int t = half; t < T; ++t) ASSERT_TRUE(inc.append(std::span(ids).subspan(t, 1), true, &got_inc).ok());
        for (int t = 0; t < T; ++t) {
            Compare c = compare_row(got_inc.data() + static_cast<size_t>(t) * V, want + static_cast<size_t>(t) * V, V);
            EXPECT_LE(c.rel_l2, kMaxRelL2) << dir << " incremental, prompt " << i << " position " << t;
        }
        std::printf("%s prompt %d: %d tokens, worst relative L2 %.3g\n", fs::path(dir).filename().c_str(), i, T, worst);
    }
    EXPECT_GT(prompts, 0) << "no prompts in " << ref_path;

    int greedy = 0;
    for (int i = 0;; ++i) {
        const TensorInfo* p = (*ref)->find("greedy" + std::to_string(i) + ".prompt");
        const TensorInfo* c = (*ref)->find("greedy" + std::to_string(i) + ".continuation");
        if (!p || !c) break;
        ++greedy;
        std::vector<int32_t> prompt = as_ids(*p), want = as_ids(*c);
        SingleSequence seq(**weights, static_cast<int>(prompt.size() + want.size()));
        std::vector<float> logits;
        ASSERT_TRUE(seq.append(prompt, false, &logits).ok());
        std::vector<int32_t> got;
        for (size_t n = 0; n < want.size(); ++n) {
            int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
            got.push_back(best);
            logits.clear();
            if (n + 1 < want.size()) {
                ASSERT_TRUE(seq.append(std::span(&best, 1), false, &logits).ok());
            }
        }
        EXPECT_EQ(got, want) << dir << " greedy " << i;
    }
    EXPECT_GT(greedy, 0) << "no greedy continuations in " << ref_path;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, GoldenTest, ::testing::ValuesIn(checkpoint_dirs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                             std::string n = fs::path(info.param).filename().string();
                             for (char& ch : n)
                                 if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

TEST(Golden, FixturesArePresent) {
    EXPECT_GE(checkpoint_dirs().size(), 3u) << "tests/data/checkpoints should hold tiny_a, tiny_a_bf16 and tiny_b";
}

}  // namespace
}  // namespace gptoss::model
