// One request as the scheduler and the KV cache see it: its tokens, how many of them have KV in the
// cache, and its block tables. Sampling and stop state live with the engine's request.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace gptoss::runtime {

enum class SequenceStatus {
    kWaiting,  // not admitted yet, or preempted (its blocks were freed; it will be recomputed)
    kRunning,  // holds blocks; gets a prefill chunk or a decode token each step it is scheduled
    kFinished,
};

struct Sequence {
    uint64_t id = 0;  // unique and increasing: the arrival order (FCFS)
    // vLLM's request priority (lower first): the scheduler's order is (priority, id), so all 0 is FCFS.
    int priority = 0;
    std::vector<int32_t> tokens;  // the prompt, then the generated tokens
    int num_prompt_tokens = 0;
    // Positions [0, num_computed) have KV in the cache; the next forward feeds tokens from here.
    int num_computed = 0;
    SequenceStatus status = SequenceStatus::kWaiting;

    // Logical block b holds positions [b·block_size, (b+1)·block_size); both tables have the same
    // length. Sliding-layer entries are -1 once every position in the block is older than the
    // window of the next token (KvCacheManager releases them as the window moves).
    std::vector<int32_t> block_table_full;
    std::vector<int32_t> block_table_sliding;
    int first_held_sliding = 0;          // sliding entries below this index are released (-1)
    std::vector<uint64_t> block_hashes;  // prefix hash of each complete block of `tokens` so far
    uint64_t cache_salt = 0;             // the first block's parent hash (cache_salt_hash of Request::cache_salt)
    int num_indexed_blocks = 0;          // leading blocks already offered to the prefix index

    // Speculative drafts at the end of `tokens` (runtime/speculative.h): fed with the last token in
    // one step and kept only as far as the model agrees; never part of the prompt or the output.
    int num_draft = 0;

    // The prompt's logprobs are still being computed (Request::prompt_logprobs): each of its chunks
    // returns a logits row a token, so it reuses no cached prefix and its chunks draw on the step's
    // SchedulerConfig::max_scored_tokens.
    bool score_prompt = false;

    int num_cached_tokens = -1;  // prompt tokens found in the prefix cache at first admission
    int num_preemptions = 0;

    int num_tokens() const { return static_cast<int>(tokens.size()); }
    int num_generated() const { return num_tokens() - num_prompt_tokens - num_draft; }  // drafts excluded
    std::span<const int32_t> prompt() const { return std::span(tokens).first(num_prompt_tokens); }
    std::span<const int32_t> output() const {  // the generated tokens, drafts excluded
        return std::span(tokens).subspan(num_prompt_tokens, static_cast<size_t>(num_generated()));
    }
    // Removes the drafts (a step that cannot take them all, a preemption).
    void drop_drafts() {
        tokens.resize(tokens.size() - static_cast<size_t>(num_draft));
        num_draft = 0;
    }
};

}  // namespace gptoss::runtime
