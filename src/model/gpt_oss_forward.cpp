#include "model/gpt_oss_forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/ops.h"

namespace gptoss::model {

namespace cpu = kernels::cpu;

CpuKvCache::CpuKvCache(const GptOssConfig& c, int block_size, int num_blocks_full, int num_blocks_sliding,
                       int num_kv_heads, bool fp8)
    : block_size_(block_size), num_blocks_full_(num_blocks_full), num_blocks_sliding_(num_blocks_sliding), fp8_(fp8) {
    const int heads = num_kv_heads > 0 ? num_kv_heads : c.num_key_value_heads;
    const size_t per_block = static_cast<size_t>(block_size) * heads * c.head_dim;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const size_t n = per_block * (c.is_sliding(l) ? num_blocks_sliding : num_blocks_full);
        k_.emplace_back(n);
        v_.emplace_back(n);
    }
}

size_t CpuKvCache::bytes() const {
    size_t n = 0;
    for (size_t l = 0; l < k_.size(); ++l) n += (k_[l].size() + v_[l].size()) * sizeof(float);
    return n;
}

namespace {

void round_to_bf16(float* v, size_t n) {
    for (size_t i = 0; i < n; ++i) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
}

}  // namespace

float rope_frequencies(const GptOssConfig& c, std::vector<float>* inv_freq) {
    inv_freq->assign(static_cast<size_t>(c.head_dim / 2), 0.0f);
    if (!c.rope_scaling || c.rope_scaling->rope_type == "linear") {  // plain RoPE; linear divides by the factor
        for (int i = 0; i < c.head_dim / 2; ++i) {
            (*inv_freq)[i] =
                1.0f / std::pow(static_cast<float>(c.rope_theta), 2.0f * i / static_cast<float>(c.head_dim));
            if (c.rope_scaling) (*inv_freq)[i] /= static_cast<float>(c.rope_scaling->factor);
        }
        return 1.0f;
    }
    cpu::YarnParams yp;
    yp.rope_theta = static_cast<float>(c.rope_theta);
    yp.factor = static_cast<float>(c.rope_scaling->factor);
    yp.beta_fast = static_cast<float>(c.rope_scaling->beta_fast);
    yp.beta_slow = static_cast<float>(c.rope_scaling->beta_slow);
    yp.original_max_position_embeddings = c.rope_scaling->original_max_position_embeddings;
    yp.truncate = c.rope_scaling->truncate;
    yp.attention_factor = static_cast<float>(c.rope_scaling->concentration());
    return cpu::yarn_inv_freq(yp, c.head_dim, inv_freq->data());
}

CpuForward::CpuForward(const GptOssWeights& weights, bool emulate_bf16, parallel::RankComms* comms)
    : w_(weights), emulate_bf16_(emulate_bf16), comms_(comms) {
    const GptOssConfig& c = w_.config;
    attention_scaling_ = rope_frequencies(c, &inv_freq_);
}

Status CpuForward::validate(std::span<const ForwardSequence> seqs, const CpuKvCache& kv) const {
    const GptOssConfig& c = w_.config;
    const int bs = kv.block_size();
    for (size_t s = 0; s < seqs.size(); ++s) {
        const ForwardSequence& q = seqs[s];
        if (q.tokens.empty()) return invalid_argument("sequence " + std::to_string(s) + " has no new tokens");
        for (int32_t id : q.tokens) {
            if (id < 0 || id >= c.vocab_size) {
                return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                        std::to_string(c.vocab_size) + ")");
            }
        }
        const int64_t end = static_cast<int64_t>(q.start_pos) + static_cast<int64_t>(q.tokens.size());
        if (q.start_pos < 0 || end > c.max_position_embeddings) {
            return out_of_range("positions up to " + std::to_string(end) + " exceed the model's context of " +
                                std::to_string(c.max_position_embeddings) + " tokens");
        }
        const int64_t needed_blocks = (end + bs - 1) / bs;
        for (int sliding = 0; sliding < 2; ++sliding) {
            auto table = sliding ? q.block_table_sliding : q.block_table_full;
            if (static_cast<int64_t>(table.size()) < needed_blocks) {
                return invalid_argument("block table too short for " + std::to_string(end) + " positions");
            }
            // Every block a new token reads or writes must be valid.
            const int64_t first_pos = sliding ? std::max<int64_t>(0, q.start_pos - c.sliding_window + 1) : 0;
            for (int64_t b = first_pos / bs; b < needed_blocks; ++b) {
                if (table[b] < 0 || table[b] >= kv.num_blocks(sliding)) {
                    return invalid_argument("block table entry " + std::to_string(b) + " = " +
                                            std::to_string(table[b]) + " is not a valid block");
                }
            }
        }
    }
    return ok_status();
}

