// Early-return helpers for absl::Status; Abseil 20220623 ships none publicly.
#ifndef ATTNSERVE_CORE_BASE_STATUS_MACROS_H_
#define ATTNSERVE_CORE_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function when
// it is not OK.
#define ATTN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status attn_status_ = (expr);        \
    if (!attn_status_.ok()) return attn_status_; \
  } while (false)

#define ATTN_STATUS_CONCAT_INNER_(a, b) a##b
#define ATTN_STATUS_CONCAT_(a, b) ATTN_STATUS_CONCAT_INNER_(a, b)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status when not OK, else moves
// the value into `lhs` (a declaration such as `auto x` or an existing lvalue).
#define ATTN_ASSIGN_OR_RETURN(lhs, rexpr) \
  ATTN_ASSIGN_OR_RETURN_IMPL_(ATTN_STATUS_CONCAT_(attn_statusor_, __LINE__), lhs, rexpr)

#define ATTN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)  \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // ATTNSERVE_CORE_BASE_STATUS_MACROS_H_
