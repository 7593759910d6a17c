// BpeTokenizer on the real o200k_harmony tokenizer.json: known ids (HARMONY.md §1), special-token
// handling, round trips, streaming decode, and bounded cost on long runs of one character.
#include "tokenizer/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "tokenizer/utf8.h"
#include "tokenizer_fixture.h"

namespace gptoss::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

// Random well-formed UTF-8: mostly ASCII words and spaces, with code points from the whole range.
std::string random_text(std::mt19937& rng, size_t num_chars) {
    static const char* kPieces[] = {" ",   "  ",   "\n",   "\r\n", "\t",     "'s",     "'LL", "the",
                                    "The", "HTTP", "123",  "4567", "!",      "...",    "//",  "<|",
                                    "|>",  "é",    "中文", "😀",    "\u0301", "\u00a0", "Ⅻ"};
    std::string s;
    for (size_t i = 0; i < num_chars; ++i) {
        uint32_t kind = rng() % 4;
        if (kind == 0) {
            s += kPieces[rng() % (sizeof(kPieces) / sizeof(kPieces[0]))];
        } else if (kind == 1) {
            s += static_cast<char>(0x20 + rng() % 95);
        } else {
            uint32_t cp;
            do {
                cp = kind == 2 ? rng() % 0x10000 : rng() % 0x110000;
            } while (cp >= 0xD800 && cp < 0xE000);
            s += utf8(cp);
        }
    }
    return s;
}

TEST(BpeTokenizer, KnownIdsFromHarmonySpec) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    EXPECT_EQ(tok->encode_ordinary("assistant"), Ids({173781}));
    EXPECT_EQ(tok->encode_ordinary("user"), Ids({1428}));
    EXPECT_EQ(tok->encode_ordinary("system"), Ids({17360}));
    EXPECT_EQ(tok->encode_ordinary("developer"), Ids({77944}));
    EXPECT_EQ(tok->encode_ordinary("analysis"), Ids({35644}));
    EXPECT_EQ(tok->encode_ordinary("final"), Ids({17196}));
    EXPECT_EQ(tok->encode_ordinary("commentary"), Ids({12606, 815}));
    EXPECT_EQ(tok->encode_ordinary(" to"), Ids({316}));
    EXPECT_EQ(tok->encode_ordinary("="), Ids({28}));
    EXPECT_EQ(tok->encode_ordinary("functions"), Ids({44580}));
    EXPECT_EQ(tok->encode_ordinary("json"), Ids({4108}));
    EXPECT_EQ(tok->encode_ordinary(" json"), Ids({5701}));
    EXPECT_EQ(tok->encode_ordinary(" code"), Ids({3490}));
    EXPECT_EQ(tok->encode_ordinary(" "), Ids({220}));
    EXPECT_EQ(tok->encode_ordinary(" <"), Ids({464}));
    EXPECT_EQ(tok->encode_ordinary(""), Ids());
}

TEST(BpeTokenizer, SpecialTokenTable) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    const std::pair<const char*, int32_t> kSpecials[] = {
        {"<|startoftext|>", 199998}, {"<|endoftext|>", 199999},      {"<|return|>", 200002},
        {"<|constrain|>", 200003},   {"<|channel|>", 200005},        {"<|start|>", 200006},
        {"<|end|>", 200007},         {"<|message|>", 200008},        {"<|call|>", 200012},
        {"<|endofprompt|>", 200018}, {"<|reserved_200000|>", 200000}};
    for (const auto& [text, id] : kSpecials) {
        EXPECT_EQ(tok->special_token_id(text), id) << text;
        EXPECT_TRUE(tok->is_special(id)) << text;
        EXPECT_EQ(tok->token_bytes(id), std::string_view(text));
    }
    for (int32_t id = 199998; id <= 200018; ++id) EXPECT_TRUE(tok->is_special(id)) << id;
    EXPECT_FALSE(tok->is_special(199997));
    EXPECT_FALSE(tok->is_special(200019));
    EXPECT_FALSE(tok->special_token_id("assistant").has_value());
    EXPECT_EQ(tok->vocab_size(), 200019);
    EXPECT_EQ(tok->token_bytes(173781), std::string_view("assistant"));
    EXPECT_FALSE(tok->token_bytes(200019).has_value());
    EXPECT_FALSE(tok->token_bytes(-1).has_value());
}

