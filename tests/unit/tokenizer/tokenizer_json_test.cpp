// Loading tokenizer.json: small synthetic tokenizers (exact BPE behaviour against a reference
// implementation, both merge paths, added tokens) and malformed files (a clear Status, no crash).
#include "tokenizer/tokenizer_json.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <unordered_set>

#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/o200k_splitter.h"
#include "tokenizer/rank_table.h"
#include "tokenizer_fixture.h"

namespace gptoss::tokenizer {
namespace {

using Json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

// GPT-2 bytes_to_unicode spelling of raw bytes.
std::string spell(std::string_view bytes) {
    std::string out;
    for (unsigned char b : bytes) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = b;
        if (!printable) {
            uint32_t index = 0;
            for (uint32_t x = 0; x < b; ++x) {
                bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
                if (!p) ++index;
            }
            cp = 0x100 + index;
        }
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }
    return out;
}

// A byte-level BPE tokenizer.json: ids 0..255 are the bytes, then `tokens` in order; merges are
// every split of every multi-byte token into two tokens, ordered by the id they make.
struct MiniTokenizer {
    std::vector<std::string> tokens;
    std::string pattern = std::string(kO200kPattern);
    Json added = Json::array();
    bool legacy_merges = false;
    bool with_merges = true;

    Json vocab() const {
        Json v = Json::object();
        for (int b = 0; b < 256; ++b) v[spell(std::string(1, static_cast<char>(b)))] = b;
        for (size_t i = 0; i < tokens.size(); ++i) v[spell(tokens[i])] = 256 + i;
        return v;
    }
    Json merges() const {
        std::map<std::string, int> id;
        for (int b = 0; b < 256; ++b) id[std::string(1, static_cast<char>(b))] = b;
        for (size_t i = 0; i < tokens.size(); ++i) id[tokens[i]] = 256 + static_cast<int>(i);
        Json m = Json::array();
        for (const std::string& t : tokens) {
            for (size_t k = 1; k < t.size(); ++k) {
                std::string l = t.substr(0, k), r = t.substr(k);
                if (!id.count(l) || !id.count(r)) continue;
                if (legacy_merges) {
                    std::string legacy = spell(l);  // (not a + chain: GCC 12 -Wrestrict false positive)
                    legacy += ' ';
                    legacy += spell(r);
                    m.push_back(legacy);
                } else {
                    m.push_back(Json::array({spell(l), spell(r)}));
                }
            }
        }
        return m;
    }
    Json json() const {
        Json pre = {
            {"type", "Sequence"},
            {"pretokenizers",
             Json::array(
                 {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                  {{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}}})}};
        return {{"version", "1.0"},
                {"added_tokens", added},
                {"normalizer", nullptr},
                {"pre_tokenizer", pre},
                {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", vocab()}, {"merges", merges()}}}};
    }
    std::string text() const { return json().dump(); }
};

std::unique_ptr<BpeTokenizer> load(const std::string& text) {
    auto tok = BpeTokenizer::from_json(text);
    EXPECT_TRUE(tok.ok()) << tok.status().to_string();
    return tok.ok() ? std::move(*tok) : nullptr;
}

// tiktoken's algorithm, written plainly: whole piece, else merge the lowest-rank adjacent pair.
Ids reference_bpe(const std::string& piece, const std::map<std::string, int>& rank) {
    if (auto it = rank.find(piece); it != rank.end()) return {it->second};
    std::vector<std::string> parts;
    for (char c : piece) parts.emplace_back(1, c);
    for (;;) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
            auto it = rank.find(parts[i] + parts[i + 1]);
            if (it != rank.end() && (best < 0 || it->second < best)) {
                best = it->second;
                at = i;
            }
        }
        if (best < 0) break;
        parts[at] += parts[at + 1];
        parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    Ids ids;
    for (const auto& p : parts) ids.push_back(rank.at(p));
    return ids;
}

TEST(MiniTokenizer, WholePiecesMergesAndLeftmostTies) {
    MiniTokenizer mini;
    mini.tokens = {"ab", "bc", "abc", "  ", " a", "aa"};  // ids 256..261
    auto tok = load(mini.text());
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->vocab_size(), 262);
    EXPECT_EQ(tok->encode_ordinary("abc"), Ids({258}));
    EXPECT_EQ(tok->encode_ordinary("abcbc"), Ids({258, 257}));
    EXPECT_EQ(tok->encode_ordinary("ab ab"), Ids({256, ' ', 256}));  // "ab" (256) beats " a" (260)
    EXPECT_EQ(tok->encode_ordinary("aaa"), Ids({261, 'a'}));         // equal ranks: leftmost first
    EXPECT_EQ(tok->encode_ordinary("x"), Ids({'x'}));
    auto text = tok->decode(Ids{258, ' ', 261});
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "abc aa");
}

