#include "cli/speculative_flags.h"

#include <nlohmann/json.hpp>

namespace gptoss::cli {

void add_speculative_flags(CLI::App* sub, SpeculativeFlags* f) {
    f->tokens_opt = sub->add_option("--speculative-tokens", f->config.num_tokens,
                                    "N-gram speculative decoding: drafts a step per sequence (0 = off)")
                        ->capture_default_str();
    f->tuning_opts[0] =
        sub->add_option("--ngram-min", f->config.ngram_min, "Shortest context suffix the drafter matches")
            ->capture_default_str();
    f->tuning_opts[1] =
        sub->add_option("--ngram-max", f->config.ngram_max, "Longest context suffix the drafter matches")
            ->capture_default_str();
    f->tuning_opts[2] = sub->add_option("--speculative-max-running", f->config.max_running,
                                        "Draft only while at most this many sequences run (0 = always)")
                            ->capture_default_str();
    f->tuning_opts[3] =
        sub->add_option("--speculative-max-backoff", f->config.max_backoff,
                        "Steps a sequence waits after drafts all rejected, doubling up to this (0 = never wait)")
            ->capture_default_str();
    f->config_opt =
        sub->add_option("--speculative-config", f->config_json,
                        "vLLM's form: '{\"method\":\"ngram\",\"num_speculative_tokens\":4,\"prompt_lookup_max\":4}'");
}

StatusOr<runtime::SpeculativeConfig> resolve_speculative_flags(const SpeculativeFlags& f) {
    runtime::SpeculativeConfig c = f.config;
    // A flag that tunes speculation without any that turns it on does nothing: said rather than ignored. An explicit
    // --speculative-tokens 0 (off, e.g. a sweep's baseline) keeps the others quiet.
    if (f.config_opt != nullptr && f.config_opt->count() > 0 && f.config_json.empty())
        return invalid_argument("--speculative-config: empty (give a JSON object, or leave the flag out)");
    if (f.config_json.empty() && f.tokens_opt != nullptr && f.tokens_opt->count() == 0) {
        for (CLI::Option* o : f.tuning_opts)
            if (o != nullptr && o->count() > 0)
                return invalid_argument(o->get_name() + " has no effect without --speculative-tokens N or " +
                                        "--speculative-config");
    }
    if (!f.config_json.empty()) {
        const runtime::SpeculativeConfig defaults;
        if (c.num_tokens != defaults.num_tokens || c.ngram_min != defaults.ngram_min ||
            c.ngram_max != defaults.ngram_max)
            return invalid_argument(
                "give --speculative-config or --speculative-tokens / --ngram-min / --ngram-max, "
                "not both");
        const nlohmann::json j = nlohmann::json::parse(f.config_json, nullptr, false);
        if (j.is_discarded() || !j.is_object()) return invalid_argument("--speculative-config is not a JSON object");
        auto get_int = [&](const char* key, int* out) -> Status {
            if (!j.contains(key)) return ok_status();
            const nlohmann::json& v = j[key];
            if (!v.is_number_integer())
                return invalid_argument(std::string("--speculative-config: ") + key + " must be an integer");
            const int64_t x = v.get<int64_t>();
            if (x < -1000000 || x > 1000000)
                return invalid_argument(std::string("--speculative-config: ") + key + " is out of range");
            *out = static_cast<int>(x);
            return ok_status();
        };
        for (auto it = j.begin(); it != j.end(); ++it) {
            const std::string& k = it.key();
            if (k != "method" && k != "num_speculative_tokens" && k != "prompt_lookup_max" &&
                k != "prompt_lookup_min" && k != "disable_by_batch_size")
                return invalid_argument("--speculative-config: unsupported key '" + k +
                                        "' (this server drafts by n-gram lookup only)");
        }
        if (!j.contains("method") || !j["method"].is_string() ||
            (j["method"] != "ngram" && j["method"] != "[ngram]"))  // vLLM accepts both spellings
            return invalid_argument("--speculative-config: method must be \"ngram\" (no draft models here)");
        if (!j.contains("num_speculative_tokens"))
            return invalid_argument("--speculative-config: num_speculative_tokens is required");
        RETURN_IF_ERROR(get_int("num_speculative_tokens", &c.num_tokens));
        // vLLM's defaults: both absent 5 and 5; one absent equals the other.
        const bool has_max = j.contains("prompt_lookup_max"), has_min = j.contains("prompt_lookup_min");
        c.ngram_min = c.ngram_max = 5;
        RETURN_IF_ERROR(get_int("prompt_lookup_max", &c.ngram_max));
        RETURN_IF_ERROR(get_int("prompt_lookup_min", &c.ngram_min));
        if (has_max && !has_min) c.ngram_min = c.ngram_max;
        if (has_min && !has_max) c.ngram_max = c.ngram_min;
        if (j.contains("disable_by_batch_size")) {
            int d = 0;
            RETURN_IF_ERROR(get_int("disable_by_batch_size", &d));
            // 1 would mean "off at every batch" but max-running 0 is "always": vLLM refuses it too (> 1).
            if (d < 2) return invalid_argument("--speculative-config: disable_by_batch_size must be >= 2");
            c.max_running = d - 1;  // vLLM: off once the batch reaches this size
        }
    }
    if (Status st = runtime::validate_speculative_config(c); !st.ok())
        return invalid_argument("speculative decoding: " + st.message());
    return c;
}

}  // namespace gptoss::cli
