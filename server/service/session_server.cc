#include "server/service/session_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "server/service/job_manager.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Start(
    const std::string& path, unsigned mode, FdProvider fd_provider, ChannelFactory channel_factory,
    SessionLimits limits, InUse in_use) {
  FERRY_ASSIGN_OR_RETURN(UniqueFd listener, ListenUnix(path, SOCK_SEQPACKET, mode));
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::InternalError("eventfd failed");
  // One uid may hold at most a quarter of the sessions: one user's clients never lock out
  // the others (nor, with the administrators' reserve, root).
  limits.max_sessions_per_uid =
      std::min(limits.max_sessions_per_uid, std::max<size_t>(1, limits.max_sessions / 4));
  std::unique_ptr<SessionServer> server(
      new SessionServer(path, std::move(listener), std::move(wake), std::move(fd_provider),
                        std::move(channel_factory), limits, std::move(in_use)));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

SessionServer::SessionServer(std::string path, UniqueFd listener, UniqueFd wake,
                             FdProvider provider, ChannelFactory channel_factory,
                             SessionLimits limits, InUse in_use)
    : path_(std::move(path)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      fd_provider_(std::move(provider)),
      channel_factory_(std::move(channel_factory)),
      limits_(limits),
      in_use_(std::move(in_use)),
      spare_fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

SessionServer::~SessionServer() {
  uint64_t one = 1;
  ssize_t unused = write(wake_.get(), &one, sizeof(one));
  (void)unused;
  if (thread_.joinable()) thread_.join();
  unlink(path_.c_str());
}

size_t SessionServer::live_sessions() const {
  absl::MutexLock lock(&mutex_);
  return by_token_.size();
}

std::optional<PeerCredentials> SessionServer::Lookup(const std::string& token) {
  absl::MutexLock lock(&mutex_);
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return std::nullopt;
  it->second.active = absl::Now();
  return it->second.peer;
}

std::shared_ptr<BatchChannel> SessionServer::TakeChannel(const std::string& token,
                                                         const std::string& attach_id) {
  absl::MutexLock lock(&mutex_);
  auto session = waiting_channels_.find(token);
  if (session == waiting_channels_.end()) return nullptr;
  auto it = session->second.find(attach_id);
  if (it == session->second.end()) return nullptr;
  std::shared_ptr<BatchChannel> channel = std::move(it->second);
  session->second.erase(it);
  auto peer = by_token_.find(token);  // live: Close drops a session's channels with it
  if (peer != by_token_.end()) CountWaiting(peer->second.peer.uid, -1);
  return channel;
}

void SessionServer::CountWaiting(unsigned uid, ptrdiff_t change) {
  size_t& count = waiting_per_uid_[uid];
  count += change;
  if (count == 0) waiting_per_uid_.erase(uid);
}

void SessionServer::Close(int fd) {
  auto it = sessions_.find(fd);
  {
    absl::MutexLock lock(&mutex_);
    by_token_.erase(it->second.token);
    auto waiting = waiting_channels_.find(it->second.token);
    if (waiting != waiting_channels_.end()) {
      CountWaiting(it->second.peer.uid, -static_cast<ptrdiff_t>(waiting->second.size()));
      waiting_channels_.erase(waiting);
    }
  }
  if (!it->second.administrator) --user_sessions_;
  auto count = sessions_per_uid_.find(it->second.peer.uid);
  if (count != sessions_per_uid_.end() && --count->second == 0) sessions_per_uid_.erase(count);
  sessions_.erase(it);
}

void SessionServer::Run() {
  NameThisThread("ferry-sessions");
  std::vector<pollfd> fds;
  // While out of descriptors with no spare left, the listener rests (it would stay readable
  // and this thread spin); sessions are still served.
  absl::Time listener_rests_until = absl::InfinitePast();
  for (;;) {
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    const bool resting = absl::Now() < listener_rests_until;
    fds.push_back({listener_.get(), static_cast<short>(resting ? 0 : POLLIN), 0});
    for (const auto& [fd, session] : sessions_) fds.push_back({fd, POLLIN, 0});
    // Idle sessions are looked for every second (or sooner for a shorter timeout).
    const absl::Duration sweep =
        std::min(absl::Seconds(1), limits_.idle_timeout / 2) + absl::Milliseconds(1);
    absl::Time wake_at = absl::InfiniteFuture();
    if (resting) wake_at = listener_rests_until;
    if (limits_.idle_timeout > absl::ZeroDuration())
      wake_at = std::min(wake_at, absl::Now() + sweep);
    const int timeout_ms = wake_at == absl::InfiniteFuture()
                               ? -1
                               : static_cast<int>(std::max<int64_t>(
                                     0, absl::ToInt64Milliseconds(wake_at - absl::Now()) + 1));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      FERRY_LOG(ERROR) << "session socket poll failed: " << strerror(errno);
      return;
    }
    if (fds[0].revents != 0) break;
    if ((fds[1].revents & POLLIN) && !Accept()) {
      listener_rests_until = absl::Now() + absl::Milliseconds(100);
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (!Serve(fds[i].fd)) Close(fds[i].fd);
    }
    if (limits_.idle_timeout > absl::ZeroDuration()) CloseIdleSessions(absl::Now());
  }
  absl::MutexLock lock(&mutex_);
  by_token_.clear();
  waiting_channels_.clear();
  waiting_per_uid_.clear();
  sessions_.clear();
}

void SessionServer::Refuse(UniqueFd fd, const std::string& why) {
  (void)SendPacket(fd.get(), absl::StrCat("ERR ", why));
}

bool SessionServer::Accept() {
  // Non-blocking: this one thread answers every session, so a client that does not read
  // its answers must not stall the others. An answer that does not fit ends that session.
  UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) {
    const int err = errno;
    if (err != EMFILE && err != ENFILE) return true;  // the client left, or a signal
    FERRY_LOG_EVERY_N_SEC(WARNING, 10)
        << "ferryd is out of file descriptors (" << strerror(err)
        << "): refusing new sessions; raise LimitNOFILE or close idle clients";
    if (!spare_fd_.valid()) return false;
    spare_fd_.Reset();
    UniqueFd refused(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (refused.valid()) {
      Refuse(std::move(refused),
             "ferryd is out of file descriptors; try again later, and ask the administrator "
             "to raise its LimitNOFILE");
    }
    spare_fd_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return refused.valid() || spare_fd_.valid();
  }
  auto peer = GetPeerCredentials(fd.get());
  if (!peer.ok()) {
    FERRY_LOG(WARNING) << "rejected a session: " << peer.status();
    return true;
  }
  size_t& mine = sessions_per_uid_[peer->uid];
  const bool administrator = peer->uid == 0 || peer->uid == geteuid();
  // Users share max_sessions; administrators may also take the reserve beyond it.
  const bool full =
      administrator ? sessions_.size() >= limits_.max_sessions + limits_.reserved_for_administrators
                    : user_sessions_ >= limits_.max_sessions;
  if ((!administrator && mine >= limits_.max_sessions_per_uid) || full) {
    const bool per_uid = !administrator && mine >= limits_.max_sessions_per_uid;
    if (mine == 0) sessions_per_uid_.erase(peer->uid);
    const std::string why =
        per_uid ? absl::StrCat("uid ", peer->uid, " has ", limits_.max_sessions_per_uid,
                               " sessions open, the most ferryd allows one user "
                               "(max_sessions_per_uid); close idle clients")
                : absl::StrCat("ferryd has ", limits_.max_sessions,
                               " sessions open, the most it allows (max_sessions); try again "
                               "later");
    FERRY_LOG_EVERY_N_SEC(WARNING, 10) << "refused a session of pid " << peer->pid << ": " << why;
    Refuse(std::move(fd), why);
    return true;
  }
  ++mine;
  if (!administrator) ++user_sessions_;
  Session session{std::move(fd), *peer, RandomHex(16), administrator};
  // Known before the client can learn it: its first RPC may race this thread.
  {
    absl::MutexLock lock(&mutex_);
    by_token_[session.token] = Known{session.peer, absl::Now()};
  }
  const int key = session.fd.get();
  const std::string hello = absl::StrCat("HELLO ", session.token, " ", getpid());
  sessions_.emplace(key, std::move(session));
  if (!SendPacket(key, hello).ok()) Close(key);
  return true;
}

bool SessionServer::Sent(int fd, const absl::Status& sent) {
  if (sent.ok()) return true;
  if (absl::IsResourceExhausted(sent)) {  // the socket is full: answers pile up unread
    FERRY_LOG(WARNING) << "closing the session of pid " << sessions_.at(fd).peer.pid
                       << ": its answer could not be sent (" << sent.message()
                       << "); a client must read the answer to each request before the next";
  } else if (absl::IsUnavailable(sent)) {  // the client went away mid-request
    FERRY_LOG(INFO) << "the session of pid " << sessions_.at(fd).peer.pid
                    << " ended: its answer could not be sent (" << sent.message() << ")";
  } else {
    FERRY_LOG(WARNING) << "closing the session of pid " << sessions_.at(fd).peer.pid
                       << ": its answer could not be sent (" << sent.message() << ")";
  }
  return false;
}

bool SessionServer::Serve(int fd) {
  auto message = RecvPacket(fd);
  if (!message.ok()) return false;  // closed or broken: the session ends
  const Session& session = sessions_.at(fd);
  {
    absl::MutexLock lock(&mutex_);
    auto known = by_token_.find(session.token);
    if (known != by_token_.end()) known->second.active = absl::Now();
  }
  if (absl::StartsWith(*message, "FD ")) {
    const std::string attach_id = message->substr(3);
    auto provided = fd_provider_(session.peer, attach_id);
    if (!provided.ok()) {
      return Sent(fd, SendPacket(fd, absl::StrCat("ERR ", provided.status().ToString())));
    }
    return Sent(fd, SendPacket(fd, absl::StrCat("OK ", provided->second), provided->first));
  }
  if (absl::StartsWith(*message, "CHANNEL ")) return ServeChannel(fd, message->substr(8));
  return Sent(fd, SendPacket(fd, absl::StrCat("ERR unknown request '", message->substr(0, 32),
                                              "'; expected 'FD <attach_id>' or 'CHANNEL "
                                              "<attach_id>'")));
}

bool SessionServer::ServeChannel(int fd, const std::string& attach_id) {
  const Session& session = sessions_.at(fd);
  {
    absl::MutexLock lock(&mutex_);
    const auto it = waiting_channels_.find(session.token);
    const size_t mine = it == waiting_channels_.end() ? 0 : it->second.size();
    const bool refetch = mine > 0 && it->second.contains(attach_id);  // replaces, adds none
    const auto uid_count = waiting_per_uid_.find(session.peer.uid);
    const size_t users = uid_count == waiting_per_uid_.end() ? 0 : uid_count->second;
    if (!refetch && (mine >= kMaxWaitingChannelsPerSession || users >= kMaxWaitingChannelsPerUid)) {
      const std::string holder =
          mine >= kMaxWaitingChannelsPerSession
              ? absl::StrCat("this session holds ", kMaxWaitingChannelsPerSession)
              : absl::StrCat("the sessions of uid ", session.peer.uid, " hold ",
                             kMaxWaitingChannelsPerUid);
      return Sent(fd,
                  SendPacket(fd, absl::StrCat("ERR ", holder,
                                              " batch channels that no Consume stream opened; open "
                                              "a stream (Open.channel) before fetching more")));
    }
  }
  absl::StatusOr<std::unique_ptr<BatchChannel>> made = channel_factory_(session.peer, attach_id);
  if (!made.ok()) {
    return Sent(fd, SendPacket(fd, absl::StrCat("ERR ", made.status().ToString())));
  }
  std::shared_ptr<BatchChannel> channel = *std::move(made);
  // Waiting before the client can learn of it: its Open may race this thread. A second
  // fetch for the same attachment replaces the first (whose stream never opened).
  {
    absl::MutexLock lock(&mutex_);
    auto& mine = waiting_channels_[session.token];
    if (mine.insert_or_assign(attach_id, channel).second) CountWaiting(session.peer.uid, 1);
  }
  const bool sent =
      Sent(fd, SendPacket(fd, absl::StrCat("OK ", channel->bytes()), channel->HandoverFds()));
  // ferryd keeps its mapping and its own wake sockets; the trainer's fds are its now.
  channel->DropHandoverFds();
  return sent;
}

void SessionServer::CloseIdleSessions(absl::Time now) {
  std::vector<int> idle;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [fd, session] : sessions_) {
      auto known = by_token_.find(session.token);
      if (known == by_token_.end() || now - known->second.active < limits_.idle_timeout) continue;
      if (waiting_channels_.contains(session.token)) continue;
      idle.push_back(fd);
    }
  }
  for (int fd : idle) {
    const Session& session = sessions_.at(fd);
    if (in_use_ != nullptr && in_use_(session.peer)) continue;
    pollfd pending{fd, POLLIN, 0};
    if (poll(&pending, 1, 0) != 0) continue;  // a request came: it is served first
    FERRY_LOG(INFO) << "closing the session of pid " << session.peer.pid << " (uid "
                    << session.peer.uid << "): idle for "
                    << absl::FormatDuration(limits_.idle_timeout)
                    << " with no consumer attached (session_idle_timeout_seconds)";
    (void)SendPacket(fd, absl::StrCat("BYE idle for ", absl::FormatDuration(limits_.idle_timeout),
                                      " with no consumer attached; open a new session"));
    Close(fd);
  }
}

}  // namespace ferry
