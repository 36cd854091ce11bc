// ferryd: the per-node data-prefetch daemon.
//
//   ferryd [--config FILE] [--listen SOCKET] [--workers N] [--log-level LEVEL]
//
// Without --config, only the system daemon (root or user ferry, no --listen) reads
// /etc/ferry/ferryd.conf; every other ferryd starts with built-in defaults. SIGTERM or SIGINT
// drains and exits 0; a second signal while draining, or a drain that takes longer than
// drain_timeout_seconds + 10 s, exits 1 at once.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/base/config.h"
#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "server/service/daemon.h"

namespace {

void Usage(FILE* out) {
  fprintf(out,
          "usage: ferryd [--config FILE] [--listen SOCKET] [--workers N] [--log-level LEVEL]\n"
          "  --config FILE    config file (protobuf text, ferry.v1.DaemonConfig); default:\n"
          "                   /etc/ferry/ferryd.conf if it exists for the system daemon (run\n"
          "                   as root or as user ferry, without --listen), else built-in\n"
          "                   defaults\n"
          "  --listen SOCKET  Unix socket for the API (overrides unix_socket); default\n"
          "                   /run/ferry/ferryd.sock as root, $XDG_RUNTIME_DIR/ferry/ferryd.sock\n"
          "                   otherwise\n"
          "  --workers N      worker threads per NUMA node (0 = one per CPU)\n"
          "  --log-level LEVEL  least severity logged: debug, info, warning or error\n"
          "                   (overrides log_level; default info)\n"
          "  --version        print the version\n");
}

}  // namespace

int main(int argc, char** argv) {
#if !defined(ABSL_HAVE_ADDRESS_SANITIZER) && !defined(ABSL_HAVE_THREAD_SANITIZER)
  // A crash (SIGSEGV, SIGABRT, ...) writes the signal and the stack of the thread it hit to
  // stderr (the journal, or the log file), then ferryd dies of the signal as it would have. The
  // sanitizers' own handlers report better and are left in place.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
#endif
  // absl's tracking of the order in which mutexes are taken (a global graph consulted at
  // every nested lock) is on wherever absl was built without NDEBUG, as distributions build
  // it, and its default ends the process at the first cycle it sees. A daemon runs without
  // it, as with a release build of absl; FERRY_MUTEX_DEADLOCK_DETECTION=report (log each
  // cycle) or =abort turns it on for a diagnosis (tests, the sanitizer builds and clang's
  // -Wthread-safety check lock order at build and test time).
  {
    const char* mode = std::getenv("FERRY_MUTEX_DEADLOCK_DETECTION");
    const std::string want = mode == nullptr ? "" : mode;
    absl::SetMutexDeadlockDetectionMode(want == "abort"    ? absl::OnDeadlockCycle::kAbort
                                        : want == "report" ? absl::OnDeadlockCycle::kReport
                                                           : absl::OnDeadlockCycle::kIgnore);
  }
  ferry::DaemonOptions options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "ferryd: %s needs a value\n", name);
        exit(2);
      }
      return argv[++i];
    };
    if (arg == "--config") {
      options.config_path = value("--config");
    } else if (arg == "--listen") {
      options.listen = value("--listen");
    } else if (arg == "--workers") {
      options.workers = atoi(value("--workers").c_str());
    } else if (arg == "--log-level") {
      options.log_level = value("--log-level");
      auto level = ferry::ParseLogSeverity(options.log_level);
      if (!level.ok()) {
        fprintf(stderr, "ferryd: --log-level: %s\n", std::string(level.status().message()).c_str());
        return 2;
      }
      // At once, so that the start-up lines follow it too.
      ferry::SetLogLevel(*level);
    } else if (arg == "--version") {
      printf("ferryd %s\n", ferry::kFerryVersion);
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "ferryd: unknown argument '%s'\n", arg.c_str());
      Usage(stderr);
      return 2;
    }
  }

  // Signals are taken synchronously by this thread; every thread started later inherits the
  // mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = ferry::Daemon::Start(options);
  if (!daemon.ok()) {
    FERRY_LOG(ERROR) << "ferryd cannot start: " << daemon.status().ToString();
    return 1;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  FERRY_LOG(INFO) << "received " << strsignal(sig) << ", draining";
  // The drain is bounded whatever a worker or a handler is doing: a second signal, or the
  // stop limit, ends ferryd at once (the kernel then closes its sockets and frees its
  // memory; trainers see it gone).
  const absl::Duration limit = (*daemon)->stop_limit();
  std::thread([signals, limit] {
    const timespec wait = absl::ToTimespec(limit);
    const int again = sigtimedwait(&signals, nullptr, &wait);
    if (again > 0) {
      FERRY_LOG(ERROR) << "received " << strsignal(again) << " while draining; exiting now";
    } else {
      FERRY_LOG(ERROR) << "did not stop within " << absl::FormatDuration(limit)
                       << " (drain_timeout_seconds and "
                       << absl::FormatDuration(ferry::Daemon::kStopGrace) << " more); exiting now";
    }
    _exit(1);
  }).detach();
  (*daemon)->Drain();
  return 0;
}
