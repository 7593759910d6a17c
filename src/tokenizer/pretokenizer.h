// The pre-tokenizer: splits text into the pieces that BPE then encodes one by one. The pattern comes
// from tokenizer.json (pre_tokenizer Split Regex) and is matched with PCRE2 (UTF + UCP, JIT); when
// it is the o200k pattern, the equivalent hand-written O200kSplitter runs instead.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/o200k_splitter.h"

namespace gptoss::tokenizer {

// A compiled PCRE2 pattern. `\s` and `\S` are rewritten to Unicode White_Space, which is what
// Oniguruma (Hugging Face tokenizers) and the Rust regex crate (tiktoken) mean by them; PCRE2's own
// \s differs on U+180E. PCRE2's property tables are those of the system library (Debian 12: 10.42,
// Unicode 14.0), so for characters assigned in Unicode 15 or 16 this path can split differently
// from Hugging Face; the o200k fast path uses Unicode 16.0 and does not.
class RegexSplitter {
public:
    static StatusOr<std::unique_ptr<RegexSplitter>> create(std::string_view pattern);
    ~RegexSplitter();
    RegexSplitter(const RegexSplitter&) = delete;
    RegexSplitter& operator=(const RegexSplitter&) = delete;

    // First match at or after `pos` in well-formed UTF-8 `text`: true and [*start, *end), or false
    // when there is none (or matching failed, e.g. on a resource limit).
    bool find(std::string_view text, size_t pos, size_t* start, size_t* end) const;
    bool jit() const { return jit_; }

private:
    RegexSplitter() = default;
    void* code_ = nullptr;  // pcre2_code_8*
    bool jit_ = false;
};

// The pattern with \s and \S replaced by explicit White_Space classes (exposed for tests).
std::string rewrite_white_space_escapes(std::string_view pattern);

class PreTokenizer {
public:
    // fast_path: use O200kSplitter when `pattern` is the o200k pattern (tests turn it off).
    static StatusOr<std::unique_ptr<PreTokenizer>> create(std::string_view pattern, bool fast_path = true);

    // Calls on_piece(std::string_view) for consecutive pieces that together are `text` (well-formed
    // UTF-8). Text between regex matches becomes pieces too (Hugging Face "Isolated" behaviour).
    template <typename F>
    void split(std::string_view text, F&& on_piece) const {
        size_t pos = 0;
        const size_t n = text.size();
        if (fast_) {
            while (pos < n) {
                size_t end = o200k_.piece_end(text, pos);
                on_piece(text.substr(pos, end - pos));
                pos = end;
            }
            return;
        }
        size_t gap_start = 0;  // start of text not yet handed out
        while (pos < n) {
            size_t start, end;
            if (!regex_->find(text, pos, &start, &end)) break;
            if (end == start) {  // empty match: hands out nothing; step one character
                int len;
                decode_utf8(reinterpret_cast<const uint8_t*>(text.data()) + start, n - start, &len);
                pos = start + len;
                continue;
            }
            if (start > gap_start) on_piece(text.substr(gap_start, start - gap_start));
            on_piece(text.substr(start, end - start));
            pos = gap_start = end;
        }
        if (gap_start < n) on_piece(text.substr(gap_start));
    }

    bool uses_fast_path() const { return fast_; }
    const std::string& pattern() const { return pattern_; }

private:
    PreTokenizer() = default;
    std::string pattern_;
    bool fast_ = false;
    O200kSplitter o200k_;
    std::unique_ptr<RegexSplitter> regex_;
};

}  // namespace gptoss::tokenizer
