#include "parallel/world.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>

namespace gptoss::parallel {

std::string ParallelConfig::to_string() const {
    return "EP" + std::to_string(ep) + "·DP" + std::to_string(dp) + "·TP" + std::to_string(tp);
}

Status ParallelConfig::validate() const {
    if (tp < 1 || dp < 1 || ep < 1) return invalid_argument("tp, dp and ep must be at least 1 (" + to_string() + ")");
    // Each factor first: tp · dp must not overflow before it is checked.
    if (tp > 1024 || dp > 1024 || ep > 1024 || static_cast<int64_t>(tp) * dp > 1024) {
        return invalid_argument(to_string() + ": at most 1024 ranks");
    }
    if (world_size() % ep != 0) {
        return invalid_argument("ep " + std::to_string(ep) +
                                " must divide the world size tp × dp = " + std::to_string(world_size()));
    }
    return ok_status();
}

StatusOr<ParallelConfig> ParallelConfig::parse(const std::string& text) {
    ParallelConfig c;
    std::string s;
    for (char ch : text) {
        if (ch == ' ') continue;
        s += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    // Accept "·" (UTF-8 C2 B7), ',' and '.' as separators, '=' optional: "tp=2,ep=4", "ep4·dp1·tp4".
    size_t i = 0;
    bool seen[3] = {false, false, false};
    bool separator_last = false;
    while (i < s.size()) {
        if (s[i] == ',' || s[i] == '.' || s[i] == '*' || s[i] == 'x' || static_cast<unsigned char>(s[i]) == 0xC2 ||
            static_cast<unsigned char>(s[i]) == 0xB7) {
            ++i;
            separator_last = true;
            continue;
        }
        separator_last = false;
        if (i + 2 > s.size()) return invalid_argument("cannot parse parallel layout '" + text + "'");
        const std::string key = s.substr(i, 2);
        int* slot = nullptr;
        int which = -1;
        if (key == "tp") slot = &c.tp, which = 0;
        if (key == "dp") slot = &c.dp, which = 1;
        if (key == "ep") slot = &c.ep, which = 2;
        if (!slot)
            return invalid_argument("unknown key at '" + s.substr(i, 16) + "' in parallel layout '" + text +
                                    "' (keys: tp, dp, ep)");
        if (seen[which]) return invalid_argument("'" + key + "' given twice in '" + text + "'");
        seen[which] = true;
        i += 2;
        if (i < s.size() && s[i] == '=') ++i;
        const char* begin = s.data() + i;
        const char* end = s.data() + s.size();
        int value = 0;
        auto [ptr, ec] = std::from_chars(begin, end, value);
        if (ec != std::errc() || ptr == begin) {
            return invalid_argument("expected a number after '" + key + "' in '" + text + "'");
        }
        *slot = value;
        i += static_cast<size_t>(ptr - begin);
    }
    if (separator_last) return invalid_argument("parallel layout '" + text + "' ends in a separator");
    RETURN_IF_ERROR(c.validate());
    return c;
}

RankLayout rank_layout(const ParallelConfig& c, int rank) {
    RankLayout r;
    r.rank = rank;
    r.tp_rank = rank % c.tp;
    r.dp_rank = rank / c.tp;
    r.ep_rank = rank / c.moe_tp();
    r.moe_tp_rank = rank % c.moe_tp();
    return r;
}

std::vector<int> tp_group_ranks(const ParallelConfig& c, int rank) {
    std::vector<int> g;
    const int base = (rank / c.tp) * c.tp;
    for (int i = 0; i < c.tp; ++i) g.push_back(base + i);
    return g;
}

std::vector<int> dp_group_ranks(const ParallelConfig& c, int rank) {
    std::vector<int> g;
    for (int i = 0; i < c.dp; ++i) g.push_back(i * c.tp + rank % c.tp);
    return g;
}

std::pair<int, int> ceil_split(int n, int parts, int index) {
    const int chunk = (n + parts - 1) / parts;
    const int begin = std::min(n, chunk * index);
    const int end = std::min(n, begin + chunk);
    return {begin, end};
}

std::vector<ParallelConfig> all_configs(int world_size) {
    std::vector<ParallelConfig> out;
    for (int tp = 1; tp <= world_size; tp *= 2) {
        if (world_size % tp != 0) continue;
        const int dp = world_size / tp;
        for (int ep = 1; ep <= world_size; ep *= 2) {
            if (world_size % ep != 0) continue;
            out.push_back({tp, dp, ep});
        }
    }
    return out;
}

}  // namespace gptoss::parallel
