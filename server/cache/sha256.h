// SHA-256 (OpenSSL's libcrypto) as lower-case hex: the names of cache entries, and the
// hashes AWS Signature Version 4 signs (server/remote/sigv4.cc).
//
//   std::string name = Sha256Hex(key.Canonical());  // 64 hex digits
//
// Pure functions; thread-safe.
#ifndef FERRY_SERVER_CACHE_SHA256_H_
#define FERRY_SERVER_CACHE_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

// `bytes` as lower-case hex, two digits a byte.
std::string LowerHex(absl::string_view bytes);

// The SHA-256 of `text`, as LowerHex.
std::string Sha256Hex(absl::string_view text);

}  // namespace ferry

#endif  // FERRY_SERVER_CACHE_SHA256_H_
