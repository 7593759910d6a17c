#include "runtime/cuda_model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace gptoss::runtime {

StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::create(std::shared_ptr<const model::GptOssWeights> weights,
                                                                   int max_num_seqs, int max_batched_tokens,
                                                                   const parallel::ParallelConfig& layout, bool fp8,
                                                                   bool kv_fp8, bool fp8_experts) {
    model::CudaModelOptions opt;
    opt.fp8 = fp8;
    opt.fp8_experts = fp8 && fp8_experts;
    opt.kv_fp8 = kv_fp8;
    opt.max_seqs = std::max(1, max_num_seqs);
    opt.max_tokens = std::max({max_batched_tokens, max_num_seqs, 1});
    opt.defer_kv_cache = true;
    ASSIGN_OR_RETURN(model::WeightShard shard, model::plan_shard(weights->config, layout, 0));
    // What the devices (ranks 0 .. n-1, ParallelCudaModel's default) had free before this process put anything there:
    // --gpu-memory-utilization counts this process's own use against its share.
    size_t free_before = SIZE_MAX;
    for (int d = 0; d < std::max(1, layout.world_size()); ++d)
        free_before = std::min(free_before, model::CudaModel::free_device_memory(d));
    ASSIGN_OR_RETURN(auto m, model::ParallelCudaModel::create(*weights, layout, opt));
    auto runner = std::unique_ptr<CudaModelRunner>(
        new CudaModelRunner(std::move(weights), std::move(m), shard.num_kv_heads, kv_fp8, opt.max_seqs));
    runner->free_before_ = free_before == SIZE_MAX ? 0 : free_before;
    return runner;
}

KvGeometry CudaModelRunner::kv_geometry(int block_size) const {
    const model::GptOssConfig& c = weights_->config;
    // Per GPU: each rank holds its kv heads' share of every block (the engine budgets one device).
    const size_t per_layer = 2 * static_cast<size_t>(block_size) * kv_heads_ * c.head_dim * (kv_fp8_ ? 1 : 2);  // K, V
    KvGeometry g;
    g.block_size = block_size;
    for (int l = 0; l < c.num_hidden_layers; ++l)
        (c.is_sliding(l) ? g.bytes_per_block_sliding : g.bytes_per_block_full) += per_layer;
    g.sliding_window = g.bytes_per_block_sliding > 0 ? c.sliding_window : 0;
    return g;
}

StatusOr<KvFormat> CudaModelRunner::kv_format(int block_size) const {
    if (model_->layout().world_size() != 1)
        return unimplemented("KV export and import need a model of one GPU (no parallel layout)");
    const model::GptOssConfig& c = weights_->config;
    if (c.num_hidden_layers > 64) return unimplemented("KV transfers carry at most 64 layers");
    if ((static_cast<size_t>(block_size) * kv_heads_ * c.head_dim * (kv_fp8_ ? 1 : 2)) % 16 != 0)
        return unimplemented("KV transfers copy 16-byte pieces: a layer's K of a block must be a multiple of 16 bytes");
    const KvGeometry g = kv_geometry(block_size);
    return make_kv_format(c, kv_fp8_ ? KvDtype::kE4m3 : KvDtype::kBf16, kv_heads_, block_size, g.bytes_per_block_full,
                          g.bytes_per_block_sliding, model_id_);
}

size_t CudaModelRunner::free_memory_bytes() const { return model_->free_device_memory(); }
size_t CudaModelRunner::total_memory_bytes() const { return model_->total_device_memory(); }
size_t CudaModelRunner::free_memory_before_bytes() const { return free_before_; }

Status CudaModelRunner::allocate_kv_cache(int block_size, KvBlockCounts counts) {
    return model_->allocate_kv_cache(block_size, counts.full, counts.sliding);
}

void CudaModelRunner::prepare(const Batch& batch) {
    seqs_.clear();
    seq_of_.clear();
    need_.clear();
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
        const BatchSequence& s = batch.seqs[i];
        if (s.need_logits && s.all_logits && !s.score_prompt) {
            for (size_t t = 0; t < s.tokens.size(); ++t) {
                seqs_.push_back({s.tokens.subspan(t, 1), s.start_pos + static_cast<int>(t), s.block_table_full,
                                 s.block_table_sliding, false});
                seq_of_.push_back(static_cast<int>(i));
                need_.push_back(1);
            }
        } else {
            const bool all = s.need_logits && s.all_logits;
            seqs_.push_back({s.tokens, s.start_pos, s.block_table_full, s.block_table_sliding, all});
            seq_of_.push_back(static_cast<int>(i));
            need_.push_back(s.need_logits ? 1 : 0);
        }
    }
    rows_.clear();
    dp_group_.clear();
    const int dp = model_->layout().dp;
    for (const auto& s : seqs_) dp_group_.push_back(s.block_table_full.empty() ? 0 : s.block_table_full[0] % dp);
}

