// Speculative decoding by n-gram lookup (prompt lookup; vLLM's "ngram" method): a sequence in its
// decode phase proposes the tokens that followed the most recent earlier occurrence of its own
// last n tokens, the engine feeds them with its last token in one step, and keeps the drafts the
// model itself would have produced. No draft model and no extra weights: it pays off on text that
// repeats what the context holds (code edits, quoting, retrieval answers, extraction).
//
// Verification (Engine::step): one logits row per fed token. Row i is sampled exactly as a plain
// decode step would sample that position (same sampler, same parameters, draw index = the token's
// index in the output), and draft i + 1 is kept while it equals the token drawn at row i. The first
// mismatch, or the row after the last draft, gives the step's final token. A draft is a single
// proposed token (q is a point mass), so this is the rejection rule of speculative sampling in the
// form that needs no probabilities: every emitted token is drawn from the target distribution of
// its position, greedy outputs are exactly the non-speculative ones, and a seeded request draws the
// same tokens with or without speculation (up to the backend's rounding between batch shapes).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace gptoss::runtime {

struct SpeculativeConfig {
    int num_tokens = 0;  // drafts proposed per sequence and step; 0: speculation off
    int ngram_min = 2;   // shortest suffix matched
    int ngram_max = 4;   // longest suffix matched (the longest match wins; among equals the latest)
    // Propose only while at most this many sequences run (0: any number). A draft costs a full token
    // of compute whether kept or not; at large batches the step is compute-bound and drafts lose.
    int max_running = 8;
    // After a verification that keeps none of a sequence's drafts, it proposes none for the next
    // 1, 2, 4, ... steps (doubling, up to this; 0: never wait); a kept draft resets the wait. On
    // text that does not repeat its context, rejected drafts then cost a step in ~max_backoff
    // rather than every step (a k-draft verification costs like a (k + 1)-sequence step).
    int max_backoff = 32;
};

// Batch entries a runner needs beyond max_num_seqs for the drafts (the CUDA runner runs a
// verification as one decode entry a token): num_tokens for each sequence that may draft.
int speculative_extra_entries(const SpeculativeConfig& config, int max_num_seqs);

// Ranges: num_tokens in [0, 16], 1 <= ngram_min <= ngram_max <= 64, max_running >= 0,
// max_backoff in [0, 1024].
Status validate_speculative_config(const SpeculativeConfig& config);

// The longest suffix of `tokens` of length in [ngram_min, ngram_max] that also occurs earlier (its
// latest earlier occurrence among the longest), then up to `max_drafts` tokens that followed that
// occurrence, appended to `drafts`. Returns how many were appended (0: no match). One backward pass
// over `tokens`, stopped at the first match of the full ngram_max length.
int propose_ngram_drafts(std::span<const int32_t> tokens, int max_drafts, int ngram_min, int ngram_max,
                         std::vector<int32_t>* drafts);

}  // namespace gptoss::runtime
