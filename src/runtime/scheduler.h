// Continuous batching: each step picks which sequences run and how many tokens each feeds, under a
// per-step token budget. Pure CPU bookkeeping over Sequence and KvCacheManager (no model).
//
// Both queues are kept in scheduling order: Sequence::priority (lower first, vLLM's priority policy), then arrival
// (FCFS among equal priorities; with every priority 0, plain FCFS). "Oldest" and "newest" below mean first and last
// in that order.
// One step (schedule()):
//   1. Running sequences, oldest first: each gets its next prefill chunk or its one decode token
//      (as much as the budget and max_chunk allow). When the KV pools cannot hold the new tokens,
//      the newest running sequence is preempted (blocks freed, back to its place in the waiting
//      queue, ahead of later arrivals of its priority; it will be recomputed — prefix caching usually makes that cheap)
//      until they fit or the sequence itself was the newest.
//   2. If nobody was preempted, waiting sequences in order (the head blocks the
//      rest) while the budget, the cap on running sequences and the free blocks allow. A sequence
//      is admitted when the full pool can hold all its current tokens and the sliding pool its
//      first chunk; it reuses what the prefix cache has (unless it scores its prompt). One whose
//      next prompt blocks a running sequence is still computing (the same prefix) is passed over
//      until they are in the prefix cache (SchedulerConfig::min_shared_prefix_tokens).
// Prefill chunks and decode tokens mix freely in one step; a sequence samples when its scheduled
// tokens reach the end of what it has (the last chunk of a prefill, or a decode token).
// Speculative drafts (Sequence::num_draft) are scheduled whole or not at all: a sequence whose
// drafts do not fit the budget, the chunk limit or the free blocks loses them (before anyone is
// preempted for them) and decodes its one token; a preempted sequence loses them too.
#pragma once

#include <deque>
#include <span>
#include <vector>

#include "runtime/kv_cache.h"
#include "runtime/sequence.h"

namespace gptoss::runtime {

struct SchedulerConfig {
    int max_num_seqs = 256;            // cap on running sequences
    int max_num_batched_tokens = 512;  // token budget of one step
    // Tokens of sequences with score_prompt one step may feed (each is a logits row for the host:
    // vocab_size floats), within the step's budget.
    int max_scored_tokens = 256;
    // A waiting sequence whose next prompt blocks a running sequence is still to compute (the same prefix: the
    // other choices of an n > 1 request, a shared system prompt) waits until they reach the prefix cache, when
    // that saves it at least this many tokens (0: never waits; GPTOSS_SHARED_PREFIX_WAIT=N sets it for an Engine).
    // One step's wait for several hundred tokens of prefill a copy.
    int min_shared_prefix_tokens = 256;
};

struct ScheduledSequence {
    Sequence* seq = nullptr;
    int start_pos = 0;       // = seq->num_computed when scheduled
    int num_new_tokens = 0;  // tokens [start_pos, start_pos + num_new_tokens) go through the model
    bool sample = false;     // these reach the sequence's last token: sample the next one
    int num_draft = 0;       // of them, speculative drafts at the end (sample is then true)
};

struct SchedulerOutput {
    std::vector<ScheduledSequence> seqs;  // running order (oldest first)
    int num_tokens = 0;
    std::vector<Sequence*> preempted;  // this step
    bool empty() const { return seqs.empty(); }
};

class Scheduler {
public:
    Scheduler(const SchedulerConfig& config, KvCacheManager* kv);

    // A new sequence joins the waiting queue.
    void add(Sequence* seq);
    // Finished or cancelled: leaves whichever queue it is in and frees its blocks.
    void remove(Sequence* seq);

    SchedulerOutput schedule();
    // After the forward of `out`: advances num_computed, indexes complete blocks, slides windows.
    // rejected[i] (empty: none): drafts of out.seqs[i] the model did not keep; the caller has already
    // removed them from the sequence's tokens. Their KV stays in the blocks, to be overwritten.
    void on_step_done(const SchedulerOutput& out, std::span<const int> rejected = {});
    // Running sequences, oldest first (the engine proposes drafts for them before schedule()).
    const std::vector<Sequence*>& running() const { return running_; }

    bool has_work() const { return !waiting_.empty() || !running_.empty(); }
    int num_waiting() const { return static_cast<int>(waiting_.size()); }
    int num_running() const { return static_cast<int>(running_.size()); }
    int64_t num_preemptions() const { return num_preemptions_; }
    int64_t num_cached_prompt_tokens() const { return num_cached_prompt_tokens_; }
    int64_t num_shared_prefix_waits() const { return num_shared_prefix_waits_; }
    int max_chunk_tokens() const { return max_chunk_; }

private:
    void preempt(Sequence* seq);
    void insert_waiting(Sequence* seq);
    // Whether `seq` (waiting; `matched` tokens found in the prefix cache) should wait for a running sequence
    // that is computing its next prompt blocks.
    bool waits_for_shared_prefix(const Sequence& seq, int matched) const;

    SchedulerConfig config_;
    KvCacheManager* kv_;
    int max_chunk_;
    std::deque<Sequence*> waiting_;   // by id (arrival order)
    std::vector<Sequence*> running_;  // by id
    int64_t num_preemptions_ = 0;
    int64_t num_cached_prompt_tokens_ = 0;  // reused from the prefix cache at admissions
    int64_t num_shared_prefix_waits_ = 0;   // steps a waiting sequence was passed over for a shared prefix
};

}  // namespace gptoss::runtime
