// Status and Result<T>: how every fallible deltacast function reports failure (the
// public API and the internals alike).
//
// A Status is an error code plus a human-readable message that names the problem
// (which file, which field, which value). Result<T> holds either a T or a non-OK
// Status, shaped like std::expected. No exceptions cross a module boundary.
//
// Thread safety: values; safe to copy between threads.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace deltacast {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something unusable (bad flag, bad config)
  kNotFound,            // a named file, tensor or node does not exist
  kCorrupt,             // data from disk or the network failed validation
  kVersionMismatch,     // a delta does not apply to this store's version
  kFailedPrecondition,  // the store or system is in the wrong state for this call
  kIoError,             // the operating system refused a read, write, mmap or fsync
  kUnsupported,         // valid, but this build or backend cannot do it
  kResourceExhausted,   // a size or memory cap would be exceeded
  kUnavailable,         // a peer or service cannot be reached right now
  kTimeout,
  kAborted,
  kInternal,          // a bug in deltacast
  kPermissionDenied,  // a peer failed authentication, or is not allowed to do this
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
  static Status VersionMismatch(std::string m) {
    return {StatusCode::kVersionMismatch, std::move(m)};
  }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  // An IoError whose message ends with strerror(errno_value).
  static Status FromErrno(int errno_value, std::string_view what);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CORRUPT: chunk 3: payload checksum mismatch" or "OK".
  std::string ToString() const;

  // Prepends context: "while reading x: <message>". Keeps the code.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : data_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(data_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return ok(); }

  // The error; Status::Ok() when this holds a value.
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(data_); }

  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace deltacast
