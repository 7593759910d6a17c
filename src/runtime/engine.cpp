#include "runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <optional>
#include <random>
#include <unordered_map>

#include "core/check.h"
#include "core/thread_pool.h"

namespace gptoss::runtime {

struct Submission {
    uint64_t id = 0;
    Request request;
    uint64_t seed = 0;
    std::shared_ptr<RequestStream> stream;
};

// The only way into the engine thread: submissions and cancellations under one short lock.
class CommandQueue {
public:
    void submit(Submission s) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            submissions_.push_back(std::move(s));
        }
        cv_.notify_one();
    }
    void cancel(uint64_t id) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (closed_) return;
            cancels_.push_back(id);
        }
        cv_.notify_one();
    }
    // `task` runs on the engine thread between steps; false (it never runs) once closed.
    bool post(std::function<void()> task) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (closed_) return false;
            tasks_.push_back(std::move(task));
        }
        cv_.notify_one();
        return true;
    }
    void close() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            closed_ = true;
        }
        cv_.notify_one();
    }
    // Takes everything queued; waits for something first when `wait` is set. False once closed
    // (what was queued is still handed over, so every submission gets its final event and every task runs).
    bool take(bool wait, std::deque<Submission>* submissions, std::vector<uint64_t>* cancels,
              std::vector<std::function<void()>>* tasks) {
        std::unique_lock<std::mutex> lock(mu_);
        if (wait)
            cv_.wait(lock, [&] { return closed_ || !submissions_.empty() || !cancels_.empty() || !tasks_.empty(); });
        submissions->swap(submissions_);
        cancels->swap(cancels_);
        tasks->swap(tasks_);
        return !closed_;
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Submission> submissions_;
    std::vector<uint64_t> cancels_;
    std::vector<std::function<void()>> tasks_;
    bool closed_ = false;
};

RequestHandle& RequestHandle::operator=(RequestHandle&& other) {
    if (this != &other) {
        cancel();
        stream_ = std::move(other.stream_);
        queue_ = std::move(other.queue_);
    }
    return *this;
}

RequestHandle::~RequestHandle() { cancel(); }

void RequestHandle::cancel() {
    if (stream_ && queue_ && !stream_->done()) queue_->cancel(stream_->id());
}

struct Engine::Active {
    Sequence seq;
    Request request;
    uint64_t seed = 0;
    std::shared_ptr<RequestStream> stream;
    StopChecker stop;
    int spec_wait = 0;                              // steps before this sequence proposes drafts again
    int spec_backoff = 0;                           // the last wait (doubles while verifications keep nothing)
    std::unique_ptr<TokenConstraint> constraint{};  // from request.constraint
    std::vector<uint8_t> allowed{};                 // the constraint's last mask
    // This step's constraint answer when computed ahead of the draw (beside the forward): -1 not yet, 0 every token
    // allowed, 1 the mask in `allowed`.
    int8_t next_mask = -1;
    std::vector<PromptLogprob> prompt_lps{};  // request.prompt_logprobs: prompt tokens 1.. so far
};

