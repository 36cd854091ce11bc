#include "server/metrics/metrics_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

absl::Status Invalid(const std::string& text, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("metrics_listen '", text.substr(0, 256), "' ", why,
                   "; write HOST:PORT with a numeric address (127.0.0.1:9464, [::1]:9464), "
                   "localhost:PORT, or unix:/ABSOLUTE/PATH"));
}

}  // namespace

absl::StatusOr<MetricsAddress> ParseMetricsAddress(const std::string& text) {
  MetricsAddress address;
  if (absl::StartsWith(text, "unix:")) {
    address.unix_socket = true;
    address.loopback = true;
    address.path = text.substr(5);
    if (address.path.empty() || address.path[0] != '/') {
      return Invalid(text, "names no absolute socket path");
    }
    if (address.path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return Invalid(text, absl::StrCat("has a socket path longer than ",
                                        sizeof(sockaddr_un{}.sun_path) - 1, " bytes"));
    }
    return address;
  }
  std::string port;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find("]:");
    if (close == std::string::npos) return Invalid(text, "has no ']:PORT' after its IPv6 address");
    address.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) return Invalid(text, "has no port");
    address.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (address.host.find(':') != std::string::npos) {
      return Invalid(text, "is an IPv6 address without brackets");
    }
  }
  if (!absl::SimpleAtoi(port, &address.port) || address.port < 0 || address.port > 65535) {
    return Invalid(text, "has no port number from 0 to 65535");
  }
  if (address.host == "localhost") address.host = "127.0.0.1";
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, address.host.c_str(), &v4) == 1) {
    address.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else if (inet_pton(AF_INET6, address.host.c_str(), &v6) == 1) {
    address.loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  } else {
    return Invalid(text,
                   "has no numeric IP address (host names other than localhost are not "
                   "resolved)");
  }
  return address;
}

std::string FormatMetricsAddress(const MetricsAddress& address) {
  if (address.unix_socket) return absl::StrCat("unix:", address.path);
  if (address.host.find(':') != std::string::npos) {
    return absl::StrCat("[", address.host, "]:", address.port);
  }
  return absl::StrCat(address.host, ":", address.port);
}

}  // namespace ferry
