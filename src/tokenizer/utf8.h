// UTF-8 helpers for the tokenizer: validation, decoding of already-validated text, and lossy
// conversion (maximal ill-formed subparts become U+FFFD, as Python and Rust do).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gptoss::tokenizer {

// Length of the longest prefix of p[0, n) that is well-formed UTF-8 (Unicode table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF).
size_t valid_utf8_prefix(const char* p, size_t n);

// Decodes one code point at p (n > 0 bytes available) of text known to be well-formed UTF-8.
// Stores its length in *len. For ill-formed input it still stays inside p[0, n) and returns the
// byte value with length 1.
inline uint32_t decode_utf8(const uint8_t* p, size_t n, int* len) {
    uint32_t b0 = p[0];
    if (b0 < 0x80) {
        *len = 1;
        return b0;
    }
    if (b0 >= 0xC2 && b0 < 0xE0 && n >= 2) {
        *len = 2;
        return ((b0 & 0x1F) << 6) | (p[1] & 0x3F);
    }
    if (b0 >= 0xE0 && b0 < 0xF0 && n >= 3) {
        *len = 3;
        return ((b0 & 0x0F) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3F);
    }
    if (b0 >= 0xF0 && b0 < 0xF5 && n >= 4) {
        *len = 4;
        uint32_t cp = ((b0 & 0x07) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3F);
        return cp <= 0x10FFFF ? cp : 0xFFFD;
    }
    *len = 1;
    return b0;
}

// Appends `bytes` to `out` as well-formed UTF-8, each maximal ill-formed subpart replaced by
// U+FFFD. With hold_incomplete, a sequence cut off by the end of `bytes` that could still become
// valid is left unconsumed. Returns the number of bytes consumed.
size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool hold_incomplete);

}  // namespace gptoss::tokenizer
