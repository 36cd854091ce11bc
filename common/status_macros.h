// Status propagation macros. Debian's abseil (20220623) has no RETURN_IF_ERROR, so ferry
// defines this one pair, used everywhere.
//
//   FERRY_RETURN_IF_ERROR(file.Open(path));
//   FERRY_ASSIGN_OR_RETURN(Slab slab, Slab::Create(bytes));
#ifndef FERRY_COMMON_STATUS_MACROS_H_
#define FERRY_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FERRY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status ferry_status_ = (expr);         \
    if (!ferry_status_.ok()) return ferry_status_; \
  } while (0)

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, expr)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)  \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // FERRY_COMMON_STATUS_MACROS_H_
