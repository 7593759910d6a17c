#include "core/status.h"

#include <cstdarg>

namespace gptoss {

std::string_view status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "ok";
        case StatusCode::kInvalidArgument: return "invalid_argument";
        case StatusCode::kNotFound: return "not_found";
        case StatusCode::kOutOfRange: return "out_of_range";
        case StatusCode::kDataLoss: return "data_loss";
        case StatusCode::kFailedPrecondition: return "failed_precondition";
        case StatusCode::kResourceExhausted: return "resource_exhausted";
        case StatusCode::kUnimplemented: return "unimplemented";
        case StatusCode::kCancelled: return "cancelled";
        case StatusCode::kInternal: return "internal";
    }
    return "unknown";
}

std::string Status::to_string() const {
    if (ok()) return "ok";
    return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(std::string_view context) const {
    if (ok()) return *this;
    return Status(code_, std::string(context) + ": " + message_);
}

void fatal_error(const char* file, int line, const char* func, const char* cond, const char* fmt, ...) {
    std::fprintf(stderr, "FATAL %s:%d in %s: check failed: %s: ", file, line, func, cond);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::fflush(stderr);
    std::abort();
}

}  // namespace gptoss
