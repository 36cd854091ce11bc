// ferryctl: look at a running ferryd.
//
//   ferryctl [--address PATH] [--json] status     daemon, NUMA nodes, memory, jobs
//   ferryctl [--address PATH] [--json] jobs       your jobs with rates and errors
//   ferryctl [--address PATH] [--json] job <id>   one job with a per-rank table
//   ferryctl [--address PATH] delete <id>...       delete jobs, freeing their memory
//   ferryctl [--address PATH] drain [--no-wait]    take no new work, exit when trainers are done
//   ferryctl [--address PATH] top [-n S] [--once]  live table of every rank, most stalled first
//   ferryctl [-n S | --watch] status|jobs|job <id> redraw every S seconds until q or Ctrl-C
//
// Exit status: 0 on success, 1 when ferryd reports an error or cannot be reached, 2 on a
// usage error. Errors go to stderr. Live views (top, -n/--watch on a terminal) keep retrying
// an unreachable ferryd and exit 0 on q or Ctrl-C, 128 + the signal on SIGTERM or SIGHUP.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/ferryctl/format.h"
#include "client/ferryctl/live.h"
#include "client/ferryctl/top.h"
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
    "  top        live table of every job's ranks (rate, stall %, limiting stage, queue,\n"
    "             memory), the most stalled first; q or Ctrl-C quits\n"
    "options:\n"
    "  --address PATH  ferryd's socket (default: $FERRY_ADDRESS, else the default socket)\n"
    "  --json          print the proto3 JSON of the answer instead of tables\n"
    "  --no-wait       drain: return once the drain has begun\n"
    "  -n SECONDS      top: refresh interval (default 1); status, jobs, job: redraw every\n"
    "                  SECONDS until q or Ctrl-C, like watch(1)\n"
    "  --watch         status, jobs, job: redraw every 2 s (or -n SECONDS)\n"
    "  --once          top: print one snapshot and exit (also when stdout is no terminal)\n";

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
    if (status->daemon().consumers() != last) {
      last = status->daemon().consumers();
      printf("%u consumer(s) attached\n", last);
      fflush(stdout);
    }
  }
  printf("ferryd stopped\n");
  return 0;
}

// The client, connected on first use and again after ferryd went away (a restarted ferryd
// is a new session; the old channel's reconnect backoff would hide it for minutes).
class Connection final {
 public:
  explicit Connection(std::string address) : address_(std::move(address)) {}

  // Runs `call` on the client; a transport failure drops the client for the next call.
  template <typename T>
  absl::StatusOr<T> Call(const std::function<absl::StatusOr<T>(ferry::Client&)>& call) {
    if (client_ == nullptr) {
      auto client = ferry::Client::Connect(address_);
      if (!client.ok()) return client.status();
      client_ = *std::move(client);
    }
    absl::StatusOr<T> answer = call(*client_);
    if (!answer.ok() &&
        (absl::IsUnavailable(answer.status()) || absl::IsCancelled(answer.status()) ||
         absl::IsDeadlineExceeded(answer.status()))) {
      client_.reset();
    }
    return answer;
  }

 private:
  const std::string address_;
  std::unique_ptr<ferry::Client> client_;
};

absl::StatusOr<ferry::v1::GetStatusResponse> FetchStatus(Connection& connection) {
  return connection.Call<ferry::v1::GetStatusResponse>(
      [](ferry::Client& client) { return client.GetStatus(); });
}

// `ferryctl top`: the daemon's answers, the previous one kept for ferryd's CPU use.
class TopView final : public ferry::ctl::LiveView {
 public:
  explicit TopView(Connection& connection) : connection_(connection) {}

  absl::Status Refresh() override {
    auto status = FetchStatus(connection_);
    if (!status.ok()) return status.status();
    previous_ = std::move(now_);
    now_ = *std::move(status);
    return absl::OkStatus();
  }

  std::string Render(ferry::ctl::ScreenSize size) const override {
    if (!now_.has_value()) return "";
    return ferry::ctl::RenderTop(*now_, previous_.has_value() ? &*previous_ : nullptr, size);
  }

 private:
  Connection& connection_;
  std::optional<ferry::v1::GetStatusResponse> now_;
  std::optional<ferry::v1::GetStatusResponse> previous_;
};

// --watch: the text a one-shot command prints, fetched again every interval.
class TextView final : public ferry::ctl::LiveView {
 public:
  using Fetch = std::function<absl::StatusOr<std::string>(ferry::Client&)>;
  TextView(Connection& connection, Fetch fetch)
      : connection_(connection), fetch_(std::move(fetch)) {}

