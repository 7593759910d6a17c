// Sampling on the GPU, one CTA per sequence: greedy (temperature 0), or temperature sampling
// restricted by top-k and top-p, drawn with the Gumbel-max trick from counter-based noise, so a
// draw depends only on (seed, draw_index, logits): reproducible whatever shares the batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

struct SampleArgs {
    const float* logits = nullptr;         // [num_seqs, vocab_size]
    const float* temperature = nullptr;    // [num_seqs]; <= 0 means greedy
    const float* top_p = nullptr;          // [num_seqs]; 1 disables
    const int32_t* top_k = nullptr;        // [num_seqs]; 0 disables
    const uint64_t* seed = nullptr;        // [num_seqs]
    const uint64_t* draw_index = nullptr;  // [num_seqs]: position of this draw in the request's output
    int32_t* out = nullptr;                // [num_seqs]; -1 where the row has a NaN or infinity
    int num_seqs = 0;
    int vocab_size = 0;
    // Optional, sample_workspace_bytes(most rows of any call), zeroed once when allocated (the
    // kernels leave it zeroed; calls of any size up to that may share it, in stream order): greedy
    // rows then take a split arg-max over many CTAs (one CTA reading a 201k-entry row took 87 µs
    // on the H200) and the one-CTA kernel only the sampled rows (or, with split_draws, split ones).
    void* workspace = nullptr;
    // Optional: row s of this call is logits row row_index[s] (else row s).
    const int32_t* row_index = nullptr;
    // Optional: [num_seqs][⌈vocab_size / 32⌉] words; token i of row s may be drawn where bit i % 32 of word
    // s · words + i / 32 is set, and the others are drawn as if their logit were -inf (the host sampler's masked
    // draw: top-k and top-p among the allowed tokens). out[s] = -1 where no token is allowed.
    const uint32_t* allowed_bits = nullptr;
    // Optional, [num_seqs]: tokens whose probability at the row's temperature is below min_p[s] times the most
    // probable token's are not drawn (0: no cut), after top-k and before top-p, as the host sampler orders them.
    const float* min_p = nullptr;
    // With a workspace: draw the non-greedy rows with kSplit CTAs each over a fixed sequence of launches (~30 µs
    // in all, the one-CTA kernel ~110 µs for a temperature draw of 201k tokens and ~0.7-0.9 ms with top-k or
    // top-p: sample_bench) instead of one CTA a row; the same tokens. Off, the greedy-only step launches less:
    // the caller chooses per call (a graph captures one form).
    bool split_draws = false;
};
size_t sample_workspace_bytes(int num_seqs);
void sample(const SampleArgs& args, cudaStream_t stream);

// The host sampler's bias and penalties on rows of logits, in place (runtime/sampler.h LogitEdits): row s (logits
// row row_index[s], or s) gets logit[id] += value for its add entries, then l > 0 ? l / repetition[s] :
// l · repetition[s] for its repeat ids, then logit[id] -= value for its subtract entries; row s's entries of each
// list are [offset[s], offset[s + 1]), ids unique within a row's list. IEEE single roundings (no contraction), so
// the rows equal the host's edited rows bit for bit.
struct LogitEditArgs {
    float* logits = nullptr;
    const int32_t* row_index = nullptr;
    int num_seqs = 0;
    int vocab_size = 0;
    const int32_t* add_offset = nullptr;  // [num_seqs + 1]
    const int32_t* add_id = nullptr;
    const float* add_value = nullptr;
    const int32_t* repeat_offset = nullptr;  // [num_seqs + 1]
    const int32_t* repeat_id = nullptr;
    const float* repetition = nullptr;         // [num_seqs]
    const int32_t* subtract_offset = nullptr;  // [num_seqs + 1]
    const int32_t* subtract_id = nullptr;
    const float* subtract_value = nullptr;
};
void edit_logits(const LogitEditArgs& args, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