namespace {

uint64_t mix_seed(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<ModelRunner> runner, EngineConfig config) {
    if (!runner) return invalid_argument("no model runner");
    if (config.block_size <= 0) return invalid_argument("block_size must be positive");
    if (config.scheduler.max_num_seqs <= 0 || config.scheduler.max_num_batched_tokens <= 0)
        return invalid_argument("max_num_seqs and max_num_batched_tokens must be positive");
    if (const char* v = std::getenv("GPTOSS_SHARED_PREFIX_WAIT"); v != nullptr)
        config.scheduler.min_shared_prefix_tokens = std::max(0, std::atoi(v));
    const KvGeometry geometry = runner->kv_geometry(config.block_size);
    const bool by_fraction = config.kv_budget.num_blocks_full <= 0 && config.kv_budget.bytes == 0;
    ASSIGN_OR_RETURN(KvBlockCounts counts,
                     plan_kv_blocks(geometry, config.kv_budget, by_fraction ? runner->free_memory_bytes() : 0,
                                    config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens));
    if (geometry.sliding_window > 0) {
        // One sequence must be able to take one token with its whole window held.
        const int64_t need =
            (static_cast<int64_t>(geometry.sliding_window) - 1 + config.block_size - 1) / config.block_size + 2;
        if (counts.sliding < need)
            return resource_exhausted("the KV budget gives " + std::to_string(counts.sliding) +
                                      " sliding-window blocks; a sequence needs " + std::to_string(need));
    }
    RETURN_IF_ERROR(validate_speculative_config(config.speculative));
    if (const int64_t model_len = runner->config().max_position_embeddings;
        config.max_model_len < 0 || config.max_model_len == 1 || config.max_model_len > model_len)
        return invalid_argument("max_model_len must be in [2, " + std::to_string(model_len) +
                                "] (the model's context; 0: all of it), got " + std::to_string(config.max_model_len));
    RETURN_IF_ERROR(runner->allocate_kv_cache(config.block_size, counts));
    return std::unique_ptr<Engine>(new Engine(std::move(runner), std::move(config), counts));
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, EngineConfig config, KvBlockCounts counts)
    : runner_(std::move(runner)),
      config_(std::move(config)),
      queue_(std::make_shared<CommandQueue>()),
      kv_(config_.block_size, runner_->kv_geometry(config_.block_size).sliding_window, counts,
          config_.enable_prefix_caching),
      scheduler_(config_.scheduler, &kv_),
      kv_format_(runner_->kv_format(config_.block_size)),
      capacity_tokens_(kv_.capacity_tokens()),
      context_tokens_(config_.max_model_len > 0 ? config_.max_model_len : runner_->config().max_position_embeddings),
      seed_base_(config_.seed ? mix_seed(*config_.seed ^ 0x9e3779b97f4a7c15ull)
                              : static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}()) {
    kv_.set_dp_groups(runner_->dp_groups());
    device_sampling_ = config_.device_sampling && runner_->samples_on_device();
    if (const char* v = std::getenv("GPTOSS_DEVICE_SAMPLING"); v != nullptr && std::atoi(v) == 0)
        device_sampling_ = false;
    defer_draws_ = device_sampling_ && config_.defer_masked_draws && runner_->can_defer_draws();
    if (const char* v = std::getenv("GPTOSS_DEFER_MASKED_DRAWS"); v != nullptr && std::atoi(v) == 0)
        defer_draws_ = false;
    overlap_masks_ = config_.overlap_masks && runner_->host_idle_during_forward();
    if (const char* v = std::getenv("GPTOSS_MASK_OVERLAP"); v != nullptr && std::atoi(v) == 0) overlap_masks_ = false;
    counters_.num_blocks = {kv_.full().num_blocks(), kv_.sliding().num_blocks()};
    counters_.max_chunk_tokens = scheduler_.max_chunk_tokens();
    stats_ = counters_;
    thread_ = std::thread([this] { loop(); });
}

int Engine::cached_prompt_tokens(std::vector<int32_t> prompt) const {
    auto answer = std::make_shared<std::promise<int>>();
    std::future<int> cached = answer->get_future();
    if (!queue_->post(
            [this, answer, prompt = std::move(prompt)] { answer->set_value(kv_.cached_prefix_tokens(prompt)); }))
        return 0;  // shutting down
    return cached.get();
}

Engine::~Engine() {
    queue_->close();
    thread_.join();
}

Status Engine::validate(const Request& r) const {
    const model::GptOssConfig& c = runner_->config();
    const int64_t n = static_cast<int64_t>(r.prompt.size());
    if (n == 0) return invalid_argument("the prompt is empty");
    for (int32_t id : r.prompt) {
        if (id < 0 || id >= c.vocab_size)
            return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                    std::to_string(c.vocab_size) + ")");
    }
    if (n > context_tokens_)
        return out_of_range("the prompt has " + std::to_string(n) + " tokens, more than the model's context of " +
                            std::to_string(context_tokens_));
    if (r.max_tokens <= 0) return invalid_argument("max_tokens must be positive, got " + std::to_string(r.max_tokens));
    if (r.min_tokens < 0 || r.min_tokens > r.max_tokens)
        return invalid_argument("min_tokens must be in [0, max_tokens = " + std::to_string(r.max_tokens) + "], got " +
                                std::to_string(r.min_tokens));
    if (n + r.max_tokens > context_tokens_)
        return out_of_range("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                            std::to_string(r.max_tokens) + ") exceed the model's context of " +
                            std::to_string(context_tokens_) + " tokens");
    if (n + r.max_tokens > capacity_tokens_)
        return resource_exhausted("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                                  std::to_string(r.max_tokens) + ") exceed the KV cache's capacity of " +
                                  std::to_string(capacity_tokens_) + " tokens");
    RETURN_IF_ERROR(validate_sampling_params(r.sampling, c.vocab_size));
    if (r.logprobs < -1 || r.logprobs > kMaxLogprobs)
        return invalid_argument("logprobs must be in [-1, " + std::to_string(kMaxLogprobs) + "], got " +
                                std::to_string(r.logprobs));
    if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxLogprobs)
        return invalid_argument("prompt_logprobs must be in [-1, " + std::to_string(kMaxLogprobs) + "], got " +
                                std::to_string(r.prompt_logprobs));
    for (int32_t id : r.stop_ids) {
        if (id < 0 || id >= c.vocab_size)
            return invalid_argument("stop id " + std::to_string(id) + " is outside the vocabulary");
    }
    for (const std::vector<int32_t>& w : r.bad_words) {
        if (w.empty()) return invalid_argument("a bad_words sequence is empty");
        for (int32_t id : w)
            if (id < 0 || id >= c.vocab_size)
                return invalid_argument("bad_words id " + std::to_string(id) + " is outside the vocabulary");
    }
    for (const std::string& s : r.stop_strings) {
        if (s.empty()) return invalid_argument("a stop string is empty");
    }
    if (!r.stop_strings.empty() && !config_.detokenizer)
        return failed_precondition("stop strings need a detokenizer, and the engine was given none");
    if (r.export_kv) {
        if (!kv_format_.ok()) return failed_precondition(kv_format_.status().message());
        if (n % config_.block_size != 0)
            return invalid_argument("a KV export needs a prompt of whole blocks (" + std::to_string(n) +
                                    " tokens, blocks of " + std::to_string(config_.block_size) + ")");
    }
    if (r.kv_prefix) {
        if (!kv_format_.ok()) return failed_precondition(kv_format_.status().message());
        if (!config_.enable_prefix_caching) return failed_precondition("importing KV needs prefix caching");
        if (!r.cache_salt.empty()) return invalid_argument("imported KV is not salted: no cache_salt with kv_prefix");
        RETURN_IF_ERROR(check_kv_transfer(*r.kv_prefix, *kv_format_));
        const std::vector<int32_t>& t = r.kv_prefix->tokens;
        if (static_cast<int64_t>(t.size()) >= n || !std::equal(t.begin(), t.end(), r.prompt.begin()))
            return invalid_argument("the imported KV (" + std::to_string(t.size()) +
                                    " tokens) is not of a proper prefix of the prompt (" + std::to_string(n) +
                                    " tokens)");
    }

    return ok_status();
}

