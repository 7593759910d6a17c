// ModelRunner on the CPU backend: model::CpuForward over a model::CpuKvCache (fp32 K/V).
#pragma once

#include <algorithm>

#include <memory>
#include <vector>

#include "model/gpt_oss_forward.h"
#include "model/gpt_oss_weights.h"
#include "model/parallel_cpu_forward.h"
#include "parallel/world.h"
#include "runtime/model_runner.h"

namespace gptoss::runtime {

class CpuModelRunner : public ModelRunner {
public:
    // layout: simulated ranks (threads, model/parallel_cpu_forward.h), the CPU twin of the CUDA
    // runner's parallel layouts; under DP a sequence runs on group block_table_full[0] % dp as there.
    // kv_fp8: the KV cache rounds what it stores to e4m3 (model::CpuKvCache), as the CUDA
    // runner's FP8 cache does (--kv-cache-dtype fp8).
    explicit CpuModelRunner(std::shared_ptr<const model::GptOssWeights> weights,
                            const parallel::ParallelConfig& layout = {}, bool kv_fp8 = false);

    const model::GptOssConfig& config() const override { return weights_->config; }
    int dp_groups() const override { return parallel_ ? std::max(1, layout_.dp) : 1; }
    KvGeometry kv_geometry(int block_size) const override;
    size_t free_memory_bytes() const override;
    Status allocate_kv_cache(int block_size, KvBlockCounts counts) override;
    Status forward(const Batch& batch, std::vector<float>* logits) override;
    StatusOr<KvFormat> kv_format(int block_size) const override;
    Status read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* data) override;
    Status write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* data) override;

private:
    // Copies one pool's blocks to `out` (read_kv_blocks) or from `in` (write_kv_blocks); one of them is null.
    Status copy_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out, const uint8_t* in);

    std::shared_ptr<const model::GptOssWeights> weights_;
    model::CpuForward forward_;
    std::unique_ptr<model::CpuKvCache> kv_;
    parallel::ParallelConfig layout_;
    bool kv_fp8_;
    uint64_t model_id_;                                    // model::model_fingerprint (KvFormat::model_id)
    std::unique_ptr<model::ParallelCpuForward> parallel_;  // non-trivial layouts
    std::vector<int> dp_group_;                            // scratch
    std::vector<model::ForwardSequence> seqs_;             // scratch
    std::vector<float> rows_;                              // [num_seqs, vocab_size] scratch
};

}  // namespace gptoss::runtime