// A non-finite row means a backend bug: fail the step with a clear error rather than sampling
// from garbage (rows sampled on the device come back as id -1).
Status CudaModelRunner::check_row(const Batch& batch, size_t e, const float* row) const {
    const size_t V = static_cast<size_t>(weights_->config.vocab_size);
    if (row != nullptr) {
        // Exponent bits all set: an infinity or a NaN. Integer ops only, so the pass over 201k values vectorizes.
        uint32_t bad = 0;
        for (size_t t = 0; t < V; ++t) {
            uint32_t bits;
            std::memcpy(&bits, row + t, 4);
            bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
        }
        if (bad == 0) return ok_status();
    }
    const size_t i = static_cast<size_t>(seq_of_[e]);
    const model::ForwardSequence& s = seqs_[e];
    return internal_error("non-finite logits from the CUDA backend for sequence " + std::to_string(i) + " of " +
                          std::to_string(batch.seqs.size()) + " (positions " + std::to_string(s.start_pos) + ".." +
                          std::to_string(s.start_pos + static_cast<int>(s.tokens.size()) - 1) + ", batch of " +
                          std::to_string(batch.num_tokens) + " tokens)");
}

Status CudaModelRunner::forward(const Batch& batch, std::vector<float>* logits) {
    prepare(batch);
    // CudaModel returns the last token's logits for every entry (a scored chunk's: every token's); keep
    // the rows asked for.
    RETURN_IF_ERROR(model_->forward(seqs_, &rows_, dp_group_));
    const size_t V = static_cast<size_t>(weights_->config.vocab_size);
    size_t row = 0;
    for (size_t e = 0; e < seqs_.size(); ++e) {
        const size_t n = model_rows(e);
        if (need_[e]) {
            for (size_t r = row; r < row + n; ++r) RETURN_IF_ERROR(check_row(batch, e, rows_.data() + r * V));
            logits->insert(logits->end(), rows_.begin() + static_cast<long>(row * V),
                           rows_.begin() + static_cast<long>((row + n) * V));
        }
        row += n;
    }
    return ok_status();
}

Status CudaModelRunner::forward_sample(const Batch& batch, std::span<const DeviceSample> params,
                                       std::vector<int32_t>* ids, std::vector<float>* logits) {
    prepare(batch);
    deferred_.assign(params.size(), -1);
    if (std::none_of(seqs_.begin(), seqs_.end(), [](const model::ForwardSequence& s) { return s.all_logits; }))
        return sample_entries(batch, params, ids, logits);
    // Scored prompt chunks want every row on the host, and the model draws one row an entry: they
    // run through forward() first, the other entries through forward_sample() after them (each
    // entry writes only its own blocks, so the order does not matter), and the rows are merged
    // back into batch order. Their rows come back as host rows (id -1) whatever their parameters.
    size_t total = 0;
    for (size_t e = 0; e < seqs_.size(); ++e) total += need_[e] ? model_rows(e) : 0;
    if (params.size() != total)
        return invalid_argument("forward_sample: " + std::to_string(params.size()) + " parameter sets for " +
                                std::to_string(total) + " logits rows");
    std::vector<model::ForwardSequence> scored, rest;
    std::vector<int> scored_dp, rest_dp;
    std::vector<model::CudaModel::SampleParams> rest_params;
    size_t k = 0;
    for (size_t e = 0; e < seqs_.size(); ++e) {
        const size_t n = need_[e] ? model_rows(e) : 0;
        if (seqs_[e].all_logits) {
            scored.push_back(seqs_[e]);
            scored_dp.push_back(dp_group_[e]);
        } else {
            rest.push_back(seqs_[e]);
            rest_dp.push_back(dp_group_[e]);
            model::CudaModel::SampleParams sp{};
            if (n > 0) {  // no deferred draws here: those rows come back as logits
                const DeviceSample& p = params[k];
                sp = {p.temperature, p.top_p, p.top_k, p.seed, p.draw_index, p.want_logits || p.defer};
            }
            rest_params.push_back(sp);
        }
        k += n;
    }
    std::vector<float> scored_rows, rest_rows;
    RETURN_IF_ERROR(model_->forward(scored, &scored_rows, scored_dp));
    std::vector<int32_t> rest_ids;
    if (!rest.empty()) RETURN_IF_ERROR(model_->forward_sample(rest, rest_params, &rest_ids, rest_dp, &rest_rows));
    const size_t V = static_cast<size_t>(weights_->config.vocab_size);
    size_t ri = 0, srow = 0, rrow = 0;
    for (size_t e = 0; e < seqs_.size(); ++e) {
        if (seqs_[e].all_logits) {
            for (size_t r = 0; r < seqs_[e].tokens.size(); ++r, ++srow)
                RETURN_IF_ERROR(emit_row(batch, e, true, -1, scored_rows.data() + srow * V, ids, logits));
            continue;
        }
        const size_t j = ri++;
        if (!need_[e]) continue;
        const bool host = rest_params[j].return_logits;
        RETURN_IF_ERROR(
            emit_row(batch, e, host, rest_ids[j], host ? rest_rows.data() + (rrow++) * V : nullptr, ids, logits));
    }
    return ok_status();
}

