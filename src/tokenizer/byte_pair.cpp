#include "tokenizer/byte_pair.h"

#include <algorithm>
#include <functional>

namespace gptoss::tokenizer {

void byte_pair_merge_scan(const uint8_t* p, size_t n, const BpeTables& t, std::vector<int32_t>& out) {
    struct Part {
        uint32_t id;    // the part's token
        uint32_t rank;  // token made by joining it with the next part (kNoRank: none)
    };
    Part parts[kMaxScanPieceBytes];
    size_t m = n;
    for (size_t i = 0; i < n; ++i) parts[i].id = t.byte_id[p[i]];
    for (size_t i = 0; i + 1 < n; ++i) parts[i].rank = t.pairs.find(parts[i].id, parts[i + 1].id);
    parts[n - 1].rank = kNoRank;
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
        // Join parts[at] and parts[at + 1] into token `best`.
        for (size_t i = at + 1; i + 1 < m; ++i) parts[i] = parts[i + 1];
        --m;
        parts[at].id = best;
        parts[at].rank = at + 1 < m ? t.pairs.find(best, parts[at + 1].id) : kNoRank;
        if (at > 0) parts[at - 1].rank = t.pairs.find(parts[at - 1].id, best);
    }
    for (size_t i = 0; i < m; ++i) out.push_back(static_cast<int32_t>(parts[i].id));
}

namespace {

struct HeapPart {
    uint32_t next, prev;  // linked list over byte positions: the part at i covers [i, next)
    uint32_t id;          // the part's token
    uint32_t rank;        // token made by joining it with the next part (kNoRank: none)
};

// parts: [n]; heap: room for 3n entries (n - 1 at the start, at most two more per merge).
void merge_with_heap(const uint8_t* p, size_t n, const BpeTables& t, HeapPart* parts, uint64_t* heap,
                     std::vector<int32_t>& out) {
    // A heap entry (rank << 32 | i) proposes joining part i with the next one; it is stale once part
    // i is gone or its rank changed. An entry whose rank still matches is current even if the parts
    // moved: the same token from the same start is the same join.
    constexpr uint32_t kGone = kNoRank - 1;  // rank of a part merged into its left neighbour
    size_t size = 0;
    for (size_t i = 0; i < n; ++i) {
        parts[i] = {static_cast<uint32_t>(i + 1), static_cast<uint32_t>(i - 1), t.byte_id[p[i]], kNoRank};
    }
    for (size_t i = 0; i + 1 < n; ++i) {
        parts[i].rank = t.pairs.find(parts[i].id, parts[i + 1].id);
        if (parts[i].rank != kNoRank) heap[size++] = (uint64_t{parts[i].rank} << 32) | i;
    }
    auto later = std::greater<uint64_t>();
    std::make_heap(heap, heap + size, later);
    auto push = [&](uint32_t rank, uint32_t i) {
        heap[size++] = (uint64_t{rank} << 32) | i;
        std::push_heap(heap, heap + size, later);
    };
    while (size > 0) {
        std::pop_heap(heap, heap + size, later);
        uint64_t top = heap[--size];
        uint32_t rank = static_cast<uint32_t>(top >> 32);
        uint32_t left = static_cast<uint32_t>(top);
        HeapPart& l = parts[left];
        if (l.rank != rank) continue;  // stale
        uint32_t mid = l.next;
        uint32_t end = parts[mid].next;
        l.id = rank;
        l.next = end;
        parts[mid].rank = kGone;
        if (end < n) parts[end].prev = left;
        if (left > 0) {
            HeapPart& before = parts[l.prev];
            before.rank = t.pairs.find(before.id, rank);
            if (before.rank != kNoRank) push(before.rank, l.prev);
        }
        l.rank = end < n ? t.pairs.find(rank, parts[end].id) : kNoRank;
        if (l.rank != kNoRank) push(l.rank, left);
    }
    for (size_t i = 0; i < n; i = parts[i].next) out.push_back(static_cast<int32_t>(parts[i].id));
}

}  // namespace

void byte_pair_merge_heap(const uint8_t* p, size_t n, const BpeTables& t, std::vector<int32_t>& out) {
    // Positions are 32-bit; a piece of 2 GiB or more is merged in chunks.
    constexpr size_t kMaxChunk = size_t{1} << 31;
    if (n > kMaxChunk) {
        for (size_t start = 0; start < n; start += kMaxChunk) {
            size_t len = std::min(kMaxChunk, n - start);
            if (len == 1) {
                out.push_back(static_cast<int32_t>(t.byte_id[p[start]]));
            } else {
                byte_pair_merge_heap(p + start, len, t, out);
            }
        }
        return;
    }
    constexpr size_t kStackParts = 256;  // pieces up to this size need no allocation
    if (n <= kStackParts) {
        HeapPart parts[kStackParts];
        uint64_t heap[3 * kStackParts];
        merge_with_heap(p, n, t, parts, heap, out);
        return;
    }
    std::vector<HeapPart> parts(n);
    std::vector<uint64_t> heap(3 * n);
    merge_with_heap(p, n, t, parts.data(), heap.data(), out);
}

}  // namespace gptoss::tokenizer