StatusOr<RequestHandle> Engine::submit(Request r) {
    if (r.export_kv) {  // the export ends with its first token
        r.max_tokens = 1;
        r.min_tokens = 0;
    }
    RETURN_IF_ERROR(validate(r));
    Submission s;
    s.id = next_id_.fetch_add(1);
    s.seed = r.sampling.seed ? *r.sampling.seed : mix_seed(seed_base_ ^ s.id);
    s.stream = std::make_shared<RequestStream>(s.id, std::move(r.on_event));
    r.on_event = nullptr;
    s.request = std::move(r);
    RequestHandle handle(s.stream, queue_);
    {
        std::lock_guard<std::mutex> lock(stats_mu_);
        ++submitted_;
        idle_ = false;
    }
    queue_->submit(std::move(s));
    return handle;
}

void Engine::cancel(const RequestHandle& handle) const {
    if (handle.valid()) queue_->cancel(handle.id());
}

int64_t Engine::max_sequence_tokens() const { return std::min<int64_t>(capacity_tokens_, context_tokens_); }

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
}

bool Engine::wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(stats_mu_);
    return stats_cv_.wait_for(lock, timeout, [&] { return idle_; });
}

void Engine::publish_stats() {
    counters_.num_running = scheduler_.num_running();
    counters_.num_waiting = scheduler_.num_waiting();
    counters_.num_active = static_cast<int>(active_.size());
    counters_.num_blocks_in_use = {kv_.full().num_in_use(), kv_.has_sliding() ? kv_.sliding().num_in_use() : 0};
    counters_.num_blocks_indexed = {kv_.full().num_indexed(), kv_.sliding().num_indexed()};
    counters_.num_preemptions = scheduler_.num_preemptions();
    counters_.num_cached_prompt_tokens = scheduler_.num_cached_prompt_tokens();
    {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_ = counters_;
        idle_ = submitted_ == static_cast<uint64_t>(counters_.num_finished);
    }
    stats_cv_.notify_all();
}

void Engine::finish(Active& a, TokenEvent ev) {
    if (a.request.export_kv && (ev.finish_reason == FinishReason::kStop || ev.finish_reason == FinishReason::kLength)) {
        StatusOr<std::shared_ptr<const KvTransfer>> kv = export_kv(a.seq);
        if (kv.ok()) {
            ev.kv = std::move(*kv);
            counters_.num_exported_tokens += a.seq.num_prompt_tokens;
        } else {
            ev.finish_reason = FinishReason::kError;
            ev.error = kv.status().to_string();
        }
    }
    kv_.drop_import(a.seq.id);
    scheduler_.remove(&a.seq);
    ev.num_prompt_tokens = a.seq.num_prompt_tokens;
    ev.num_cached_tokens = std::max(0, a.seq.num_cached_tokens);
    a.stream->push(std::move(ev));
    ++counters_.num_finished;
    active_.erase(a.seq.id);  // destroys `a`
}

