// Byte string -> rank (= token id) lookup for BPE: one arena holding every token's bytes and an
// open-addressing hash table. Read-only after build, so concurrent lookups are safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace gptoss::tokenizer {

inline constexpr uint32_t kNoRank = 0xFFFFFFFFu;

// wyhash-style 64-bit hash: short keys (the common case) take a couple of multiplies.
inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
    constexpr uint64_t kP0 = 0xa0761d6478bd642full, kP1 = 0xe7037ed1a0b428dbull, kP2 = 0x8ebc6af09c88c6e3ull;
    auto mix = [](uint64_t a, uint64_t b) {
        __uint128_t r = static_cast<__uint128_t>(a) * b;
        return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
    };
    auto read8 = [](const uint8_t* q) {
        uint64_t v;
        std::memcpy(&v, q, 8);
        return v;
    };
    auto read4 = [](const uint8_t* q) {
        uint32_t v;
        std::memcpy(&v, q, 4);
        return static_cast<uint64_t>(v);
    };
    uint64_t seed = kP0;
    uint64_t a, b;
    if (n <= 16) {
        if (n >= 4) {
            size_t off = (n >> 3) << 2;
            a = (read4(p) << 32) | read4(p + off);
            b = (read4(p + n - 4) << 32) | read4(p + n - 4 - off);
        } else if (n > 0) {
            a = (static_cast<uint64_t>(p[0]) << 16) | (static_cast<uint64_t>(p[n >> 1]) << 8) | p[n - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else {
        size_t i = n;
        const uint8_t* q = p;
        while (i > 16) {
            seed = mix(read8(q) ^ kP1, read8(q + 8) ^ seed);
            q += 16;
            i -= 16;
        }
        a = read8(p + n - 16);
        b = read8(p + n - 8);
    }
    return mix(kP1 ^ n, mix(a ^ kP1, b ^ seed ^ kP2));
}

// The first min(n, 8) bytes of p as a little-endian integer (upper bytes zero); reads only p[0, n).
inline uint64_t load_head(const uint8_t* p, size_t n) {
    uint64_t v = 0;
    if (n >= 8) {
        std::memcpy(&v, p, 8);
    } else if (n >= 4) {
        uint32_t a, b;
        std::memcpy(&a, p, 4);
        std::memcpy(&b, p + n - 4, 4);  // overlaps a for n < 8; the shared bytes are equal
        v = a | (static_cast<uint64_t>(b) << ((n - 4) * 8));
    } else if (n > 0) {
        v = p[0] | (static_cast<uint64_t>(p[n >> 1]) << (8 * (n >> 1))) |
            (static_cast<uint64_t>(p[n - 1]) << (8 * (n - 1)));
    }
    return v;
}

class RankTable {
public:
    // Token bytes for ids 0..n-1 (empty = no such id). Fails (returns false) on a duplicate
    // byte string, storing the two ids in *dup_a, *dup_b.
    bool build(std::string arena, std::vector<uint32_t> offsets, uint32_t* dup_a, uint32_t* dup_b);

    uint32_t find(const uint8_t* p, size_t n) const {
        // Slots hold a token's first 8 bytes and its length: a lookup of a piece of up to 8 bytes
        // (most of them) touches one cache line and no arena bytes.
        uint64_t head = load_head(p, n);
        for (size_t i = hash(p, n, head) & mask_;; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.id == kNoRank) return kNoRank;
            if (s.head == head && s.length == n &&
                (n <= 8 || std::memcmp(arena_.data() + offsets_[s.id] + 8, p + 8, n - 8) == 0)) {
                return s.id;
            }
        }
    }
    uint32_t find(std::string_view s) const { return find(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

    // Bytes of id (empty when the id has none).
    std::string_view bytes(uint32_t id) const {
        if (id + 1 >= offsets_.size()) return {};
        return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
    }
    uint32_t num_ids() const { return offsets_.empty() ? 0 : static_cast<uint32_t>(offsets_.size() - 1); }

private:
    struct Slot {
        uint64_t head = 0;  // load_head of the token
        uint32_t id = kNoRank;
        uint32_t length = 0;
    };
    static uint64_t hash(const uint8_t* p, size_t n, uint64_t head) {
        if (n > 8) return hash_bytes(p, n);
        __uint128_t r = static_cast<__uint128_t>(head ^ 0xe7037ed1a0b428dbull) * (0xa0761d6478bd642full ^ n);
        return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
    }
    std::string arena_;              // all token bytes, concatenated in id order
    std::vector<uint32_t> offsets_;  // [num_ids + 1] start of each id's bytes in arena_
    std::vector<Slot> slots_;        // power-of-two size, at most half full
    size_t mask_ = 0;
};

// (left id, right id) -> id of the token that is their concatenation: the adjacent-pair lookup of
// BPE. Ids instead of bytes: a probe compares one 64-bit key, with no memcmp into the arena.
class PairTable {
public:
    // Room from the start: find() on a table nothing was reserved for (a tokenizer.json without merges)
    // indexed an empty slot array.
    PairTable() { reserve(0); }
    void reserve(size_t num_pairs);
    // False if the pair is already there (the first insert wins).
    bool insert(uint32_t left, uint32_t right, uint32_t merged);

    uint32_t find(uint32_t left, uint32_t right) const {
        uint64_t key = (uint64_t{left} << 32) | right;
        for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key == key) return s.merged;
            if (s.key == kEmpty) return kNoRank;
        }
    }
    size_t size() const { return size_; }

private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
        uint64_t key = kEmpty;  // left << 32 | right
        uint32_t merged = kNoRank;
    };
    size_t slot_of(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    int shift_ = 64;
    size_t size_ = 0;
};

}  // namespace gptoss::tokenizer
