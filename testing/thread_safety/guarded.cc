// Must compile with the project's clang flags: breach.cc, with the lock taken.
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

class Counter {
 public:
  void Add() {
    absl::MutexLock lock(&mutex_);
    ++value_;
  }

 private:
  absl::Mutex mutex_;
  int value_ ABSL_GUARDED_BY(mutex_) = 0;
};

int main() {
  Counter c;
  c.Add();
}
