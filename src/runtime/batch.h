// What the scheduler hands the model runner for one step: every sequence's new tokens with their
// positions and block tables (the explicit batch metadata of STYLE.md rule 7; no globals).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gptoss::runtime {

struct BatchSequence {
    std::span<const int32_t> tokens;  // [num_new_tokens] a prefill chunk or one decode token
    int start_pos = 0;                // absolute position of tokens[0]
    // Logical block → block id in the runner's cache, covering every position up to
    // start_pos + tokens.size() - 1. Sliding entries older than the window of tokens[0] may be -1.
    std::span<const int32_t> block_table_full;
    std::span<const int32_t> block_table_sliding;
    bool need_logits = false;  // logits of the last new token (the sequence samples this step)
    // With need_logits: logits of every new token, in order (a speculative step's verification, or
    // a prompt chunk scored for its prompt logprobs).
    bool all_logits = false;
    // With all_logits: the rows are a prompt chunk's (Sequence::score_prompt), not a verification's.
    bool score_prompt = false;
    int num_logits() const { return need_logits ? (all_logits ? static_cast<int>(tokens.size()) : 1) : 0; }
};

struct Batch {
    std::vector<BatchSequence> seqs;
    int num_tokens = 0;  // sum of tokens.size()
    int num_logits() const {
        int n = 0;
        for (const BatchSequence& s : seqs) n += s.num_logits();
        return n;
    }
};

}  // namespace gptoss::runtime
