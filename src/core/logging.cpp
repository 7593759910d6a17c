#include "core/logging.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace gptoss {
namespace {

LogLevel level_from_env() {
    const char* env = std::getenv("GPTOSS_LOG_LEVEL");
    if (env == nullptr) return LogLevel::kInfo;
    if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
    if (std::strcmp(env, "warn") == 0) return LogLevel::kWarn;
    if (std::strcmp(env, "error") == 0) return LogLevel::kError;
    return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
    static std::atomic<int> level{static_cast<int>(level_from_env())};
    return level;
}

const char* level_tag(LogLevel level) {
    switch (level) {
        case LogLevel::kDebug: return "D";
        case LogLevel::kInfo: return "I";
        case LogLevel::kWarn: return "W";
        case LogLevel::kError: return "E";
    }
    return "?";
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }
void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

void log_message(LogLevel level, const char* fmt, ...) {
    if (static_cast<int>(level) < level_storage().load()) return;
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    std::fprintf(stderr, "[%s] ", level_tag(level));
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
}

}  // namespace gptoss
