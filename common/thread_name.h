#ifndef FERRY_COMMON_THREAD_NAME_H_
#define FERRY_COMMON_THREAD_NAME_H_

#include <string_view>

namespace ferry {

// Names the calling thread for top -H, perf, gdb and /proc/<pid>/task/*/comm, e.g.
// "ferry-events". Linux keeps 15 bytes; longer names are cut. Best effort: a failure only
// leaves the inherited name.
void NameThisThread(std::string_view name);

}  // namespace ferry

#endif  // FERRY_COMMON_THREAD_NAME_H_
