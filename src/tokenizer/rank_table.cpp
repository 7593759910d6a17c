#include "tokenizer/rank_table.h"

#include <algorithm>

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
        uint64_t head = load_head(p, b.size());
        size_t i = hash(p, b.size(), head) & mask_;
        while (slots_[i].id != kNoRank) i = (i + 1) & mask_;
        slots_[i] = Slot{head, id, static_cast<uint32_t>(b.size())};
    }
    return true;
}

void PairTable::reserve(size_t num_pairs) {
    size_t capacity = 16;
    int bits = 4;
    while (capacity < 2 * num_pairs) {
        capacity *= 2;
        ++bits;
    }
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
    shift_ = 64 - bits;
    size_ = 0;
}

bool PairTable::insert(uint32_t left, uint32_t right, uint32_t merged) {
    if (2 * (size_ + 1) > slots_.size()) {  // grow: rehash into twice the room
        std::vector<Slot> old = std::move(slots_);
        reserve(std::max<size_t>(size_ + 1, old.size()));
        for (const Slot& s : old) {
            if (s.key != kEmpty) insert(static_cast<uint32_t>(s.key >> 32), static_cast<uint32_t>(s.key), s.merged);
        }
    }
    uint64_t key = (uint64_t{left} << 32) | right;
    size_t i = slot_of(key);
    for (; slots_[i].key != kEmpty; i = (i + 1) & mask_) {
        if (slots_[i].key == key) return false;
    }
    slots_[i] = Slot{key, merged};
    ++size_;
    return true;
}

}  // namespace gptoss::tokenizer