// The bytes alone, no merges and no token to split into pairs: pieces come out byte by byte (the pair table,
// never sized, was indexed empty: a segfault on the first piece of two bytes).
TEST(MiniTokenizer, BytesOnlyWithoutMerges) {
    MiniTokenizer mini;  // no tokens past the 256 bytes: merges() is []
    auto tok = load(mini.text());
    ASSERT_TRUE(tok);
    const std::vector<int32_t> ids = tok->encode_ordinary("ab c");
    EXPECT_EQ(ids, (std::vector<int32_t>{'a', 'b', ' ', 'c'}));  // byte b is id b
    auto text = tok->decode(ids);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "ab c");
    // An id the file does not list: decode refuses it, decode_lossy adds nothing for it (a model's output
    // of o200k_harmony's reserved ids past the tokenizer.json's last one dropped generate's whole text).
    const std::vector<int32_t> with_unknown = {'a', 300, 'b', -1, 201087};
    EXPECT_FALSE(tok->decode(with_unknown).ok());
    EXPECT_EQ(tok->decode_lossy(with_unknown), "ab");
}

TEST(MiniTokenizer, LegacyMergeStringsAndAddedTokens) {
    MiniTokenizer mini;
    mini.tokens = {"ab", "bc", "abc"};
    mini.legacy_merges = true;
    mini.added = Json::array({{{"id", 300}, {"content", "<|x|>"}, {"special", true}},
                              {{"id", 301}, {"content", "<|xy|>"}, {"special", true}}});
    auto tok = load(mini.text());
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->vocab_size(), 302);
    EXPECT_FALSE(tok->token_bytes(280).has_value());  // a gap in the ids
    EXPECT_EQ(tok->special_token_id("<|x|>"), 300);
    std::vector<std::string> allowed = {"<|x|>"};
    EXPECT_EQ(tok->encode("ab<|x|>c", allowed), Ids({256, 300, 'c'}));
    EXPECT_EQ(tok->encode("<|xy|>", allowed), tok->encode_ordinary("<|xy|>"));
    EXPECT_EQ(tok->encode("<|xy|><|x|>", {}, true), Ids({301, 300}));
    for (int32_t id : tok->encode_ordinary("<|x|><|xy|>")) EXPECT_FALSE(tok->is_special(id));
}

// Random vocabularies over a 3-letter alphabet, long and short pieces: both merge paths (the
// quadratic scan up to 64 bytes, the heap on the stack up to 256, the heap on the heap above)
// against the plain reference.
TEST(MiniTokenizer, MergesMatchReferenceOnRandomVocabularies) {
    std::mt19937 rng(7);
    for (int round = 0; round < 12; ++round) {
        std::vector<std::string> all;
        for (int len = 2; len <= 5; ++len) {
            for (int k = 0; k < 40; ++k) {
                std::string s;
                for (int i = 0; i < len; ++i) s += static_cast<char>('a' + rng() % 3);
                if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
            }
        }
        std::shuffle(all.begin(), all.end(), rng);
        MiniTokenizer mini;
        mini.tokens = all;
        mini.with_merges = round % 2 == 0;  // without merges, pairs come from splitting the vocab
        auto tok = load(mini.text());
        ASSERT_TRUE(tok);
        std::map<std::string, int> rank;
        for (int b = 0; b < 256; ++b) rank[std::string(1, static_cast<char>(b))] = b;
        for (size_t i = 0; i < all.size(); ++i) rank[all[i]] = 256 + static_cast<int>(i);
        for (int t = 0; t < 60; ++t) {
            size_t len = 1 + rng() % (t % 2 ? 400 : 64);
            std::string piece;
            for (size_t i = 0; i < len; ++i) piece += static_cast<char>('a' + rng() % 3);
            ASSERT_EQ(tok->encode_ordinary(piece), reference_bpe(piece, rank)) << piece;
        }
    }
}

TEST(MiniTokenizer, OtherPatternsUsePcre2) {
    MiniTokenizer mini;
    mini.tokens = {"ab", " a", " ab"};
    // GPT-2's pattern: no prefix character for letters, so "!ab" splits as "!", "ab".
    mini.pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
    auto tok = load(mini.text());
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->encode_ordinary("!ab ab"), Ids({'!', 256, 258}));
}

struct BadCase {
    const char* name;
    std::string text;
    StatusCode code;
    const char* message_part;
};