StatusOr<std::shared_ptr<const KvTransfer>> Engine::export_kv(const Sequence& seq) {
    const int bs = config_.block_size, P = seq.num_prompt_tokens, k = P / bs;
    if (seq.num_computed < P || static_cast<int>(seq.block_table_full.size()) < k)
        return internal_error("the prompt's KV is not all computed");
    auto t = std::make_shared<KvTransfer>();
    t->format = *kv_format_;
    t->tokens.assign(seq.tokens.begin(), seq.tokens.begin() + P);
    t->first_sliding_block = kv_.has_sliding() ? first_window_block(P, t->format.sliding_window, bs) : k;
    const std::span<const int32_t> full = std::span(seq.block_table_full).first(static_cast<size_t>(k));
    t->full.resize(static_cast<size_t>(k) * t->format.bytes_per_block_full);
    RETURN_IF_ERROR(runner_->read_kv_blocks(false, full, t->full.data()));
    if (t->first_sliding_block < k) {
        const std::span<const int32_t> sliding =
            std::span(seq.block_table_sliding)
                .subspan(static_cast<size_t>(t->first_sliding_block), static_cast<size_t>(k - t->first_sliding_block));
        for (int32_t id : sliding)
            if (id < 0) return internal_error("a sliding-window block of the prompt's last window was released");
        t->sliding.resize(sliding.size() * t->format.bytes_per_block_sliding);
        RETURN_IF_ERROR(runner_->read_kv_blocks(true, sliding, t->sliding.data()));
    }
    return std::shared_ptr<const KvTransfer>(std::move(t));
}

void Engine::import_kv(uint64_t seq_id, const KvTransfer& t) {
    KvCacheManager::PrefixImport im;
    if (!kv_.begin_import(t.tokens, &im)) {
        ++counters_.num_kv_imports_dropped;
        return;
    }
    Status st = runner_->write_kv_blocks(false, im.write_full, t.full.data());
    if (st.ok() && !im.write_sliding.empty()) {
        // The transfer may start its sliding blocks earlier than the window needs.
        const size_t skip =
            static_cast<size_t>(im.first_sliding - t.first_sliding_block) * t.format.bytes_per_block_sliding;
        st = runner_->write_kv_blocks(true, im.write_sliding, t.sliding.data() + skip);
    }
    if (!st.ok()) {
        kv_.release_import(im);
        ++counters_.num_kv_imports_dropped;
        return;
    }
    kv_.index_import(t.tokens, im);
    kv_.hold_import(seq_id, std::move(im));  // until the request is admitted (or the blocks are needed)
    counters_.num_imported_tokens += static_cast<int64_t>(t.tokens.size());
}

void Engine::loop() {
    std::deque<Submission> submissions;
    std::vector<uint64_t> cancels;
    std::vector<std::function<void()>> tasks;
    for (;;) {
        const bool open = queue_->take(!scheduler_.has_work(), &submissions, &cancels, &tasks);
        for (Submission& s : submissions) {
            auto a = std::make_unique<Active>(
                Active{Sequence{}, std::move(s.request), s.seed, std::move(s.stream), StopChecker({}, {}, 0, nullptr)});
            a->stop = StopChecker(a->request.stop_ids, a->request.stop_strings, a->request.max_tokens,
                                  &config_.detokenizer, a->request.min_tokens);
            if (a->request.constraint) a->constraint = a->request.constraint->start();
            a->seq.id = s.id;
            a->seq.tokens = a->request.prompt;
            a->seq.num_prompt_tokens = static_cast<int>(a->seq.tokens.size());
            a->seq.cache_salt = cache_salt_hash(a->request.cache_salt);
            a->seq.priority = a->request.priority;
            a->seq.score_prompt = a->request.prompt_logprobs >= 0 && a->seq.num_prompt_tokens > 1;
            if (a->request.kv_prefix) {
                if (!a->seq.score_prompt) import_kv(a->seq.id, *a->request.kv_prefix);
                a->request.kv_prefix.reset();  // its bytes are in the cache now (or dropped)
            }
            scheduler_.add(&a->seq);
            active_.emplace(s.id, std::move(a));
        }
        submissions.clear();
        for (uint64_t id : cancels) {
            auto it = active_.find(id);
            if (it == active_.end()) continue;  // already finished
            TokenEvent ev;
            ev.finish_reason = FinishReason::kCancelled;
            finish(*it->second, std::move(ev));
        }
        cancels.clear();
        for (auto& task : tasks) task();
        tasks.clear();
        if (!open) break;
        if (scheduler_.has_work()) step();
        publish_stats();
    }
    // Shutting down: whatever is left ends as cancelled.
    while (!active_.empty()) {
        TokenEvent ev;
        ev.finish_reason = FinishReason::kCancelled;
        finish(*active_.begin()->second, std::move(ev));
    }
    publish_stats();
}

