#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace gptoss::tokenizer {
namespace {

// Unicode White_Space (PropList.txt), as a character-class body.
constexpr std::string_view kWhiteSpaceClassBody =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// Per-thread match state: encode is const and may run on many threads at once.
struct MatchScratch {
    pcre2_match_data* data = nullptr;
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;
    MatchScratch() {
        data = pcre2_match_data_create(1, nullptr);
        context = pcre2_match_context_create(nullptr);
        // Long runs of one class backtrack character by character; give the JIT room for that.
        jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
        if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
    ~MatchScratch() {
        pcre2_jit_stack_free(jit_stack);
        pcre2_match_context_free(context);
        pcre2_match_data_free(data);
    }
};

MatchScratch& match_scratch() {
    thread_local MatchScratch scratch;
    return scratch;
}

}  // namespace

std::string rewrite_white_space_escapes(std::string_view pattern) {
    std::string out;
    out.reserve(pattern.size() + 64);
    bool in_class = false;
    size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
    for (size_t i = 0; i < pattern.size(); ++i) {
        char ch = pattern[i];
        if (ch == '\\' && i + 1 < pattern.size()) {
            char next = pattern[i + 1];
            ++i;
            if (next == 's') {
                if (in_class) {
                    out += kWhiteSpaceClassBody;
                } else {
                    out += '[';
                    out += kWhiteSpaceClassBody;
                    out += ']';
                }
            } else if (next == 'S' && !in_class) {
                out += "[^";
                out += kWhiteSpaceClassBody;
                out += ']';
            } else {  // includes \S inside a class, which has no class-body form: left to PCRE2
                out += '\\';
                out += next;
            }
            continue;
        }
        if (!in_class && ch == '[') {
            in_class = true;
            out += ch;
            if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
            class_start = i + 1;
            continue;
        }
        if (in_class && ch == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:]
            size_t close = pattern.find(":]", i + 2);
            if (close != std::string_view::npos) {
                out.append(pattern.substr(i, close + 2 - i));
                i = close + 1;
                continue;
            }
        }
        if (in_class && ch == ']' && i != class_start) in_class = false;  // a leading ']' is literal
        out += ch;
    }
    return out;
}

StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::create(std::string_view pattern) {
    std::string rewritten = rewrite_white_space_escapes(pattern);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (!code) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error_code, message, sizeof(message));
        return invalid_argument(
            "pre-tokenizer regex does not compile: " + std::string(reinterpret_cast<const char*>(message)) +
            " (at offset " + std::to_string(error_offset) + " of the rewritten pattern)");
    }
    std::unique_ptr<RegexSplitter> splitter(new RegexSplitter());
    splitter->code_ = code;
    splitter->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // else the interpreter runs
    return splitter;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool RegexSplitter::find(std::string_view text, size_t pos, size_t* start, size_t* end) const {
    MatchScratch& s = match_scratch();
    if (!s.data) return false;
    auto* code = static_cast<pcre2_code*>(code_);
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, PCRE2_NO_UTF_CHECK, s.data,
                         s.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // retry with the interpreter (heap-backed backtracking)
        rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s.data, s.context);
    }
    if (rc < 0) return false;
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.data);
    *start = ovector[0];
    *end = ovector[1];
    return *end >= *start && *start >= pos;  // \K could break this; then treat as no match
}

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::create(std::string_view pattern, bool fast_path) {
    std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
    pre->pattern_ = std::string(pattern);
    // The regex is compiled even when the fast path runs, so a pattern error is reported the same way.
    ASSIGN_OR_RETURN(pre->regex_, RegexSplitter::create(pattern));
    pre->fast_ = fast_path && pattern == kO200kPattern;
    return pre;
}

}  // namespace gptoss::tokenizer
