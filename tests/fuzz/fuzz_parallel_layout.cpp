// Fuzz target: `--layout` text. Parsing must never crash or throw, and whatever parses must pass
// validation, survive the rank arithmetic and the shard plan for both gpt-oss presets (accepted or
// refused with a Status).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/gpt_oss_config.h"
#include "model/weight_shard.h"
#include "parallel/world.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    auto p = gptoss::parallel::ParallelConfig::parse(text);
    if (!p.ok()) return 0;
    if (!p->validate().ok() || p->world_size() < 1 || p->world_size() > 1024) __builtin_trap();
    static const auto c20 = *gptoss::model::GptOssConfig::preset("gpt-oss-20b");
    static const auto c120 = *gptoss::model::GptOssConfig::preset("gpt-oss-120b");
    for (const auto* c : {&c20, &c120}) {
        if (!gptoss::model::check_parallel_config(*c, *p).ok()) continue;
        for (int r = 0; r < p->world_size(); r += std::max(1, p->world_size() / 7)) {
            auto s = gptoss::model::plan_shard(*c, *p, r);
            if (!s.ok() || s->num_q_heads <= 0 || s->num_kv_heads <= 0 || s->inter_size < 0) __builtin_trap();
        }
    }
    return 0;
}