void Engine::propose_drafts() {
    const SpeculativeConfig& sc = config_.speculative;
    const std::vector<Sequence*>& running = scheduler_.running();
    const int R = static_cast<int>(running.size());
    if (sc.num_tokens <= 0 || R == 0 || (sc.max_running > 0 && R > sc.max_running)) return;
    // Every verified token is a logits row (and, on the CUDA runner, a batch entry). The step may
    // hold max_num_seqs sequences (this step's admissions included), so the drafts get what the
    // runner takes beyond that (the CLI sizes the CUDA runner by speculative_extra_entries).
    const int entries = runner_->max_batch_entries();
    int room = entries == std::numeric_limits<int>::max() ? entries : entries - config_.scheduler.max_num_seqs;
    for (Sequence* s : running) {
        if (room <= 0) break;
        if (s->num_draft != 0 || s->num_computed != s->num_tokens() - 1) continue;  // not decoding
        Active& a = *active_.at(s->id);
        if (a.constraint) continue;  // drafts are not checked against the constraint
        if (s->num_generated() < a.request.min_tokens || !a.request.bad_words.empty())
            continue;  // nor against min_tokens' or bad_words' masks
        if (a.spec_wait > 0) {
            --a.spec_wait;
            continue;
        }
        // Never past max_tokens: the step's last row gives one more token after the drafts.
        const int k = std::min({sc.num_tokens, a.request.max_tokens - s->num_generated() - 1, room});
        if (k <= 0) continue;
        const int n = propose_ngram_drafts(s->tokens, k, sc.ngram_min, sc.ngram_max, &draft_scratch_);
        if (n == 0) continue;
        s->tokens.insert(s->tokens.end(), draft_scratch_.end() - n, draft_scratch_.end());
        s->num_draft = n;
        draft_scratch_.clear();
        room -= n;
    }
}

// The constraint's mask for this draw (computed beside the forward, else now), in a.allowed; nullptr where it allows
// every token or there is none.
const uint8_t* Engine::constraint_mask(Active& a, int V) {
    if (!a.constraint) return nullptr;
    const bool masked = a.next_mask >= 0 ? a.next_mask == 1 : a.constraint->allowed_next(&a.allowed);
    a.next_mask = -1;
    if (!masked) return nullptr;
    if (a.allowed.size() < static_cast<size_t>(V)) a.allowed.resize(static_cast<size_t>(V), 0);
    return a.allowed.data();
}

// The rows forward_sample deferred (id -2): their masks (the constraint's, computed beside the forward or now, and
// min_tokens' / bad_words'), bias and penalties, and one device draw for all of them; their ids replace the -2s.
Status Engine::draw_deferred(const std::vector<Active*>& samplers, const std::vector<int>& first_row,
                             const std::vector<int>& first_index) {
    const int V = runner_->config().vocab_size;
    std::vector<ModelRunner::DeferredDraw> draws;
    std::vector<LogitEdits> edits;
    edits.reserve(samplers.size());  // draws point into it
    for (size_t i = 0; i < samplers.size(); ++i) {
        const int row = first_row[i];
        if (device_ids_[static_cast<size_t>(row)] != -2) continue;
        Active& a = *samplers[i];
        const uint8_t* allowed = constraint_mask(a, V);
        const auto output =
            std::span<const int32_t>(a.seq.tokens)
                .subspan(static_cast<size_t>(a.seq.num_prompt_tokens), static_cast<size_t>(first_index[i]));
        allowed = mask_banned(a, allowed, V, first_index[i], output);
        const LogitEdits& e = edits.emplace_back(logit_edits(a.request.sampling, a.seq.prompt(), output));
        draws.push_back({row, device_params_[static_cast<size_t>(row)], allowed, e.empty() ? nullptr : &e});
    }
    if (draws.empty()) return ok_status();
    std::vector<int32_t> ids;
    RETURN_IF_ERROR(runner_->draw_deferred(draws, &ids));
    if (ids.size() != draws.size())
        return internal_error("the model runner drew " + std::to_string(ids.size()) + " of " +
                              std::to_string(draws.size()) + " deferred rows");
    for (size_t j = 0; j < draws.size(); ++j) device_ids_[static_cast<size_t>(draws[j].row)] = ids[j];
    return ok_status();
}

const uint8_t* Engine::mask_banned(Active& a, const uint8_t* allowed, int V, int index,
                                   std::span<const int32_t> output) {
    std::vector<int32_t> banned;
    if (index < a.request.min_tokens) banned = a.request.stop_ids;  // min_tokens: no stop id yet
    for (const std::vector<int32_t>& w : a.request.bad_words) {
        const size_t n = w.size() - 1;  // the output must end with w[0, n)
        if (output.size() >= n && std::equal(w.begin(), w.end() - 1, output.end() - static_cast<std::ptrdiff_t>(n)))
            banned.push_back(w.back());
    }
    if (banned.empty()) return allowed;
    std::vector<uint8_t>& m = a.allowed;
    if (allowed == nullptr) m.assign(static_cast<size_t>(V), 1);
    std::vector<std::pair<int32_t, uint8_t>> saved;
    for (int32_t id : banned) {
        saved.emplace_back(id, m[static_cast<size_t>(id)]);
        m[static_cast<size_t>(id)] = 0;
    }
    if (std::none_of(m.begin(), m.end(), [](uint8_t v) { return v != 0; }))
        for (auto it = saved.rbegin(); it != saved.rend(); ++it) m[static_cast<size_t>(it->first)] = it->second;
    return m.data();
}

