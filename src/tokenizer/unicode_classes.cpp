#include "tokenizer/unicode_classes.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace gptoss::tokenizer {
namespace {

constexpr uint32_t kRuns[] = {
#include "tokenizer/unicode_classes_data.inc"
};

}  // namespace

const UnicodeClassTable& UnicodeClassTable::get() {
    static const UnicodeClassTable* table = new UnicodeClassTable();  // never destroyed: used by statics
    return *table;
}

UnicodeClassTable::UnicodeClassTable() {
    std::vector<uint8_t> flat(0x110000, static_cast<uint8_t>(CharClass::kOther));
    constexpr size_t kNumRuns = sizeof(kRuns) / sizeof(kRuns[0]);
    for (size_t i = 0; i < kNumRuns; ++i) {
        uint32_t first = kRuns[i] >> 3;
        uint32_t last = i + 1 < kNumRuns ? kRuns[i + 1] >> 3 : 0x110000;
        std::memset(flat.data() + first, static_cast<int>(kRuns[i] & 7), last - first);
    }
    // Deduplicate blocks: most of the code space is a few repeated blocks (unassigned, CJK, Hangul).
    std::map<std::string, uint16_t> seen;
    std::string unique;
    for (uint32_t b = 0; b < kNumBlocks; ++b) {
        std::string block(reinterpret_cast<const char*>(flat.data()) + b * kBlockSize, kBlockSize);
        auto [it, inserted] = seen.emplace(block, static_cast<uint16_t>(seen.size()));
        if (inserted) unique += block;
        stage1_[b] = it->second;
    }
    blocks_.assign(unique.begin(), unique.end());
}

}  // namespace gptoss::tokenizer
