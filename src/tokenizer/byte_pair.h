// Byte-pair merging of one pre-tokenizer piece, tiktoken's algorithm: the whole piece if it is a
// token, else start from single bytes and repeatedly merge the adjacent pair whose merged token has
// the lowest rank (= id; leftmost on ties) until no adjacent pair makes a token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tokenizer/rank_table.h"

namespace gptoss::tokenizer {

// What merging needs: whole pieces by bytes, adjacent pairs by ids, single bytes.
struct BpeTables {
    const RankTable& ranks;
    const PairTable& pairs;
    const uint32_t* byte_id;  // [256]
};

// Pieces up to this many bytes use tiktoken's quadratic scan over a small array (fastest for the
// short pieces of real text); longer ones use a heap, O(n log n), so that a megabyte of one letter
// takes a fraction of a second rather than hours. 64 measured best on CJK text (bench/cpu).
inline constexpr size_t kMaxScanPieceBytes = 64;

// Both append the ids of p[0, n) (n >= 2) to `out`.
void byte_pair_merge_scan(const uint8_t* p, size_t n, const BpeTables& t, std::vector<int32_t>& out);
void byte_pair_merge_heap(const uint8_t* p, size_t n, const BpeTables& t, std::vector<int32_t>& out);

inline void encode_piece(const uint8_t* p, size_t n, const BpeTables& t, std::vector<int32_t>& out) {
    if (n == 1) {
        out.push_back(static_cast<int32_t>(t.byte_id[p[0]]));
        return;
    }
    uint32_t id = t.ranks.find(p, n);
    if (id != kNoRank) {
        out.push_back(static_cast<int32_t>(id));
        return;
    }
    if (n <= kMaxScanPieceBytes) {
        byte_pair_merge_scan(p, n, t, out);
    } else {
        byte_pair_merge_heap(p, n, t, out);
    }
}

}  // namespace gptoss::tokenizer
