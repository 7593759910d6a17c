// The model behind the engine, one implementation per backend (CpuModelRunner now, a CUDA runner
// later): it owns the weights' forward pass and the paged KV cache whose block ids the scheduler
// hands out (two id spaces: full-attention layers and sliding-window layers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/gpt_oss_config.h"
#include "runtime/batch.h"
#include "runtime/kv_cache.h"
#include "runtime/kv_transfer.h"
#include "runtime/sampler.h"

namespace gptoss::runtime {

class ModelRunner {
public:
    virtual ~ModelRunner() = default;

    virtual const model::GptOssConfig& config() const = 0;
    // Bytes per block of each pool for `block_size`-token blocks in this backend's cache format.
    virtual KvGeometry kv_geometry(int block_size) const = 0;
    // Memory the KV cache may draw from now (host: MemAvailable; CUDA: free device memory).
    virtual size_t free_memory_bytes() const = 0;
    // The device's whole memory (CUDA: the smallest of the runner's GPUs); 0 where it does not apply (host).
    virtual size_t total_memory_bytes() const { return 0; }
    // The device memory free before this runner allocated anything (CUDA; 0 on the host): with free_memory_bytes()
    // now, what the runner itself holds.
    virtual size_t free_memory_before_bytes() const { return 0; }
    // Allocates the paged cache; called once, before forward().
    virtual Status allocate_kv_cache(int block_size, KvBlockCounts counts) = 0;
    // Disaggregated prefill (runtime/kv_transfer.h): the cache's format for `block_size`-token blocks, or
    // unimplemented where this runner cannot copy its blocks (parallel layouts).
    virtual StatusOr<KvFormat> kv_format(int block_size) const {
        (void)block_size;
        return unimplemented("this backend cannot export or import KV blocks");
    }
    // Copies blocks of one pool (`sliding`) between the cache and host memory: block ids[i] <-> data bytes
    // [i·B, (i+1)·B), B the format's bytes a block of that pool (for each layer of the pool in order, K then V
    // of the block's slots). write_kv_blocks skips ids of -1. Between steps only (the engine thread).
    virtual Status read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* data) {
        (void)sliding, (void)ids, (void)data;
        return unimplemented("this backend cannot export KV blocks");
    }
    virtual Status write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* data) {
        (void)sliding, (void)ids, (void)data;
        return unimplemented("this backend cannot import KV blocks");
    }
    // Runs one step. Appends vocab_size logits rows in batch order: for each sequence with
    // need_logits, its last new token's row, or with all_logits one row per new token (a
    // speculative verification). Writes the new tokens' K/V into their blocks.
    virtual Status forward(const Batch& batch, std::vector<float>* logits) = 0;

    // Sampling on the device, where the backend has it (kernels/cuda/sampling.h: greedy,
    // temperature, top-k, top-p; a draw depends only on (seed, draw_index, logits)).
    struct DeviceSample {
        float temperature = 0.0f;
        float top_p = 1.0f;
        int top_k = 0;
        uint64_t seed = 0;
        uint64_t draw_index = 0;
        bool want_logits = false;  // the caller samples this row itself: return its logits instead
        // Where can_defer_draws(): the row is not drawn now (its id comes back -2, no logits) and its logits stay on
        // the device for draw_deferred() right after this step, which draws it under a mask the caller computes
        // meanwhile. A runner that cannot defer it this step returns its logits (id -1) as for want_logits.
        bool defer = false;
        float min_p = 0.0f;  // deferred draws only (the host sampler's min_p)
    };
    // Data-parallel groups (a layout's dp): a sequence's KV lives in group block_table_full[0] % dp_groups() only,
    // so the prefix cache matches within one group (KvCacheManager::set_dp_groups).
    virtual int dp_groups() const { return 1; }
    virtual bool samples_on_device() const { return false; }
    // True where forward() leaves the calling thread waiting (the GPU computes): the engine then computes the
    // step's structured-output masks on another thread meanwhile. False for a forward that keeps the host's cores
    // busy itself (the CPU backend), where a second thread would only compete with it.
    virtual bool host_idle_during_forward() const { return false; }
    // Whether forward_sample honours DeviceSample::defer (the CUDA runner on one GPU).
    virtual bool can_defer_draws() const { return false; }
    struct DeferredDraw {
        int row = 0;                        // the row's index among the last forward_sample's parameter sets
        DeviceSample params{};              // the draw's (defer and want_logits ignored)
        const uint8_t* allowed = nullptr;   // vocab_size bytes, nonzero where the token may be drawn; nullptr: all
        const LogitEdits* edits = nullptr;  // bias and penalties to apply first (nullptr: none)
    };
    // Draws rows the last forward_sample deferred (id -2), each once, on the device's noise: the host sampler's
    // draw (its edits, min_p, the mask with the rest at -inf) with the device's stream for the seed. Appends one id
    // a draw to `ids`.
    virtual Status draw_deferred(std::span<const DeferredDraw> draws, std::vector<int32_t>* ids) {
        (void)draws, (void)ids;
        return unimplemented("this backend does not defer draws");
    }
    // Most entries one step may hold: sequences, plus one per speculative draft verified (the CUDA
    // runner runs a verification as one decode entry a token). The engine proposes no more drafts
    // than fit.
    virtual int max_batch_entries() const { return std::numeric_limits<int>::max(); }
    // Runs one step like forward(), and for each logits row forward() would give (params in the
    // same order, one set a row) appends the token drawn on the device to `ids`, or, for params
    // with want_logits, -1 to `ids` and the row to `logits` (in that order).
    virtual Status forward_sample(const Batch& batch, std::span<const DeviceSample> params, std::vector<int32_t>* ids,
                                  std::vector<float>* logits) {
        (void)batch, (void)params, (void)ids, (void)logits;
        return unimplemented("this backend samples on the host");
    }
};

}  // namespace gptoss::runtime
