// Minimal leveled logging to stderr. Level from GPTOSS_LOG_LEVEL (debug|info|warn|error), default info.
#pragma once

namespace gptoss {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace gptoss

#define LOG_DEBUG(...) ::gptoss::log_message(::gptoss::LogLevel::kDebug, __VA_ARGS__)
#define LOG_INFO(...) ::gptoss::log_message(::gptoss::LogLevel::kInfo, __VA_ARGS__)
#define LOG_WARN(...) ::gptoss::log_message(::gptoss::LogLevel::kWarn, __VA_ARGS__)
#define LOG_ERROR(...) ::gptoss::log_message(::gptoss::LogLevel::kError, __VA_ARGS__)