TEST(TokenizerJson, MalformedFilesGiveClearErrors) {
    MiniTokenizer mini;
    mini.tokens = {"ab", "bc", "abc"};
    Json good = mini.json();
    std::string good_text = good.dump();
    ASSERT_TRUE(BpeTokenizer::from_json(good_text).ok());

    auto with = [&](auto&& edit) {
        Json j = good;
        edit(j);
        return j.dump();
    };
    std::vector<BadCase> cases = {
        {"empty", "", StatusCode::kDataLoss, "JSON"},
        {"truncated", good_text.substr(0, good_text.size() / 2), StatusCode::kDataLoss, "JSON"},
        {"trailing garbage", good_text + "}", StatusCode::kDataLoss, "JSON"},
        {"array", "[1, 2]", StatusCode::kInvalidArgument, "top level"},
        {"scalar", "42", StatusCode::kInvalidArgument, "top level"},
        {"no model", "{\"version\": \"1.0\"}", StatusCode::kInvalidArgument, "model"},
        {"wordpiece", with([](Json& j) { j["model"]["type"] = "WordPiece"; }), StatusCode::kUnimplemented, "WordPiece"},
        {"vocab id string", with([](Json& j) { j["model"]["vocab"]["a"] = "97"; }), StatusCode::kInvalidArgument,
         "integers"},
        {"vocab id negative", with([](Json& j) { j["model"]["vocab"]["a"] = -3; }), StatusCode::kInvalidArgument,
         "negative"},
        {"vocab id float", with([](Json& j) { j["model"]["vocab"]["a"] = 1.5; }), StatusCode::kInvalidArgument,
         "integers"},
        {"vocab id huge", with([](Json& j) { j["model"]["vocab"]["xyz"] = 1ll << 40; }), StatusCode::kInvalidArgument,
         "too large"},
        {"vocab id implausible", with([](Json& j) { j["model"]["vocab"]["xyz"] = 2000000000; }),
         StatusCode::kInvalidArgument, "implausibly"},
        {"vocab nested", with([](Json& j) { j["model"]["vocab"]["a"] = Json::object(); }), StatusCode::kInvalidArgument,
         "integers"},
        {"vocab not byte-level", with([](Json& j) { j["model"]["vocab"]["\xe4\xb8\xad"] = 500; }),
         StatusCode::kInvalidArgument, "byte-level"},
        {"vocab duplicate id", with([](Json& j) { j["model"]["vocab"]["xyz"] = 256; }), StatusCode::kInvalidArgument,
         "appears twice"},
        {"vocab missing byte", with([](Json& j) { j["model"]["vocab"].erase("a"); }), StatusCode::kInvalidArgument,
         "byte 97"},
        {"vocab empty", with([](Json& j) { j["model"]["vocab"] = Json::object(); }), StatusCode::kInvalidArgument,
         "empty"},
        {"vocab missing", with([](Json& j) { j["model"].erase("vocab"); }), StatusCode::kInvalidArgument, "vocab"},
        {"merges out of order", with([](Json& j) { std::swap(j["model"]["merges"][0], j["model"]["merges"][2]); }),
         StatusCode::kUnimplemented, "ordered"},
        {"merges unknown token", with([](Json& j) {
             j["model"]["merges"].push_back(Json::array({"x", "y"}));
         }),
         StatusCode::kInvalidArgument, "not in model.vocab"},
        {"merges triple", with([](Json& j) {
             j["model"]["merges"].push_back(Json::array({"a", "b", "c"}));
         }),
         StatusCode::kInvalidArgument, "more than two"},
        {"merges bad string", with([](Json& j) { j["model"]["merges"].push_back("abc"); }),
         StatusCode::kInvalidArgument, "left right"},
        {"merges number", with([](Json& j) { j["model"]["merges"].push_back(5); }), StatusCode::kInvalidArgument, ""},
        {"bad regex", with([](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }),
         StatusCode::kInvalidArgument, "regex"},
        {"no split", with([](Json& j) {
             j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", true}};
         }),
         StatusCode::kUnimplemented, "use_regex"},
        {"no pre_tokenizer", with([](Json& j) { j.erase("pre_tokenizer"); }), StatusCode::kUnimplemented,
         "pre_tokenizer"},
        {"other pre_tokenizer", with([](Json& j) {
             j["pre_tokenizer"] = {{"type", "Whitespace"}};
         }),
         StatusCode::kUnimplemented, "Whitespace"},
        {"normalizer", with([](Json& j) {
             j["normalizer"] = {{"type", "NFC"}};
         }),
         StatusCode::kUnimplemented, "NFC"},
        {"added without id", with([](Json& j) {
             j["added_tokens"] = Json::array({{{"content", "<x>"}}});
         }),
         StatusCode::kInvalidArgument, "id"},
        {"added empty", with([](Json& j) {
             j["added_tokens"] = Json::array({{{"id", 400}, {"content", ""}}});
         }),
         StatusCode::kInvalidArgument, "content"},
        {"added twice", with([](Json& j) {
             j["added_tokens"] = Json::array({{{"id", 400}, {"content", "<x>"}}, {{"id", 400}, {"content", "<y>"}}});
         }),
         StatusCode::kInvalidArgument, "twice"},
        {"added not a list", with([](Json& j) { j["added_tokens"] = 3; }), StatusCode::kInvalidArgument, "list"},
    };
    for (const BadCase& c : cases) {
        auto tok = BpeTokenizer::from_json(c.text);
        ASSERT_FALSE(tok.ok()) << c.name;
        EXPECT_EQ(tok.status().code(), c.code) << c.name << ": " << tok.status().to_string();
        EXPECT_NE(tok.status().message().find(c.message_part), std::string::npos)
            << c.name << ": " << tok.status().to_string();
        EXPECT_EQ(tok.status().message().rfind("tokenizer.json", 0), 0u) << c.name << ": " << tok.status().to_string();
    }
}