void Engine::score_prompts(const SchedulerOutput& out, std::span<const int> row_base,
                           std::span<const int64_t> host_row) {
    // Row j of a scored chunk is position p = start_pos + j: the distribution of prompt token p + 1.
    // Positions recorded before (a chunk recomputed after a preemption) are not scored again.
    struct Job {
        Active* a;
        int pos;
        int64_t row;
    };
    std::vector<Job> jobs;
    for (size_t j = 0; j < out.seqs.size(); ++j) {
        const ScheduledSequence& ss = out.seqs[j];
        if (!ss.seq->score_prompt) continue;
        Active* a = active_.at(ss.seq->id).get();
        for (int t = 0; t < ss.num_new_tokens; ++t) {
            const int pos = ss.start_pos + t;
            if (pos < static_cast<int>(a->prompt_lps.size()) || pos + 1 >= a->seq.num_prompt_tokens) continue;
            const int64_t row = host_row[static_cast<size_t>(row_base[j] + t)];
            ENGINE_CHECK(row >= 0, "a scored prompt row was drawn on the device");
            jobs.push_back({a, pos, row});
        }
    }
    if (jobs.empty()) return;
    const int V = runner_->config().vocab_size;
    std::vector<PromptLogprob> scored(jobs.size());
    auto score_range = [&](int64_t begin, int64_t end) {
        Sampler sampler(V);
        for (int64_t i = begin; i < end; ++i) {
            const Job& job = jobs[static_cast<size_t>(i)];
            scored[static_cast<size_t>(i)] =
                sampler.score(logits_.data() + static_cast<size_t>(job.row) * static_cast<size_t>(V),
                              job.a->seq.tokens[static_cast<size_t>(job.pos) + 1], job.a->request.prompt_logprobs);
        }
    };
    if (jobs.size() > 1) {
        ThreadPool::global().parallel_for(static_cast<int64_t>(jobs.size()), score_range, 8);
    } else {
        score_range(0, 1);
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        Active* a = jobs[i].a;
        a->prompt_lps.push_back(std::move(scored[i]));  // jobs are in position order per sequence
        if (static_cast<int>(a->prompt_lps.size()) == a->seq.num_prompt_tokens - 1) a->seq.score_prompt = false;
    }
}

