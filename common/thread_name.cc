#include "common/thread_name.h"

#include <pthread.h>

#include <string>

namespace ferry {

void NameThisThread(std::string_view name) {
  // pthread_setname_np refuses (ERANGE) names over 15 bytes instead of cutting them.
  const std::string cut(name.substr(0, 15));
  pthread_setname_np(pthread_self(), cut.c_str());
}

}  // namespace ferry
