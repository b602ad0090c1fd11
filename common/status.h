// The public Status and Result<T> (deltacast/status.h), and the macros the
// implementation uses to pass errors on. Not installed.
#pragma once

#include "deltacast/status.h"

#define DELTACAST_CONCAT_INNER(a, b) a##b
#define DELTACAST_CONCAT(a, b) DELTACAST_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::deltacast::Status _dc_status = (expr); \
    if (!_dc_status.ok()) return _dc_status; \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  DELTACAST_ASSIGN_OR_RETURN_IMPL(DELTACAST_CONCAT(_dc_result_, __LINE__), lhs, expr)
#define DELTACAST_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
