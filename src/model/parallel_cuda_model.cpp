#include "model/parallel_cuda_model.h"

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/nccl_communicator.h"
#if defined(GPTOSS_HAVE_CUDA)
#include "kernels/cuda/peer_allreduce.h"
#endif

namespace gptoss::model {
namespace {
#if defined(GPTOSS_HAVE_CUDA)

// NCCL with small fp32 all-reduces (the per-layer ones of decode) through the one-shot peer
// kernel (kernels/cuda/peer_allreduce.h); everything else goes to NCCL.
class PeerAllReduceComm : public parallel::Communicator {
public:
    PeerAllReduceComm(std::unique_ptr<parallel::Communicator> inner, std::unique_ptr<kernels::cuda::PeerAllReduce> peer)
        : inner_(std::move(inner)), peer_(std::move(peer)) {}
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    Status all_reduce_sum(void* data, size_t count, DType dtype, void* stream) override {
        if (dtype == DType::kF32 && count <= peer_->max_floats()) {
            peer_->all_reduce_f32(static_cast<float*>(data), count, static_cast<cudaStream_t>(stream));
            return ok_status();
        }
        return inner_->all_reduce_sum(data, count, dtype, stream);
    }
    Status all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
        return inner_->all_gather(send, recv, count, dtype, stream);
    }
    Status reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
        return inner_->reduce_scatter_sum(send, recv, count, dtype, stream);
    }
    Status all_to_all(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
        return inner_->all_to_all(send, recv, count, dtype, stream);
    }
    Status broadcast(void* data, size_t bytes, int root, void* stream) override {
        return inner_->broadcast(data, bytes, root, stream);
    }

private:
    std::unique_ptr<parallel::Communicator> inner_;
    std::unique_ptr<kernels::cuda::PeerAllReduce> peer_;
};

// Wraps the TP and world communicators of every rank (groups of more than one rank) with the peer
// all-reduce. Groups are listed from each rank's member list; one PeerAllReduce set per group.
Status add_peer_allreduce(std::vector<parallel::RankComms>& comms, const parallel::ParallelConfig& layout,
                          const std::vector<int>& devices, size_t max_floats) {
    const int n = layout.world_size();
    auto wrap = [&](auto member_of, auto slot) -> Status {
        std::vector<bool> done(n, false);
        for (int r = 0; r < n; ++r) {
            if (done[r]) continue;
            const std::vector<int> members = member_of(r);
            if (members.size() < 2) return ok_status();  // every group of this kind is one rank
            std::vector<int> devs;
            for (int m : members) devs.push_back(devices[m]);
            ASSIGN_OR_RETURN(auto peers, kernels::cuda::PeerAllReduce::create_group(devs, max_floats));
            for (size_t i = 0; i < members.size(); ++i) {
                const int m = members[i];
                std::unique_ptr<parallel::Communicator>& c = comms[m].*slot;
                if (c->rank() != static_cast<int>(i))
                    return internal_error("peer all-reduce: group order differs from the communicator's ranks");
                c = std::make_unique<PeerAllReduceComm>(std::move(c), std::move(peers[i]));
                done[m] = true;
            }
        }
        return ok_status();
    };
    RETURN_IF_ERROR(wrap([&](int r) { return parallel::tp_group_ranks(layout, r); }, &parallel::RankComms::tp));
    std::vector<int> all(n);
    for (int r = 0; r < n; ++r) all[r] = r;
    return wrap([&](int) { return all; }, &parallel::RankComms::world);
}
#else
Status add_peer_allreduce(std::vector<parallel::RankComms>&, const parallel::ParallelConfig&, const std::vector<int>&,
                          size_t) {
    return unimplemented("the peer all-reduce needs the CUDA backend");
}
#endif

}  // namespace

