// Status and Result<T>: how every fallible xsilo call reports failure.
//
// No exception crosses the public API. A Status is cheap when OK (a null
// pointer) and carries a code and a human-readable message otherwise.
#pragma once

#include <cassert>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace xsilo {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed
  kNotFound,            // a key, object, peer or file does not exist
  kAlreadyExists,       // create of something that exists
  kCorrupt,             // data failed validation (bad frame, checksum mismatch)
  kTimeout,             // a deadline passed
  kUnavailable,         // peer or service unreachable; retrying may help
  kPermissionDenied,    // credentials were refused
  kUnauthenticated,     // no or invalid credentials were presented
  kResourceExhausted,   // a configured limit or memory ran out
  kCancelled,           // the operation was cancelled (e.g. transport stopped)
  kFailedPrecondition,  // called in the wrong state (e.g. before Start)
  kOutOfRange,          // an offset or range lies outside the object
  kUnimplemented,       // not supported by this backend
  kInternal,            // a bug or an unexpected library error
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;
  // The same code with "context: " prepended to the message.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status Unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T> holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK Status");
    if (std::get<Status>(v_).ok()) v_ = Internal("Result built from OK status without a value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? value() : std::move(fallback); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace xsilo

#define XSILO_CONCAT_INNER_(a, b) a##b
#define XSILO_CONCAT_(a, b) XSILO_CONCAT_INNER_(a, b)

#define XSILO_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::xsilo::Status _xsilo_st = (expr);    \
    if (!_xsilo_st.ok()) return _xsilo_st; \
  } while (0)

#define XSILO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// XSILO_ASSIGN_OR_RETURN(auto x, SomethingReturningResult());
#define XSILO_ASSIGN_OR_RETURN(lhs, expr) \
  XSILO_ASSIGN_OR_RETURN_IMPL_(XSILO_CONCAT_(_xsilo_r_, __LINE__), lhs, expr)
