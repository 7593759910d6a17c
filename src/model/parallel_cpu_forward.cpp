#include "model/parallel_cpu_forward.h"

#include <thread>

#include "parallel/local_communicator.h"

namespace gptoss::model {

StatusOr<std::unique_ptr<ParallelCpuForward>> ParallelCpuForward::create(const GptOssWeights& full,
                                                                         const parallel::ParallelConfig& layout,
                                                                         int block_size, int num_blocks_full,
                                                                         int num_blocks_sliding, bool emulate_bf16,
                                                                         bool kv_fp8) {
    RETURN_IF_ERROR(check_parallel_config(full.config, layout));
    std::unique_ptr<ParallelCpuForward> p(new ParallelCpuForward(layout));
    p->vocab_size_ = full.config.vocab_size;
    std::vector<parallel::RankComms> comms = parallel::make_local_world(layout);
    p->ranks_.resize(layout.world_size());
    for (int r = 0; r < layout.world_size(); ++r) {
        Rank& rk = p->ranks_[r];
        ASSIGN_OR_RETURN(WeightShard s, plan_shard(full.config, layout, r));
        ASSIGN_OR_RETURN(rk.weights, shard_weights(full, s));
        rk.kv = std::make_unique<CpuKvCache>(full.config, block_size, num_blocks_full, num_blocks_sliding,
                                             s.num_kv_heads, kv_fp8);
        rk.comms = std::move(comms[r]);
        rk.forward = std::make_unique<CpuForward>(*rk.weights, emulate_bf16, &rk.comms);
    }
    return p;
}

ParallelCpuForward::~ParallelCpuForward() = default;

Status ParallelCpuForward::forward(std::span<const ForwardSequence> seqs, std::span<const int> dp_group,
                                   std::vector<float>* logits) {
    const int dp = layout_.dp, tp = layout_.tp;
    if (!dp_group.empty() && dp_group.size() != seqs.size()) {
        return invalid_argument("dp_group needs one entry per sequence");
    }
    // The step plan every rank follows (rank 0 would broadcast it across processes).
    std::vector<std::vector<ForwardSequence>> per_group(dp);
    std::vector<std::vector<size_t>> members(dp);
    for (size_t i = 0; i < seqs.size(); ++i) {
        const int g = dp_group.empty() ? 0 : dp_group[i];
        if (g < 0 || g >= dp) return invalid_argument("dp group " + std::to_string(g) + " out of range");
        per_group[g].push_back(seqs[i]);
        members[g].push_back(i);
    }
    // Validate up front: a rank failing alone would leave the others waiting in a collective.
    for (int g = 0; g < dp; ++g) {
        const Rank& r0 = ranks_[g * tp];
        RETURN_IF_ERROR(r0.forward->validate(per_group[g], *r0.kv));
    }
    std::vector<std::vector<float>> out(ranks_.size());
    std::vector<Status> status(ranks_.size());
    {
        std::vector<std::jthread> threads;
        for (size_t r = 0; r < ranks_.size(); ++r) {
            threads.emplace_back([&, r] {
                const int g = static_cast<int>(r) / tp;
                status[r] = ranks_[r].forward->forward(per_group[g], *ranks_[r].kv, &out[r]);
            });
        }
    }
    for (const Status& s : status) RETURN_IF_ERROR(s);
    // Rows per sequence, then scatter each group's rows (from its TP rank 0) into seqs order.
    std::vector<size_t> rows_of(seqs.size()), first_row(seqs.size());
    size_t total = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        rows_of[i] = seqs[i].all_logits ? seqs[i].tokens.size() : 1;
        first_row[i] = total;
        total += rows_of[i];
    }
    const size_t V = static_cast<size_t>(vocab_size_);
    const size_t base = logits->size();
    logits->resize(base + total * V);
    for (int g = 0; g < dp; ++g) {
        const std::vector<float>& src = out[g * tp];
        size_t row = 0;
        for (size_t i : members[g]) {
            std::copy(src.begin() + row * V, src.begin() + (row + rows_of[i]) * V,
                      logits->begin() + static_cast<std::ptrdiff_t>(base + first_row[i] * V));
            row += rows_of[i];
        }
    }
    return ok_status();
}

}  // namespace gptoss::model