// One thread per rank, woken per job (a generation counter), so a decode step costs two
// condition-variable round trips, not thread creation.
struct ParallelCudaModel::Workers {
    explicit Workers(int n) : status(n) {
        for (int r = 0; r < n; ++r) threads.emplace_back([this, r] { loop(r); });
    }
    ~Workers() {
        {
            std::lock_guard<std::mutex> lock(mu);
            stop = true;
        }
        cv_job.notify_all();
        for (auto& t : threads) t.join();
    }
    Status run(const std::function<Status(int)>& fn) {
        std::unique_lock<std::mutex> lock(mu);
        job = &fn;
        pending = static_cast<int>(threads.size());
        ++generation;
        cv_job.notify_all();
        cv_done.wait(lock, [&] { return pending == 0; });
        job = nullptr;
        for (Status& s : status) RETURN_IF_ERROR(s);
        return ok_status();
    }
    void loop(int r) {
        uint64_t seen = 0;
        for (;;) {
            const std::function<Status(int)>* fn = nullptr;
            {
                std::unique_lock<std::mutex> lock(mu);
                cv_job.wait(lock, [&] { return stop || generation != seen; });
                if (stop) return;
                seen = generation;
                fn = job;
            }
            Status s = (*fn)(r);
            std::lock_guard<std::mutex> lock(mu);
            status[r] = std::move(s);
            if (--pending == 0) cv_done.notify_all();
        }
    }
    std::mutex mu;
    std::condition_variable cv_job, cv_done;
    const std::function<Status(int)>* job = nullptr;
    uint64_t generation = 0;
    int pending = 0;
    bool stop = false;
    std::vector<Status> status;
    std::vector<std::thread> threads;
};

ParallelCudaModel::ParallelCudaModel(const GptOssWeights& full, const parallel::ParallelConfig& layout)
    : full_(full), layout_(layout) {}

ParallelCudaModel::~ParallelCudaModel() {
    workers_.reset();  // threads first, then the models and communicators they used
    models_.clear();
    comms_.clear();
}

Status ParallelCudaModel::run_all(const std::function<Status(int)>& fn) {
    if (!workers_) return fn(0);
    return workers_->run(fn);
}

