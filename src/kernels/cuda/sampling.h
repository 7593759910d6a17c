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
    // on the H200) and the one-CTA kernel only the sampled rows.
    void* workspace = nullptr;
    // Optional [num_seqs][argmax_key_slots ≤ 32], GemvArgs::argmax_key of the GEMV that wrote the logits
    // (session 40): greedy rows take their token from the largest of their keys (the logit's
    // order-preserving bits above ~index, all ones where the row has a NaN or infinity) and no arg-max
    // kernel runs; every key is reset to zero here, so the next GEMV finds it so.
    uint64_t* argmax_keys = nullptr;
    int argmax_key_slots = 1;
};
size_t sample_workspace_bytes(int num_seqs);
void sample(const SampleArgs& args, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
