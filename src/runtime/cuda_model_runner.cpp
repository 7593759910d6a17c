#include "runtime/cuda_model_runner.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace gptoss::runtime {

StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::create(std::shared_ptr<const model::GptOssWeights> weights,
                                                                   int max_num_seqs, int max_batched_tokens,
                                                                   const parallel::ParallelConfig& layout, bool fp8) {
    model::CudaModelOptions opt;
    opt.fp8 = fp8;
    opt.max_seqs = std::max(1, max_num_seqs);
    opt.max_tokens = std::max({max_batched_tokens, max_num_seqs, 1});
    opt.defer_kv_cache = true;
    ASSIGN_OR_RETURN(model::WeightShard shard, model::plan_shard(weights->config, layout, 0));
    ASSIGN_OR_RETURN(auto m, model::ParallelCudaModel::create(*weights, layout, opt));
    return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(weights), std::move(m), shard.num_kv_heads));
}

KvGeometry CudaModelRunner::kv_geometry(int block_size) const {
    const model::GptOssConfig& c = weights_->config;
    // Per GPU: each rank holds its kv heads' share of every block (the engine budgets one device).
    const size_t per_layer = 2 * static_cast<size_t>(block_size) * kv_heads_ * c.head_dim * 2;  // K and V, bf16
    KvGeometry g;
    g.block_size = block_size;
    for (int l = 0; l < c.num_hidden_layers; ++l)
        (c.is_sliding(l) ? g.bytes_per_block_sliding : g.bytes_per_block_full) += per_layer;
    g.sliding_window = g.bytes_per_block_sliding > 0 ? c.sliding_window : 0;
    return g;
}

size_t CudaModelRunner::free_memory_bytes() const { return model_->free_device_memory(); }

Status CudaModelRunner::allocate_kv_cache(int block_size, KvBlockCounts counts) {
    return model_->allocate_kv_cache(block_size, counts.full, counts.sliding);
}

Status CudaModelRunner::forward(const Batch& batch, std::vector<float>* logits) {
    seqs_.clear();
    for (const BatchSequence& s : batch.seqs)
        seqs_.push_back({s.tokens, s.start_pos, s.block_table_full, s.block_table_sliding, false});
    // CudaModel returns the last token's logits for every sequence; keep the rows asked for.
    rows_.clear();
    dp_group_.clear();
    const int dp = model_->layout().dp;
    for (const auto& s : seqs_) dp_group_.push_back(s.block_table_full.empty() ? 0 : s.block_table_full[0] % dp);
    RETURN_IF_ERROR(model_->forward(seqs_, &rows_, dp_group_));
    const size_t V = static_cast<size_t>(weights_->config.vocab_size);
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
        if (!batch.seqs[i].need_logits) continue;
        // A non-finite row means a backend bug: fail the step with a clear error rather than
        // sampling from garbage.
        const float* row = rows_.data() + i * V;
        if (!std::all_of(row, row + V, [](float v) { return std::isfinite(v); })) {
            const BatchSequence& s = batch.seqs[i];
            return internal_error("non-finite logits from the CUDA backend for sequence " + std::to_string(i) + " of " +
                                  std::to_string(batch.seqs.size()) + " (positions " + std::to_string(s.start_pos) +
                                  ".." + std::to_string(s.start_pos + static_cast<int>(s.tokens.size()) - 1) +
                                  ", batch of " + std::to_string(batch.num_tokens) + " tokens)");
        }
        logits->insert(logits->end(), rows_.begin() + static_cast<long>(i * V),
                       rows_.begin() + static_cast<long>((i + 1) * V));
    }
    return ok_status();
}

}  // namespace gptoss::runtime