Status CpuForward::forward(std::span<const ForwardSequence> seqs, CpuKvCache& kv, std::vector<float>* logits) {
    RETURN_IF_ERROR(validate(seqs, kv));
    const GptOssConfig& c = w_.config;
    const WeightShard& sh = w_.shard;
    const int H = c.hidden_size, nq = sh.num_q_heads, nkv = sh.num_kv_heads, hd = c.head_dim;
    const int qw = nq * hd, kvw = nkv * hd, K = c.experts_per_token;
    parallel::Communicator* tp_comm = comms_ ? comms_->tp.get() : nullptr;
    parallel::Communicator* dp_comm = comms_ ? comms_->dp.get() : nullptr;
    parallel::Communicator* world_comm = comms_ ? comms_->world.get() : nullptr;
    const int bs = kv.block_size();

    // Flatten the batch: token rows in sequence order, with positions and cache slots.
    std::vector<int32_t> ids, positions, slots_full, slots_sliding;
    std::vector<kernels::AttentionSeq> attn_full, attn_sliding;
    for (const ForwardSequence& q : seqs) {
        const int offset = static_cast<int>(ids.size());
        for (size_t i = 0; i < q.tokens.size(); ++i) {
            const int pos = q.start_pos + static_cast<int>(i);
            ids.push_back(q.tokens[i]);
            positions.push_back(pos);
            slots_full.push_back(q.block_table_full[pos / bs] * bs + pos % bs);
            slots_sliding.push_back(q.block_table_sliding[pos / bs] * bs + pos % bs);
        }
        const int n = static_cast<int>(q.tokens.size());
        attn_full.push_back(
            {offset, n, q.start_pos, q.block_table_full.data(), static_cast<int>(q.block_table_full.size())});
        attn_sliding.push_back(
            {offset, n, q.start_pos, q.block_table_sliding.data(), static_cast<int>(q.block_table_sliding.size())});
    }
    const int T = static_cast<int>(ids.size());

    std::vector<float> x(static_cast<size_t>(T) * H);  // residual stream [T, H]
    std::vector<float> h(x.size());                    // normed input of a block [T, H]
    std::vector<float> q(static_cast<size_t>(T) * qw), k(static_cast<size_t>(T) * kvw), v(k.size());
    std::vector<float> attn(q.size());
    std::vector<float> block_out(x.size());
    std::vector<float> router_logits(static_cast<size_t>(T) * c.num_experts);
    std::vector<int32_t> expert_ids(static_cast<size_t>(T) * K);
    std::vector<float> expert_weights(expert_ids.size());

    cpu::embedding(ids.data(), T, w_.embed_tokens.data, w_.embed_tokens.dtype, H, x.data());

    // DP: every group's token count, to pad the MoE gather.
    const int dp_size = dp_comm ? dp_comm->size() : 1;
    const int dp_rank = dp_comm ? dp_comm->rank() : 0;
    int max_rows = T;
    if (dp_size > 1) {
        std::vector<int32_t> counts(dp_size);
        const int32_t mine = T;
        RETURN_IF_ERROR(dp_comm->all_gather(&mine, counts.data(), 1, DType::kI32));
        max_rows = *std::max_element(counts.begin(), counts.end());
    }
    std::vector<float> moe_y;

    auto linear = [&](const float* in, const DenseWeight& wt, const std::vector<float>* bias, float* out) {
        kernels::LinearArgs a;
        a.x = in;
        a.weight = wt.data;
        a.weight_dtype = wt.dtype;
        a.bias = bias ? bias->data() : nullptr;
        a.y = out;
        a.num_tokens = T;
        a.in_features = wt.cols;
        a.out_features = wt.rows;
        cpu::linear(a);
    };
    auto rmsnorm = [&](const float* in, const std::vector<float>& gain, float* out, int rows) {
        cpu::rmsnorm({in, gain.data(), out, rows, H, static_cast<float>(c.rms_norm_eps)});
    };

    for (int l = 0; l < c.num_hidden_layers; ++l) {
        const LayerWeights& L = w_.layers[l];
        const bool sliding = c.is_sliding(l);

        // ---- attention block ----
        rmsnorm(x.data(), L.input_layernorm, h.data(), T);
        if (emulate_bf16_) round_to_bf16(h.data(), h.size());
        linear(h.data(), L.q_proj, &L.q_bias, q.data());
        linear(h.data(), L.k_proj, &L.k_bias, k.data());
        linear(h.data(), L.v_proj, &L.v_bias, v.data());
        kernels::RopeKvWriteArgs r;
        r.q = q.data();
        r.k = k.data();
        r.v = v.data();
        r.positions = positions.data();
        r.slot_mapping = sliding ? slots_sliding.data() : slots_full.data();
        r.inv_freq = inv_freq_.data();
        r.attention_scaling = attention_scaling_;
        r.k_cache = kv.k(l);
        r.v_cache = kv.v(l);
        r.num_tokens = T;
        r.num_heads = nq;
        r.num_kv_heads = nkv;
        r.head_dim = hd;
        r.block_size = bs;
        r.round_fp8 = kv.fp8();
        cpu::rope_kv_write(r);
        if (emulate_bf16_) {
            round_to_bf16(q.data(), q.size());
            const int* slots = sliding ? slots_sliding.data() : slots_full.data();
            for (int t = 0; t < T; ++t) {
                round_to_bf16(kv.k(l) + static_cast<size_t>(slots[t]) * kvw, kvw);
                round_to_bf16(kv.v(l) + static_cast<size_t>(slots[t]) * kvw, kvw);
            }
        }

        kernels::AttentionArgs at;
        at.q = q.data();
        at.out = attn.data();
        at.sinks = L.sinks.data();
        at.k_cache = kv.k(l);
        at.v_cache = kv.v(l);
        at.seqs = sliding ? attn_sliding.data() : attn_full.data();
        at.num_seqs = static_cast<int>(seqs.size());
        at.num_tokens = T;
        at.num_heads = nq;
        at.num_kv_heads = nkv;
        at.head_dim = hd;
        at.block_size = bs;
        at.sliding_window = sliding ? c.sliding_window : 0;
        at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        cpu::attention(at);
        if (emulate_bf16_) round_to_bf16(attn.data(), attn.size());
        linear(attn.data(), L.o_proj, sh.add_o_bias ? &L.o_bias : nullptr, block_out.data());
        if (tp_comm) RETURN_IF_ERROR(tp_comm->all_reduce_sum(block_out.data(), block_out.size(), DType::kF32));
        for (size_t i = 0; i < x.size(); ++i) x[i] += block_out[i];

        // ---- MoE block ----
        rmsnorm(x.data(), L.post_attention_layernorm, h.data(), T);
        // With DP groups, the experts see every group's tokens: gather the rows (padded to the
        // largest group), run the local experts on all of them, reduce over the world, keep ours.
        std::vector<float> gathered;
        float* moe_in = h.data();
        float* moe_out = block_out.data();
        int moe_rows = T;
        if (dp_size > 1) {
            std::vector<float> padded(static_cast<size_t>(max_rows) * H, 0.0f);
            std::copy(h.begin(), h.end(), padded.begin());
            gathered.resize(padded.size() * dp_size);
            RETURN_IF_ERROR(dp_comm->all_gather(padded.data(), gathered.data(), padded.size(), DType::kF32));
            moe_in = gathered.data();
            moe_rows = max_rows * dp_size;
            moe_y.resize(gathered.size());
            moe_out = moe_y.data();
            router_logits.resize(static_cast<size_t>(moe_rows) * c.num_experts);
            expert_ids.resize(static_cast<size_t>(moe_rows) * K);
            expert_weights.resize(expert_ids.size());
        }
        kernels::RouterArgs ra;
        ra.x = moe_in;
        ra.weight = L.router.data;
        ra.weight_dtype = L.router.dtype;
        ra.bias = L.router_bias.data();
        ra.expert_ids = expert_ids.data();
        ra.expert_weights = expert_weights.data();
        ra.logits = router_logits.data();
        ra.num_tokens = moe_rows;
        ra.hidden_size = H;
        ra.num_experts = c.num_experts;
        ra.experts_per_token = K;
        cpu::router(ra);

        std::vector<float> h_moe;
        if (emulate_bf16_) {  // the router reads fp32 h, the experts a bf16 copy
            h_moe.assign(moe_in, moe_in + static_cast<size_t>(moe_rows) * H);
            round_to_bf16(h_moe.data(), h_moe.size());
        }
        kernels::MoeArgs m;
        m.x = emulate_bf16_ ? h_moe.data() : moe_in;
        m.expert_ids = expert_ids.data();
        m.expert_weights = expert_weights.data();
        m.y = moe_out;
        m.format = L.expert_format;
        m.gate_up_blocks = L.gate_up_blocks;
        m.gate_up_scales = L.gate_up_scales;
        m.down_blocks = L.down_blocks;
        m.down_scales = L.down_scales;
        m.gate_up_dense = L.gate_up_dense;
        m.gate_up_fp8 = L.gate_up_fp8;
        m.gate_up_fp8_scale = L.gate_up_fp8_scale;
        m.down_fp8 = L.down_fp8;
        m.down_fp8_scale = L.down_fp8_scale;
        m.down_dense = L.down_dense;
        m.dense_dtype = L.dense_dtype;
        m.gate_up_bias = L.gate_up_bias.data();
        m.down_bias = L.down_bias.empty() ? nullptr : L.down_bias.data();
        m.expert_begin = sh.expert_begin;
        m.num_tokens = moe_rows;
        m.hidden_size = H;
        m.intermediate_size = sh.inter_size;
        m.num_experts = sh.num_experts;
        m.experts_per_token = K;
        m.swiglu_limit = static_cast<float>(c.swiglu_limit);
        m.swiglu_alpha = static_cast<float>(c.swiglu_alpha);
        cpu::moe(m);
        if (world_comm) {
            RETURN_IF_ERROR(world_comm->all_reduce_sum(moe_out, static_cast<size_t>(moe_rows) * H, DType::kF32));
        }
        if (dp_size > 1) {
            const float* mine = moe_out + static_cast<size_t>(dp_rank) * max_rows * H;
            std::copy(mine, mine + x.size(), block_out.begin());
        }
        for (size_t i = 0; i < x.size(); ++i) x[i] += block_out[i];
    }

    // ---- output: final norm and lm_head, only for the rows asked for ----
    std::vector<float> rows;
    int offset = 0;
    for (const ForwardSequence& s : seqs) {
        const int n = static_cast<int>(s.tokens.size());
        const int first = s.all_logits ? 0 : n - 1;
        for (int i = first; i < n; ++i) {
            const float* src = x.data() + static_cast<size_t>(offset + i) * H;
            rows.insert(rows.end(), src, src + H);
        }
        offset += n;
    }
    const int R = static_cast<int>(rows.size() / H);
    rmsnorm(rows.data(), w_.norm, rows.data(), R);
    if (emulate_bf16_) round_to_bf16(rows.data(), rows.size());
    const size_t base = logits->size();
    logits->resize(base + static_cast<size_t>(R) * c.vocab_size);
    kernels::LinearArgs a;
    a.x = rows.data();
    a.weight = w_.lm_head.data;
    a.weight_dtype = w_.lm_head.dtype;
    a.num_tokens = R;
    a.in_features = H;
    a.out_features = sh.vocab_size;
    if (!tp_comm || tp_comm->size() == 1) {
        a.y = logits->data() + base;
        cpu::linear(a);
        return ok_status();
    }
    // TP: each rank has a ceil(V / tp) slice of the vocabulary; gather [tp, R, chunk] and interleave.
    const int tp = tp_comm->size();
    const int chunk = (c.vocab_size + tp - 1) / tp;
    std::vector<float> local(static_cast<size_t>(R) * chunk, 0.0f);
    std::vector<float> part(static_cast<size_t>(R) * sh.vocab_size);
    a.y = part.data();
    cpu::linear(a);
    for (int r = 0; r < R; ++r)
        std::copy(part.begin() + static_cast<size_t>(r) * sh.vocab_size,
                  part.begin() + static_cast<size_t>(r + 1) * sh.vocab_size,
                  local.begin() + static_cast<size_t>(r) * chunk);
    std::vector<float> all(local.size() * tp);
    RETURN_IF_ERROR(tp_comm->all_gather(local.data(), all.data(), local.size(), DType::kF32));
    for (int t = 0; t < tp; ++t) {
        const int v0 = t * chunk;
        const int n = std::max(0, std::min(c.vocab_size, v0 + chunk) - v0);
        for (int r = 0; r < R; ++r) {
            const float* src = all.data() + (static_cast<size_t>(t) * R + r) * chunk;
            std::copy(src, src + n, logits->data() + base + static_cast<size_t>(r) * c.vocab_size + v0);
        }
    }
    return ok_status();
}

