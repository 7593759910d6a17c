// Fuzz target: guided_grammar's GBNF compiler (and Lark converter) and matcher. The input is a grammar and, after a NUL
// byte, text fed to the matcher one byte at a time; a small token trie's mask is checked against feeding each token at
// every 16th step, and a live matcher must be able to end or read on (no dead ends). None of it may crash, hang or
// throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "structured/ebnf_grammar.h"
#include "structured/json_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gptoss::structured;
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t nul = in.find('\0');
    const std::string_view text = in.substr(0, nul);
    const std::string_view input = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    if (text.size() > 1024) return 0;
    // Lark's form (no ::=) through the converter first, as the server does.
    std::string converted;
    if (EbnfGrammar::looks_like_lark(text)) {
        auto gbnf = EbnfGrammar::lark_to_gbnf(text);
        if (!gbnf.ok()) return 0;
        converted = std::move(*gbnf);
    }
    auto g = EbnfGrammar::compile(converted.empty() ? text : std::string_view(converted));
    if (!g.ok()) return 0;
    static const std::vector<std::string> vocab = [] {
        std::vector<std::string> v;
        for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
        for (const char* t : {"ab", "((", "))", "12", "-0", "  ", "\n", "\xc3\xa9", "\xe2\x82", "\xe2\x82\xac", "xyz"})
            v.push_back(t);
        return v;
    }();
    static const TokenTrie trie(vocab);
    EbnfMatcher m(**g);
    if (m.dead()) std::abort();  // the root can always finish (the compiler refuses grammars where it cannot)
    std::vector<uint8_t> mask;
    for (size_t i = 0; i < input.size() && i < 256; ++i) {
        if (i % 16 == 0) {
            trie.fill_mask(m, &mask);
            for (size_t id = 0; id < vocab.size(); ++id) {
                EbnfMatcher copy = m;
                if ((mask[id] != 0) != copy.feed(vocab[id])) std::abort();
            }
        }
        // No dead end: the output may end here or some byte reads on (while the stack bound cannot be the cause).
        if (static_cast<size_t>((**g).num_rules()) * (i + 1) < 900 && !m.accepting()) {
            bool reads = false;
            for (int b = 0; b < 256 && !reads; ++b) {
                EbnfMatcher copy = m;
                reads = copy.feed(std::string(1, static_cast<char>(b)));
            }
            if (!reads) std::abort();
        }
        if (!m.feed(input.substr(i, 1))) break;
    }
    (void)m.accepting();
    return 0;
}
