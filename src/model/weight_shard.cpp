#include "model/weight_shard.h"

#include <cstring>
#include <string>

#include "core/dtype.h"

namespace gptoss::model {

namespace {

// Units the expert intermediate is split in: the 32-wide MXFP4 groups when they fit.
int inter_unit(const GptOssConfig& c) { return c.intermediate_size % 32 == 0 ? 32 : 1; }

}  // namespace

Status check_parallel_config(const GptOssConfig& c, const parallel::ParallelConfig& p) {
    RETURN_IF_ERROR(p.validate());
    const std::string what = p.to_string() + ": ";
    if (c.num_attention_heads % p.tp != 0) {
        return invalid_argument(what + "tp " + std::to_string(p.tp) + " must divide the " +
                                std::to_string(c.num_attention_heads) + " attention heads");
    }
    const int group = c.num_attention_heads / c.num_key_value_heads;  // q heads per kv head
    const int local = c.num_attention_heads / p.tp;
    if (local % group != 0 && group % local != 0) {
        return invalid_argument(what + "a rank's " + std::to_string(local) +
                                " q heads would straddle kv heads (groups of " + std::to_string(group) + ")");
    }
    if (c.num_experts % p.ep != 0) {
        return invalid_argument(what + "ep " + std::to_string(p.ep) + " must divide the " +
                                std::to_string(c.num_experts) + " experts");
    }
    // More MoE-TP ranks than intermediate units is allowed: the extra ranks hold no units (they
    // still add the down bias when they are MoE-TP rank 0, which always has units).
    if (p.tp > c.vocab_size) return invalid_argument(what + "tp exceeds the vocabulary");
    return ok_status();
}

StatusOr<WeightShard> plan_shard(const GptOssConfig& c, const parallel::ParallelConfig& p, int rank) {
    RETURN_IF_ERROR(check_parallel_config(c, p));
    if (rank < 0 || rank >= p.world_size()) return invalid_argument("rank out of range");
    const parallel::RankLayout r = parallel::rank_layout(p, rank);
    WeightShard s;
    const int group = c.num_attention_heads / c.num_key_value_heads;
    s.num_q_heads = c.num_attention_heads / p.tp;
    s.q_head_begin = r.tp_rank * s.num_q_heads;
    s.kv_head_begin = s.q_head_begin / group;
    s.num_kv_heads = (s.q_head_begin + s.num_q_heads - 1) / group + 1 - s.kv_head_begin;
    s.num_experts = c.num_experts / p.ep;
    s.expert_begin = r.ep_rank * s.num_experts;
    const int unit = inter_unit(c);
    auto [u0, u1] = parallel::ceil_split(c.intermediate_size / unit, p.moe_tp(), r.moe_tp_rank);
    s.inter_begin = u0 * unit;
    s.inter_size = (u1 - u0) * unit;
    auto [v0, v1] = parallel::ceil_split(c.vocab_size, p.tp, r.tp_rank);
    s.vocab_begin = v0;
    s.vocab_size = v1 - v0;
    s.add_o_bias = r.tp_rank == 0;
    s.add_down_bias = r.moe_tp_rank == 0;
    return s;
}

namespace {

DenseWeight row_slice(const DenseWeight& w, int begin, int count) {
    DenseWeight out = w;
    out.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(begin) * w.cols * dtype_size(w.dtype);
    out.rows = count;
    return out;
}

std::vector<float> slice(const std::vector<float>& v, size_t begin, size_t count) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(begin),
                              v.begin() + static_cast<std::ptrdiff_t>(begin + count));
}

// Copies [rows, src_cols) elements of `elem` bytes, keeping columns [col_begin, col_begin + cols) of
// each row, into a new owned buffer.
const uint8_t* copy_columns(GptOssWeights& dst, const uint8_t* src, size_t rows, size_t src_cols, size_t col_begin,
                            size_t cols, size_t elem) {
    std::vector<uint8_t> buf(rows * cols * elem);
    for (size_t r = 0; r < rows; ++r)
        std::memcpy(buf.data() + r * cols * elem, src + (r * src_cols + col_begin) * elem, cols * elem);
    dst.owned.push_back(std::move(buf));
    return dst.owned.back().data();
}

}  // namespace

