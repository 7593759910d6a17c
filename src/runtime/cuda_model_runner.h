// ModelRunner on the CUDA backend: model::CudaModel (device weights, paged bf16 KV cache, CUDA
// graphs for decode). In a build without CUDA, create() returns a clear error.
#pragma once

#include <memory>
#include <vector>

#include "model/cuda_model.h"
#include "model/parallel_cuda_model.h"
#include "parallel/world.h"
#include "runtime/model_runner.h"

namespace gptoss::runtime {

class CudaModelRunner : public ModelRunner {
public:
    // Uploads the weights and sizes activations for max_num_seqs sequences and max_batched_tokens
    // tokens per step; the KV cache comes later (allocate_kv_cache), from the memory then free.
    // layout: several GPUs (model/parallel_cuda_model.h). Under DP a sequence runs on group
    // block_table_full[0] % dp, so sequences sharing a cached prefix share a group. kv_fp8: the
    // KV cache in e4m3 (model::CudaModelOptions::kv_fp8).
    static StatusOr<std::unique_ptr<CudaModelRunner>> create(std::shared_ptr<const model::GptOssWeights> weights,
                                                             int max_num_seqs, int max_batched_tokens,
                                                             const parallel::ParallelConfig& layout = {},
                                                             bool fp8 = false, bool kv_fp8 = false,
                                                             bool fp8_experts = false);

    const model::GptOssConfig& config() const override { return weights_->config; }
    int dp_groups() const override;
    KvGeometry kv_geometry(int block_size) const override;
    size_t free_memory_bytes() const override;
    size_t total_memory_bytes() const override;
    size_t free_memory_before_bytes() const override;
    Status allocate_kv_cache(int block_size, KvBlockCounts counts) override;
    Status forward(const Batch& batch, std::vector<float>* logits) override;
    StatusOr<KvFormat> kv_format(int block_size) const override;
    Status read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* data) override {
        return model_->read_kv_blocks(sliding, ids, data);
    }
    Status write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* data) override {
        return model_->write_kv_blocks(sliding, ids, data);
    }
    bool samples_on_device() const override { return true; }
    bool host_idle_during_forward() const override { return true; }
    int max_batch_entries() const override { return max_entries_; }
    Status forward_sample(const Batch& batch, std::span<const DeviceSample> params, std::vector<int32_t>* ids,
                          std::vector<float>* logits) override;
    bool can_defer_draws() const override;
    Status draw_deferred(std::span<const DeferredDraw> draws, std::vector<int32_t>* ids) override;

private:
    CudaModelRunner(std::shared_ptr<const model::GptOssWeights> weights,
                    std::unique_ptr<model::ParallelCudaModel> model, int kv_heads, bool kv_fp8, int max_entries)
        : weights_(std::move(weights)),
          model_(std::move(model)),
          kv_heads_(kv_heads),
          kv_fp8_(kv_fp8),
          max_entries_(max_entries),
          model_id_(model::model_fingerprint(*weights_)) {}

    // seqs_, need_ and dp_group_ for this batch. A sequence asking for all_logits for a speculative
    // verification becomes one single-token entry a position, all on its block tables: the
    // model writes every entry's K/V before any attention reads the cache in a layer, so entry
    // p + 1 sees entry p's, and the step stays a decode step (CUDA graphs, device sampling). A
    // scored prompt chunk stays one entry with all of its rows.
    void prepare(const Batch& batch);
    // Rows the model gives entry e (every entry gets its last token's; a scored chunk every token's).
    size_t model_rows(size_t e) const { return seqs_[e].all_logits ? seqs_[e].tokens.size() : 1; }
    // forward_sample() for batches without scored chunks: the model draws every entry's row.
    Status sample_entries(const Batch& batch, std::span<const DeviceSample> params, std::vector<int32_t>* ids,
                          std::vector<float>* logits);
    Status check_row(const Batch& batch, size_t i, const float* row) const;
    // For each parameter set of the last forward_sample: the model's logits row of a deferred draw, else -1.
    std::vector<int> deferred_;
    static constexpr size_t kMaxDeferRows = 256;  // the model's logits rows kept on the device (one chunk)
    // Entry e's result: the id drawn on the device, or (host) -1 and its logits row.
    Status emit_row(const Batch& batch, size_t e, bool host, int32_t id, const float* row, std::vector<int32_t>* ids,
                    std::vector<float>* logits) const;

    std::shared_ptr<const model::GptOssWeights> weights_;  // the model's host copy stays mapped
    std::unique_ptr<model::ParallelCudaModel> model_;
    int kv_heads_;                                        // per rank
    bool kv_fp8_;                                         // e4m3 KV cache (CudaModelOptions::kv_fp8)
    int max_entries_;                                     // CudaModelOptions::max_seqs
    uint64_t model_id_;                                   // model::model_fingerprint (KvFormat::model_id)
    size_t free_before_ = 0;                              // free device memory before create() allocated
    std::vector<int> dp_group_;                           // scratch
    std::vector<model::ForwardSequence> seqs_;            // scratch: the model's entries
    std::vector<int> seq_of_;                             // scratch: entry -> batch sequence
    std::vector<uint8_t> need_;                           // scratch: entry's rows are asked for
    std::vector<float> rows_;                             // [num_seqs, vocab_size] scratch
    std::vector<model::CudaModel::SampleParams> params_;  // scratch
    std::vector<int32_t> ids_;                            // scratch
};

}  // namespace gptoss::runtime
