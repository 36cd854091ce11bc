#include "client/ferryctl/live.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry::ctl {

namespace {

// The write end of the open SignalPipe, for the handler; -1 when none is open.
std::atomic<int> g_signal_fd{-1};

void OnSignal(int signo) {
  const int saved_errno = errno;
  const int fd = g_signal_fd.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    (void)!write(fd, &byte, 1);  // a full pipe already holds a wake-up
  }
  errno = saved_errno;
}

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
constexpr int kNumSignals = sizeof(kSignals) / sizeof(kSignals[0]);

absl::Status ErrnoError(const char* call) {
  return absl::InternalError(absl::StrCat("ferryctl: ", call, ": ", strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p = {fd, POLLOUT, 0};
        poll(&p, 1, 1000);
        continue;
      }
      return ErrnoError("writing to the terminal");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

constexpr char kEnterScreen[] = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";
constexpr char kLeaveScreen[] = "\x1b[?25h\x1b[?1049l";

}  // namespace

// Handlers for kSignals that write the signal's number into a non-blocking pipe; the old
// handlers come back in the destructor.
class SignalPipe final {
 public:
  static absl::StatusOr<std::unique_ptr<SignalPipe>> Create() {
    std::unique_ptr<SignalPipe> p(new SignalPipe());
    if (pipe2(p->fds_, O_CLOEXEC | O_NONBLOCK) != 0) return ErrnoError("pipe2");
    int expected = -1;
    if (!g_signal_fd.compare_exchange_strong(expected, p->fds_[1])) {
      return absl::FailedPreconditionError("ferryctl: a live view is already running");
    }
    p->published_ = true;
    struct sigaction action = {};
    action.sa_handler = OnSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int i = 0; i < kNumSignals; ++i) {
      if (sigaction(kSignals[i], &action, &p->saved_[i]) != 0) return ErrnoError("sigaction");
      p->installed_ = i + 1;
    }
    return p;
  }

  ~SignalPipe() {
    for (int i = installed_ - 1; i >= 0; --i) sigaction(kSignals[i], &saved_[i], nullptr);
    if (published_) g_signal_fd.store(-1);
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  int read_fd() const { return fds_[0]; }

 private:
  SignalPipe() = default;

  int fds_[2] = {-1, -1};
  bool published_ = false;
  struct sigaction saved_[kNumSignals] = {};
  int installed_ = 0;  // kSignals[0, installed_) have our handler
};

// The input terminal in raw mode, its termios restored by the destructor.
class RawMode final {
 public:
  static absl::StatusOr<std::unique_ptr<RawMode>> Enable(int fd) {
    std::unique_ptr<RawMode> m(new RawMode(fd));
    if (tcgetattr(fd, &m->saved_) != 0) return ErrnoError("tcgetattr");
    struct termios raw = m->saved_;
    raw.c_lflag &= ~(ICANON | ECHO | IEXTEN);  // ISIG stays: Ctrl-C is SIGINT
    raw.c_iflag &= ~(IXON | ICRNL);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    // Ctrl-Z would stop us with the terminal still raw and on the alternate screen.
    raw.c_cc[VSUSP] = _POSIX_VDISABLE;
    if (tcsetattr(fd, TCSANOW, &raw) != 0) return ErrnoError("tcsetattr");
    m->enabled_ = true;
    return m;
  }

  ~RawMode() {
    if (enabled_) tcsetattr(fd_, TCSANOW, &saved_);
  }

 private:
  explicit RawMode(int fd) : fd_(fd) {}

  const int fd_;
  struct termios saved_ = {};
  bool enabled_ = false;
};

// The alternate screen with the cursor hidden; the destructor shows the cursor and goes
// back to the normal screen (whose contents the terminal kept).
class AlternateScreen final {
 public:
  static absl::StatusOr<std::unique_ptr<AlternateScreen>> Enter(int fd) {
    std::unique_ptr<AlternateScreen> s(new AlternateScreen(fd));
    absl::Status entered = WriteAll(fd, kEnterScreen);
    if (!entered.ok()) return entered;
    return s;
  }

  ~AlternateScreen() { (void)WriteAll(fd_, kLeaveScreen).ok(); }

 private:
  explicit AlternateScreen(int fd) : fd_(fd) {}

  const int fd_;
};

TerminalSession::TerminalSession(int in_fd, int out_fd) : in_fd_(in_fd), out_fd_(out_fd) {}

TerminalSession::~TerminalSession() {
  // Reverse order of Open, spelled out: the screen first, while the terminal is still raw.
  screen_.reset();
  raw_mode_.reset();
  signals_.reset();
}

absl::StatusOr<std::unique_ptr<TerminalSession>> TerminalSession::Open(int in_fd, int out_fd) {
  std::unique_ptr<TerminalSession> s(new TerminalSession(in_fd, out_fd));
  auto signals = SignalPipe::Create();
  if (!signals.ok()) return signals.status();
  s->signals_ = *std::move(signals);
  if (isatty(in_fd)) {
    auto raw = RawMode::Enable(in_fd);
    if (!raw.ok()) return raw.status();
    s->raw_mode_ = *std::move(raw);
  }
  auto screen = AlternateScreen::Enter(out_fd);
  if (!screen.ok()) return screen.status();
  s->screen_ = *std::move(screen);
  return s;
}

ScreenSize TerminalSession::Size() const {
  struct winsize ws = {};
  ScreenSize size{80, 24};
  if (ioctl(out_fd_, TIOCGWINSZ, &ws) == 0) {
    if (ws.ws_col > 0) size.width = ws.ws_col;
    if (ws.ws_row > 0) size.height = ws.ws_row;
  }
  return size;
}

absl::Status TerminalSession::Draw(std::string_view frame) {
  // Cursor home, each line over the old one (erasing its rest), then erase below. No
  // newline after the last line: on the screen's last row it would scroll the frame.
  std::string out = "\x1b[H";
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(frame.data(), frame.size()), '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StrAppend(&out, lines[i], "\x1b[K", i + 1 < lines.size() ? "\r\n" : "");
  }
  out += "\x1b[J";
  return WriteAll(out_fd_, out);
}

