// Fatal checks for programmer and driver errors only. Never use these on a path that user input
// (a request, a file, a flag) can reach: return a Status instead (status.h).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace gptoss {
[[noreturn]] void fatal_error(const char* file, int line, const char* func, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
}  // namespace gptoss

#define ENGINE_CHECK(cond, ...)                                                               \
    do {                                                                                      \
        if (!(cond)) ::gptoss::fatal_error(__FILE__, __LINE__, __func__, #cond, __VA_ARGS__); \
    } while (0)

#define ENGINE_UNREACHABLE(...) ::gptoss::fatal_error(__FILE__, __LINE__, __func__, "unreachable", __VA_ARGS__)
