// ThreadSanitizer annotations for an abseil that was not built with TSan (Debian's).
//
// Contract: linked into every target of a `-fsanitize=thread` build (preset tsan), ahead of
// abseil, this library interposes absl::Mutex, absl::CondVar and absl::Notification. Each
// function calls abseil's own implementation (found with dlsym(RTLD_NEXT)) and tells TSan
// what it did: a lock taken or released (`__tsan_mutex_*`), a notification sent or seen
// (`__tsan_release` / `__tsan_acquire`). Without it TSan sees no ordering in abseil's
// uninstrumented lock words and reports a race under every lock; with it, races in ferry's
// code are found and ordering through abseil is not mistaken for one. An abseil built with
// TSan annotates itself (ABSL_TSAN_MUTEX_*); this library is for the packaged one.
//
// Calls from the uninstrumented libraries themselves (abseil calling abseil, gRPC's locks)
// pass through unannotated; see UninstrumentedCode. Limits: the inline
// `Notification::HasBeenNotified()` pairs with Notify() only through a later
// WaitForNotification*; races inside gRPC's own callback machinery cannot be judged (its
// core is uninstrumented), so tests that run a gRPC server in-process are left out of the
// TSan run (label grpc-server, scripts/sanitize.sh).

#include <dlfcn.h>
#include <link.h>
#include <sanitizer/tsan_interface.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define FERRY_TSAN_STR2(x) #x
#define FERRY_TSAN_STR(x) FERRY_TSAN_STR2(x)

namespace {

// Abseil's implementation of the function with the Itanium-mangled name
// `_Z[N|NK]4absl<inline namespace><class><rest>`. Aborts naming the symbol when abseil does
// not export it (a different abseil version): a silent miss would hide real races.
template <typename Fn>
Fn Next(bool is_const, const char* class_and_rest) {
  std::string ns = FERRY_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl");
  if (!ns.empty()) name += std::to_string(ns.size()) + ns;
  name += class_and_rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr,
                 "ferry tsan annotations: abseil does not export %s; rebuild "
                 "testing/tsan for this abseil version\n",
                 name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// Which mutexes this thread holds as a reader, so that Await and CondVar::Wait release and
// retake them in the mode they are held in. Readers hold few mutexes at once.
constexpr int kMaxReaderMutexes = 16;
thread_local const void* reader_held[kMaxReaderMutexes];
thread_local int reader_held_count = 0;

void NoteReaderLock(const void* mu) {
  if (reader_held_count < kMaxReaderMutexes) reader_held[reader_held_count++] = mu;
}

void NoteReaderUnlock(const void* mu) {
  for (int i = 0; i < reader_held_count; ++i) {
    if (reader_held[i] == mu) {
      reader_held[i] = reader_held[--reader_held_count];
      return;
    }
  }
}

unsigned ModeFlags(const void* mu) {
  for (int i = 0; i < reader_held_count; ++i) {
    if (reader_held[i] == mu) return __tsan_mutex_read_lock;
  }
  return 0;
}

void AnnotateLocked(void* mu, unsigned flags) {
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
}

void AnnotateUnlocked(void* mu, unsigned flags) {
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
}

// Whether `caller` is code in an uninstrumented library: abseil itself (WaitWithTimeout
// calls WaitWithDeadline, a Notification locks its own Mutex) or gRPC. Those calls pass
// through unannotated, as if this library were not there: TSan sees none of their memory
// accesses either, and annotating only their locks would show it half of their ordering.
// The libraries are the ones loaded at start (gRPC and abseil are linked, not dlopened).
class UninstrumentedCode {
 public:
  static const UninstrumentedCode& Get() {
    static const UninstrumentedCode* code = new UninstrumentedCode();
    return *code;
  }

  bool Contains(const void* caller) const {
    auto address = reinterpret_cast<uintptr_t>(caller);
    for (int i = 0; i < count_; ++i) {
      if (address >= ranges_[i].begin && address < ranges_[i].end) return true;
    }
    return false;
  }

 private:
  struct Range {
    uintptr_t begin, end;
  };
  static constexpr int kMaxRanges = 256;

  UninstrumentedCode() { dl_iterate_phdr(&AddObject, this); }

  static int AddObject(dl_phdr_info* info, size_t, void* data) {
    auto* self = static_cast<UninstrumentedCode*>(data);
    const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
    const char* base = std::strrchr(name, '/');
    base = base != nullptr ? base + 1 : name;
    if (std::strncmp(base, "libabsl_", 8) != 0 && std::strncmp(base, "libgrpc", 7) != 0 &&
        std::strncmp(base, "libgpr", 6) != 0) {
      return 0;
    }
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& segment = info->dlpi_phdr[i];
      if (segment.p_type != PT_LOAD || (segment.p_flags & PF_X) == 0) continue;
      if (self->count_ == kMaxRanges) {
        std::fprintf(stderr, "ferry tsan annotations: more than %d library code segments\n",
                     kMaxRanges);
        std::abort();
      }
      uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
      self->ranges_[self->count_++] = Range{begin, begin + segment.p_memsz};
    }
    return 0;
  }

  Range ranges_[kMaxRanges];
  int count_ = 0;
};

// True while an interposed function runs on this thread. Abseil also calls itself by tail
// call (AwaitWithTimeout jumps to AwaitWithDeadline), which leaves the outer caller's return
// address in place: only the outermost interposed call annotates.
thread_local int depth = 0;

// Whether this interposed call should tell TSan what it did: it is the outermost one on this
// thread and its caller is instrumented code.
class Annotating {
 public:
  explicit Annotating(const void* caller)
      : annotate_(depth++ == 0 && !UninstrumentedCode::Get().Contains(caller)) {}
  ~Annotating() { --depth; }
  Annotating(const Annotating&) = delete;
  Annotating& operator=(const Annotating&) = delete;
  explicit operator bool() const { return annotate_; }

