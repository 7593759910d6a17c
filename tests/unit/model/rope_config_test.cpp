// The engine's rotary tables against transformers' own, for config.json variants of the rope fields.
// tests/data/hf_rope_cases.json comes from tools/hf_rope_probe.py run with transformers 5.17 (the GPU host's):
// each case is a whole config.json and what GptOssRotaryEmbedding computed from it (inv_freq, attention_scaling)
// or the error transformers raised.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt_oss_config.h"
#include "model/gpt_oss_forward.h"

namespace gptoss::model {
namespace {

using nlohmann::json;

// Cases transformers runs but the engine refuses, each with the reason and the words its error must contain.
const std::map<std::string, std::string>& refused_cases() {
    static const std::map<std::string, std::string> m = {
        // transformers logs "factor field must be a float or int >= 1" and runs anyway.
        {"factor_0_5", "must be at least 1"},
        // GptOssRotaryEmbedding makes head_dim / 4 frequencies, which the model's rotation of head_dim / 2 pairs
        // cannot take: a checkpoint with it does not run in transformers either.
        {"partial_rotary_0_5", "partial_rotary_factor (0.5) is not supported"},
    };
    return m;
}

TEST(RopeConfig, MatchesTransformers) {
    std::ifstream f(std::string(GPTOSS_SOURCE_DIR) + "/tests/data/hf_rope_cases.json");
    ASSERT_TRUE(f.good());
    const json data = json::parse(f);
    ASSERT_GE(data.at("cases").size(), 20u);
    int compared = 0;
    for (const json& c : data.at("cases")) {
        const std::string name = c.at("name");
        SCOPED_TRACE(name);
        auto parsed = GptOssConfig::from_json_text(c.at("config").dump());
        Status status = parsed.ok() ? parsed->validate() : parsed.status();
        if (!c.at("ok").get<bool>()) {  // transformers refused it: so must the engine
            EXPECT_FALSE(status.ok()) << "transformers: " << c.at("error");
            continue;
        }
        if (auto it = refused_cases().find(name); it != refused_cases().end()) {
            ASSERT_FALSE(status.ok());
            EXPECT_NE(status.to_string().find(it->second), std::string::npos) << status.to_string();
            continue;
        }
        ASSERT_TRUE(status.ok()) << status.to_string();
        std::vector<float> inv_freq;
        const float scaling = rope_frequencies(*parsed, &inv_freq);
        const std::vector<double> want = c.at("inv_freq").get<std::vector<double>>();
        ASSERT_EQ(inv_freq.size(), want.size());
        // transformers computes in fp32 too; the tolerance (~4 ulp) covers powf's last-bit differences between libm and
        // torch (a few ulp), far below what a wrong ramp bound, factor or original context moves (≥ 1%).
        for (size_t i = 0; i < want.size(); ++i)
            EXPECT_NEAR(inv_freq[i], want[i], 2.5e-7 * std::abs(want[i])) << "inv_freq[" << i << "]";
        EXPECT_NEAR(scaling, c.at("attention_scaling").get<double>(), 1e-6);
        ++compared;
    }
    EXPECT_GE(compared, 18);
}

}  // namespace
}  // namespace gptoss::model
