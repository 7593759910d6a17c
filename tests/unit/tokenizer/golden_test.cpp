// tests/data/tokenizer_golden.jsonl (tools/make_tokenizer_golden.py, Hugging Face `tokenizers` on the
// same tokenizer.json): one {"category", "text", "ids"} per line, "ids" with encode_ordinary
// semantics; "ids_hf_specials", where present, is what HF gives when it matches special-token text.
// Every line must match exactly, and decode(ids) must give the text back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer_fixture.h"

namespace gptoss::tokenizer {
namespace {

std::vector<int32_t> ids_of(const nlohmann::json& array) {
    std::vector<int32_t> ids;
    for (const auto& id : array) ids.push_back(id.get<int32_t>());
    return ids;
}

TEST(TokenizerGolden, MatchesHuggingFaceTokenizers) {
    const std::string path = std::string(GPTOSS_SOURCE_DIR) + "/tests/data/tokenizer_golden.jsonl";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " does not exist yet";
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    std::ifstream in(path, std::ios::binary);
    std::string line;
    int line_number = 0, checked = 0, failures = 0, with_specials = 0;
    auto report = [&](const std::string& what, const std::string& text, const std::vector<int32_t>& expected,
                      const std::vector<int32_t>& got) {
        if (++failures > 10) return;
        ADD_FAILURE() << path << ":" << line_number << " (" << what << "): text " << ::testing::PrintToString(text)
                      << "\n  expected " << ::testing::PrintToString(expected) << "\n  got      "
                      << ::testing::PrintToString(got);
    };
    while (std::getline(in, line)) {
        ++line_number;
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        ASSERT_TRUE(j.is_object() && j.contains("text") && j["text"].is_string() && j.contains("ids") &&
                    j["ids"].is_array())
            << path << ":" << line_number << ": not {\"text\": string, \"ids\": [...]}";
        const std::string text = j["text"].get<std::string>();
        const std::vector<int32_t> expected = ids_of(j["ids"]);
        ++checked;
        std::vector<int32_t> got = tok->encode_ordinary(text);
        if (got != expected) report("encode_ordinary", text, expected, got);
        if (j.contains("ids_hf_specials")) {
            ++with_specials;
            const std::vector<int32_t> expected_specials = ids_of(j["ids_hf_specials"]);
            std::vector<int32_t> got_specials = tok->encode(text, {}, /*allow_all_special=*/true);
            if (got_specials != expected_specials) report("all specials", text, expected_specials, got_specials);
        } else if (tok->encode(text, {}, /*allow_all_special=*/true) != expected) {
            report("all specials, none in text", text, expected, tok->encode(text, {}, true));
        }
        auto decoded = tok->decode(expected);
        EXPECT_TRUE(decoded.ok() && *decoded == text) << path << ":" << line_number << ": decode differs";
    }
    EXPECT_EQ(failures, 0) << failures << " mismatches in " << checked << " lines";
    EXPECT_GT(checked, 0) << path << " has no lines";
    EXPECT_GT(with_specials, 0) << "no line exercises special tokens";
}

}  // namespace
}  // namespace gptoss::tokenizer
