#include "server/transport/gather_policy.h"

namespace ferry {

bool GatherPolicy::GatherNext(int leased, int pending) {
  if (pending >= kGpuBehind) {
    copies_left_ = slots_;
    return false;
  }
  if (copies_left_ > 0) {
    --copies_left_;
    return false;
  }
  const int held = leased + pending;
  return 4 * held < 3 * (slots_ - 1);
}

}  // namespace ferry
