// The CPU backend under a parallel layout: one thread per simulated rank, each with its weight
// shard, KV caches for its heads, and LocalGroup communicators (parallel/local_communicator.h).
// This is how CI checks every TP/EP/DP combination against the single-rank forward.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "model/gpt_oss_forward.h"
#include "model/weight_shard.h"
#include "parallel/world.h"

namespace gptoss::model {

class ParallelCpuForward {
public:
    // `full` must outlive this object. Every DP group gets KV caches of the given size.
    static StatusOr<std::unique_ptr<ParallelCpuForward>> create(const GptOssWeights& full,
                                                                const parallel::ParallelConfig& layout, int block_size,
                                                                int num_blocks_full, int num_blocks_sliding,
                                                                bool emulate_bf16 = false, bool kv_fp8 = false);
    ~ParallelCpuForward();

    // One step: seqs[i] runs on DP group dp_group[i] (its block tables index that group's cache;
    // empty dp_group = all on group 0). Logits rows are appended in the order of `seqs`, as
    // CpuForward::forward would append them.
    Status forward(std::span<const ForwardSequence> seqs, std::span<const int> dp_group, std::vector<float>* logits);

    const parallel::ParallelConfig& layout() const { return layout_; }
    const GptOssWeights& shard(int rank) const { return *ranks_[rank].weights; }

private:
    struct Rank {
        std::unique_ptr<GptOssWeights> weights;
        std::unique_ptr<CpuKvCache> kv;
        std::unique_ptr<CpuForward> forward;
        parallel::RankComms comms;
    };
    explicit ParallelCpuForward(const parallel::ParallelConfig& layout) : layout_(layout) {}

    parallel::ParallelConfig layout_;
    int vocab_size_ = 0;
    std::vector<Rank> ranks_;
};

}  // namespace gptoss::model
