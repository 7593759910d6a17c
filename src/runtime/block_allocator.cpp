#include "runtime/block_allocator.h"

#include <algorithm>

#include "core/check.h"

namespace gptoss::runtime {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) {
    uint64_t h = mix64(parent_hash + 0x9e3779b97f4a7c15ull);
    for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull));
    return h;
}

uint64_t cache_salt_hash(std::string_view salt) {
    if (salt.empty()) return 0;
    uint64_t h = mix64(0x5a17c0debadc0ffeull ^ salt.size());
    for (unsigned char c : salt) h = mix64(h ^ (c + 0x9e3779b97f4a7c15ull));
    return h == 0 ? 1 : h;
}

BlockAllocator::BlockAllocator(int num_blocks, int block_size)
    : block_size_(block_size),
      ref_count_(static_cast<size_t>(num_blocks), 0),
      indexed_(static_cast<size_t>(num_blocks), 0),
      hash_(static_cast<size_t>(num_blocks), 0),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0),
      lru_prev_(static_cast<size_t>(num_blocks) + 1, num_blocks),
      lru_next_(static_cast<size_t>(num_blocks) + 1, num_blocks) {
    ENGINE_CHECK(num_blocks >= 0 && block_size > 0, "bad block pool %d x %d", num_blocks, block_size);
    // Hand out low ids first (easier to read in dumps).
    free_list_.reserve(static_cast<size_t>(num_blocks));
    for (int b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

void BlockAllocator::lru_remove(int b) {
    lru_next_[lru_prev_[b]] = lru_next_[b];
    lru_prev_[lru_next_[b]] = lru_prev_[b];
    --num_evictable_;
}

void BlockAllocator::lru_push_back(int b) {
    const int sentinel = num_blocks();
    lru_prev_[b] = lru_prev_[sentinel];
    lru_next_[b] = sentinel;
    lru_next_[lru_prev_[sentinel]] = b;
    lru_prev_[sentinel] = b;
    ++num_evictable_;
}

int BlockAllocator::allocate() {
    int b = -1;
    if (!free_list_.empty()) {
        b = free_list_.back();
        free_list_.pop_back();
    } else if (num_evictable_ > 0) {
        b = lru_next_[num_blocks()];  // least recently released
        lru_remove(b);
        auto it = index_.find(hash_[b]);
        ENGINE_CHECK(it != index_.end() && it->second == b, "prefix index out of sync for block %d", b);
        index_.erase(it);
        indexed_[b] = 0;
    } else {
        return -1;
    }
    ref_count_[b] = 1;
    return b;
}

void BlockAllocator::ref(int b) {
    ENGINE_CHECK(b >= 0 && b < num_blocks(), "block %d out of range", b);
    if (ref_count_[b] == 0) {
        ENGINE_CHECK(indexed_[b], "ref on free block %d", b);
        lru_remove(b);
    }
    ++ref_count_[b];
}

void BlockAllocator::unref(int b) {
    ENGINE_CHECK(b >= 0 && b < num_blocks() && ref_count_[b] > 0, "unref of unheld block %d", b);
    if (--ref_count_[b] > 0) return;
    if (indexed_[b]) {
        lru_push_back(b);
    } else {
        free_list_.push_back(b);
    }
}

int BlockAllocator::lookup(uint64_t hash, std::span<const int32_t> tokens) const {
    auto it = index_.find(hash);
    if (it == index_.end()) return -1;
    const int b = it->second;
    const int32_t* stored = tokens_.data() + static_cast<size_t>(b) * block_size_;
    if (static_cast<int>(tokens.size()) != block_size_ || !std::equal(tokens.begin(), tokens.end(), stored)) return -1;
    return b;
}

void BlockAllocator::index(int b, uint64_t hash, std::span<const int32_t> tokens) {
    ENGINE_CHECK(ref_count_[b] > 0 && static_cast<int>(tokens.size()) == block_size_, "bad index of block %d", b);
    if (indexed_[b] || index_.count(hash)) return;
    index_.emplace(hash, b);
    indexed_[b] = 1;
    hash_[b] = hash;
    std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<long>(b) * block_size_);
}

}  // namespace gptoss::runtime
