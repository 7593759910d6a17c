// Paged-KV bookkeeping for sequences: two block pools (full-attention layers keep every block of a
// sequence; sliding-window layers keep only the blocks the window still needs and release the rest
// as it moves), prefix caching across requests, and the KV budget (bytes or a fraction of free
// memory → block counts). The block ids it puts in a sequence's tables are the ids the model
// runner's cache uses (model::CpuKvCache on the CPU backend).
//
// Prefix caching with sliding layers. A block's key is the hash of all tokens up to its end (both
// pools use the same key: the KV of a position depends only on the tokens up to it). Blocks stay
// indexed after their last holder lets them go, until evicted (LRU). A new sequence may resume at
// position p = k·block_size only if (a) full blocks 0..k-1 are all indexed and (b) the sliding
// blocks covering positions [p - sliding_window + 1, p - 1] (the window of the token at p) are too.
// match_prefix() takes the largest such k (sliding blocks further back are never needed: the
// sequence's table holds -1 there, exactly as if it had computed them and released them). When
// (b) fails for the longest full match, shorter ones are tried, so a hit is always exact and the
// rest is recomputed. At least the last token is always recomputed (its logits are needed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/block_allocator.h"
#include "runtime/sequence.h"

namespace gptoss::runtime {

// KV geometry of a model on a backend.
struct KvGeometry {
    int block_size = 16;
    int sliding_window = 0;              // 0: the model has no sliding-window layers
    size_t bytes_per_block_full = 0;     // K and V of one block over all full-attention layers
    size_t bytes_per_block_sliding = 0;  // the same over all sliding-window layers
};

// How much memory the KV cache may take: explicit block counts (tests), bytes, or a fraction of
// the backend's free memory. The first one set wins, in that order.
struct KvBudget {
    int num_blocks_full = 0;
    int num_blocks_sliding = 0;
    size_t bytes = 0;
    double fraction_of_free = 0.0;
};

struct KvBlockCounts {
    int full = 0;
    int sliding = 0;
};

// Splits a budget between the pools. Sliding layers need at most about
// max_num_seqs · (window / block_size + 2) + max_num_batched_tokens / block_size blocks at once
// (more only helps prefix caching); they get that, at most half of the bytes, and full layers the
// rest. Without sliding layers the sliding count equals the full count (those tables are unused).
StatusOr<KvBlockCounts> plan_kv_blocks(const KvGeometry& geometry, const KvBudget& budget, size_t free_bytes,
                                       int max_num_seqs, int max_num_batched_tokens);

// vLLM's --gpu-memory-utilization, a per-instance share: this process may hold `utilization` (in (0, 1]) of the
// device's `total_bytes`. It held `free_before - free_now` once its weights and activations were allocated, so the KV
// cache gets utilization · total − that, at most `free_now` (what other processes hold is not this one's share: two
// servers at 0.45 each fit one GPU). An error, with the figures, when that leaves no room.
StatusOr<size_t> kv_bytes_for_utilization(size_t free_before, size_t free_now, size_t total_bytes, double utilization);

class KvCacheManager {
public:
    KvCacheManager(int block_size, int sliding_window, KvBlockCounts counts, bool prefix_caching);

    int block_size() const { return block_size_; }
    bool prefix_caching() const { return prefix_caching_; }
    bool has_sliding() const { return sliding_window_ > 0; }
    const BlockAllocator& full() const { return full_; }
    const BlockAllocator& sliding() const { return sliding_; }
    // Most positions one sequence can ever hold (the full pool's size).
    int64_t capacity_tokens() const { return static_cast<int64_t>(full_.num_blocks()) * block_size_; }
    // Largest number of new tokens one sequence may take in one step so that its sliding blocks
    // (window + chunk) always fit in the sliding pool; 0 if not even one token fits.
    int max_chunk_tokens() const;

    // Data-parallel groups (ModelRunner::dp_groups): a block's KV exists only in the group of the sequence that
    // computed it (block_table_full[0] % dp). A match keeps to the group of its first block: two sequences computing
    // one prefix at once in different groups could leave the index with block 0 of one and block 1 of the other,
    // and a third sequence then read the other group's (absent) KV.
    void set_dp_groups(int dp);

