// ferryctl: look at a running ferryd.
//
//   ferryctl [--address PATH] [--json] status     daemon, NUMA nodes, memory, jobs
//   ferryctl [--address PATH] [--json] jobs       your jobs with rates and errors
//   ferryctl [--address PATH] [--json] job <id>   one job with a per-rank table
//   ferryctl [--address PATH] delete <id>...       delete jobs, freeing their memory
//   ferryctl [--address PATH] drain [--no-wait]    take no new work, exit when trainers are done
//
// Exit status: 0 on success, 1 when ferryd reports an error or cannot be reached, 2 on a
// usage error. Errors go to stderr.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ferryctl/format.h"
#include "ferry/client.h"

namespace {

constexpr char kUsage[] =
    "usage: ferryctl [--address PATH] [--json] <command>\n"
    "commands:\n"
    "  status     the daemon (version, uptime, NUMA nodes, memory) and your jobs\n"
    "  jobs       your jobs: dataset, batch size, ranks attached, rates, errors\n"
    "  job <id>   one job with a per-rank table and recent sample errors\n"
    "  delete <id>...  delete jobs: their consumers' streams end, their memory is freed\n"
    "  drain      ferryd takes no new jobs or attaches and exits once the trainers attached\n"
    "             now are done; waits for that unless --no-wait (root or ferryd's user)\n"
    "options:\n"
    "  --address PATH  ferryd's socket (default: $FERRY_ADDRESS, else the default socket)\n"
    "  --json          print the proto3 JSON of the answer instead of tables\n"
    "  --no-wait       drain: return once the drain has begun\n";

int UsageError(const std::string& message) {
  fprintf(stderr, "ferryctl: %s\n%s", message.c_str(), kUsage);
  return 2;
}

int Fail(const absl::Status& status) {
  fprintf(stderr, "ferryctl: %s\n", std::string(status.message()).c_str());
  return 1;
}

// Drains ferryd and, with `wait`, follows it until it has exited.
int Drain(ferry::Client& client, bool wait) {
  auto consumers = client.Drain();
  if (!consumers.ok()) return Fail(consumers.status());
  printf("ferryd (pid %d) is draining: %u consumer(s) attached; it exits when none is left\n",
         client.daemon_pid(), *consumers);
  fflush(stdout);
  if (!wait) return 0;
  uint32_t last = *consumers;
  for (;;) {
    absl::SleepFor(absl::Milliseconds(500));
    auto status = client.GetStatus();
    if (!status.ok()) {
      if (absl::IsUnavailable(status.status())) break;   // the daemon is gone
      if (absl::IsCancelled(status.status())) continue;  // it is stopping its server
      return Fail(status.status());
    }
    if (status->daemon.consumers != last) {
      last = status->daemon.consumers;
      printf("%u consumer(s) attached\n", last);
      fflush(stdout);
    }
  }
  printf("ferryd stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  if (const char* env = getenv("FERRY_ADDRESS"); env != nullptr) address = env;
  bool json = false;
  bool wait = true;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--no-wait") {
      wait = false;
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
  if (command != "status" && command != "jobs" && command != "job" && command != "delete" &&
      command != "drain") {
    return UsageError("unknown command '" + command + "'");
  }
  if (command == "delete") {
    if (args.size() < 2) return UsageError("delete needs one or more job ids");
  } else if (args.size() != (command == "job" ? 2u : 1u)) {
    return UsageError(command == "job" ? "job needs exactly one job id"
                                       : command + " takes no arguments");
  }

  auto client = ferry::Client::Connect(address);
  if (!client.ok()) return Fail(client.status());

  if (command == "drain") return Drain(**client, wait);
  if (command == "delete") {
    int failed = 0;
    for (size_t i = 1; i < args.size(); ++i) {
      absl::Status deleted = (*client)->DeleteJob(args[i]);
      if (deleted.ok()) {
        printf("deleted %s\n", args[i].c_str());
      } else {
        Fail(deleted);
        failed = 1;
      }
    }
    return failed;
  }

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
