#include "common/thread_name.h"

#include <pthread.h>

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace ferry {
namespace {

std::string NameOfThisThread() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  return name;
}

TEST(ThreadNameTest, NamesTheCallingThreadAndCutsLongNames) {
  std::string short_name, long_name;
  std::thread([&] {
    NameThisThread("ferry-events");
    short_name = NameOfThisThread();
    NameThisThread("ferry-worker-n12345678");
    long_name = NameOfThisThread();
  }).join();
  EXPECT_EQ(short_name, "ferry-events");
  EXPECT_EQ(long_name, "ferry-worker-n1");  // Linux keeps 15 bytes
}

}  // namespace
}  // namespace ferry
