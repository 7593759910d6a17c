// Byte-pair merging of one pre-tokenizer piece, tiktoken's algorithm: the whole piece if it is a
// token, else start from single bytes and repeatedly merge the adjacent pair whose concatenation has
// the lowest rank (leftmost on ties) until no pair is a token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tokenizer/rank_table.h"

namespace gptoss::tokenizer {

// Pieces up to this many bytes use tiktoken's quadratic scan on a stack array (fast for the short
// pieces of real text); longer ones use a heap, O(n log n), so a megabyte of one letter is not
// quadratic.
inline constexpr size_t kMaxScanPieceBytes = 64;

// Both append the ids of p[0, n) (n >= 2, not itself a token) to `out`. byte_id: [256].
void byte_pair_merge_scan(const uint8_t* p, size_t n, const RankTable& ranks, const uint32_t* byte_id,
                          std::vector<int32_t>& out);
void byte_pair_merge_heap(const uint8_t* p, size_t n, const RankTable& ranks, const uint32_t* byte_id,
                          std::vector<int32_t>& out);

inline void encode_piece(const uint8_t* p, size_t n, const RankTable& ranks, const uint32_t* byte_id,
                         std::vector<int32_t>& out) {
    if (n == 1) {
        out.push_back(static_cast<int32_t>(byte_id[p[0]]));
        return;
    }
    uint32_t id = ranks.find(p, n);
    if (id != kNoRank) {
        out.push_back(static_cast<int32_t>(id));
        return;
    }
    if (n <= kMaxScanPieceBytes) {
        byte_pair_merge_scan(p, n, ranks, byte_id, out);
    } else {
        byte_pair_merge_heap(p, n, ranks, byte_id, out);
    }
}

}  // namespace gptoss::tokenizer
