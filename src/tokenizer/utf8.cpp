#include "tokenizer/utf8.h"

#include <cstring>

namespace gptoss::tokenizer {
namespace {

// Allowed range of the second byte for a lead byte (Unicode table 3-7); later bytes are 80..BF.
struct LeadInfo {
    uint8_t length;  // 0: not a valid lead byte
    uint8_t second_lo;
    uint8_t second_hi;
};

inline LeadInfo lead_info(uint8_t b) {
    if (b < 0x80) return {1, 0, 0};
    if (b < 0xC2) return {0, 0, 0};
    if (b < 0xE0) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};
    if (b == 0xED) return {3, 0x80, 0x9F};
    if (b < 0xF0) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};
    if (b < 0xF4) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};
    return {0, 0, 0};
}

// Number of leading bytes of p[0, n) that form a valid prefix of the sequence led by p[0]
// (at least 1), and whether the whole sequence is there.
inline size_t valid_subpart(const uint8_t* p, size_t n, const LeadInfo& info, bool* complete) {
    size_t i = 1;
    for (; i < info.length && i < n; ++i) {
        uint8_t lo = i == 1 ? info.second_lo : 0x80;
        uint8_t hi = i == 1 ? info.second_hi : 0xBF;
        if (p[i] < lo || p[i] > hi) break;
    }
    *complete = i == info.length;
    return i;
}

}  // namespace

size_t valid_utf8_prefix(const char* text, size_t n) {
    const auto* p = reinterpret_cast<const uint8_t*>(text);
    size_t i = 0;
    while (i < n) {
        // ASCII runs eight bytes at a time.
        while (i + 8 <= n) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (p[i] < 0x80) {
            ++i;
            continue;
        }
        LeadInfo info = lead_info(p[i]);
        if (info.length == 0) return i;
        bool complete = false;
        size_t len = valid_subpart(p + i, n - i, info, &complete);
        if (!complete) return i;
        i += len;
    }
    return n;
}

size_t append_utf8_lossy(std::string_view bytes, std::string& out, bool hold_incomplete) {
    static constexpr char kReplacement[] = "\xEF\xBF\xBD";
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    size_t n = bytes.size();
    size_t i = 0;
    while (i < n) {
        size_t ok = valid_utf8_prefix(bytes.data() + i, n - i);
        out.append(bytes.data() + i, ok);
        i += ok;
        if (i == n) break;
        LeadInfo info = lead_info(p[i]);
        if (info.length == 0) {
            out.append(kReplacement, 3);
            ++i;
            continue;
        }
        bool complete = false;
        size_t len = valid_subpart(p + i, n - i, info, &complete);
        if (i + len == n && hold_incomplete) return i;  // cut off by the end: may still complete
        out.append(kReplacement, 3);
        i += len;
    }
    return n;
}

}  // namespace gptoss::tokenizer
