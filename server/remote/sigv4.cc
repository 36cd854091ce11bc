#include "server/remote/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/cache/sha256.h"

namespace ferry {
namespace {

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

// Header values as SigV4 canonicalizes them: leading and trailing spaces trimmed, inner runs
// of spaces made one.
std::string TrimValue(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  std::string out;
  bool space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string UriEncode(absl::string_view text, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

void SignV4(const SigV4Request& request, const AwsCredentials& credentials, absl::Time now,
            std::vector<Header>* headers) {
  const std::string datetime = absl::FormatTime("%Y%m%dT%H%M%SZ", now, absl::UTCTimeZone());
  const std::string date = datetime.substr(0, 8);
  std::string payload_hash = kEmptyPayloadSha256;
  bool has_payload_hash = false;
  for (Header& h : *headers) {
    h.first = absl::AsciiStrToLower(h.first);
    if (h.first == "x-amz-content-sha256") {
      has_payload_hash = true;
      payload_hash = h.second;
    }
  }
  if (!has_payload_hash) headers->push_back({"x-amz-content-sha256", payload_hash});
  headers->push_back({"x-amz-date", datetime});
  if (!credentials.session_token.empty()) {
    headers->push_back({"x-amz-security-token", credentials.session_token});
  }
  std::vector<Header> sorted = *headers;
  std::sort(sorted.begin(), sorted.end());
  std::string canonical_headers, signed_headers;
  for (const Header& h : sorted) {
    absl::StrAppend(&canonical_headers, h.first, ":", TrimValue(h.second), "\n");
    absl::StrAppend(&signed_headers, signed_headers.empty() ? "" : ";", h.first);
  }
  const std::string canonical_request =
      absl::StrCat(request.method, "\n", request.path, "\n", request.query, "\n", canonical_headers,
                   "\n", signed_headers, "\n", payload_hash);
  const std::string scope =
      absl::StrCat(date, "/", request.region, "/", request.service, "/aws4_request");
  const std::string string_to_sign =
      absl::StrCat("AWS4-HMAC-SHA256\n", datetime, "\n", scope, "\n", Sha256Hex(canonical_request));
  std::string key = HmacSha256(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = HmacSha256(key, request.region);
  key = HmacSha256(key, request.service);
  key = HmacSha256(key, "aws4_request");
  const std::string signature = HmacSha256(key, string_to_sign);
  headers->push_back(
      {"authorization",
       absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key_id, "/", scope,
                    ",SignedHeaders=", signed_headers, ",Signature=", LowerHex(signature))});
}

}  // namespace ferry