TEST(BpeTokenizer, EncodeOrdinaryTreatsSpecialTextAsText) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    // HARMONY.md §1.2: a user typing "<|end|>" gets ordinary tokens.
    Ids ids = tok->encode_ordinary(" <|end|>");
    EXPECT_EQ(ids, Ids({464, 91, 419, 91, 29}));
    Ids hi = tok->encode_ordinary("hi");
    hi.insert(hi.end(), ids.begin(), ids.end());
    EXPECT_EQ(tok->encode_ordinary("hi <|end|>"), hi);
    for (int32_t id : tok->encode_ordinary("<|start|>user<|message|>hi<|end|><|return|><|endoftext|>")) {
        EXPECT_FALSE(tok->is_special(id)) << id;
    }
    EXPECT_EQ(tok->encode(" <|end|>", {}), ids);  // nothing allowed: same as ordinary
    Ids appended = {7};
    tok->encode_ordinary_append(" <|end|>", appended);
    EXPECT_EQ(appended, Ids({7, 464, 91, 419, 91, 29}));
}

TEST(BpeTokenizer, EncodeRecognisesOnlyAllowedSpecials) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    const std::string text = "<|start|>user<|message|>What is 2 + 2?<|end|>";
    std::vector<std::string> allowed = {"<|start|>", "<|end|>"};
    Ids ids = tok->encode(text, allowed);
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 200006);
    EXPECT_EQ(ids.back(), 200007);
    Ids middle(ids.begin() + 1, ids.end() - 1);
    EXPECT_EQ(middle, tok->encode_ordinary("user<|message|>What is 2 + 2?"));  // <|message|> not allowed

    Ids all = tok->encode(text, {}, /*allow_all_special=*/true);
    Ids expected = {200006, 1428, 200008};
    Ids body = tok->encode_ordinary("What is 2 + 2?");
    expected.insert(expected.end(), body.begin(), body.end());
    expected.push_back(200007);
    EXPECT_EQ(all, expected);

    // Adjacent specials, specials at both ends, and a special that is a prefix of nothing else.
    EXPECT_EQ(tok->encode("<|end|><|start|>", {}, true), Ids({200007, 200006}));
    EXPECT_EQ(tok->encode("<|endoftext|>", {}, true), Ids({199999}));
    EXPECT_EQ(tok->encode("<|end", {}, true), tok->encode_ordinary("<|end"));
}

TEST(BpeTokenizer, DecodeOfEncodeIsIdentityOnVariedText) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    std::mt19937 rng(1234);
    for (int i = 0; i < 2000; ++i) {
        std::string text = random_text(rng, 1 + rng() % 80);
        auto decoded = tok->decode(tok->encode_ordinary(text));
        ASSERT_TRUE(decoded.ok());
        ASSERT_EQ(*decoded, text) << "case " << i;
        auto with_specials = tok->decode(tok->encode(text, {}, true));
        ASSERT_TRUE(with_specials.ok());
        ASSERT_EQ(*with_specials, text) << "case " << i;
    }
    for (const char* text :
         {"Hello, world!", "  leading and trailing  ", "\n\n\r\n\t", "don't STOP'S we'LL", "1234567890",
          "naïve café Straße", "中文 日本語 한국어 العربية हिन्दी", "😀👍🏽🇺🇸"}) {
        auto decoded = tok->decode(tok->encode_ordinary(text));
        ASSERT_TRUE(decoded.ok());
        EXPECT_EQ(*decoded, text);
    }
}

TEST(BpeTokenizer, IllFormedUtf8RoundTripsByteForByte) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    std::mt19937 rng(99);
    for (int i = 0; i < 500; ++i) {
        std::string bytes(1 + rng() % 40, '\0');
        for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 128 : rng() % 256);
        auto decoded = tok->decode(tok->encode_ordinary(bytes));
        ASSERT_TRUE(decoded.ok());
        ASSERT_EQ(*decoded, bytes) << "case " << i;
    }
}

TEST(BpeTokenizer, DecodeRejectsUnknownIds) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    EXPECT_FALSE(tok->decode(Ids{1428, 200019}).ok());
    EXPECT_FALSE(tok->decode(Ids{-1}).ok());
    EXPECT_FALSE(tok->decode(Ids{1 << 30}).ok());
    auto empty = tok->decode(Ids{});
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(*empty, "");
    auto special = tok->decode(Ids{200006, 1428, 200008});
    ASSERT_TRUE(special.ok());
    EXPECT_EQ(*special, "<|start|>user<|message|>");
}

bool is_utf8(const std::string& s) { return valid_utf8_prefix(s.data(), s.size()) == s.size(); }

TEST(StreamingDecoder, HoldsBackCharactersSplitAcrossTokens) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    const std::string text = "flamingo \U0001F9A9, hieroglyph \U00013000, \uA66E and plain text";
    Ids ids = tok->encode_ordinary(text);
    bool split_char = false;
    for (int32_t id : ids) split_char |= !is_utf8(std::string(*tok->token_bytes(id)));
    ASSERT_TRUE(split_char) << "the sample should have a token that ends inside a character";
    StreamingDecoder dec(*tok);
    std::string streamed;
    for (int32_t id : ids) {
        std::string piece = dec.push(id);
        EXPECT_TRUE(is_utf8(piece)) << "id " << id;
        streamed += piece;
    }
    streamed += dec.flush();
    EXPECT_EQ(streamed, text);
}

