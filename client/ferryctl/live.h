// Live views for ferryctl (`top`, and `--watch` / `-n SECONDS` of the read-only commands):
// a full-screen text frame redrawn every interval in a plain terminal (ANSI escapes only:
// alternate screen, cursor home, clear to end of line), until q, Ctrl-C, SIGTERM or a hangup.
//
//   class StatusView final : public LiveView { ... };
//   StatusView view(...);
//   return RunLive(view, {.interval = absl::Seconds(1)});
//
// The terminal is given back as it was found (termios, cursor shown, alternate screen left,
// signal handlers) on every way out, errors included: TerminalSession owns that state.
#ifndef FERRY_CLIENT_FERRYCTL_LIVE_H_
#define FERRY_CLIENT_FERRYCTL_LIVE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ferryctl/top.h"

namespace ferry::ctl {

// What a live loop shows. Refresh is called once per interval (and is the only call that
// may block, e.g. on an RPC); Render as often as the screen needs redrawing (resize),
// from the last successful Refresh.
class LiveView {
 public:
  LiveView() = default;
  LiveView(const LiveView&) = delete;
  LiveView& operator=(const LiveView&) = delete;
  virtual ~LiveView() = default;

  virtual absl::Status Refresh() = 0;
  // Lines ending in '\n', fitting `size` (FitToScreen does that for any text).
  virtual std::string Render(ScreenSize size) const = 0;
};

class SignalPipe;
class RawMode;
class AlternateScreen;

// The terminal state a live view changes, each part with its owner, restored in reverse
// order by the destructor: handlers for SIGINT, SIGTERM, SIGHUP and SIGWINCH, which only
// write the signal's number into a pipe the session polls (SignalPipe); the input
// terminal's termios, raw: no echo, no line buffering, Ctrl-Z disabled, Ctrl-C still
// raises SIGINT (RawMode); the alternate screen with the cursor hidden (AlternateScreen).
// One session at a time per process (the handlers share one pipe).
class TerminalSession final {
 public:
  enum class Event { kTimeout, kQuit, kResize };

  // `in_fd` may be a terminal or not (then keys are not read; signals still end the view);
  // `out_fd` should be a terminal. FAILED_PRECONDITION when another session is open,
  // INTERNAL naming the call when the OS refuses.
  static absl::StatusOr<std::unique_ptr<TerminalSession>> Open(int in_fd, int out_fd);
  ~TerminalSession();
  TerminalSession(const TerminalSession&) = delete;
  TerminalSession& operator=(const TerminalSession&) = delete;

  // The output terminal's size (TIOCGWINSZ); 80x24 when it says 0 or is no terminal.
  ScreenSize Size() const;
  // Replaces the screen with `frame` (lines ending in '\n', fitting Size()).
  absl::Status Draw(std::string_view frame);
  // Waits up to `timeout` for a key (q, Q or Ctrl-C quits; others are ignored), the end of
  // the input, or a signal. After kQuit, quit_signal() says which signal ended it (0: a key
  // or the end of the input).
  absl::StatusOr<Event> Wait(absl::Duration timeout);
  int quit_signal() const { return quit_signal_; }

 private:
  TerminalSession(int in_fd, int out_fd);

  // Constant after Open.
  const int in_fd_;
  const int out_fd_;
  std::unique_ptr<SignalPipe> signals_;
  std::unique_ptr<RawMode> raw_mode_;  // null when in_fd_ is no terminal
  std::unique_ptr<AlternateScreen> screen_;

  bool input_open_ = true;
  int quit_signal_ = 0;
};

struct LiveOptions {
  // Time between two Refresh calls. Default: 1 s.
  absl::Duration interval = absl::Seconds(1);
  // Prepended to every frame (e.g. "every 2s: ferryctl status"); may be empty.
  std::string title;
};

// One frame of a live view: the title, then `view` rendered into the rest of `size` (0: no
// limit). After a failed Refresh (`refreshed`), the title and one line saying why ("ferryd
// unreachable: ..." for a daemon that is gone, and when it is retried) and nothing else:
// the last good answer is no longer current, so it is not shown.
std::string ComposeFrame(const LiveView& view, const absl::Status& refreshed,
                         const LiveOptions& options, ScreenSize size);

// Runs `view` full screen on stdin/stdout until q, Ctrl-C (exit status 0), SIGTERM or
// SIGHUP (128 + the signal), drawing ComposeFrame every interval and on resize; a failed
// Refresh is retried next interval. Returns 1 when the terminal cannot be set up or
// written.
int RunLive(LiveView& view, const LiveOptions& options);

}  // namespace ferry::ctl

#endif  // FERRY_CLIENT_FERRYCTL_LIVE_H_
