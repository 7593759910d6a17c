#include "tokenizer/byte_pair.h"

#include <algorithm>
#include <cstring>
#include <queue>

namespace gptoss::tokenizer {

void byte_pair_merge_scan(const uint8_t* p, size_t n, const RankTable& ranks, const uint32_t* byte_id,
                          std::vector<int32_t>& out) {
    struct Part {
        uint32_t start;  // first byte of the part
        uint32_t rank;   // rank of this part joined with the next one (kNoRank: not a token)
        uint32_t id;     // id of the part itself
    };
    Part parts[kMaxScanPieceBytes + 1];
    size_t m = n + 1;  // parts[m - 1] only marks the end
    for (size_t i = 0; i < n; ++i) {
        parts[i] = {static_cast<uint32_t>(i), i + 1 < n ? ranks.find(p + i, 2) : kNoRank, byte_id[p[i]]};
    }
    parts[n] = {static_cast<uint32_t>(n), kNoRank, kNoRank};
    for (;;) {
        uint32_t best = kNoRank;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; ++i) {
            if (parts[i].rank < best) {
                best = parts[i].rank;
                at = i;
            }
        }
        if (best == kNoRank) break;
        // Join parts[at] and parts[at + 1]; the merged token's id is the rank (rank = id).
        std::memmove(&parts[at + 1], &parts[at + 2], (m - at - 2) * sizeof(Part));
        --m;
        parts[at].id = best;
        parts[at].rank = at + 2 < m ? ranks.find(p + parts[at].start, parts[at + 2].start - parts[at].start) : kNoRank;
        if (at > 0) {
            parts[at - 1].rank = ranks.find(p + parts[at - 1].start, parts[at + 1].start - parts[at - 1].start);
        }
    }
    for (size_t i = 0; i + 1 < m; ++i) out.push_back(static_cast<int32_t>(parts[i].id));
}

void byte_pair_merge_heap(const uint8_t* p, size_t n, const RankTable& ranks, const uint32_t* byte_id,
                          std::vector<int32_t>& out) {
    // Positions are 32-bit to keep the heap small; a piece of 4 GiB or more is merged in chunks.
    constexpr size_t kMaxChunk = size_t{1} << 31;
    if (n > kMaxChunk) {
        for (size_t start = 0; start < n; start += kMaxChunk) {
            size_t len = std::min(kMaxChunk, n - start);
            if (len == 1) {
                out.push_back(static_cast<int32_t>(byte_id[p[start]]));
            } else {
                byte_pair_merge_heap(p + start, len, ranks, byte_id, out);
            }
        }
        return;
    }
    // Parts form a linked list over byte positions: part i covers [i, next[i]), and pair_rank[i] is
    // the rank of part i joined with the part after it. A heap entry (rank << 32 | i) proposes that
    // join; it is stale once part i is gone or its pair rank changed. An entry whose rank still
    // matches is current even if the parts moved: equal rank means equal bytes [i, end), so the
    // join it makes is the same.
    constexpr uint32_t kGone = kNoRank - 1;  // pair_rank of a part merged into its left neighbour
    std::vector<uint32_t> next(n), prev(n), id(n), pair_rank(n);
    std::vector<uint64_t> storage;
    storage.reserve(n);
    std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> heap(std::greater<uint64_t>(),
                                                                                      std::move(storage));
    for (size_t i = 0; i < n; ++i) {
        next[i] = static_cast<uint32_t>(i + 1);
        prev[i] = static_cast<uint32_t>(i - 1);  // wraps for i = 0; never read there
        id[i] = byte_id[p[i]];
        pair_rank[i] = i + 1 < n ? ranks.find(p + i, 2) : kNoRank;
        if (pair_rank[i] != kNoRank) heap.push((uint64_t{pair_rank[i]} << 32) | i);
    }
    auto pair_end = [&](uint32_t i) { return next[i] < n ? next[next[i]] : static_cast<uint32_t>(n); };
    while (!heap.empty()) {
        uint64_t top = heap.top();
        heap.pop();
        uint32_t rank = static_cast<uint32_t>(top >> 32);
        uint32_t left = static_cast<uint32_t>(top);
        if (pair_rank[left] != rank) continue;  // stale
        uint32_t mid = next[left];
        uint32_t end = next[mid];
        id[left] = rank;
        pair_rank[mid] = kGone;
        next[left] = end;
        if (end < n) prev[end] = left;
        if (left > 0) {
            uint32_t l = prev[left];
            pair_rank[l] = ranks.find(p + l, end - l);
            if (pair_rank[l] != kNoRank) heap.push((uint64_t{pair_rank[l]} << 32) | l);
        }
        pair_rank[left] = end < n ? ranks.find(p + left, pair_end(left) - left) : kNoRank;
        if (pair_rank[left] != kNoRank) heap.push((uint64_t{pair_rank[left]} << 32) | left);
    }
    for (size_t i = 0; i < n; i = next[i]) out.push_back(static_cast<int32_t>(id[i]));
}

}  // namespace gptoss::tokenizer
