#include "runtime/cpu_model_runner.h"

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

namespace gptoss::runtime {

CpuModelRunner::CpuModelRunner(std::shared_ptr<const model::GptOssWeights> weights,
                               const parallel::ParallelConfig& layout, bool kv_fp8)
    : weights_(std::move(weights)),
      forward_(*weights_),
      layout_(layout),
      kv_fp8_(kv_fp8),
      model_id_(model::model_fingerprint(*weights_)) {}

KvGeometry CpuModelRunner::kv_geometry(int block_size) const {
    const model::GptOssConfig& c = weights_->config;
    // K and V; under a layout every DP group holds the pool, each TP rank its kv heads (replicated
    // when TP exceeds them).
    const int kv_heads = std::max(c.num_key_value_heads, layout_.tp) * layout_.dp;
    const size_t per_layer = 2 * static_cast<size_t>(block_size) * kv_heads * c.head_dim * sizeof(float);
    KvGeometry g;
    g.block_size = block_size;
    for (int l = 0; l < c.num_hidden_layers; ++l)
        (c.is_sliding(l) ? g.bytes_per_block_sliding : g.bytes_per_block_full) += per_layer;
    g.sliding_window = g.bytes_per_block_sliding > 0 ? c.sliding_window : 0;
    return g;
}

size_t CpuModelRunner::free_memory_bytes() const {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    size_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
        if (key == "MemAvailable:") return kib * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

Status CpuModelRunner::allocate_kv_cache(int block_size, KvBlockCounts counts) {
    if (kv_ || parallel_) return failed_precondition("the KV cache is already allocated");
    if (!layout_.trivial()) {
        ASSIGN_OR_RETURN(parallel_, model::ParallelCpuForward::create(*weights_, layout_, block_size, counts.full,
                                                                      counts.sliding, false, kv_fp8_));
        return ok_status();
    }
    kv_ = std::make_unique<model::CpuKvCache>(weights_->config, block_size, counts.full, counts.sliding, 0, kv_fp8_);
    return ok_status();
}

Status CpuModelRunner::forward(const Batch& batch, std::vector<float>* logits) {
    if (!kv_ && !parallel_) return failed_precondition("forward before allocate_kv_cache");
    seqs_.clear();
    for (const BatchSequence& s : batch.seqs) {
        model::ForwardSequence f;
        f.tokens = s.tokens;
        f.start_pos = s.start_pos;
        f.block_table_full = s.block_table_full;
        f.block_table_sliding = s.block_table_sliding;
        f.all_logits = s.need_logits && s.all_logits;
        seqs_.push_back(f);
    }
    // CpuForward gives the last token's logits for every sequence; keep the rows asked for.
    rows_.clear();
    if (parallel_) {
        dp_group_.clear();
        for (const auto& s : seqs_)
            dp_group_.push_back(s.block_table_full.empty() ? 0 : s.block_table_full[0] % layout_.dp);
        RETURN_IF_ERROR(parallel_->forward(seqs_, dp_group_, &rows_));
    } else {
        RETURN_IF_ERROR(forward_.forward(seqs_, *kv_, &rows_));
    }
    // Rows in batch order: every new token's for all_logits, else the last one's.
    const size_t V = static_cast<size_t>(weights_->config.vocab_size);
    size_t row = 0;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
        const size_t n = seqs_[i].all_logits ? batch.seqs[i].tokens.size() : 1;
        if (batch.seqs[i].need_logits) {
            // Non-finite logits (NaN or Inf in a checkpoint's weights, or an overflow) leave nothing to sample
            // from: fail the step with a clear error, as the CUDA runner does, rather than draw token 0.
            const auto first = rows_.begin() + static_cast<long>(row * V), last = first + static_cast<long>(n * V);
            if (!std::all_of(first, last, [](float v) { return std::isfinite(v); }))
                return internal_error(
                    "non-finite logits from the CPU backend for sequence " + std::to_string(i) + " of " +
                    std::to_string(batch.seqs.size()) + " (positions " + std::to_string(batch.seqs[i].start_pos) +
                    ".." + std::to_string(batch.seqs[i].start_pos + static_cast<int>(batch.seqs[i].tokens.size()) - 1) +
                    "): the checkpoint or the activations hold NaN or Inf");
            logits->insert(logits->end(), first, last);
        }
        row += n;
    }
    return ok_status();
}

StatusOr<KvFormat> CpuModelRunner::kv_format(int block_size) const {
    if (!layout_.trivial()) return unimplemented("KV export and import need the single-rank CPU layout");
    const model::GptOssConfig& c = weights_->config;
    if (c.num_hidden_layers > 64) return unimplemented("KV transfers carry at most 64 layers");
    const KvGeometry g = kv_geometry(block_size);
    return make_kv_format(c, kv_fp8_ ? KvDtype::kF32E4m3 : KvDtype::kF32, c.num_key_value_heads, block_size,
                          g.bytes_per_block_full, g.bytes_per_block_sliding, model_id_);
}

Status CpuModelRunner::copy_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out, const uint8_t* in) {
    const bool to_cache = in != nullptr;
    if (!kv_)
        return failed_precondition(parallel_ ? "KV export and import need the single-rank CPU layout"
                                             : "the KV cache is not allocated");
    const model::GptOssConfig& c = weights_->config;
    // One layer's K (or V) of one block: block_size slots of [num_key_value_heads, head_dim] floats.
    const size_t per = static_cast<size_t>(kv_->block_size()) * c.num_key_value_heads * c.head_dim;
    const int n = kv_->num_blocks(sliding);
    size_t layers = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) layers += c.is_sliding(l) == sliding ? 1 : 0;
    const size_t block_bytes = layers * 2 * per * sizeof(float);
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 && to_cache) continue;
        if (ids[i] < 0 || ids[i] >= n) return out_of_range("KV block id " + std::to_string(ids[i]) + " out of range");
        const size_t offset = i * block_bytes;
        size_t done = 0;
        for (int l = 0; l < c.num_hidden_layers; ++l) {
            if (c.is_sliding(l) != sliding) continue;
            for (float* base : {kv_->k(l), kv_->v(l)}) {
                float* block = base + static_cast<size_t>(ids[i]) * per;
                if (to_cache) {
                    std::memcpy(block, in + offset + done, per * sizeof(float));
                } else {
                    std::memcpy(out + offset + done, block, per * sizeof(float));
                }
                done += per * sizeof(float);
            }
        }
    }
    return ok_status();
}

Status CpuModelRunner::read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* data) {
    return copy_kv_blocks(sliding, ids, data, nullptr);
}

Status CpuModelRunner::write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* data) {
    return copy_kv_blocks(sliding, ids, nullptr, data);
}

}  // namespace gptoss::runtime