StatusOr<std::unique_ptr<ParallelCudaModel>> ParallelCudaModel::create(const GptOssWeights& full,
                                                                       const parallel::ParallelConfig& layout,
                                                                       const CudaModelOptions& options,
                                                                       std::vector<int> devices) {
    RETURN_IF_ERROR(check_parallel_config(full.config, layout));
    if (full.config.num_key_value_heads % layout.tp != 0) {
        // The CUDA attention kernels take the model's q/kv head ratio: no kv-head replication.
        return invalid_argument(layout.to_string() + ": the CUDA backend needs tp to divide the " +
                                std::to_string(full.config.num_key_value_heads) + " kv heads");
    }
    const int n = layout.world_size();
    if (devices.empty())
        for (int r = 0; r < n; ++r) devices.push_back(r);
    if (static_cast<int>(devices.size()) != n) {
        return invalid_argument(layout.to_string() + " needs " + std::to_string(n) + " devices, got " +
                                std::to_string(devices.size()));
    }
    const int visible = cuda_device_count();
    for (int d : devices) {
        if (d < 0 || d >= visible) {
            return failed_precondition(layout.to_string() + " needs CUDA device " + std::to_string(d) + " but " +
                                       std::to_string(visible) + " are visible");
        }
    }
    std::unique_ptr<ParallelCudaModel> p(new ParallelCudaModel(full, layout));
    p->devices_ = devices;
    p->models_.resize(n);
    CudaModelOptions opt = options;
    opt.device = devices[0];
    if (n == 1) {
        ASSIGN_OR_RETURN(p->models_[0], CudaModel::create(full, opt));
        return p;
    }
    ASSIGN_OR_RETURN(p->comms_, parallel::make_nccl_world(layout, devices));
    const char* peer_env = std::getenv("GPTOSS_PEER_ALLREDUCE");
    if (options.peer_allreduce || (peer_env != nullptr && std::string(peer_env) == "1")) {
        // Decode-sized reductions: up to 8 tokens × the hidden size per DP group.
        const size_t max_floats = static_cast<size_t>(8) * layout.dp * full.config.hidden_size;
        RETURN_IF_ERROR(add_peer_allreduce(p->comms_, layout, devices, max_floats));
    }
    for (int r = 0; r < n; ++r) {
        ASSIGN_OR_RETURN(WeightShard s, plan_shard(full.config, layout, r));
        ASSIGN_OR_RETURN(auto w, shard_weights(full, s));
        p->shards_.push_back(std::move(w));
    }
    p->workers_ = std::make_unique<Workers>(n);
    // One decision for every rank on keeping a bf16 copy of the experts (it picks the MoE kernels):
    // from the least free memory, as CudaModel would decide for one GPU.
    CudaModelOptions shared = options;
    if (shared.bf16_experts && !full.layers.empty() && full.layers[0].expert_format == kernels::ExpertFormat::kMxfp4) {
        size_t least = SIZE_MAX;
        for (int d : devices) least = std::min(least, CudaModel::free_device_memory(d));
        const WeightShard& s0 = p->shards_[0]->shard;
        const double bytes = static_cast<double>(full.config.num_hidden_layers) * s0.num_experts * 3.0 * s0.inter_size *
                             full.config.hidden_size * 2.0;
        if (bytes > 0.6 * static_cast<double>(least)) shared.bf16_experts = false;
    }
    const bool size_kv = options.num_blocks_full <= 0 && !options.defer_kv_cache;
    RETURN_IF_ERROR(p->run_all([&](int r) -> Status {
        CudaModelOptions o = shared;
        o.device = devices[r];
        o.comms = &p->comms_[r];
        o.defer_kv_cache = true;  // every rank of a DP group needs the same block count: sized below
        ASSIGN_OR_RETURN(p->models_[r], CudaModel::create(*p->shards_[r], o));
        return ok_status();
    }));
    if (options.defer_kv_cache) return p;
    // KV cache: the same block counts on every rank, from the rank with the least free memory.
    const GptOssConfig& c = full.config;
    const int bs = options.block_size;
    int nsl = options.num_blocks_sliding > 0 ? options.num_blocks_sliding
                                             : options.max_seqs * ((c.sliding_window + bs - 1) / bs + 2);
    int nfull = options.num_blocks_full;
    if (size_kv) {
        std::vector<size_t> free_b(n);
        RETURN_IF_ERROR(p->run_all([&](int r) -> Status {
            free_b[r] = p->models_[r]->free_device_memory();
            return ok_status();
        }));
        int sliding_layers = 0;
        for (int l = 0; l < c.num_hidden_layers; ++l) sliding_layers += c.is_sliding(l);
        const int full_layers = c.num_hidden_layers - sliding_layers;
        double fit = 1e300;
        for (int r = 0; r < n; ++r) {
            const double block = static_cast<double>(bs) * p->shards_[r]->shard.num_kv_heads * c.head_dim * 2 *
                                 (options.kv_fp8 ? 1 : 2);  // K and V
            const double budget = static_cast<double>(free_b[r]) * options.kv_cache_fraction -
                                  static_cast<double>(nsl) * block * sliding_layers;
            fit = std::min(fit, budget / (block * std::max(1, full_layers)));
        }
        nfull = static_cast<int>(std::max(0.0, fit));
    }
    RETURN_IF_ERROR(p->allocate_kv_cache(bs, nfull, nsl));
    return p;
}

Status ParallelCudaModel::allocate_kv_cache(int block_size, int num_blocks_full, int num_blocks_sliding) {
    if (!workers_) return models_[0]->allocate_kv_cache(block_size, num_blocks_full, num_blocks_sliding);
    // One more block of each kind than reported: the scratch block an idle DP group's placeholder
    // sequence writes to (every rank must join every step's collectives).
    RETURN_IF_ERROR(run_all(
        [&](int r) { return models_[r]->allocate_kv_cache(block_size, num_blocks_full + 1, num_blocks_sliding + 1); }));
    scratch_full_ = num_blocks_full;
    scratch_sliding_ = num_blocks_sliding;
    return ok_status();
}

size_t ParallelCudaModel::free_device_memory() {
    std::vector<size_t> free_b(models_.size());
    (void)run_all([&](int r) {
        free_b[r] = CudaModel::free_device_memory();
        return ok_status();
    });
    return *std::min_element(free_b.begin(), free_b.end());
}

