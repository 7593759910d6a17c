// Tensor, expert and data parallel sharding of gpt-oss weights (MODEL.md §2.4, parallel/world.h).
//   TP:     q heads split evenly (kv heads follow their q heads, replicated when TP > kv heads);
//           o_proj split on its input dim, bias added by TP rank 0, summed over the TP group;
//           lm_head split by vocabulary rows (ceil), logits gathered over the TP group.
//   EP:     experts split evenly; MoE-TP: each expert's intermediate split in ceil(G / n) groups of
//           32 units (vLLM's rule: TP4 = 736,736,736,672), gate_up rows [2·begin, 2·end), down
//           input columns [begin, end), down bias added by MoE-TP rank 0; summed over the world.
//   Router, embedding and norms are replicated.
#pragma once

#include <memory>

#include "core/status.h"
#include "model/gpt_oss_weights.h"
#include "parallel/world.h"

namespace gptoss::model {

// Checks that `config` can run under `layout` (heads, experts and intermediate divide as needed).
Status check_parallel_config(const GptOssConfig& config, const parallel::ParallelConfig& layout);

// The slice rank `rank` of `layout` holds.
StatusOr<WeightShard> plan_shard(const GptOssConfig& config, const parallel::ParallelConfig& layout, int rank);

// Views and copies of `full`'s tensors for one shard: row slices point into `full` (which must
// outlive the result), column slices and expert subsets are copied.
StatusOr<std::unique_ptr<GptOssWeights>> shard_weights(const GptOssWeights& full, const WeightShard& shard);

}  // namespace gptoss::model
