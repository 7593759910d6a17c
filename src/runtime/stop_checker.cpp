#include "runtime/stop_checker.h"

#include <algorithm>

namespace gptoss::runtime {

const char* finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::kStop: return "stop";
        case FinishReason::kLength: return "length";
        case FinishReason::kCancelled: return "cancelled";
        case FinishReason::kError: return "error";
    }
    return "?";
}

StopChecker::StopChecker(std::vector<int32_t> stop_ids, std::vector<std::string> stop_strings, int max_tokens,
                         const Detokenizer* detokenizer, int min_tokens)
    : stop_ids_(std::move(stop_ids)),
      stop_strings_(std::move(stop_strings)),
      max_tokens_(max_tokens),
      detokenizer_(detokenizer),
      min_tokens_(min_tokens) {
    for (const std::string& s : stop_strings_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

std::optional<StopResult> StopChecker::push(int32_t id, int num_generated) {
    // A stop id ends it even within min_tokens: the engine masks them there, so one drawn anyway is the end a
    // constraint left as the only choice. Stop strings wait.
    const bool armed = num_generated > min_tokens_;
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
        StopResult r;
        r.stop_id = id;
        return r;
    }
    if (!stop_strings_.empty() && detokenizer_ && *detokenizer_) {
        const std::string piece = (*detokenizer_)(std::span<const int32_t>(&id, 1));
        // Only a match ending inside the new bytes is new: search from where such a match starts.
        const size_t old_len = tail_.size();
        tail_ += piece;
        std::optional<StopResult> best;
        size_t best_pos = 0;
        for (size_t i = 0; armed && i < stop_strings_.size(); ++i) {
            const std::string& s = stop_strings_[i];
            if (s.empty()) continue;
            const size_t from = old_len >= s.size() - 1 ? old_len - (s.size() - 1) : 0;
            const size_t pos = tail_.find(s, from);
            if (pos == std::string::npos) continue;
            if (!best || pos < best_pos) {  // earliest match wins; ties to the first listed
                best_pos = pos;
                best = StopResult{};
                best->stop_string_index = static_cast<int>(i);
                best->trim_bytes = static_cast<int>(tail_.size() - pos);
            }
        }
        if (best) return best;
        if (tail_.size() > max_stop_len_) tail_.erase(0, tail_.size() - (max_stop_len_ - 1));
    }
    if (num_generated >= max_tokens_) {
        StopResult r;
        r.reason = FinishReason::kLength;
        return r;
    }
    return std::nullopt;
}

}  // namespace gptoss::runtime
