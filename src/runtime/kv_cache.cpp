#include "runtime/kv_cache.h"

#include "runtime/kv_transfer.h"

#include <cstdio>

#include <algorithm>
#include <limits>
#include <string>

#include "core/check.h"

namespace gptoss::runtime {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

StatusOr<size_t> kv_bytes_for_utilization(size_t free_before, size_t free_now, size_t total_bytes, double utilization) {
    if (!(utilization > 0.0 && utilization <= 1.0))
        return invalid_argument("the GPU memory utilization must be in (0, 1], got " + std::to_string(utilization));
    if (total_bytes == 0 || free_before > total_bytes || free_now > total_bytes)
        return failed_precondition("the device's memory is unknown (" + std::to_string(free_now) + " bytes free of " +
                                   std::to_string(total_bytes) + "): give the KV cache size instead");
    constexpr double kMiB = 1024.0 * 1024.0;
    const double held = free_before > free_now ? static_cast<double>(free_before - free_now) : 0.0;
    const double share = utilization * static_cast<double>(total_bytes);
    const double kv = std::min(share - held, static_cast<double>(free_now));
    if (kv < kMiB) {
        char buf[320];
        std::snprintf(buf, sizeof(buf),
                      "at a GPU memory utilization of %.2f no memory is left for the KV cache: the share is %.0f of "
                      "%.0f MiB, the model holds %.0f MiB, and %.0f MiB are free",
                      utilization, share / kMiB, static_cast<double>(total_bytes) / kMiB, held / kMiB,
                      static_cast<double>(free_now) / kMiB);
        return resource_exhausted(buf);
    }
    return static_cast<size_t>(kv);
}

StatusOr<KvBlockCounts> plan_kv_blocks(const KvGeometry& g, const KvBudget& b, size_t free_bytes, int max_num_seqs,
                                       int max_num_batched_tokens) {
    if (g.block_size <= 0) return invalid_argument("KV block size must be positive");
    const bool sliding = g.sliding_window > 0;
    if (b.num_blocks_full > 0) {
        if (sliding && b.num_blocks_sliding <= 0)
            return invalid_argument("an explicit KV budget needs both full and sliding block counts");
        return KvBlockCounts{b.num_blocks_full, sliding ? b.num_blocks_sliding : b.num_blocks_full};
    }
    size_t bytes = b.bytes;
    if (bytes == 0) {
        if (!(b.fraction_of_free > 0.0 && b.fraction_of_free <= 1.0))
            return invalid_argument(
                "give the KV budget as block counts, bytes, or a fraction of free memory in (0, 1]");
        bytes = static_cast<size_t>(static_cast<double>(free_bytes) * b.fraction_of_free);
    }
    const size_t F = g.bytes_per_block_full, S = sliding ? g.bytes_per_block_sliding : 0;
    const int64_t kMaxBlocks = std::numeric_limits<int32_t>::max() / 2;
    int64_t n_sliding = 0;
    if (sliding && S > 0) {
        const int64_t demand = static_cast<int64_t>(max_num_seqs) * (ceil_div(g.sliding_window - 1, g.block_size) + 2) +
                               ceil_div(max_num_batched_tokens, g.block_size);
        const size_t share = F > 0 ? bytes / 2 : bytes;
        n_sliding = std::min<int64_t>(demand, static_cast<int64_t>(share / S));
    }
    int64_t n_full = 0;
    if (F > 0) {
        n_full = static_cast<int64_t>((bytes - static_cast<size_t>(n_sliding) * S) / F);
    } else {
        n_full = n_sliding;  // no full-attention layers: full blocks cost nothing; match the sliding pool
    }
    n_full = std::min(n_full, kMaxBlocks);
    if (!sliding) n_sliding = n_full;
    if (n_full <= 0 || n_sliding <= 0) {
        return resource_exhausted("a KV budget of " + std::to_string(bytes) +
                                  " bytes holds no block (one block takes " + std::to_string(F + S) + " bytes)");
    }
    return KvBlockCounts{static_cast<int>(n_full), static_cast<int>(n_sliding)};
}

KvCacheManager::KvCacheManager(int block_size, int sliding_window, KvBlockCounts counts, bool prefix_caching)
    : block_size_(block_size),
      sliding_window_(sliding_window),
      prefix_caching_(prefix_caching),
      full_(counts.full, block_size),
      sliding_(sliding_window > 0 ? counts.sliding : 0, block_size) {}

void KvCacheManager::set_dp_groups(int dp) {
    dp_ = std::max(1, dp);
    if (dp_ > 1) {
        full_group_.assign(static_cast<size_t>(full_.num_blocks()), -1);
        sliding_group_.assign(static_cast<size_t>(sliding_.num_blocks()), -1);
    }
}

int KvCacheManager::max_chunk_tokens() const {
    if (!has_sliding()) return std::numeric_limits<int>::max();
    // A chunk of C tokens starting anywhere touches the blocks of W - 1 + C consecutive positions:
    // at most ceil((W - 1 + C) / bs) + 1 blocks.
    const int64_t span = static_cast<int64_t>(sliding_.num_blocks() - 1) * block_size_ - (sliding_window_ - 1);
    return static_cast<int>(std::clamp<int64_t>(span, 0, std::numeric_limits<int>::max()));
}

void KvCacheManager::extend_hashes(Sequence& seq, int num_blocks) const {
    while (static_cast<int>(seq.block_hashes.size()) < num_blocks) {
        const size_t b = seq.block_hashes.size();
        const uint64_t parent = b == 0 ? seq.cache_salt : seq.block_hashes[b - 1];
        seq.block_hashes.push_back(
            hash_block(parent, std::span(seq.tokens).subspan(b * block_size_, static_cast<size_t>(block_size_))));
    }
}

int KvCacheManager::match_prefix(Sequence& seq) {
    ENGINE_CHECK(seq.block_table_full.empty(), "match_prefix on a sequence holding blocks");
    return longest_cached_prefix(seq);
}

int KvCacheManager::cached_prefix_tokens(std::span<const int32_t> tokens) const {
    Sequence seq;
    seq.tokens.assign(tokens.begin(), tokens.end());
    seq.num_prompt_tokens = seq.num_tokens();
    return longest_cached_prefix(seq);
}

int KvCacheManager::longest_cached_prefix(Sequence& seq) const {
    if (!prefix_caching_ || seq.tokens.empty()) return 0;
    const int max_blocks = (seq.num_tokens() - 1) / block_size_;  // keep at least one token to compute
    extend_hashes(seq, max_blocks);
    auto block_tokens = [&](int b) {
        return std::span(seq.tokens).subspan(static_cast<size_t>(b) * block_size_, block_size_);
    };
    // With several DP groups every block taken must hold the KV of the group of block 0 (the sequence's group).
    int group = -1;
    const auto usable = [&](const std::vector<int32_t>& groups, int id) {
        return id >= 0 && (dp_ == 1 || groups[static_cast<size_t>(id)] == group);
    };
    int k = 0;
    if (max_blocks > 0 && dp_ > 1) {
        const int id0 = full_.lookup(seq.block_hashes[0], block_tokens(0));
        group = id0 >= 0 ? id0 % dp_ : -1;
    }
    while (k < max_blocks && usable(full_group_, full_.lookup(seq.block_hashes[k], block_tokens(k)))) ++k;
    if (!has_sliding()) return k * block_size_;
    for (; k > 0; --k) {
        const int first = first_window_block(k * block_size_, sliding_window_, block_size_);
        bool all = true;
        for (int b = first; b < k && all; ++b)
            all = usable(sliding_group_, sliding_.lookup(seq.block_hashes[b], block_tokens(b)));
        if (all) break;
    }
    return k * block_size_;
}

bool KvCacheManager::can_admit(const Sequence& seq, int cached_tokens, int num_new_tokens) const {
    const int k = cached_tokens / block_size_;
    auto block_tokens = [&](int b) {
        return std::span(seq.tokens).subspan(static_cast<size_t>(b) * block_size_, block_size_);
    };
    // Cached blocks nobody holds count as free now, but stop being free once this sequence holds them.
    int full_revived = 0, sliding_revived = 0;
    for (int b = 0; b < k; ++b)
        if (full_.ref_count(full_.lookup(seq.block_hashes[b], block_tokens(b))) == 0) ++full_revived;
    const int64_t full_rest = ceil_div(seq.num_tokens(), block_size_) - k;
    if (full_revived + full_rest > full_.num_free()) return false;
    if (!has_sliding()) return true;
    for (int b = first_window_block(cached_tokens, sliding_window_, block_size_); b < k; ++b)
        if (sliding_.ref_count(sliding_.lookup(seq.block_hashes[b], block_tokens(b))) == 0) ++sliding_revived;
    const int64_t sliding_new = ceil_div(cached_tokens + num_new_tokens, block_size_) - k;
    return sliding_revived + sliding_new <= sliding_.num_free();
}

void KvCacheManager::admit(Sequence& seq, int cached_tokens) {
    ENGINE_CHECK(seq.block_table_full.empty() && cached_tokens % block_size_ == 0, "bad admit");
    const int k = cached_tokens / block_size_;
    auto block_tokens = [&](int b) {
        return std::span(seq.tokens).subspan(static_cast<size_t>(b) * block_size_, block_size_);
    };
    for (int b = 0; b < k; ++b) {
        const int id = full_.lookup(seq.block_hashes[b], block_tokens(b));
        ENGINE_CHECK(id >= 0, "prefix block %d vanished", b);
        full_.ref(id);
        seq.block_table_full.push_back(id);
    }
    seq.block_table_sliding.assign(static_cast<size_t>(k), -1);
    seq.first_held_sliding = 0;
    if (has_sliding()) {
        const int first = first_window_block(cached_tokens, sliding_window_, block_size_);
        for (int b = first; b < k; ++b) {
            const int id = sliding_.lookup(seq.block_hashes[b], block_tokens(b));
            ENGINE_CHECK(id >= 0, "prefix sliding block %d vanished", b);
            sliding_.ref(id);
            seq.block_table_sliding[b] = id;
        }
        seq.first_held_sliding = std::min(first, k);
    }
    seq.num_computed = cached_tokens;
    seq.num_indexed_blocks = k;
    drop_import(seq.id);  // the sequence holds what it uses of it now
}

int KvCacheManager::blocks_needed(const Sequence& seq, int n) const {
    const int64_t needed = ceil_div(static_cast<int64_t>(seq.num_computed) + n, block_size_);
    return static_cast<int>(std::max<int64_t>(0, needed - static_cast<int64_t>(seq.block_table_full.size())));
}

bool KvCacheManager::can_allocate(const Sequence& seq, int n) const {
    const int need = blocks_needed(seq, n);
    return need <= full_.num_free() && (!has_sliding() || need <= sliding_.num_free());
}

void KvCacheManager::allocate(Sequence& seq, int n) {
    ENGINE_CHECK(can_allocate(seq, n), "allocate without room");
    for (int i = blocks_needed(seq, n); i > 0; --i) {
        seq.block_table_full.push_back(full_.allocate());
        seq.block_table_sliding.push_back(has_sliding() ? sliding_.allocate() : -1);
    }
}

void KvCacheManager::on_computed(Sequence& seq) {
    const int complete = seq.num_computed / block_size_;
    if (prefix_caching_ && seq.num_indexed_blocks < complete) {
        extend_hashes(seq, complete);
        const int group = dp_ > 1 ? seq.block_table_full[0] % dp_ : 0;
        for (int b = seq.num_indexed_blocks; b < complete; ++b) {
            auto tokens = std::span(seq.tokens).subspan(static_cast<size_t>(b) * block_size_, block_size_);
            const int32_t full_id = seq.block_table_full[b];
            full_.index(full_id, seq.block_hashes[b], tokens);
            // (Blocks from num_indexed_blocks on are this sequence's own work: their KV is in its group. A block id
            // keeps the group of its last indexing, so a reallocated block is set again here when indexed.)
            if (dp_ > 1 && full_.lookup(seq.block_hashes[b], tokens) == full_id)
                full_group_[static_cast<size_t>(full_id)] = group;
            if (has_sliding() && seq.block_table_sliding[b] >= 0) {
                const int32_t id = seq.block_table_sliding[b];
                sliding_.index(id, seq.block_hashes[b], tokens);
                if (dp_ > 1 && sliding_.lookup(seq.block_hashes[b], tokens) == id)
                    sliding_group_[static_cast<size_t>(id)] = group;
            }
        }
        seq.num_indexed_blocks = complete;
    }
    if (!has_sliding()) return;
    // The next token (position num_computed) reads positions >= num_computed - W + 1.
    const int first_needed = first_window_block(seq.num_computed, sliding_window_, block_size_);
    for (; seq.first_held_sliding < first_needed; ++seq.first_held_sliding) {
        int32_t& id = seq.block_table_sliding[seq.first_held_sliding];
        if (id >= 0) sliding_.unref(id);
        id = -1;
    }
}

void KvCacheManager::free(Sequence& seq) {
    // Tail first: the LRU list then evicts a prefix's later blocks before its earlier ones, which
    // more requests share.
    for (size_t i = seq.block_table_full.size(); i-- > 0;) {
        full_.unref(seq.block_table_full[i]);
        if (seq.block_table_sliding[i] >= 0) sliding_.unref(seq.block_table_sliding[i]);
    }
    seq.block_table_full.clear();
    seq.block_table_sliding.clear();
    seq.first_held_sliding = 0;
    seq.num_indexed_blocks = 0;
    seq.num_computed = 0;
}

bool KvCacheManager::begin_import(std::span<const int32_t> tokens, PrefixImport* im) {
    *im = PrefixImport{};
    if (!prefix_caching_) return false;
    const int k = static_cast<int>(tokens.size()) / block_size_;
    if (k <= 0) return false;
    std::vector<uint64_t> hashes(static_cast<size_t>(k));
    for (int b = 0; b < k; ++b)
        hashes[b] =
            hash_block(b == 0 ? 0 : hashes[b - 1], tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_));
    auto block_tokens = [&](int b) { return tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_); };
    im->first_sliding = has_sliding() ? first_window_block(k * block_size_, sliding_window_, block_size_) : k;
    // Pin what is cached first, so that allocating the rest cannot evict it.
    int missing_full = 0, missing_sliding = 0;
    for (int b = 0; b < k; ++b) {
        const int id = full_.lookup(hashes[b], block_tokens(b));
        if (id >= 0) full_.ref(id);
        im->full.push_back(id);
        missing_full += id < 0;
    }
    for (int b = im->first_sliding; b < k; ++b) {
        const int id = sliding_.lookup(hashes[b], block_tokens(b));
        if (id >= 0) sliding_.ref(id);
        im->sliding.push_back(id);
        missing_sliding += id < 0;
    }
    if (missing_full > full_.num_free() || missing_sliding > sliding_.num_free()) {
        for (int id : im->full)
            if (id >= 0) full_.unref(id);
        for (int id : im->sliding)
            if (id >= 0) sliding_.unref(id);
        *im = PrefixImport{};
        return false;
    }
    im->write_full.assign(im->full.size(), -1);
    im->write_sliding.assign(im->sliding.size(), -1);
    for (size_t i = 0; i < im->full.size(); ++i)
        if (im->full[i] < 0) im->full[i] = im->write_full[i] = full_.allocate();
    for (size_t i = 0; i < im->sliding.size(); ++i)
        if (im->sliding[i] < 0) im->sliding[i] = im->write_sliding[i] = sliding_.allocate();
    return true;
}