absl::StatusOr<TerminalSession::Event> TerminalSession::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd fds[2] = {{signals_->read_fd(), POLLIN, 0}, {in_fd_, POLLIN, 0}};
    const nfds_t n = raw_mode_ != nullptr && input_open_ ? 2 : 1;
    const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(left + absl::Milliseconds(1)));
    const int ready = poll(fds, n, ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("poll");
    }
    if (ready == 0) return Event::kTimeout;
    bool resized = false;
    if (fds[0].revents & POLLIN) {
      unsigned char signos[64];
      ssize_t got;
      while ((got = read(signals_->read_fd(), signos, sizeof(signos))) > 0) {
        for (ssize_t i = 0; i < got; ++i) {
          if (signos[i] == SIGWINCH) {
            resized = true;
          } else if (quit_signal_ == 0) {
            quit_signal_ = signos[i];
          }
        }
      }
      if (quit_signal_ != 0) return Event::kQuit;
    }
    if (n == 2 && fds[1].revents != 0) {
      char keys[64];
      const ssize_t got = read(in_fd_, keys, sizeof(keys));
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) return Event::kQuit;  // the terminal is gone (a hangup, EIO)
      for (ssize_t i = 0; i < got; ++i) {
        if (keys[i] == 'q' || keys[i] == 'Q' || keys[i] == '\x03') return Event::kQuit;
      }
    }
    if (resized) return Event::kResize;
  }
}

namespace {

std::string ErrorLine(const absl::Status& status, absl::Duration interval) {
  const bool gone =
      absl::IsUnavailable(status) || absl::IsCancelled(status) || absl::IsDeadlineExceeded(status);
  return absl::StrCat(gone ? "ferryd unreachable: " : "ferryctl: ", status.message(),
                      " (retrying every ", absl::FormatDuration(interval), ")");
}

}  // namespace

std::string ComposeFrame(const LiveView& view, const absl::Status& refreshed,
                         const LiveOptions& options, ScreenSize size) {
  std::string top = options.title.empty() ? "" : options.title + "\n";
  if (!refreshed.ok()) {
    // The last answer is stale: the screen shows only why there is no current one.
    absl::StrAppend(&top, ErrorLine(refreshed, options.interval), "\n");
    return FitToScreen(top, size);
  }
  top = FitToScreen(top, size);
  const int used = static_cast<int>(std::count(top.begin(), top.end(), '\n'));
  std::string frame = top;
  if (size.height == 0 || size.height > used) {
    frame += view.Render({size.width, size.height == 0 ? 0 : size.height - used});
  }
  return frame;
}

int RunLive(LiveView& view, const LiveOptions& options) {
  absl::Status failed;
  {
    auto session = TerminalSession::Open(STDIN_FILENO, STDOUT_FILENO);
    if (!session.ok()) {
      failed = session.status();
    } else {
      TerminalSession& terminal = **session;
      absl::Status refreshed = view.Refresh();
      absl::Time next = absl::Now() + options.interval;
      for (;;) {
        const std::string frame = ComposeFrame(view, refreshed, options, terminal.Size());
        if (absl::Status drawn = terminal.Draw(frame); !drawn.ok()) {
          failed = drawn;
          break;
        }
        auto event = terminal.Wait(next - absl::Now());
        if (!event.ok()) {
          failed = event.status();
          break;
        }
        if (*event == TerminalSession::Event::kQuit) {
          const int signo = terminal.quit_signal();
          if (signo != 0 && signo != SIGINT) return 128 + signo;
          return 0;
        }
        if (*event == TerminalSession::Event::kTimeout) {
          refreshed = view.Refresh();
          next = absl::Now() + options.interval;
        }
      }
    }
  }  // the terminal is restored here, so the error is printed on the normal screen
  fprintf(stderr, "%s\n", std::string(failed.message()).c_str());
  return 1;
}

}  // namespace ferry::ctl