  absl::Status Refresh() override {
    auto text = connection_.Call<std::string>(fetch_);
    if (!text.ok()) return text.status();
    text_ = *std::move(text);
    return absl::OkStatus();
  }

  std::string Render(ferry::ctl::ScreenSize size) const override {
    return ferry::ctl::FitToScreen(text_, size);
  }

 private:
  Connection& connection_;
  const Fetch fetch_;
  std::string text_;
};

// What `command` prints once (status, jobs, job <id>, as tables or --json).
TextView::Fetch OneShot(const std::vector<std::string>& args, bool json) {
  const std::string command = args[0];
  if (command == "job") {
    const std::string id = args[1];
    if (json) {
      return [id](ferry::Client& c) -> absl::StatusOr<std::string> {
        auto answer = c.GetJobJson(id);
        if (!answer.ok()) return answer.status();
        return *answer + "\n";
      };
    }
    return [id](ferry::Client& c) -> absl::StatusOr<std::string> {
      auto answer = c.GetJob(id);
      if (!answer.ok()) return answer.status();
      return ferry::ctl::RenderJob(*answer);
    };
  }
  if (json) {
    return [command](ferry::Client& c) -> absl::StatusOr<std::string> {
      auto answer = command == "jobs" ? c.ListJobsJson() : c.GetStatusJson();
      if (!answer.ok()) return answer.status();
      return *answer + "\n";
    };
  }
  return [command](ferry::Client& c) -> absl::StatusOr<std::string> {
    auto answer = c.GetStatus();
    if (!answer.ok()) return answer.status();
    return command == "jobs" ? ferry::ctl::RenderJobs(*answer) : ferry::ctl::RenderStatus(*answer);
  };
}

// stdout's width when it is a terminal, else 0 (unlimited: a file or a pipe gets whole rows).
int OutputWidth() {
  struct winsize ws = {};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) return ws.ws_col;
  return 0;
}

// Parses -n's value: seconds, at least 0.1.
bool ParseInterval(const std::string& text, absl::Duration* interval) {
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !(seconds >= 0.1) || seconds > 86400) return false;
  *interval = absl::Seconds(seconds);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  if (const char* env = getenv("FERRY_ADDRESS"); env != nullptr) address = env;
  bool json = false;
  bool wait = true;
  bool watch = false;
  bool once = false;
  bool interval_given = false;
  absl::Duration interval = absl::Seconds(1);
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
    } else if (arg == "--watch") {
      watch = true;
    } else if (arg == "--once") {
      once = true;
    } else if (arg == "-n" || arg == "--interval") {
      if (i + 1 >= argc) return UsageError(arg + " needs a value (seconds)");
      if (!ParseInterval(argv[++i], &interval)) {
        return UsageError(absl::StrCat(arg, " '", argv[i], "': want seconds, 0.1 to 86400"));
      }
      interval_given = true;
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
      command != "drain" && command != "top") {
    return UsageError("unknown command '" + command + "'");
  }
  const bool read_only = command == "status" || command == "jobs" || command == "job";
  if ((watch || interval_given) && !read_only && command != "top") {
    return UsageError("-n and --watch are for top, status, jobs and job, not " + command);
  }
  if (once && command != "top") return UsageError("--once is for top");
  if (command == "top" && json) return UsageError("top has no --json; use --json status");
  if (watch && !interval_given) interval = absl::Seconds(2);
  if (command == "delete") {
    if (args.size() < 2) return UsageError("delete needs one or more job ids");
  } else if (args.size() != (command == "job" ? 2u : 1u)) {
    return UsageError(command == "job" ? "job needs exactly one job id"
                                       : command + " takes no arguments");
  }

  // Live views need a terminal; otherwise (a pipe, a file, --once) one snapshot is printed.
  const bool live = isatty(STDOUT_FILENO) && !once;
  if (command == "top") {
    Connection connection(address);
    if (live) {
      TopView view(connection);
      return ferry::ctl::RunLive(view, {interval, ""});
    }
    auto status = FetchStatus(connection);
    if (!status.ok()) return Fail(status.status());
    fputs(ferry::ctl::RenderTop(*status, nullptr, {OutputWidth(), 0}).c_str(), stdout);
    return 0;
  }
  if (live && (watch || interval_given)) {
    Connection connection(address);
    TextView view(connection, OneShot(args, json));
    const std::string title = absl::StrCat("every ", absl::FormatDuration(interval), ": ferryctl ",
                                           absl::StrJoin(args, " "), "  (q quits)");
    return ferry::ctl::RunLive(view, {interval, title});
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

  auto out = OneShot(args, json)(**client);
  if (!out.ok()) return Fail(out.status());
  fputs(out->c_str(), stdout);
  return 0;
}