    // For a sequence holding no blocks: how many leading tokens have reusable KV in the prefix
    // cache (a multiple of block_size, less than num_tokens; 0 without prefix caching). Extends
    // seq.block_hashes.
    int match_prefix(Sequence& seq);
    // What match_prefix would find for a new sequence of `tokens`, without taking anything (a probe).
    int cached_prefix_tokens(std::span<const int32_t> tokens) const;
    // Whether a sequence holding no blocks can be admitted reusing `cached_tokens` and computing
    // `num_new_tokens` now, with full blocks free for the rest of its current tokens too.
    bool can_admit(const Sequence& seq, int cached_tokens, int num_new_tokens) const;
    // Takes references on the cached blocks; seq.num_computed = cached_tokens.
    void admit(Sequence& seq, int cached_tokens);

    // Blocks the sequence must add to compute tokens [num_computed, num_computed + n).
    int blocks_needed(const Sequence& seq, int n) const;
    bool can_allocate(const Sequence& seq, int n) const;
    void allocate(Sequence& seq, int n);  // ENGINE_CHECKs can_allocate

    // After a forward advanced seq.num_computed: offers newly complete blocks to the prefix index
    // and releases sliding blocks that are behind the window of the next token.
    void on_computed(Sequence& seq);
    // Drops every reference the sequence holds (finish, cancel, preemption); resets its progress.
    void free(Sequence& seq);

    // Disaggregated prefill (runtime/kv_transfer.h): room in the prefix cache for the KV of tokens[0, k·bs)
    // computed elsewhere (k = tokens.size() / block_size): full blocks 0..k-1 and the sliding blocks of the
    // window of position k·bs. Blocks the cache already has are kept (-1 in write_*: nothing to copy); the others
    // are allocated for the caller to fill. Every block of the import holds a reference until finish_import, so
    // nothing it needs is evicted meanwhile. False, holding nothing, without prefix caching or free blocks.
    struct PrefixImport {
        int first_sliding = 0;                           // first sliding block of the window
        std::vector<int32_t> full, sliding;              // [k], [k - first_sliding] the blocks held
        std::vector<int32_t> write_full, write_sliding;  // the same with -1 where the block was cached
    };
    bool begin_import(std::span<const int32_t> tokens, PrefixImport* im);
    // Indexes the blocks the caller wrote, keeping the import's references: match_prefix finds them, and nothing
    // evicts them until release_import.
    void index_import(std::span<const int32_t> tokens, const PrefixImport& im);
    // An indexed import kept for the waiting sequence `seq_id`: its references go when the sequence is admitted
    // (admit), when drop_import(seq_id) is called (it ended), or when the scheduler needs blocks and calls
    // release_held_imports (a held import never costs a running sequence its blocks, or a waiting one its
    // admission: under pressure it is an ordinary cached prefix again).
    void hold_import(uint64_t seq_id, PrefixImport im);
    void drop_import(uint64_t seq_id);
    bool release_held_imports();  // false: none was held
    int num_held_imports() const { return static_cast<int>(held_.size()); }
    // Drops the import's references (tail first): indexed blocks stay in the prefix cache, least recently used
    // last; blocks never indexed (a failed copy) go back to the free list.
    void release_import(const PrefixImport& im);
    // index_import where `written`, then release_import.
    void finish_import(std::span<const int32_t> tokens, const PrefixImport& im, bool written) {
        if (written) index_import(tokens, im);
        release_import(im);
    }

private:
    void extend_hashes(Sequence& seq, int num_blocks) const;
    int longest_cached_prefix(Sequence& seq) const;  // match_prefix's search (seq gains its block hashes)

    int block_size_;
    int sliding_window_;
    bool prefix_caching_;
    BlockAllocator full_;
    BlockAllocator sliding_;
    int dp_ = 1;
    // dp_ > 1: the group whose KV an indexed block holds (set when a sequence indexes it).
    std::vector<int32_t> full_group_, sliding_group_;
    std::unordered_map<uint64_t, PrefixImport> held_;  // hold_import's, by sequence id
};

}  // namespace gptoss::runtime
