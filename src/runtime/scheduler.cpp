#include "runtime/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace gptoss::runtime {
namespace {

// The scheduling order: priority (lower first), then arrival.
bool by_order(const Sequence* a, const Sequence* b) {
    return a->priority != b->priority ? a->priority < b->priority : a->id < b->id;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager* kv)
    : config_(config), kv_(kv), max_chunk_(std::min(config.max_num_batched_tokens, kv->max_chunk_tokens())) {
    ENGINE_CHECK(config.max_num_seqs > 0 && max_chunk_ > 0, "scheduler needs room for one token (max_chunk %d)",
                 max_chunk_);
}

void Scheduler::insert_waiting(Sequence* seq) {
    seq->status = SequenceStatus::kWaiting;
    waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, by_order), seq);
}

void Scheduler::add(Sequence* seq) {
    ENGINE_CHECK(seq->num_tokens() > 0 && seq->block_table_full.empty(), "bad new sequence");
    insert_waiting(seq);
}

void Scheduler::remove(Sequence* seq) {
    if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end()) waiting_.erase(it);
    if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end()) running_.erase(it);
    kv_->free(*seq);
    seq->status = SequenceStatus::kFinished;
}

void Scheduler::preempt(Sequence* seq) {
    seq->drop_drafts();
    kv_->free(*seq);
    ++seq->num_preemptions;
    ++num_preemptions_;
    insert_waiting(seq);
}

SchedulerOutput Scheduler::schedule() {
    SchedulerOutput out;
    int budget = config_.max_num_batched_tokens;
    int scored = std::max(1, config_.max_scored_tokens);
    // A sequence scoring its prompt takes no more than the step's scored tokens left.
    auto cap = [&](const Sequence* s, int n) { return s->score_prompt ? std::min(n, scored) : n; };

    // 1. Running sequences, oldest first.
    size_t i = 0;
    for (; i < running_.size() && budget > 0;) {
        Sequence* s = running_[i];
        if (s->score_prompt && scored == 0) {  // its turn comes next step
            ++i;
            continue;
        }
        int n = cap(s, std::min({s->num_tokens() - s->num_computed, budget, max_chunk_}));
        // Drafts go whole or not at all, and never cost another sequence its blocks.
        if (s->num_draft > 0 && (n < s->num_tokens() - s->num_computed || !kv_->can_allocate(*s, n))) {
            s->drop_drafts();
            n = std::min({s->num_tokens() - s->num_computed, budget, max_chunk_});
        }
        ENGINE_CHECK(n > 0, "running sequence %llu has nothing to compute", static_cast<unsigned long long>(s->id));
        bool preempted_self = false;
        while (!kv_->can_allocate(*s, n)) {
            if (kv_->release_held_imports()) continue;  // imported prefixes go before any running sequence
            Sequence* victim = running_.back();
            running_.pop_back();
            preempt(victim);
            out.preempted.push_back(victim);
            if (victim == s) {
                preempted_self = true;
                break;
            }
        }
        if (preempted_self) break;
        kv_->allocate(*s, n);
        out.seqs.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens(), s->num_draft});
        out.num_tokens += n;
        budget -= n;
        if (s->score_prompt) scored -= n;
        ++i;
    }

    for (; i < running_.size(); ++i) running_[i]->drop_drafts();  // not scheduled this step

    // 2. Waiting sequences, FCFS (passing over those that wait for a shared prefix; their places among max_num_seqs
    // are kept for them).
    for (size_t w = 0; out.preempted.empty() && w < waiting_.size() && budget > 0 &&
                       static_cast<int>(running_.size() + w) < config_.max_num_seqs;) {
        Sequence* s = waiting_[w];
        if (s->score_prompt && scored == 0) break;
        // match_prefix also extends the block hashes the prefix index needs later.
        const int matched = kv_->match_prefix(*s);
        if (!s->score_prompt && waits_for_shared_prefix(*s, matched)) {
            ++num_shared_prefix_waits_;
            ++w;
            continue;
        }
        const int cached = s->score_prompt ? 0 : matched;  // every prompt position's row is wanted
        const int n = cap(s, std::min({s->num_tokens() - cached, budget, max_chunk_}));
        if (!kv_->can_admit(*s, cached, n)) {
            // Imported prefixes held for waiting requests (s's own among them) become ordinary cached blocks.
            if (kv_->num_held_imports() > 0) {
                kv_->release_held_imports();
                continue;  // s again, with its match redone
            }
            break;
        }
        kv_->admit(*s, cached);
        kv_->allocate(*s, n);
        waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
        if (s->num_cached_tokens < 0) s->num_cached_tokens = std::min(cached, s->num_prompt_tokens);
        num_cached_prompt_tokens_ += cached;
        s->status = SequenceStatus::kRunning;
        running_.insert(std::upper_bound(running_.begin(), running_.end(), s, by_order), s);
        out.seqs.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens()});
        out.num_tokens += n;
        budget -= n;
        if (s->score_prompt) scored -= n;
    }
    return out;
}

bool Scheduler::waits_for_shared_prefix(const Sequence& seq, int matched) const {
    if (config_.min_shared_prefix_tokens <= 0 || !kv_->prefix_caching()) return false;
    const int bs = kv_->block_size();
    const size_t k = static_cast<size_t>(matched / bs);  // the first block seq would compute
    for (const Sequence* r : running_) {
        if (r->score_prompt) continue;  // it computes max_scored_tokens a step: seq would wait long
        // Blocks k.. that r shares with seq (a block's hash covers its whole prefix, so they run on from k).
        size_t j = k;
        while (j < seq.block_hashes.size() && j < r->block_hashes.size() && seq.block_hashes[j] == r->block_hashes[j])
            ++j;
        const int64_t still_to_compute =
            static_cast<int64_t>(j) * bs - std::max<int64_t>(r->num_computed, static_cast<int64_t>(k) * bs);
        if (still_to_compute >= config_.min_shared_prefix_tokens) return true;
    }
    return false;
}

void Scheduler::on_step_done(const SchedulerOutput& out, std::span<const int> rejected) {
    ENGINE_CHECK(rejected.empty() || rejected.size() == out.seqs.size(), "rejected drafts for %zu of %zu sequences",
                 rejected.size(), out.seqs.size());
    for (size_t i = 0; i < out.seqs.size(); ++i) {
        const ScheduledSequence& ss = out.seqs[i];
        const int r = rejected.empty() ? 0 : rejected[i];
        ENGINE_CHECK(r >= 0 && r <= ss.num_draft && ss.seq->num_draft == 0, "bad rejected draft count %d of %d", r,
                     ss.num_draft);
        ss.seq->num_computed += ss.num_new_tokens - r;
        kv_->on_computed(*ss.seq);
    }
}

}  // namespace gptoss::runtime