size_t ParallelCudaModel::total_device_memory() {
    std::vector<size_t> total_b(models_.size());
    (void)run_all([&](int r) {
        total_b[r] = CudaModel::total_device_memory();
        return ok_status();
    });
    return *std::min_element(total_b.begin(), total_b.end());
}

Status ParallelCudaModel::split(std::span<const ForwardSequence> seqs, std::span<const int> dp_group, bool sample,
                                std::vector<std::vector<ForwardSequence>>* per_group,
                                std::vector<std::vector<size_t>>* members, int* max_tokens) const {
    const int dp = layout_.dp;
    if (!dp_group.empty() && dp_group.size() != seqs.size()) {
        return invalid_argument("dp_group needs one entry per sequence");
    }
    per_group->assign(dp, {});
    members->assign(dp, {});
    std::vector<int> tokens(dp, 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
        const int g = dp_group.empty() ? static_cast<int>(i % dp) : dp_group[i];
        if (g < 0 || g >= dp) return invalid_argument("dp group " + std::to_string(g) + " out of range");
        (*per_group)[g].push_back(seqs[i]);
        (*members)[g].push_back(i);
        tokens[g] += static_cast<int>(seqs[i].tokens.size());
    }
    // An idle group runs a one-token placeholder in the hidden scratch block; its results are dropped.
    for (int g = 0; g < dp; ++g) {
        if (!(*per_group)[g].empty()) continue;
        ForwardSequence s;
        s.tokens = std::span<const int32_t>(&kPlaceholderToken, 1);
        s.start_pos = 0;
        s.block_table_full = std::span<const int32_t>(&scratch_full_, 1);
        s.block_table_sliding = std::span<const int32_t>(&scratch_sliding_, 1);
        (*per_group)[g].push_back(s);
        tokens[g] = 1;
    }
    // Every group's batch is checked before any rank starts: a group failing alone would leave the
    // others waiting in a collective. Block ids must stay below num_blocks() (the scratch block is
    // the placeholder's).
    for (int g = 0; g < dp; ++g) {
        if ((*members)[g].empty()) continue;
        RETURN_IF_ERROR(
            models_[g * layout_.tp]->validate((*per_group)[g], sample, num_blocks(false), num_blocks(true)));
    }
    *max_tokens = *std::max_element(tokens.begin(), tokens.end());
    return ok_status();
}

Status ParallelCudaModel::forward(std::span<const ForwardSequence> seqs, std::vector<float>* logits,
                                  std::span<const int> dp_group) {
    if (!workers_) return models_[0]->forward(seqs, logits);
    std::vector<std::vector<ForwardSequence>> per_group;
    std::vector<std::vector<size_t>> members;
    int max_tokens = 0;
    RETURN_IF_ERROR(split(seqs, dp_group, false, &per_group, &members, &max_tokens));
    const int tp = layout_.tp;
    std::vector<std::vector<float>> out(models_.size());
    RETURN_IF_ERROR(run_all([&](int r) {
        const int g = r / tp;
        // Only TP rank 0 of a group keeps logits; the others still take part in the gathers.
        return models_[r]->forward(per_group[g], &out[r], max_tokens);
    }));
    std::vector<size_t> rows_of(seqs.size()), first(seqs.size());
    size_t total = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        rows_of[i] = seqs[i].all_logits ? seqs[i].tokens.size() : 1;
        first[i] = total;
        total += rows_of[i];
    }
    const size_t V = static_cast<size_t>(full_.config.vocab_size), base = logits->size();
    logits->resize(base + total * V);
    for (int g = 0; g < layout_.dp; ++g) {
        const std::vector<float>& src = out[g * tp];
        size_t row = 0;
        for (size_t i : members[g]) {
            std::copy(src.begin() + row * V, src.begin() + (row + rows_of[i]) * V,
                      logits->begin() + static_cast<std::ptrdiff_t>(base + first[i] * V));
            row += rows_of[i];
        }
    }
    return ok_status();
}

Status ParallelCudaModel::sample_again(std::span<const int> rows, std::span<const CudaModel::SampleParams> params,
                                       std::span<const uint32_t> bits, std::span<const CudaModel::LogitEdits> edits,
                                       std::vector<int32_t>* ids) {
    if (workers_) return failed_precondition("sample_again runs on a model of one GPU");
    return models_[0]->sample_again(rows, params, bits, edits, ids);
}