void KvCacheManager::index_import(std::span<const int32_t> tokens, const PrefixImport& im) {
    const int k = static_cast<int>(im.full.size());
    uint64_t hash = 0;
    for (int b = 0; b < k; ++b) {
        const auto block = tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_);
        hash = hash_block(hash, block);
        if (im.write_full[b] >= 0) full_.index(im.write_full[b], hash, block);
        if (b >= im.first_sliding && im.write_sliding[b - im.first_sliding] >= 0)
            sliding_.index(im.write_sliding[b - im.first_sliding], hash, block);
    }
}

void KvCacheManager::hold_import(uint64_t seq_id, PrefixImport im) {
    drop_import(seq_id);
    held_.emplace(seq_id, std::move(im));
}

void KvCacheManager::drop_import(uint64_t seq_id) {
    auto it = held_.find(seq_id);
    if (it == held_.end()) return;
    release_import(it->second);
    held_.erase(it);
}

bool KvCacheManager::release_held_imports() {
    if (held_.empty()) return false;
    for (auto& [id, im] : held_) release_import(im);
    held_.clear();
    return true;
}

void KvCacheManager::release_import(const PrefixImport& im) {
    // Tail first, as free() does: the LRU list then evicts the prefix's later blocks first.
    for (size_t i = im.sliding.size(); i-- > 0;) sliding_.unref(im.sliding[i]);
    for (size_t i = im.full.size(); i-- > 0;) full_.unref(im.full[i]);
}

}  // namespace gptoss::runtime
