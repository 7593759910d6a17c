// Status / StatusOr: the error tier for anything a user, a request, a config or a file can cause.
// Programmer and driver errors use the fatal macros in check.h instead.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "core/check.h"

namespace gptoss {

enum class StatusCode {
    kOk,
    kInvalidArgument,     // bad flag, bad request field, bad config value
    kNotFound,            // missing file, missing tensor
    kOutOfRange,          // prompt longer than the context, offsets past the end
    kDataLoss,            // truncated or corrupt file
    kFailedPrecondition,  // operation not valid in the current state
    kResourceExhausted,   // out of KV blocks, body too large
    kUnimplemented,       // a valid request we do not support
    kCancelled,
    kInternal,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok_status() { return Status(); }
    bool ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }
    // "invalid_argument: <message>"
    std::string to_string() const;
    // Returns a copy with "context: " prepended to the message.
    Status with_context(std::string_view context) const;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
public:
    StatusOr(Status status) : v_(std::move(status)) {  // NOLINT(implicit)
        ENGINE_CHECK(!std::get<Status>(v_).ok(), "StatusOr constructed from an OK status");
    }
    StatusOr(T value) : v_(std::move(value)) {}  // NOLINT(implicit)

    bool ok() const { return std::holds_alternative<T>(v_); }
    Status status() const { return ok() ? Status() : std::get<Status>(v_); }

    T& value() & {
        ENGINE_CHECK(ok(), "StatusOr::value() on error: %s", std::get<Status>(v_).to_string().c_str());
        return std::get<T>(v_);
    }
    const T& value() const& {
        ENGINE_CHECK(ok(), "StatusOr::value() on error: %s", std::get<Status>(v_).to_string().c_str());
        return std::get<T>(v_);
    }
    T&& value() && {
        ENGINE_CHECK(ok(), "StatusOr::value() on error: %s", std::get<Status>(v_).to_string().c_str());
        return std::get<T>(std::move(v_));
    }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

private:
    std::variant<Status, T> v_;
};

}  // namespace gptoss

#define GPTOSS_CONCAT_INNER_(a, b) a##b
#define GPTOSS_CONCAT_(a, b) GPTOSS_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)          \
    do {                               \
        ::gptoss::Status _st = (expr); \
        if (!_st.ok()) return _st;     \
    } while (0)

// `ASSIGN_OR_RETURN(auto x, f());` declares x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL_(GPTOSS_CONCAT_(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                         \
    if (!tmp.ok()) return tmp.status();        \
    lhs = std::move(tmp).value()
