#include "tokenizer/rank_table.h"

namespace gptoss::tokenizer {

bool RankTable::build(std::string arena, std::vector<uint32_t> offsets, uint32_t* dup_a, uint32_t* dup_b) {
    arena_ = std::move(arena);
    offsets_ = std::move(offsets);
    size_t n = num_ids();
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    for (uint32_t id = 0; id < n; ++id) {
        std::string_view b = bytes(id);
        if (b.empty()) continue;
        const auto* p = reinterpret_cast<const uint8_t*>(b.data());
        uint32_t existing = find(p, b.size());
        if (existing != kNoRank) {
            *dup_a = existing;
            *dup_b = id;
            return false;
        }
        uint64_t h = hash_bytes(p, b.size());
        size_t i = h & mask_;
        while (slots_[i].id != kNoRank) i = (i + 1) & mask_;
        slots_[i] = Slot{id, static_cast<uint32_t>(h >> 32)};
    }
    return true;
}

}  // namespace gptoss::tokenizer
