// gpt-oss on several GPUs of one node (parallel/world.h): one CudaModel per rank holding its weight
// shard, NCCL communicators, and one worker thread per GPU. The caller's thread is the scheduler
// (rank 0's plan): each step it hands every worker the same plan (the sequences of each DP group),
// the workers run their forward together and the TP rank 0 of each DP group returns the results.
// A world of one rank runs the CudaModel directly (no threads, no NCCL), so this is also the
// single-GPU path of `gptoss bench`.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/cuda_model.h"
#include "model/weight_shard.h"
#include "parallel/world.h"

namespace gptoss::model {

class ParallelCudaModel {
public:
    // devices[r] runs rank r (default: 0 .. world_size-1). `full` must outlive this object.
    // options.num_blocks_* = 0 sizes the KV cache from the smallest free memory over the ranks.
    static StatusOr<std::unique_ptr<ParallelCudaModel>> create(const GptOssWeights& full,
                                                               const parallel::ParallelConfig& layout,
                                                               const CudaModelOptions& options,
                                                               std::vector<int> devices = {});
    ~ParallelCudaModel();

    // DP: sequence i runs on DP group dp_group[i] (empty: i % dp). Its block tables index that
    // group's cache (every group has num_blocks() of each kind). Same contracts as CudaModel.
    Status forward(std::span<const ForwardSequence> seqs, std::vector<float>* logits,
                   std::span<const int> dp_group = {});
    Status forward_sample(std::span<const ForwardSequence> seqs, std::span<const CudaModel::SampleParams> params,
                          std::vector<int32_t>* ids, std::span<const int> dp_group = {},
                          std::vector<float>* logits = nullptr);
    // CudaModel::sample_again on a world of one rank (else failed_precondition).
    Status sample_again(std::span<const int> rows, std::span<const CudaModel::SampleParams> params,
                        std::span<const uint32_t> bits, std::span<const CudaModel::LogitEdits> edits,
                        std::vector<int32_t>* ids);
    void fill_kv_random(uint64_t seed);
    // CudaModel::read_kv_blocks / write_kv_blocks on a world of one rank (else failed_precondition).
    Status read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out);
    Status write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* in);
    // With options.defer_kv_cache: allocates num_blocks of each kind on every rank (same ids).
    Status allocate_kv_cache(int block_size, int num_blocks_full, int num_blocks_sliding);
    // The least free device memory over the ranks.
    size_t free_device_memory();
    size_t total_device_memory();  // the smallest of the ranks' devices

    const parallel::ParallelConfig& layout() const { return layout_; }
    const GptOssConfig& config() const { return full_.config; }
    int block_size() const;
    int num_blocks(bool sliding) const;
    // Rank 0's CudaModel::last_step_span_ms (GPTOSS_STEP_EVENTS=1).
    float last_step_span_ms() const;
    size_t weight_bytes() const;    // summed over ranks
    size_t kv_cache_bytes() const;  // summed over ranks

private:
    struct Workers;
    ParallelCudaModel(const GptOssWeights& full, const parallel::ParallelConfig& layout);
    // Runs fn(rank) on every rank's worker thread and waits; returns the first error.
    Status run_all(const std::function<Status(int)>& fn);
    Status split(std::span<const ForwardSequence> seqs, std::span<const int> dp_group, bool sample,
                 std::vector<std::vector<ForwardSequence>>* per_group, std::vector<std::vector<size_t>>* members,
                 int* max_tokens) const;

    static constexpr int32_t kPlaceholderToken = 0;
    const GptOssWeights& full_;
    parallel::ParallelConfig layout_;
    int32_t scratch_full_ = 0, scratch_sliding_ = 0;  // the hidden last block of each pool
    std::vector<int> devices_;
    std::vector<std::unique_ptr<GptOssWeights>> shards_;
    std::vector<parallel::RankComms> comms_;
    std::vector<std::unique_ptr<CudaModel>> models_;
    std::unique_ptr<Workers> workers_;
};

}  // namespace gptoss::model
