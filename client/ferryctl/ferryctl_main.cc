// ferryctl: look at a running ferryd.
//
//   ferryctl [--address PATH] [--json] status     daemon, NUMA nodes, memory, jobs
//   ferryctl [--address PATH] [--json] jobs       your jobs with rates and errors
//   ferryctl [--address PATH] [--json] job <id>   one job with a per-rank table
//
// Exit status: 0 on success, 1 when ferryd reports an error or cannot be reached, 2 on a
// usage error. Errors go to stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/ferryctl/format.h"
#include "ferry/client.h"

namespace {

constexpr char kUsage[] =
    "usage: ferryctl [--address PATH] [--json] <command>\n"
    "commands:\n"
    "  status     the daemon (version, uptime, NUMA nodes, memory) and your jobs\n"
    "  jobs       your jobs: dataset, batch size, ranks attached, rates, errors\n"
    "  job <id>   one job with a per-rank table and recent sample errors\n"
    "options:\n"
    "  --address PATH  ferryd's socket (default: $FERRY_ADDRESS, else the default socket)\n"
    "  --json          print the proto3 JSON of the answer instead of tables\n";

int UsageError(const std::string& message) {
  fprintf(stderr, "ferryctl: %s\n%s", message.c_str(), kUsage);
  return 2;
}

int Fail(const absl::Status& status) {
  fprintf(stderr, "ferryctl: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  if (const char* env = getenv("FERRY_ADDRESS"); env != nullptr) address = env;
  bool json = false;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--address") {
      if (i + 1 >= argc) return UsageError("--address needs a value");
      address = argv[++i];
    } else if (arg.rfind("--address=", 0) == 0) {
      address = arg.substr(10);
    } else if (arg.rfind("--", 0) == 0) {
      return UsageError("unknown option '" + arg + "'");
    } else {
      args.push_back(arg);
    }
  }
  if (args.empty()) return UsageError("no command given");
  const std::string& command = args[0];
  const size_t want_args = command == "job" ? 2 : 1;
  if (command != "status" && command != "jobs" && command != "job") {
    return UsageError("unknown command '" + command + "'");
  }
  if (args.size() != want_args) {
    return UsageError(command == "job" ? "job needs exactly one job id"
                                       : command + " takes no arguments");
  }

  auto client = ferry::Client::Connect(address);
  if (!client.ok()) return Fail(client.status());

  std::string out;
  if (command == "job") {
    if (json) {
      auto answer = (*client)->GetJobJson(args[1]);
      if (!answer.ok()) return Fail(answer.status());
      out = *answer + "\n";
    } else {
      auto answer = (*client)->GetJob(args[1]);
      if (!answer.ok()) return Fail(answer.status());
      out = ferry::ctl::RenderJob(*answer);
    }
  } else if (json) {
    auto answer = command == "jobs" ? (*client)->ListJobsJson() : (*client)->GetStatusJson();
    if (!answer.ok()) return Fail(answer.status());
    out = *answer + "\n";
  } else {
    auto answer = (*client)->GetStatus();
    if (!answer.ok()) return Fail(answer.status());
    out = command == "jobs" ? ferry::ctl::RenderJobs(*answer) : ferry::ctl::RenderStatus(*answer);
  }
  fputs(out.c_str(), stdout);
  return 0;
}
