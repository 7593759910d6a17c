// A pool of paged-KV blocks in one id space (full-attention layers and sliding-window layers each
// have their own): reference counts, a free list, and the prefix-cache index (a full block's key is
// the hash of every token up to its end; blocks whose last reference went away stay indexed and
// are reused least-recently-released first, so a later request with the same prefix can find them).
// Pure bookkeeping: it never touches KV memory. Not thread-safe (the engine thread owns it).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gptoss::runtime {

class BlockAllocator {
public:
    // `block_size` tokens per block (kept with each indexed block to verify hits).
    BlockAllocator(int num_blocks, int block_size);

    int num_blocks() const { return static_cast<int>(ref_count_.size()); }
    // Blocks allocate() can hand out now: never-indexed free blocks plus indexed blocks nobody holds.
    int num_free() const { return static_cast<int>(free_list_.size()) + num_evictable_; }
    int num_in_use() const { return num_blocks() - num_free(); }  // held by at least one sequence
    int num_indexed() const { return static_cast<int>(index_.size()); }
    int ref_count(int block) const { return ref_count_[block]; }

    // A block with one reference: a plain free block first, else the least recently released
    // indexed block (which leaves the index). -1 when none is left.
    int allocate();
    // One more reference (a prefix-cache hit). An indexed block nobody held leaves the LRU list.
    void ref(int block);
    // One reference less; at zero an indexed block joins the LRU list (most recent end), any other
    // block the free list.
    void unref(int block);

    // The block indexed under `hash` whose tokens equal `tokens` (guards against hash collisions),
    // or -1.
    int lookup(uint64_t hash, std::span<const int32_t> tokens) const;
    // Indexes a held block whose positions are all computed. No-op when the hash is already indexed
    // (another block holds the same prefix: this one stays unindexed and is freed normally) or the
    // block is already indexed.
    void index(int block, uint64_t hash, std::span<const int32_t> tokens);

private:
    void lru_remove(int block);
    void lru_push_back(int block);

    int block_size_;
    std::vector<int32_t> ref_count_;            // [num_blocks]
    std::vector<int32_t> free_list_;            // unindexed blocks with no reference (a stack)
    std::vector<uint8_t> indexed_;              // [num_blocks]
    std::vector<uint64_t> hash_;                // [num_blocks] valid where indexed_
    std::vector<int32_t> tokens_;               // [num_blocks, block_size] valid where indexed_
    std::vector<int32_t> lru_prev_, lru_next_;  // [num_blocks + 1]; node num_blocks is the sentinel
    int num_evictable_ = 0;                     // indexed blocks with no reference (in the LRU list)
    std::unordered_map<uint64_t, int32_t> index_;
};

// Chained hash of one full block: mixes the previous block's hash with this block's tokens, so a
// block's key identifies its whole prefix (0 is the parent of block 0).
uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens);
// The parent of a sequence's first block under vLLM's cache_salt: 0 (no salt) for "", else a value of the salt's
// bytes, so that requests with different salts share no cached block.
uint64_t cache_salt_hash(std::string_view salt);

}  // namespace gptoss::runtime