 private:
  bool annotate_;
};

// A Condition is evaluated with the Mutex held, by the waiting thread or by whichever thread
// releases the Mutex, at moments TSan cannot see. The evaluation acquires and releases the
// Mutex's clock so that what the condition reads is ordered with the Mutex's critical sections.
struct AnnotatedCondition {
  const absl::Condition* condition;
  absl::Mutex* mu;

  // The evaluating thread may be another one than the waiter that built this (on its
  // stack) and the Condition it points to: Publish() orders those writes before Eval's reads.
  void Publish() { __tsan_release(this); }

  // Takes void*: abseil's own (uninstrumented) trampoline reads the Condition that points
  // here, so the first instrumented access is after the acquire below.
  static bool Eval(void* arg) {
    auto* self = static_cast<AnnotatedCondition*>(arg);
    __tsan_acquire(self);
    __tsan_acquire(self->mu);
    bool result = self->condition->Eval();
    __tsan_release(self->mu);
    return result;
  }
};

// Runs `wait(condition)`, which releases `mu` and holds it again on return (Await,
// CondVar::Wait with a null condition).
template <typename Wait>
auto WhileReleased(const void* caller, absl::Mutex* mu, const absl::Condition* condition,
                   Wait wait) {
  Annotating annotating(caller);
  if (!annotating) return wait(condition);
  unsigned flags = ModeFlags(mu);
  AnnotatedCondition annotated{condition, mu};
  absl::Condition checked(&AnnotatedCondition::Eval, static_cast<void*>(&annotated));
  annotated.Publish();
  AnnotateUnlocked(mu, flags);
  auto result = wait(condition != nullptr ? &checked : nullptr);
  AnnotateLocked(mu, flags);
  return result;
}

// Runs `lock(condition)`, which returns holding `mu` (Lock, LockWhen*, ReaderLock*).
template <typename Lock>
auto Locking(const void* caller, absl::Mutex* mu, unsigned flags, const absl::Condition* condition,
             Lock lock) {
  Annotating annotating(caller);
  if (!annotating) return lock(condition);
  AnnotatedCondition annotated{condition, mu};
  absl::Condition checked(&AnnotatedCondition::Eval, static_cast<void*>(&annotated));
  annotated.Publish();
  __tsan_mutex_pre_lock(mu, flags);
  auto result = lock(condition != nullptr ? &checked : nullptr);
  __tsan_mutex_post_lock(mu, flags, 0);
  if (flags & __tsan_mutex_read_lock) NoteReaderLock(mu);
  return result;
}

// Runs `unlock`, which releases `mu` (Unlock, ReaderUnlock).
template <typename Unlock>
void Unlocking(const void* caller, absl::Mutex* mu, unsigned flags, Unlock unlock) {
  Annotating annotating(caller);
  if (!annotating) return unlock();
  if (flags & __tsan_mutex_read_lock) NoteReaderUnlock(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  unlock();
  __tsan_mutex_post_unlock(mu, flags);
}

// Runs `try_lock`, which returns whether it took `mu` (TryLock, ReaderTryLock).
template <typename TryLock>
bool TryLocking(const void* caller, absl::Mutex* mu, unsigned flags, TryLock try_lock) {
  Annotating annotating(caller);
  if (!annotating) return try_lock();
  flags |= __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(mu, flags);
  bool locked = try_lock();
  __tsan_mutex_post_lock(mu, locked ? flags : flags | __tsan_mutex_try_lock_failed, 0);
  if (locked && (flags & __tsan_mutex_read_lock)) NoteReaderLock(mu);
  return locked;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using ConditionArg = const Condition&;

// The code that called the interposed function (see UninstrumentedCode).
#define FERRY_TSAN_CALLER __builtin_return_address(0)

Mutex::~Mutex() {
  static auto next = Next<void (*)(Mutex*)>(false, "5MutexD1Ev");
  Annotating annotating(FERRY_TSAN_CALLER);
  if (annotating) __tsan_mutex_destroy(this, 0);
  next(this);
}

void Mutex::Lock() {
  static auto next = Next<void (*)(Mutex*)>(false, "5Mutex4LockEv");
  Locking(FERRY_TSAN_CALLER, this, 0, nullptr, [&](const Condition*) { return (next(this), 0); });
}

void Mutex::ReaderLock() {
  static auto next = Next<void (*)(Mutex*)>(false, "5Mutex10ReaderLockEv");
  Locking(FERRY_TSAN_CALLER, this, __tsan_mutex_read_lock, nullptr,
          [&](const Condition*) { return (next(this), 0); });
}

bool Mutex::TryLock() {
  static auto next = Next<bool (*)(Mutex*)>(false, "5Mutex7TryLockEv");
  return TryLocking(FERRY_TSAN_CALLER, this, 0, [&] { return next(this); });
}

bool Mutex::ReaderTryLock() {
  static auto next = Next<bool (*)(Mutex*)>(false, "5Mutex13ReaderTryLockEv");
  return TryLocking(FERRY_TSAN_CALLER, this, __tsan_mutex_read_lock, [&] { return next(this); });
}

void Mutex::Unlock() {
  static auto next = Next<void (*)(Mutex*)>(false, "5Mutex6UnlockEv");
  Unlocking(FERRY_TSAN_CALLER, this, 0, [&] { next(this); });
}

void Mutex::ReaderUnlock() {
  static auto next = Next<void (*)(Mutex*)>(false, "5Mutex12ReaderUnlockEv");
  Unlocking(FERRY_TSAN_CALLER, this, __tsan_mutex_read_lock, [&] { next(this); });
}

void Mutex::LockWhen(const Condition& cond) {
  static auto next =
      Next<void (*)(Mutex*, ConditionArg)>(false, "5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(FERRY_TSAN_CALLER, this, 0, &cond,
          [&](const Condition* c) { return (next(this, *c), 0); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto next = Next<bool (*)(Mutex*, ConditionArg, Duration)>(
      false, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(FERRY_TSAN_CALLER, this, 0, &cond,
                 [&](const Condition* c) { return next(this, *c, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto next = Next<bool (*)(Mutex*, ConditionArg, Time)>(
      false, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(FERRY_TSAN_CALLER, this, 0, &cond,
                 [&](const Condition* c) { return next(this, *c, deadline); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static auto next =
      Next<void (*)(Mutex*, ConditionArg)>(false, "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(FERRY_TSAN_CALLER, this, __tsan_mutex_read_lock, &cond,
          [&](const Condition* c) { return (next(this, *c), 0); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto next = Next<bool (*)(Mutex*, ConditionArg, Duration)>(
      false, "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(FERRY_TSAN_CALLER, this, __tsan_mutex_read_lock, &cond,
                 [&](const Condition* c) { return next(this, *c, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static auto next = Next<bool (*)(Mutex*, ConditionArg, Time)>(
      false, "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(FERRY_TSAN_CALLER, this, __tsan_mutex_read_lock, &cond,
                 [&](const Condition* c) { return next(this, *c, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static auto next = Next<void (*)(Mutex*, ConditionArg)>(false, "5Mutex5AwaitERKNS0_9ConditionE");
  WhileReleased(FERRY_TSAN_CALLER, this, &cond,
                [&](const Condition* c) { return (next(this, *c), 0); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto next = Next<bool (*)(Mutex*, ConditionArg, Duration)>(
      false, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return WhileReleased(FERRY_TSAN_CALLER, this, &cond,
                       [&](const Condition* c) { return next(this, *c, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto next = Next<bool (*)(Mutex*, ConditionArg, Time)>(
      false, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return WhileReleased(FERRY_TSAN_CALLER, this, &cond,
                       [&](const Condition* c) { return next(this, *c, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static auto next = Next<void (*)(CondVar*, Mutex*)>(false, "7CondVar4WaitEPNS0_5MutexE");
  WhileReleased(FERRY_TSAN_CALLER, mu, nullptr,
                [&](const Condition*) { return (next(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto next = Next<bool (*)(CondVar*, Mutex*, Duration)>(
      false, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return WhileReleased(FERRY_TSAN_CALLER, mu, nullptr,
                       [&](const Condition*) { return next(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto next = Next<bool (*)(CondVar*, Mutex*, Time)>(
      false, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return WhileReleased(FERRY_TSAN_CALLER, mu, nullptr,
                       [&](const Condition*) { return next(this, mu, deadline); });
}

void Notification::Notify() {
  static auto next = Next<void (*)(Notification*)>(false, "12Notification6NotifyEv");
  Annotating annotating(FERRY_TSAN_CALLER);
  if (annotating) __tsan_release(this);
  next(this);
}

void Notification::WaitForNotification() const {
  static auto next =
      Next<void (*)(const Notification*)>(true, "12Notification19WaitForNotificationEv");
  Annotating annotating(FERRY_TSAN_CALLER);
  next(this);
  if (annotating) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto next = Next<bool (*)(const Notification*, Duration)>(
      true, "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  Annotating annotating(FERRY_TSAN_CALLER);
  bool notified = next(this, timeout);
  if (notified && annotating) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto next = Next<bool (*)(const Notification*, Time)>(
      true, "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  Annotating annotating(FERRY_TSAN_CALLER);
  bool notified = next(this, deadline);
  if (notified && annotating) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