Status ParallelCudaModel::read_kv_blocks(bool sliding, std::span<const int32_t> ids, uint8_t* out) {
    if (workers_) return failed_precondition("KV export and import need a model of one GPU (no layout)");
    return models_[0]->read_kv_blocks(sliding, ids, out);
}

Status ParallelCudaModel::write_kv_blocks(bool sliding, std::span<const int32_t> ids, const uint8_t* in) {
    if (workers_) return failed_precondition("KV export and import need a model of one GPU (no layout)");
    return models_[0]->write_kv_blocks(sliding, ids, in);
}

Status ParallelCudaModel::forward_sample(std::span<const ForwardSequence> seqs,
                                         std::span<const CudaModel::SampleParams> params, std::vector<int32_t>* ids,
                                         std::span<const int> dp_group, std::vector<float>* logits) {
    if (!workers_) return models_[0]->forward_sample(seqs, params, ids, 0, logits);
    if (params.size() != seqs.size()) return invalid_argument("one parameter set per sequence");
    std::vector<std::vector<ForwardSequence>> per_group;
    std::vector<std::vector<size_t>> members;
    int max_tokens = 0;
    RETURN_IF_ERROR(split(seqs, dp_group, true, &per_group, &members, &max_tokens));
    std::vector<std::vector<CudaModel::SampleParams>> group_params(layout_.dp);
    for (int g = 0; g < layout_.dp; ++g) {
        for (size_t i : members[g]) group_params[g].push_back(params[i]);
        if (members[g].empty()) group_params[g].push_back({});  // the placeholder's (greedy)
    }
    const int tp = layout_.tp;
    std::vector<std::vector<int32_t>> out(models_.size());
    std::vector<std::vector<float>> rows(models_.size());
    RETURN_IF_ERROR(run_all([&](int r) {
        const int g = r / tp;
        // Only TP rank 0 of a group copies logits rows back; the others run the same kernels.
        return models_[r]->forward_sample(per_group[g], group_params[g], &out[r], max_tokens,
                                          logits != nullptr && r % tp == 0 ? &rows[r] : nullptr);
    }));
    ids->assign(seqs.size(), 0);
    for (int g = 0; g < layout_.dp; ++g)
        for (size_t j = 0; j < members[g].size(); ++j) (*ids)[members[g][j]] = out[g * tp][j];
    if (logits != nullptr) {  // the asked-for rows in sequence order: each group's come in member order
        const size_t V = static_cast<size_t>(full_.config.vocab_size);
        std::vector<const float*> row_of(seqs.size(), nullptr);
        for (int g = 0; g < layout_.dp; ++g) {
            size_t k = 0;
            for (size_t i : members[g])
                if (params[i].return_logits) row_of[i] = rows[g * tp].data() + (k++) * V;
        }
        for (size_t i = 0; i < seqs.size(); ++i)
            if (row_of[i] != nullptr) logits->insert(logits->end(), row_of[i], row_of[i] + V);
    }
    return ok_status();
}

void ParallelCudaModel::fill_kv_random(uint64_t seed) {
    (void)run_all([&](int r) {
        models_[r]->fill_kv_random(seed + 1000003ull * r);
        return ok_status();
    });
}

int ParallelCudaModel::block_size() const { return models_[0]->block_size(); }
float ParallelCudaModel::last_step_span_ms() const { return models_[0]->last_step_span_ms(); }
int ParallelCudaModel::num_blocks(bool sliding) const {
    return models_[0]->num_blocks(sliding) - (workers_ ? 1 : 0);  // the scratch block is hidden
}
size_t ParallelCudaModel::weight_bytes() const {
    size_t n = 0;
    for (const auto& m : models_) n += m->weight_bytes();
    return n;
}
size_t ParallelCudaModel::kv_cache_bytes() const {
    size_t n = 0;
    for (const auto& m : models_) n += m->kv_cache_bytes();
    return n;
}

}  // namespace gptoss::model
