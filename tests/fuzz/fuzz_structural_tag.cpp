// Fuzz target: structured outputs' structural tags (parser, compiler, matcher). The input is a tag (JSON
// text) and, after a NUL byte, text fed to the matcher one byte at a time; a small token trie's mask
// is checked against feeding each token at every step. None of it may crash, hang or throw, and the
// mask must equal the feed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_json.h"
#include "structured/structural_tag.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gptoss::structured;
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t nul = in.find('\0');
    const std::string_view tag_text = in.substr(0, nul);
    const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    // The server's own guards (depth, member count, UTF-8) before nlohmann parses it.
    if (!gptoss::server::json_shape_error(tag_text, gptoss::server::kMaxJsonDepth, gptoss::server::kMaxJsonMembers)
             .empty())
        return 0;
    nlohmann::ordered_json tag;
    try {
        tag = nlohmann::ordered_json::parse(tag_text);
    } catch (const nlohmann::ordered_json::exception&) {
        return 0;
    }
    auto g = StructuralTag::parse(tag);
    if (!g.ok()) return 0;
    static const std::vector<std::string> vocab = [] {
        std::vector<std::string> v;
        for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
        for (const char* t : {"{\"", "\":", "\",", "\"}",  "},", "]}", "[\"",      "true",     "null",  "12", "-0.5",
                              "<f",  "<f=", "</",  "</f>", ">{", "}<", "\xc3\xa9", "\xe2\x82", "\\u00", "  ", "\n "})
            v.push_back(t);
        return v;
    }();
    static const TokenTrie trie(vocab);
    StructuralTagMatcher m(**g);
    std::vector<uint8_t> mask;
    std::vector<StructuralTagMatcher> levels;
    for (size_t i = 0; i < text.size() && i < 256; ++i) {
        if (i % 16 == 0) {
            trie.fill_mask(m, &mask, &levels);
            for (size_t id = 0; id < vocab.size(); ++id) {
                StructuralTagMatcher probe = m;
                if ((mask[id] != 0) != probe.feed(vocab[id])) std::abort();
            }
        }
        if (!m.feed_byte(static_cast<uint8_t>(text[i]))) break;
    }
    (void)m.accepting();
    return 0;
}