StatusOr<std::unique_ptr<GptOssWeights>> shard_weights(const GptOssWeights& full, const WeightShard& s) {
    const GptOssConfig& c = full.config;
    if (full.shard.num_q_heads != c.num_attention_heads || full.shard.num_experts != c.num_experts ||
        full.shard.inter_size != c.intermediate_size || full.shard.vocab_size != c.vocab_size) {
        return failed_precondition("shard_weights needs the whole model's weights");
    }
    auto w = std::make_unique<GptOssWeights>();
    w->config = c;
    w->shard = s;
    w->embed_tokens = full.embed_tokens;
    w->lm_head = row_slice(full.lm_head, s.vocab_begin, s.vocab_size);
    w->norm = full.norm;
    const int hd = c.head_dim, H = c.hidden_size, I = c.intermediate_size;
    const int E = s.num_experts, Il = s.inter_size;
    for (const LayerWeights& F : full.layers) {
        LayerWeights L;
        L.input_layernorm = F.input_layernorm;
        L.q_proj = row_slice(F.q_proj, s.q_head_begin * hd, s.num_q_heads * hd);
        L.k_proj = row_slice(F.k_proj, s.kv_head_begin * hd, s.num_kv_heads * hd);
        L.v_proj = row_slice(F.v_proj, s.kv_head_begin * hd, s.num_kv_heads * hd);
        L.q_bias = slice(F.q_bias, static_cast<size_t>(s.q_head_begin) * hd, static_cast<size_t>(s.num_q_heads) * hd);
        L.k_bias = slice(F.k_bias, static_cast<size_t>(s.kv_head_begin) * hd, static_cast<size_t>(s.num_kv_heads) * hd);
        L.v_bias = slice(F.v_bias, static_cast<size_t>(s.kv_head_begin) * hd, static_cast<size_t>(s.num_kv_heads) * hd);
        L.o_proj = F.o_proj;
        L.o_proj.cols = s.num_q_heads * hd;
        L.o_proj.data =
            copy_columns(*w, static_cast<const uint8_t*>(F.o_proj.data), F.o_proj.rows, F.o_proj.cols,
                         static_cast<size_t>(s.q_head_begin) * hd, L.o_proj.cols, dtype_size(F.o_proj.dtype));
        L.o_bias = F.o_bias;  // whole on every rank: see WeightShard::add_o_bias
        L.sinks = slice(F.sinks, s.q_head_begin, s.num_q_heads);
        L.post_attention_layernorm = F.post_attention_layernorm;
        L.router = F.router;
        L.router_bias = F.router_bias;

        L.expert_format = F.expert_format;
        L.dense_dtype = F.dense_dtype;
        const size_t e0 = s.expert_begin;
        if (F.expert_format == kernels::ExpertFormat::kFp8Block) {
            // Whole experts only: an intermediate split would cut 128-wide scale blocks.
            if (Il != I) {
                return unimplemented(
                    "FP8 experts with the intermediate split over ranks (MoE-TP > 1); use EP = tp × dp");
            }
            const auto blocks = [](size_t n) { return (n + 127) / 128; };
            const size_t gu = static_cast<size_t>(2) * I * H, dn = static_cast<size_t>(H) * I;
            const size_t gus = blocks(2 * I) * blocks(H), dns = blocks(H) * blocks(I);
            L.gate_up_fp8 = F.gate_up_fp8 + e0 * gu;
            L.gate_up_fp8_scale = F.gate_up_fp8_scale + e0 * gus;
            L.down_fp8 = F.down_fp8 + e0 * dn;
            L.down_fp8_scale = F.down_fp8_scale + e0 * dns;
        } else if (F.expert_format == kernels::ExpertFormat::kMxfp4) {
            const size_t gh = H / 32, gi = I / 32, gl = Il / 32, g0 = s.inter_begin / 32;
            // gate_up [E, 2I, H/32, 16]: rows [2·begin, 2·end) of each local expert.
            const size_t row_b = gh * 16;
            std::vector<uint8_t> gub(E * 2 * Il * row_b), gus(E * 2 * Il * gh);
            for (int e = 0; e < E; ++e) {
                const size_t src_row = (e0 + e) * 2 * I + 2 * s.inter_begin;
                std::memcpy(gub.data() + e * 2 * Il * row_b, F.gate_up_blocks + src_row * row_b, 2 * Il * row_b);
                std::memcpy(gus.data() + e * 2 * Il * gh, F.gate_up_scales + src_row * gh, 2 * Il * gh);
            }
            w->owned.push_back(std::move(gub));
            L.gate_up_blocks = w->owned.back().data();
            w->owned.push_back(std::move(gus));
            L.gate_up_scales = w->owned.back().data();
            // down [E, H, I/32, 16]: groups [begin/32, end/32) of every row.
            const size_t rows = static_cast<size_t>(E) * H;
            L.down_blocks = copy_columns(*w, F.down_blocks + e0 * H * gi * 16, rows, gi, g0, gl, 16);
            L.down_scales = copy_columns(*w, F.down_scales + e0 * H * gi, rows, gi, g0, gl, 1);
        } else {
            const size_t el = dtype_size(F.dense_dtype);
            const size_t row_b = static_cast<size_t>(H) * el;
            std::vector<uint8_t> gu(static_cast<size_t>(E) * 2 * Il * row_b);
            for (int e = 0; e < E; ++e) {
                const size_t src_row = (e0 + e) * 2 * I + 2 * s.inter_begin;
                std::memcpy(gu.data() + e * 2 * Il * row_b,
                            static_cast<const uint8_t*>(F.gate_up_dense) + src_row * row_b, 2 * Il * row_b);
            }
            w->owned.push_back(std::move(gu));
            L.gate_up_dense = w->owned.back().data();
            L.down_dense = copy_columns(*w, static_cast<const uint8_t*>(F.down_dense) + e0 * H * I * el,
                                        static_cast<size_t>(E) * H, I, s.inter_begin, Il, el);
        }
        L.gate_up_bias.resize(static_cast<size_t>(E) * 2 * Il);
        for (int e = 0; e < E; ++e)
            std::memcpy(L.gate_up_bias.data() + static_cast<size_t>(e) * 2 * Il,
                        F.gate_up_bias.data() + (e0 + e) * 2 * I + 2 * s.inter_begin, 2 * Il * sizeof(float));
        if (s.add_down_bias) L.down_bias = slice(F.down_bias, e0 * H, static_cast<size_t>(E) * H);
        w->layers.push_back(std::move(L));
    }
    return w;
}

}  // namespace gptoss::model