SingleSequence::SingleSequence(const GptOssWeights& weights, int max_tokens, int block_size, bool kv_fp8)
    : forward_(weights),
      kv_(weights.config, block_size, (max_tokens + block_size - 1) / block_size,
          (max_tokens + block_size - 1) / block_size, 0, kv_fp8),
      max_tokens_(max_tokens) {
    block_table_.resize((max_tokens + block_size - 1) / block_size);
    for (size_t i = 0; i < block_table_.size(); ++i) block_table_[i] = static_cast<int32_t>(i);
}

Status SingleSequence::append(std::span<const int32_t> tokens, bool all_logits, std::vector<float>* logits) {
    if (length_ + static_cast<int64_t>(tokens.size()) > max_tokens_) {
        return out_of_range("sequence of " + std::to_string(length_ + tokens.size()) +
                            " tokens exceeds the session's capacity of " + std::to_string(max_tokens_));
    }
    ForwardSequence s;
    s.tokens = tokens;
    s.start_pos = length_;
    s.block_table_full = block_table_;
    s.block_table_sliding = block_table_;
    s.all_logits = all_logits;
    RETURN_IF_ERROR(forward_.forward(std::span<const ForwardSequence>(&s, 1), kv_, logits));
    length_ += static_cast<int>(tokens.size());
    return ok_status();
}

}  // namespace gptoss::model