// Random corruptions of a valid file: any Status is fine, a crash or a hang is not.
TEST(TokenizerJson, CorruptedFilesNeverCrash) {
    MiniTokenizer mini;
    mini.tokens = {"ab", "bc", "abc", " a"};
    const std::string good = mini.text();
    std::mt19937 rng(5);
    int loaded = 0;
    for (int i = 0; i < 3000; ++i) {
        std::string text = good;
        int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits; ++e) {
            size_t at = rng() % text.size();
            switch (rng() % 4) {
                case 0: text[at] = static_cast<char>(rng() % 256); break;
                case 1: text.erase(at, 1 + rng() % 8); break;
                case 2: text.insert(at, 1, "{}[]\",:0-e\\u"[rng() % 13]); break;
                case 3: text.resize(at); break;
            }
            if (text.empty()) text.push_back('{');
        }
        auto tok = BpeTokenizer::from_json(text);
        if (tok.ok()) {
            ++loaded;
            auto ids = (*tok)->encode_ordinary("abc abcab ba");
            EXPECT_TRUE((*tok)->decode(ids).ok());
        }
    }
    EXPECT_LT(loaded, 3000);
}

TEST(ByteLevel, DecodesTheGpt2Alphabet) {
    for (int b = 0; b < 256; ++b) {
        std::string raw(1, static_cast<char>(b)), out;
        ASSERT_TRUE(byte_level_decode(spell(raw), out)) << b;
        EXPECT_EQ(out, raw);
    }
    std::string out;
    EXPECT_TRUE(byte_level_decode("\xC4\xA0hello", out));  // "Ġhello"
    EXPECT_EQ(out, " hello");
    EXPECT_FALSE(byte_level_decode("\xC5\x84", out));  // U+0144: one past the alphabet
    EXPECT_FALSE(byte_level_decode(" ", out));         // a raw space is spelled Ġ
    EXPECT_FALSE(byte_level_decode("\xFF", out));      // not UTF-8
}

// The pair lookups follow model.merges (Hugging Face); tiktoken joins any two adjacent tokens whose
// concatenation is a token. Identical when merges list every two-token split of every token, in
// the order of the id they make: check that for the real file.
TEST(TokenizerJson, FixtureMergesAreEveryTwoTokenSplitInIdOrder) {
    GPTOSS_REQUIRE_TOKENIZER_FIXTURE(tok);
    std::ifstream in(*find_tokenizer_file(""), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    auto tj = parse_tokenizer_json(ss.str());
    ASSERT_TRUE(tj.ok()) << tj.status().to_string();
    std::unordered_set<std::string_view> vocab;
    for (const auto& v : tj->vocab) vocab.insert(std::string_view(tj->vocab_bytes).substr(v.offset, v.length));
    size_t splits = 0;
    for (std::string_view t : vocab) {
        for (size_t k = 1; k < t.size(); ++k) splits += vocab.count(t.substr(0, k)) && vocab.count(t.substr(k));
    }
    std::unordered_set<std::string> listed;
    for (const auto& m : tj->merges) {
        std::string_view bytes = std::string_view(tj->merge_bytes).substr(m.offset, m.left_length + m.right_length);
        ASSERT_TRUE(vocab.count(bytes.substr(0, m.left_length)) && vocab.count(bytes.substr(m.left_length)) &&
                    vocab.count(bytes));
        std::string key(bytes);
        key.insert(m.left_length, 1, '\0');  // distinguish the split point
        listed.insert(key);
    }
    EXPECT_EQ(listed.size(), tj->merges.size()) << "duplicate merges";
    EXPECT_EQ(splits, tj->merges.size()) << "merges are not every two-token split";
    EXPECT_EQ(tj->vocab.size(), 199998u);
    EXPECT_EQ(tj->added_tokens.size(), 21u);
    EXPECT_EQ(tj->split_pattern, kO200kPattern);
}

}  // namespace
}  // namespace gptoss::tokenizer
