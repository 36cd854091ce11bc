// ferryd's side of the session socket (protocol in common/session_protocol.h): accepts
// clients, records their SO_PEERCRED credentials under a random token, and hands slab memfds
// to the owner of an attach_id. One thread polls every session; sessions end when the
// client closes its connection (or dies).
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
#include "common/session_protocol.h"
#include "common/unique_fd.h"

namespace ferry {

class SessionServer final {
 public:
  // Returns the fd to pass (borrowed; it stays owned by the slab) and the slab size.
  using FdProvider = std::function<absl::StatusOr<std::pair<int, uint64_t>>(
      const PeerCredentials& peer, const std::string& attach_id)>;

  static absl::StatusOr<std::unique_ptr<SessionServer>> Start(const std::string& path,
                                                              unsigned mode,
                                                              FdProvider fd_provider);
  ~SessionServer();  // stops the thread, closes every session, removes the socket file
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  // Credentials of a live session, nullopt for an unknown or closed one.
  std::optional<PeerCredentials> Lookup(const std::string& token) const;
  const std::string& path() const { return path_; }

 private:
  SessionServer(std::string path, UniqueFd listener, UniqueFd wake, FdProvider provider);
  void Run();
  void Accept();
  // False when the session should be closed.
  bool Serve(int fd);

  const std::string path_;
  const UniqueFd listener_;
  const UniqueFd wake_;  // eventfd: written by the destructor to stop Run()
  const FdProvider fd_provider_;
  std::thread thread_;

  struct Session {
    UniqueFd fd;
    PeerCredentials peer;
    std::string token;
  };
  // Owned and touched by the session thread only.
  absl::flat_hash_map<int, Session> sessions_;

  mutable absl::Mutex mutex_;
  absl::flat_hash_map<std::string, PeerCredentials> by_token_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_SESSION_SERVER_H_
