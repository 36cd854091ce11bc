// Where ferryd serves its metrics (DaemonConfig.metrics_listen): "127.0.0.1:9464",
// "[::1]:9464", "localhost:9464" or "unix:/run/ferry/metrics.sock". Parsed and checked
// once, at config load, so a bad or unsafe address stops ferryd from starting.
//
//   FERRY_ASSIGN_OR_RETURN(MetricsAddress address, ParseMetricsAddress("127.0.0.1:9464"));
//   if (!address.loopback && !allow_non_loopback) ... refuse ...
#ifndef FERRY_SERVER_METRICS_METRICS_ADDRESS_H_
#define FERRY_SERVER_METRICS_METRICS_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace ferry {

struct MetricsAddress {
  bool unix_socket = false;
  std::string path;  // unix_socket: absolute path of the socket
  std::string host;  // TCP: a numeric IPv4 or IPv6 address, without brackets
  int port = 0;      // TCP: 0 = any free port
  // A Unix socket, or a TCP address that only this machine can reach (127.0.0.0/8, ::1).
  bool loopback = false;
};

// INVALID_ARGUMENT naming `text` and the accepted forms for anything else (a host name other
// than localhost, a missing or out-of-range port, a relative socket path).
absl::StatusOr<MetricsAddress> ParseMetricsAddress(const std::string& text);

// "127.0.0.1:9464", "[::1]:9464", "unix:/run/ferry/metrics.sock".
std::string FormatMetricsAddress(const MetricsAddress& address);

}  // namespace ferry

#endif  // FERRY_SERVER_METRICS_METRICS_ADDRESS_H_
