// Loading ferryd's configuration (ferry.v1.DaemonConfig in protobuf text format) and filling
// in the built-in defaults, so ferryd runs with no file at all.
#ifndef FERRY_SERVER_SERVICE_CONFIG_H_
#define FERRY_SERVER_SERVICE_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/config.pb.h"

namespace ferry {

inline constexpr char kDefaultConfigPath[] = "/etc/ferry/ferryd.conf";
// Most streams a GPU rank's page-cache gather may take in turn (gather_streams).
inline constexpr uint32_t kMaxGatherStreams = 16;

struct LoadedConfig {
  ferry::v1::DaemonConfig config;  // every default filled in
  std::string path;                // the file read, or where it would have been
  bool from_file = false;
};

// The file ferryd reads when --config names none: kDefaultConfigPath for the system daemon
// (no --listen, running as root or as the `ferry` user), and none ("") for every other
// ferryd, so that an installed package never changes a private daemon's settings.
std::string ImplicitConfigPath(bool listen_given, unsigned euid);

// Reads `path` if given (it must then exist), else `implicit_path` if it is given and
// exists, else only defaults. INVALID_ARGUMENT with the parser's line and column for a
// malformed file, or naming the setting whose value is out of range.
absl::StatusOr<LoadedConfig> LoadConfig(const std::string& path,
                                        const std::string& implicit_path = "");

// Fills every unset field of `config` with its default (see config.proto).
void ApplyDefaults(ferry::v1::DaemonConfig* config);

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_CONFIG_H_
