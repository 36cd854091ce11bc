#include "common/mapped_read.h"

#include <setjmp.h>
#include <signal.h>

#include <cstring>

namespace ferry {
namespace {

struct Guard {
  sigjmp_buf env;
  const uint8_t* begin = nullptr;
  const uint8_t* end = nullptr;
  volatile sig_atomic_t active = 0;
};

thread_local Guard guard;
struct sigaction previous_action;

void OnSigbus(int signo, siginfo_t* info, void* context) {
  Guard& g = guard;
  const auto* at = static_cast<const uint8_t*>(info->si_addr);
  if (g.active && at >= g.begin && at < g.end) {
    g.active = 0;
    siglongjmp(g.env, 1);
  }
  // Not a guarded read: what was there before handles it (the default kills the process
  // when the faulting access runs again on return).
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction != nullptr) {
      previous_action.sa_sigaction(signo, info, context);
      return;
    }
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signo);
    return;
  }
  sigaction(SIGBUS, &previous_action, nullptr);
}

bool InstallHandler() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  return sigaction(SIGBUS, &action, &previous_action) == 0;
}

}  // namespace

absl::Status GuardMappedRead(absl::Span<const uint8_t> mapping, absl::FunctionRef<void()> read) {
  static const bool installed = InstallHandler();
  if (!installed) {
    read();  // no handler: as unguarded
    return absl::OkStatus();
  }
  Guard& g = guard;  // first touched here, outside the handler
  g.begin = mapping.data();
  g.end = mapping.data() + mapping.size();
  if (sigsetjmp(g.env, /*savemask=*/1) != 0) {
    return absl::DataLossError(
        "the file shrank under its mapping: a read past its new end faulted");
  }
  g.active = 1;
  read();
  g.active = 0;
  return absl::OkStatus();
}

}  // namespace ferry