TEST(StreamingDecoder, InvalidBytesBecomeReplacementCharacters) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    // Single-byte tokens: 0xF0 0x9F starts a 4-byte character; 'a' breaks it.
    uint8_t f0 = 0xF0, x9f = 0x9F;
    int32_t id_f0 = tok->encode_ordinary(std::string_view(reinterpret_cast<const char*>(&f0), 1))[0];
    int32_t id_9f = tok->encode_ordinary(std::string_view(reinterpret_cast<const char*>(&x9f), 1))[0];
    int32_t id_a = tok->encode_ordinary("a")[0];
    StreamingDecoder dec(*tok);
    EXPECT_EQ(dec.push(id_f0), "");
    EXPECT_EQ(dec.push(id_9f), "");
    EXPECT_EQ(dec.push(id_a), "\uFFFDa");  // one U+FFFD for the maximal ill-formed subpart F0 9F
    EXPECT_EQ(dec.push(id_9f), "\uFFFD");  // a lone continuation byte can never complete
    EXPECT_EQ(dec.push(id_f0), "");
    EXPECT_EQ(dec.flush(), "\uFFFD");  // cut off at the end
    EXPECT_EQ(dec.flush(), "");
    EXPECT_EQ(dec.push(200007), "<|end|>");
    EXPECT_EQ(dec.push(-5), "\uFFFD");
}

// tiktoken merges long pieces in quadratic time; ours is O(n log n). Bounds are loose for slow CI.
TEST(BpeTokenizer, LongRunsOfOneCharacterAreNotQuadratic) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    for (const std::string& text :
         {std::string(1 << 20, 'a'), std::string(1 << 20, ' '), std::string(1 << 20, '7'), std::string(1 << 20, '\n'),
          std::string(1 << 19, 'Z') + std::string(1 << 19, 'x')}) {
        auto start = std::chrono::steady_clock::now();
        Ids ids = tok->encode_ordinary(text);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_LT(seconds, 10.0) << "1 MiB of '" << text[0] << "'";
        auto decoded = tok->decode(ids);
        ASSERT_TRUE(decoded.ok());
        EXPECT_EQ(*decoded, text);
    }
}

TEST(FindTokenizerFile, PrefersModelDirThenEnvironmentThenFixture) {
    namespace fs = std::filesystem;
    fs::path dir = fs::temp_directory_path() / ("gptoss_tok_test_" + std::to_string(::getpid()));
    fs::create_directories(dir / "model");
    fs::create_directories(dir / "empty");
    std::ofstream(dir / "model" / "tokenizer.json") << "{}";
    std::ofstream(dir / "env.json") << "{}";
    const char* old_env = std::getenv("GPTOSS_TOKENIZER");
    std::string saved = old_env ? old_env : "";

    EXPECT_EQ(find_tokenizer_file((dir / "model").string()), (dir / "model" / "tokenizer.json").string());
    ::setenv("GPTOSS_TOKENIZER", (dir / "env.json").c_str(), 1);
    EXPECT_EQ(find_tokenizer_file((dir / "empty").string()), (dir / "env.json").string());
    EXPECT_EQ(find_tokenizer_file(""), (dir / "env.json").string());
    // A file the environment names is the one, found or not (the caller's "not found" names it; a missing one was
    // passed over for the fixture, silently).
    ::setenv("GPTOSS_TOKENIZER", (dir / "missing.json").c_str(), 1);
    EXPECT_EQ(find_tokenizer_file((dir / "empty").string()), (dir / "missing.json").string());
    EXPECT_FALSE(BpeTokenizer::from_file((dir / "missing.json").string()).ok());
    ::unsetenv("GPTOSS_TOKENIZER");
    auto fallback = find_tokenizer_file((dir / "empty").string());
    std::string fixture = std::string(GPTOSS_SOURCE_DIR) + "/.cache/tokenizer/tokenizer.json";
    if (fs::exists(fixture)) {
        EXPECT_EQ(fallback, fixture);
    } else {
        EXPECT_FALSE(fallback.has_value());
    }

    if (old_env) {
        ::setenv("GPTOSS_TOKENIZER", saved.c_str(), 1);
    } else {
        ::unsetenv("GPTOSS_TOKENIZER");
    }
    fs::remove_all(dir);
}

TEST(BpeTokenizer, FromFileReportsMissingFile) {
    auto tok = BpeTokenizer::from_file("/nonexistent/tokenizer.json");
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
    EXPECT_NE(tok.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace gptoss::tokenizer
