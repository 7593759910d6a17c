#include <unistd.h>

#include "cli/cli_util.h"

#include <charconv>
#include <cmath>

#include "model/synthetic_weights.h"
#include "runtime/sampler.h"

namespace gptoss::cli {

StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text, const char* what) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i <= text.size()) {
        size_t j = text.find(',', i);
        if (j == std::string::npos) j = text.size();
        std::string item = text.substr(i, j - i);
        size_t b = item.find_first_not_of(" \t");
        size_t e = item.find_last_not_of(" \t");
        if (b == std::string::npos) return invalid_argument("empty item in the list \"" + text + "\"");
        item = item.substr(b, e - b + 1);
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (ec != std::errc() || ptr != item.data() + item.size() || v < 0 || v > INT32_MAX) {
            return invalid_argument(std::string("not ") + what + ": \"" + item + "\"");
        }
        ids.push_back(static_cast<int32_t>(v));
        i = j + 1;
    }
    return ids;
}

StatusOr<bool> parse_kv_cache_dtype(const std::string& text) {
    if (text == "auto" || text == "bf16" || text == "bfloat16") return false;
    if (text == "fp8" || text == "fp8_e4m3") return true;
    return invalid_argument("--kv-cache-dtype '" + text + "': expected auto, bf16, fp8 or fp8_e4m3");
}

StatusOr<std::optional<uint64_t>> parse_seed(std::string_view text) {
    const char* end = text.data() + text.size();
    if (!text.empty() && text[0] == '-') {
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc() && ptr == end) return runtime::seed_from_signed(v);
    } else {
        uint64_t v = 0;
        auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec == std::errc() && ptr == end) return std::optional<uint64_t>(v);
    }
    return invalid_argument("seed \"" + std::string(text) +
                            "\": expected an integer in [-9223372036854775808, 18446744073709551615] (-1: random)");
}

std::string json_float(float v) {
    if (!std::isfinite(v)) return "null";
    char buf[32];
    auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    return std::string(buf, ptr);
}

size_t physical_memory_mib() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (static_cast<size_t>(pages) * static_cast<size_t>(page)) >> 20 : 0;
}

std::string synthetic_memory_error(const model::GptOssConfig& config, const std::string& preset) {
    const size_t ram_mib = physical_memory_mib();
    const uint64_t need_mib = model::synthetic_weight_bytes(config) >> 20;
    if (ram_mib == 0 || need_mib < ram_mib) return {};
    return "--synthetic " + preset + " builds its weights in host memory: " + std::to_string(need_mib) +
           " MiB, more than this machine's " + std::to_string(ram_mib) + " MiB";
}

}  // namespace gptoss::cli
