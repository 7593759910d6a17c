// The speculative-decoding flags of `serve` and `generate` (runtime/speculative.h): either the
// plain flags or vLLM's --speculative-config JSON ({"method": "ngram", "num_speculative_tokens": K,
// "prompt_lookup_max": N, "prompt_lookup_min": M}); giving both is an error.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "runtime/speculative.h"

namespace gptoss::cli {

struct SpeculativeFlags {
    runtime::SpeculativeConfig config;
    std::string config_json;  // --speculative-config
    // The options as parsed (add_speculative_flags), to tell a flag given from its default; null in flags built by
    // hand (tests): every value then counts as given.
    CLI::Option *tokens_opt = nullptr, *tuning_opts[4] = {}, *config_opt = nullptr;
};

void add_speculative_flags(CLI::App* sub, SpeculativeFlags* flags);

// The validated configuration (a clear error for bad values, unknown methods or keys).
StatusOr<runtime::SpeculativeConfig> resolve_speculative_flags(const SpeculativeFlags& flags);

}  // namespace gptoss::cli
