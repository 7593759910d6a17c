// Small kernels around the collectives of the parallel CUDA forward (parallel/world.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

// Expert parallelism: model-wide expert ids -> this rank's local ids. ids in [begin, begin + count)
// become id - begin; every other id becomes `count`, a bucket the expert kernels never process
// (moe_plan is called with count + 1 experts, the expert kernels with count).
void ep_localize(int32_t* expert_ids, int num_assignments, int expert_begin, int num_local_experts,
                 cudaStream_t stream);

// out[t, :] = Σ_{k < K} w[t, k] · y[t, k, :] in slot order (the per-rank MoE output that the world
// all-reduce sums).
void moe_combine(const float* y, const float* weights, int num_tokens, int k, int hidden_size, float* out,
                 cudaStream_t stream);

// TP lm_head: `gathered` is [tp, rows, chunk] (rank t's vocabulary slice [t·chunk, t·chunk + chunk)
// clipped to vocab); out is [rows, vocab].
void vocab_interleave(const float* gathered, int tp, int rows, int chunk, int vocab, float* out, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