Status CudaModelRunner::emit_row(const Batch& batch, size_t e, bool host, int32_t id, const float* row,
                                 std::vector<int32_t>* ids, std::vector<float>* logits) const {
    if (!host) {
        if (id < 0) return check_row(batch, e, nullptr);
        ids->push_back(id);
        return ok_status();
    }
    RETURN_IF_ERROR(check_row(batch, e, row));
    ids->push_back(-1);
    logits->insert(logits->end(), row, row + weights_->config.vocab_size);
    return ok_status();
}

Status CudaModelRunner::sample_entries(const Batch& batch, std::span<const DeviceSample> params,
                                       std::vector<int32_t>* ids, std::vector<float>* logits) {
    // Every entry gets a row and a draw on the device; those not asked for are dropped.
    params_.assign(seqs_.size(), {});
    std::vector<bool> deferred(seqs_.size(), false);
    const bool can_defer = can_defer_draws() && seqs_.size() <= kMaxDeferRows;
    size_t k = 0;
    for (size_t e = 0; e < seqs_.size(); ++e) {
        if (!need_[e]) continue;
        if (k >= params.size()) return invalid_argument("forward_sample: fewer parameter sets than logits rows");
        const DeviceSample& p = params[k++];
        if (p.defer && can_defer) {  // a greedy draw now (the cheapest; its id is dropped), the real one later
            deferred[e] = true;
            deferred_[k - 1] = static_cast<int>(e);
            continue;
        }
        params_[e] = {p.temperature, p.top_p, p.top_k, p.seed, p.draw_index, p.want_logits || p.defer};
    }
    if (k != params.size()) return invalid_argument("forward_sample: more parameter sets than logits rows");
    RETURN_IF_ERROR(model_->forward_sample(seqs_, params_, &ids_, dp_group_, &rows_));
    const size_t V = static_cast<size_t>(weights_->config.vocab_size);
    size_t row = 0;
    for (size_t e = 0; e < seqs_.size(); ++e) {
        if (!need_[e]) continue;
        if (deferred[e]) {
            ids->push_back(-2);
            continue;
        }
        const bool host = params_[e].return_logits;
        RETURN_IF_ERROR(emit_row(batch, e, host, ids_[e], host ? rows_.data() + (row++) * V : nullptr, ids, logits));
    }
    return ok_status();
}

bool CudaModelRunner::can_defer_draws() const { return model_->layout().trivial(); }

Status CudaModelRunner::draw_deferred(std::span<const DeferredDraw> draws, std::vector<int32_t>* ids) {
    const size_t V = static_cast<size_t>(weights_->config.vocab_size), words = (V + 31) / 32;
    std::vector<int> rows;
    std::vector<model::CudaModel::SampleParams> params;
    std::vector<model::CudaModel::LogitEdits> edits;
    const bool any_edits = std::any_of(draws.begin(), draws.end(),
                                       [](const DeferredDraw& d) { return d.edits != nullptr && !d.edits->empty(); });
    const bool any_mask = std::any_of(draws.begin(), draws.end(), [](const DeferredDraw& d) { return d.allowed; });
    std::vector<uint32_t> bits(any_mask ? draws.size() * words : 0, 0u);
    for (size_t i = 0; i < draws.size(); ++i) {
        const DeferredDraw& d = draws[i];
        const int e = d.row >= 0 && static_cast<size_t>(d.row) < deferred_.size() ? deferred_[d.row] : -1;
        if (e < 0) return invalid_argument("draw_deferred: row " + std::to_string(d.row) + " was not deferred");
        deferred_[d.row] = -1;  // once
        rows.push_back(e);
        const DeviceSample& p = d.params;
        params.push_back({p.temperature, p.top_p, p.top_k, p.seed, p.draw_index, false, p.min_p});
        if (any_edits) {
            model::CudaModel::LogitEdits& ed = edits.emplace_back();
            if (d.edits != nullptr) {
                ed.add = d.edits->add;
                ed.repeat = d.edits->repeat;
                ed.repetition = d.edits->repetition;
                ed.subtract = d.edits->subtract;
            }
        }
        if (!any_mask) continue;
        uint32_t* w = bits.data() + i * words;
        if (d.allowed == nullptr) {
            std::fill(w, w + words, ~0u);
        } else {
            for (size_t j = 0; j < words; ++j) {
                const size_t n = std::min<size_t>(32, V - 32 * j);
                const uint8_t* a = d.allowed + 32 * j;
                uint32_t v = 0;
                for (size_t b = 0; b < n; ++b) v |= static_cast<uint32_t>(a[b] != 0) << b;
                w[j] = v;
            }
        }
    }
    std::vector<int32_t> got;
    RETURN_IF_ERROR(model_->sample_again(rows, params, bits, edits, &got));
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] < 0)
            return internal_error("the device's masked draw failed for row " + std::to_string(draws[i].row) +
                                  ": non-finite logits or a mask that allows nothing");
    ids->insert(ids->end(), got.begin(), got.end());
    return ok_status();
}

int CudaModelRunner::dp_groups() const { return std::max(1, model_->layout().dp); }

}  // namespace gptoss::runtime
