// Must NOT compile with the project's clang flags: a member guarded by a mutex is written
// without holding it. thread_safety_test (CMakeLists.txt) checks that it fails.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

class Counter {
 public:
  void Add() { ++value_; }  // no lock held: a thread-safety error

 private:
  absl::Mutex mutex_;
  int value_ ABSL_GUARDED_BY(mutex_) = 0;
};

int main() {
  Counter c;
  c.Add();
}
