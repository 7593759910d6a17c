// Fuzz target: guided_regex's pattern compiler and DFA. The input is a pattern and, after a NUL byte, text fed
// to the DFA one byte at a time; a small token trie's mask is checked against feeding each token at every
// 16th step, and every live state must still reach a match (checked by a bounded search). None of it may
// crash, hang or throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "structured/json_grammar.h"
#include "structured/regex_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace gptoss::structured;
    const std::string_view in(reinterpret_cast<const char*>(data), size);
    const size_t nul = in.find('\0');
    const std::string_view pattern = in.substr(0, nul);
    const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    if (pattern.size() > 512) return 0;
    auto g = RegexGrammar::compile(pattern);
    if (!g.ok()) return 0;
    static const std::vector<std::string> vocab = [] {
        std::vector<std::string> v;
        for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
        for (const char* t : {"ab", "abc", "12", "-0", "  ", "\n", "\xc3\xa9", "\xe2\x82", "\xe2\x82\xac", "xyz"})
            v.push_back(t);
        return v;
    }();
    static const TokenTrie trie(vocab);
    const RegexGrammar& r = **g;
    // Every live state reaches an accepting one: a breadth-first search over bytes (the DFA is at most 20,000
    // states, checked here on the first 2,000 visited).
    {
        std::vector<int> seen(static_cast<size_t>(r.num_states()), 0), frontier{r.start()};
        seen[static_cast<size_t>(r.start())] = 1;
        for (size_t k = 0; k < frontier.size() && k < 2000; ++k) {
            const int s = frontier[k];
            bool reaches = r.accepting(s);
            for (int b = 0; b < 256; ++b) {
                const int t = r.next(s, static_cast<uint8_t>(b));
                if (t < 0) continue;
                reaches = true;  // a live successor (pruned DFA: live means it reaches a match)
                if (!seen[static_cast<size_t>(t)]) {
                    seen[static_cast<size_t>(t)] = 1;
                    frontier.push_back(t);
                }
            }
            if (!reaches) std::abort();  // a live state with no way on and no match
        }
    }
    int state = r.start();
    std::vector<uint8_t> mask;
    for (size_t i = 0; i < text.size() && i < 256 && state >= 0; ++i) {
        if (i % 16 == 0) {
            trie.fill_mask(r, state, &mask);
            for (size_t id = 0; id < vocab.size(); ++id)
                if ((mask[id] != 0) != (r.feed(state, vocab[id]) >= 0)) std::abort();
        }
        state = r.next(state, static_cast<uint8_t>(text[i]));
    }
    if (state >= 0) (void)r.accepting(state);
    return 0;
}