void Engine::step() {
    propose_drafts();
    const SchedulerOutput out = scheduler_.schedule();
    if (out.empty()) return;  // only preemptions happened; the next step readmits

    // Logits rows in batch order: a sampling sequence's 1 + num_draft, a scored prompt chunk's one a
    // token (its last one the sampling row when the chunk ends the prompt).
    Batch batch;
    std::vector<int> row_base;
    int total_rows = 0;
    for (const ScheduledSequence& ss : out.seqs) {
        const Sequence& s = *ss.seq;
        BatchSequence b;
        b.tokens =
            std::span(s.tokens).subspan(static_cast<size_t>(ss.start_pos), static_cast<size_t>(ss.num_new_tokens));
        b.start_pos = ss.start_pos;
        b.block_table_full = s.block_table_full;
        // Without sliding layers the sliding tables are unused; the full ones stand in for them.
        b.block_table_sliding = kv_.has_sliding() ? std::span<const int32_t>(s.block_table_sliding)
                                                  : std::span<const int32_t>(s.block_table_full);
        b.score_prompt = s.score_prompt;
        b.need_logits = ss.sample || b.score_prompt;
        b.all_logits = ss.num_draft > 0 || b.score_prompt;  // verification: row i checks draft i + 1
        row_base.push_back(total_rows);
        total_rows += b.num_logits();
        batch.seqs.push_back(b);
        batch.num_tokens += ss.num_new_tokens;
    }
    // Sequences that reached their last token draw one (1 + num_draft rows each); on the device
    // where that draws the same distribution as the host sampler (no logprobs, min-p, penalties or
    // bias asked for). Row r of sampler i is row first_row[i] + r: the output token at index
    // first_index[i] + r.
    std::vector<Active*> samplers;
    std::vector<int> num_rows, first_row, first_index;
    for (size_t j = 0; j < out.seqs.size(); ++j) {
        const ScheduledSequence& ss = out.seqs[j];
        if (!ss.sample) continue;
        Active* a = active_.at(ss.seq->id).get();
        samplers.push_back(a);
        num_rows.push_back(1 + ss.num_draft);
        first_row.push_back(row_base[j] + batch.seqs[j].num_logits() - (1 + ss.num_draft));
        first_index.push_back(a->seq.num_generated());
        counters_.num_draft_tokens += ss.num_draft;
    }
    // A constrained request's mask depends only on its tokens so far (it has no drafts: one row), so where the
    // runner's forward leaves this thread waiting on the device, the masks are computed meanwhile on the mask
    // worker; otherwise at the draw, as before.
    std::vector<Active*> constrained;
    if (overlap_masks_)
        for (Active* a : samplers)
            if (a->constraint) constrained.push_back(a);
    if (!constrained.empty()) {
        if (!mask_worker_) mask_worker_ = std::make_unique<BackgroundWorker>();
        mask_worker_->run([&constrained] {
            for (Active* a : constrained) a->next_mask = a->constraint->allowed_next(&a->allowed) ? 1 : 0;
        });
    }
    logits_.clear();
    device_ids_.clear();
    Status st;
    if (device_sampling_) {
        // One parameter set a row. Scored prompt rows come to the host, and so does the first draw of a
        // request with prompt logprobs (its chunks, and so whether that row is a scored chunk's, depend
        // on the other requests: a seeded draw must not).
        device_params_.assign(static_cast<size_t>(total_rows), ModelRunner::DeviceSample{.want_logits = true});
        for (size_t i = 0; i < samplers.size(); ++i) {
            const Active* a = samplers[i];
            if (a->request.prompt_logprobs >= 0 && first_index[i] == 0) continue;
            const SamplingParams& p = a->request.sampling;
            ModelRunner::DeviceSample d;
            d.temperature = p.temperature;
            d.top_p = p.top_p;
            d.top_k = p.top_k;
            d.seed = a->seed;
            // A draw that needs a mask (a constraint, min_tokens, bad_words), bias, penalties or min_p is deferred
            // where the runner can: drawn on the device after the forward, with the host sampler's edits and mask.
            // Logprobs need the logits here.
            const bool masked =
                a->constraint != nullptr || first_index[i] < a->request.min_tokens || !a->request.bad_words.empty();
            const bool edited = p.min_p > 0.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
                                p.repetition_penalty != 1.0f || !p.logit_bias.empty();
            const bool host_only = a->request.logprobs >= 0;
            d.min_p = p.min_p;
            d.defer = (masked || edited) && !host_only && num_rows[i] == 1 && defer_draws_;
            d.want_logits = (masked || edited || host_only) && !d.defer;
            for (int r = 0; r < num_rows[i]; ++r) {
                d.draw_index = static_cast<uint64_t>(first_index[i] + r);
                device_params_[static_cast<size_t>(first_row[i] + r)] = d;
            }
        }
        st = runner_->forward_sample(batch, device_params_, &device_ids_, &logits_);
    } else {
        st = runner_->forward(batch, &logits_);
    }
    if (!constrained.empty()) mask_worker_->wait();  // before any use of the masks, or finish() on an error
    if (st.ok() && device_sampling_ && device_ids_.size() == static_cast<size_t>(total_rows))
        st = draw_deferred(samplers, first_row, first_index);
    if (st.ok()) {
        // A runner that returns fewer rows than the batch asked for is a bug: fail the step, never read past them.
        int64_t want = 0;
        for (int r = 0; r < total_rows; ++r)
            if (!device_sampling_ || (static_cast<size_t>(r) < device_ids_.size() && device_ids_[r] < 0)) ++want;
        const size_t V = static_cast<size_t>(runner_->config().vocab_size);
        if ((device_sampling_ && device_ids_.size() != static_cast<size_t>(total_rows)) ||
            logits_.size() != static_cast<size_t>(want) * V)
            st = internal_error("the model runner returned " + std::to_string(logits_.size() / V) +
                                " logits rows and " + std::to_string(device_ids_.size()) + " ids for a step of " +
                                std::to_string(total_rows) + " rows");
    }
    if (!st.ok()) {
        for (const ScheduledSequence& ss : out.seqs) {
            TokenEvent ev;
            ev.finish_reason = FinishReason::kError;
            ev.error = st.to_string();
            finish(*active_.at(ss.seq->id), std::move(ev));
        }
        return;
    }
    for (const ScheduledSequence& ss : out.seqs) active_.at(ss.seq->id)->stream->mark_progress();
    ++counters_.num_steps;
    counters_.num_tokens_computed += out.num_tokens;

    // Rows drawn on the host read logits row host_row[row] (device-drawn rows have -1).
    const int V = runner_->config().vocab_size;
    std::vector<int64_t> host_row(static_cast<size_t>(total_rows), -1);
    int64_t num_host_rows = 0;
    for (int r = 0; r < total_rows; ++r)
        if (!device_sampling_ || device_ids_[static_cast<size_t>(r)] < 0)
            host_row[static_cast<size_t>(r)] = num_host_rows++;
    score_prompts(out, row_base, host_row);
    // Each sampler's tokens: row r drawn as a plain decode step would draw that position (its output
    // so far includes drafts 1..r, which are kept if row r is reached), draft r + 1 kept while it
    // equals the token drawn at row r. The first mismatch or the last row ends the list. A draw
    // depends only on its own row, parameters, seed and tokens, so samplers run in parallel (when
    // the host draws any). drawn[first_row[i] + r]: sampler i's r-th token, num_emitted[i] of them.
    std::vector<SampledToken> drawn(static_cast<size_t>(total_rows));
    std::vector<int> num_emitted(samplers.size(), 0);
    auto sample_range = [&](int64_t begin, int64_t end) {
        std::optional<Sampler> sampler;
        for (int64_t i = begin; i < end; ++i) {
            Active& a = *samplers[i];
            const int nd = num_rows[i] - 1;
            const std::span<const int32_t> all = a.seq.tokens;  // prompt, output, the drafts
            for (int r = 0; r <= nd; ++r) {
                const int row = first_row[i] + r;
                SampledToken t;
                if (host_row[static_cast<size_t>(row)] < 0) {
                    t.id = device_ids_[static_cast<size_t>(row)];
                } else {
                    if (!sampler) sampler.emplace(V);
                    const auto output = all.subspan(static_cast<size_t>(a.seq.num_prompt_tokens),
                                                    static_cast<size_t>(first_index[i] + r));
                    // A constrained request has no drafts (propose_drafts), so its one row follows its
                    // constraint's state.
                    const uint8_t* allowed = constraint_mask(a, V);
                    allowed = mask_banned(a, allowed, V, first_index[i] + r, output);
                    t = sampler->sample(logits_.data() + static_cast<size_t>(host_row[static_cast<size_t>(row)]) * V,
                                        a.request.sampling, a.seed, a.seq.prompt(), output, a.request.logprobs,
                                        allowed);
                }
                const bool keep = r < nd && t.id == all[all.size() - static_cast<size_t>(nd - r)];
                drawn[static_cast<size_t>(row)] = std::move(t);
                ++num_emitted[i];
                if (!keep) break;
            }
        }
    };
    if (samplers.size() > 1 && num_host_rows > 1) {
        ThreadPool::global().parallel_for(static_cast<int64_t>(samplers.size()), sample_range, 1);
    } else {
        sample_range(0, static_cast<int64_t>(samplers.size()));
    }

    // Rejected drafts leave the tokens before the scheduler counts what was computed (it indexes
    // complete blocks by their tokens); kept drafts stay, as ordinary output tokens.
    std::vector<int> rejected(out.seqs.size(), 0);
    for (size_t i = 0, j = 0; i < out.seqs.size(); ++i) {
        if (!out.seqs[i].sample) continue;
        Sequence& s = samplers[j]->seq;
        const int kept = num_emitted[j] - 1;
        rejected[i] = s.num_draft - kept;
        if (s.num_draft > 0) {  // back off while verifications keep nothing
            Active& a = *samplers[j];
            a.spec_backoff = kept > 0 ? 0 : std::min(std::max(1, 2 * a.spec_backoff), config_.speculative.max_backoff);
            a.spec_wait = a.spec_backoff;
        }
        s.tokens.resize(s.tokens.size() - static_cast<size_t>(rejected[i]));
        s.num_draft = 0;
        counters_.num_accepted_tokens += kept;
        ++j;
    }
    scheduler_.on_step_done(out, rejected);

    for (size_t i = 0; i < samplers.size(); ++i) {
        Active& a = *samplers[i];
        a.seq.tokens.push_back(drawn[static_cast<size_t>(first_row[i] + num_emitted[i] - 1)].id);  // drafts kept: in
        for (int r = 0; r < num_emitted[i]; ++r) {
            SampledToken& t = drawn[static_cast<size_t>(first_row[i] + r)];
            ++counters_.num_tokens_generated;
            const int index = first_index[i] + r;
            if (a.constraint) a.constraint->accept(t.id);
            TokenEvent ev;
            ev.id = t.id;
            ev.index = index;
            ev.logprob = t.logprob;
            ev.top_logprobs = std::move(t.top_logprobs);
            if (index == 0) ev.prompt_logprobs = std::move(a.prompt_lps);
            // On every token, not only the last: an answer cancelled mid-way reports its cache hit too.
            ev.num_prompt_tokens = a.seq.num_prompt_tokens;
            ev.num_cached_tokens = std::max(0, a.seq.num_cached_tokens);
            if (std::optional<StopResult> stop = a.stop.push(ev.id, index + 1)) {
                ev.finish_reason = stop->reason;
                ev.stop_id = stop->stop_id;
                ev.stop_string_index = stop->stop_string_index;
                ev.trim_bytes = stop->trim_bytes;
                finish(a, std::move(ev));  // destroys `a`; the tokens after the stop are dropped
                break;
            }
            a.stream->push(std::move(ev));
        }
    }
}

}  // namespace gptoss::runtime
