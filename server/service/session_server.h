// ferryd's side of the session socket (protocol in common/session_protocol.h): accepts
// clients, records their SO_PEERCRED credentials under a random token, hands slab memfds
// to the owner of an attach_id, and creates batch channels (common/batch_channel.h), which
// wait here until the session's Consume stream opens them (TakeChannel). One thread polls
// every session; sessions end when the client closes its connection (or dies), and take
// their channels that no stream opened with them.
//
// Thread-safe.
#ifndef FERRY_SERVER_SERVICE_SESSION_SERVER_H_
#define FERRY_SERVER_SERVICE_SESSION_SERVER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/batch_channel.h"
#include "common/session_protocol.h"
#include "common/unique_fd.h"

namespace ferry {

// Bounds on live sessions. A connection over a bound is answered "ERR <why>" and closed, so
// one user's runaway clients cannot lock other users out, nor take the descriptors ferryd
// needs to answer anyone.
struct SessionLimits {
  size_t max_sessions = 4096;          // in all, for users other than the administrators
  size_t max_sessions_per_uid = 1024;  // per uid; Start keeps it under max_sessions / 4
  // Sessions of root and of ferryd's own user beyond max_sessions: the administrator's
  // `ferryctl status` gets in when other users hold every session.
  size_t reserved_for_administrators = 16;
  // A session with nothing in use (SessionServer::InUse says no, no batch channel waiting)
  // that sent nothing and carried no RPC (Lookup) for this long is closed, after a
  // "BYE <why>" the client library takes as "open a new session when next used".
  // Zero keeps idle sessions.
  absl::Duration idle_timeout = absl::Minutes(10);
};

class SessionServer final {
 public:
  // Returns the fd to pass (borrowed; it stays owned by the slab) and the slab size.
  using FdProvider = std::function<absl::StatusOr<std::pair<int, uint64_t>>(
      const PeerCredentials& peer, const std::string& attach_id)>;

  // A new batch channel for the Consume stream of attachment `attach_id`.
  using ChannelFactory = std::function<absl::StatusOr<std::unique_ptr<BatchChannel>>(
      const PeerCredentials& peer, const std::string& attach_id)>;

  // True while the session of `peer` must stay open however long it is silent (its process
  // consumes batches of some job). Called on the session thread; must not block.
  using InUse = std::function<bool(const PeerCredentials& peer)>;

  static absl::StatusOr<std::unique_ptr<SessionServer>> Start(
      const std::string& path, unsigned mode, FdProvider fd_provider,
      ChannelFactory channel_factory, SessionLimits limits = SessionLimits(),
      InUse in_use = nullptr);
  ~SessionServer();  // stops the thread, closes every session, removes the socket file
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  // Credentials of a live session, nullopt for an unknown or closed one. A lookup is the
  // session's activity: it is not idle (SessionLimits::idle_timeout) for a while.
  std::optional<PeerCredentials> Lookup(const std::string& token);
  // The channel session `token` fetched for `attach_id` ("CHANNEL <attach_id>"), handed over
  // once: null when there is none (never fetched, already taken, or the session closed).
  std::shared_ptr<BatchChannel> TakeChannel(const std::string& token, const std::string& attach_id);
  // Channels fetched and not yet opened by a stream, per session and per uid: a client
  // fetches one and opens it at once, so more is a misbehaving client (each holds fds).
  // Per uid, not in all: one user's runaway sessions must not lock other users out.
  static constexpr size_t kMaxWaitingChannelsPerSession = 8;
  static constexpr size_t kMaxWaitingChannelsPerUid = 256;
  const std::string& path() const { return path_; }
  // Sessions open now (clients connected to the session socket).
  size_t live_sessions() const;

 private:
  SessionServer(std::string path, UniqueFd listener, UniqueFd wake, FdProvider provider,
                ChannelFactory channel_factory, SessionLimits limits, InUse in_use);
  void Run();
  // Closes the sessions idle for limits_.idle_timeout at `now`, each after a "BYE".
  void CloseIdleSessions(absl::Time now);
  // Accepts one pending connection. Out of descriptors, it gives up its spare one to accept
  // and refuse the connection (the listener would otherwise stay readable and the thread
  // spin); false when even that failed and the listener should rest a while.
  bool Accept();
  // Sends "ERR <why>" on a connection that is refused, and closes it.
  void Refuse(UniqueFd fd, const std::string& why);
  // False when the session should be closed.
  bool Serve(int fd);
  // `sent` is the status of sending an answer on session `fd`: true when it went out,
  // else false (the session is closed) after a warning naming the client.
  bool Sent(int fd, const absl::Status& sent);
  // Answers "CHANNEL <attach_id>"; false when the session should be closed.
  bool ServeChannel(int fd, const std::string& attach_id);
  void Close(int fd);

  const std::string path_;
  const UniqueFd listener_;
  const UniqueFd wake_;  // eventfd: written by the destructor to stop Run()
  const FdProvider fd_provider_;
  const ChannelFactory channel_factory_;
  const SessionLimits limits_;
  const InUse in_use_;
  std::thread thread_;
  UniqueFd spare_fd_;  // /dev/null, given up to refuse a connection when out of descriptors

  struct Session {
    UniqueFd fd;
    PeerCredentials peer;
    std::string token;
    bool administrator = false;  // root or ferryd's user: may use the reserve
  };
  // Owned and touched by the session thread only.
  absl::flat_hash_map<int, Session> sessions_;
  absl::flat_hash_map<unsigned, size_t> sessions_per_uid_;  // no zero entries
  size_t user_sessions_ = 0;  // sessions of users other than the administrators

  mutable absl::Mutex mutex_;
  struct Known {
    PeerCredentials peer;
    absl::Time active;  // its last request or Lookup
  };
  absl::flat_hash_map<std::string, Known> by_token_ ABSL_GUARDED_BY(mutex_);
  // token -> attach_id -> channel fetched but not yet opened by a stream
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, std::shared_ptr<BatchChannel>>>
      waiting_channels_ ABSL_GUARDED_BY(mutex_);
  // uid -> how many of waiting_channels_ its sessions hold (no zero entries)
  absl::flat_hash_map<unsigned, size_t> waiting_per_uid_ ABSL_GUARDED_BY(mutex_);
  void CountWaiting(unsigned uid, ptrdiff_t change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_SESSION_SERVER_H_
