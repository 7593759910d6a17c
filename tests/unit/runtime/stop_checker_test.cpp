// StopChecker: stop ids, stop strings across token boundaries (with trim), max_tokens.
#include "runtime/stop_checker.h"

#include <gtest/gtest.h>

#include <map>

namespace gptoss::runtime {
namespace {

// A byte-level "tokenizer": id → fixed bytes.
Detokenizer fake_detokenizer() {
    static const std::map<int32_t, std::string> pieces = {{1, "Hel"}, {2, "lo"}, {3, " wor"}, {4, "ld"},
                                                          {5, "!"},   {6, "EN"}, {7, "D"},    {8, "xEND"}};
    return [](std::span<const int32_t> ids) {
        std::string s;
        for (int32_t id : ids) s += pieces.at(id);
        return s;
    };
}

TEST(StopCheckerTest, StopIdEndsWithStop) {
    StopChecker c({5, 9}, {}, 10, nullptr);
    EXPECT_FALSE(c.push(1, 1));
    auto r = c.push(9, 2);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->reason, FinishReason::kStop);
    EXPECT_EQ(r->stop_id, 9);
}

TEST(StopCheckerTest, MaxTokensEndsWithLength) {
    StopChecker c({}, {}, 2, nullptr);
    EXPECT_FALSE(c.push(1, 1));
    auto r = c.push(1, 2);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->reason, FinishReason::kLength);
    // A stop id on the last allowed token is a stop, not a length.
    StopChecker d({4}, {}, 1, nullptr);
    EXPECT_EQ(d.push(4, 1)->reason, FinishReason::kStop);
}

TEST(StopCheckerTest, StopStringAcrossTokenBoundaries) {
    Detokenizer detok = fake_detokenizer();
    StopChecker c({}, {"lo wo", "zzz"}, 100, &detok);
    EXPECT_FALSE(c.push(1, 1));  // "Hel"
    EXPECT_FALSE(c.push(2, 2));  // "Hello"
    auto r = c.push(3, 3);       // "Hello wor": "lo wo" spans three tokens
    ASSERT_TRUE(r);
    EXPECT_EQ(r->reason, FinishReason::kStop);
    EXPECT_EQ(r->stop_string_index, 0);
    EXPECT_EQ(r->trim_bytes, 6);  // "lo wor" is dropped from "Hello wor"
}

TEST(StopCheckerTest, EarliestStopStringWinsAndLongTailsAreBounded) {
    Detokenizer detok = fake_detokenizer();
    StopChecker c({}, {"END", "xE"}, 1000, &detok);
    for (int i = 0; i < 200; ++i) EXPECT_FALSE(c.push(i % 4 + 1, i + 1));
    EXPECT_FALSE(c.push(6, 201));  // "EN"
    auto r = c.push(8, 202);       // "ENxEND": "xE" starts before "END" in the new bytes
    ASSERT_TRUE(r);
    EXPECT_EQ(r->stop_string_index, 1);
    EXPECT_EQ(r->trim_bytes, 4);
    StopChecker d({}, {"END"}, 1000, &detok);
    EXPECT_FALSE(d.push(6, 1));
    auto e = d.push(7, 2);  // "EN" + "D"
    ASSERT_TRUE(e);
    EXPECT_EQ(e->trim_bytes, 3);
}

// min_tokens (vLLM's): no stop id or string ends generation at or before token min_tokens; a string found later
// must end in a later token's bytes (it may begin earlier); max_tokens still applies.
TEST(StopCheckerTest, MinTokensHoldsStopsBack) {
    Detokenizer detok = fake_detokenizer();
    StopChecker c({5}, {"lo", "END"}, 100, &detok, 2);
    EXPECT_FALSE(c.push(1, 1));  // "Hel"
    EXPECT_FALSE(c.push(2, 2));  // "Hello": "lo" ends in token 2, not past min_tokens
    EXPECT_FALSE(c.push(6, 3));  // "EN"
    auto r = c.push(7, 4);       // "D": "END" began in token 3, ends in token 4
    ASSERT_TRUE(r);
    EXPECT_EQ(r->stop_string_index, 1);
    EXPECT_EQ(r->trim_bytes, 3);
    // A stop id drawn within min_tokens (the engine masks them; a constraint that allows nothing else) ends it.
    StopChecker d({5}, {}, 100, nullptr, 1);
    auto e = d.push(5, 1);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->stop_id, 5);
    StopChecker f({5}, {}, 3, nullptr, 3);  // min_tokens == max_tokens: length
    EXPECT_FALSE(f.push(1, 1));
    EXPECT_FALSE(f.push(1, 2));
    EXPECT_EQ(f.push(1, 3)->reason, FinishReason::kLength);
}

TEST(StopCheckerTest, FinishReasonNames) {
    EXPECT_STREQ(finish_reason_name(FinishReason::kStop), "stop");
    EXPECT_STREQ(finish_reason_name(FinishReason::kLength), "length");
    EXPECT_STREQ(finish_reason_name(FinishReason::kCancelled), "cancelled");
    EXPECT_STREQ(finish_reason_name(FinishReason::kError), "error");
}

}  // namespace
}  // namespace gptoss::runtime
