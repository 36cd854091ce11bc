// `ferryctl top`: one screen of a running ferryd, rendered as a pure function of its
// GetStatusResponse (the previous one for rates ferryd reports as totals) and the
// terminal's size, so that columns, sorting and truncation are unit-tested without a
// daemon or a terminal. The live loop that draws it is in live.h.
//
//   absl::StatusOr<v1::GetStatusResponse> now = client->GetStatus();
//   std::string screen = RenderTop(*now, &previous, {.width = 120, .height = 40});
#ifndef FERRY_CLIENT_FERRYCTL_TOP_H_
#define FERRY_CLIENT_FERRYCTL_TOP_H_

#include <string>
#include <string_view>

#include "ferry/v1/ferry.pb.h"

namespace ferry::ctl {

// Characters of the screen; 0 means unlimited (a snapshot for a pipe or a file).
struct ScreenSize {
  int width = 0;
  int height = 0;
};

// Cuts `line` to at most `width` characters (UTF-8 code points), ending it with "~" when
// something was cut; unchanged when width is 0.
std::string TruncateLine(std::string_view line, int width);

// Cuts every line of `text` to size.width and keeps at most size.height lines, the last
// kept one saying how many more there were. Lines end in '\n'.
std::string FitToScreen(std::string_view text, ScreenSize size);

// The top screen: header lines (ferryd version, uptime, workers busy, ferryd's CPU use
// between `previous` and `now` ("-" without a previous answer of the same ferryd), host,
// pinned and per-GPU device memory against their budgets, H2D rate per GPU), then one row
// per (job, rank), the most stalled attached ranks first. Rates, stall and stage are "-"
// for a rank with no consumer (an idle job's last rates are not current). `previous` may
// be null. Every line fits size.width, as top(1) fits a narrow terminal: job names shrink
// first (to 6 characters), then MEMORY, LEASED, QUEUE, GPU DEC and STATE go, in that
// order, as far as needed; only then are lines cut.
std::string RenderTop(const v1::GetStatusResponse& now, const v1::GetStatusResponse* previous,
                      ScreenSize size);

}  // namespace ferry::ctl

#endif  // FERRY_CLIENT_FERRYCTL_TOP_H_
