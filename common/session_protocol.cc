#include "common/session_protocol.h"

#include <errno.h>
#include <pwd.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (err == ENOENT) code = absl::StatusCode::kNotFound;
  // The peer is not there (any more): refused, or gone mid-conversation.
  if (err == ECONNREFUSED || err == EPIPE || err == ECONNRESET) {
    code = absl::StatusCode::kUnavailable;
  }
  if (err == EACCES || err == EPERM) code = absl::StatusCode::kPermissionDenied;
  if (err == EAGAIN || err == EWOULDBLOCK) code = absl::StatusCode::kResourceExhausted;
  return absl::Status(code, absl::StrCat(what, ": ", strerror(err)));
}

absl::StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is longer than ",
                                                   sizeof(addr.sun_path) - 1,
                                                   " bytes; choose a shorter path"));
  }
  memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

}  // namespace

std::string DefaultSocketPath() {
  if (geteuid() == 0) return kSystemSocketPath;
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] != '\0') return absl::StrCat(xdg, "/ferry/ferryd.sock");
  return absl::StrCat("/tmp/ferry-", geteuid(), "/ferryd.sock");
}

std::string SessionSocketPath(const std::string& grpc_socket_path) {
  if (absl::EndsWith(grpc_socket_path, ".sock")) {
    return absl::StrCat(grpc_socket_path.substr(0, grpc_socket_path.size() - 5), ".session.sock");
  }
  return absl::StrCat(grpc_socket_path, ".session");
}

bool IsTrustedDaemonUid(unsigned uid) { return uid == geteuid() || IsSystemDaemonUid(uid); }

bool IsSystemDaemonUid(unsigned uid) {
  if (uid == 0) return true;
  // The system daemon's user (deploy/systemd/ferry.sysusers.conf), looked up once.
  static const long ferry_uid = [] {
    struct passwd pw;
    struct passwd* found = nullptr;
    std::vector<char> buf(16384);
    if (getpwnam_r("ferry", &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
      return -1L;
    }
    return static_cast<long>(pw.pw_uid);
  }();
  return ferry_uid >= 0 && uid == static_cast<unsigned>(ferry_uid);
}

absl::Status CheckSocketDirectory(const std::string& socket_path) {
  const std::filesystem::path parent = std::filesystem::path(socket_path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat('", dir, "')"));
  }
  if (!IsTrustedDaemonUid(st.st_uid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "socket directory '", dir, "' belongs to uid ", st.st_uid, ", not to you (uid ", geteuid(),
        "), root or the ferry user: another user may have made it to receive your "
        "jobs. Remove it (as root, or its owner) or use another socket path (--listen, "
        "FERRY_ADDRESS)"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::PermissionDeniedError(
        absl::StrCat("socket directory '", dir, "' is writable by others (mode ", mode,
                     "): another user could replace ferryd's socket. Run chmod go-w '", dir, "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckDaemonPeer(int sock, const std::string& path) {
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(sock);
  if (!peer.ok()) return peer.status();
  if (IsTrustedDaemonUid(peer->uid)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the ferryd on '", path, "' runs as uid ", peer->uid, ", not as you (uid ", geteuid(),
      "), root or the ferry user; not sending it your jobs. It may be another user's daemon "
      "on your address: stop it, or use another address (FERRY_ADDRESS)"));
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, unsigned mode) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    // Each missing directory 0700: a per-user daemon's runtime directory is its own.
    std::filesystem::path partial;
    for (const auto& part : parent) {
      partial /= part;
      if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(absl::StrCat("cannot create socket directory '",
                                                        partial.string(), "': ", strerror(errno)));
      }
    }
  }
  absl::Status dir_ok = CheckSocketDirectory(path);
  if (!dir_ok.ok()) return dir_ok;
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  // A socket file left by a crashed daemon would make bind fail; if nobody accepts on it,
  // it is stale and safe to replace.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    UniqueFd probe(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("another ferryd is already listening on '", path,
                       "'; stop it (systemctl stop ferryd) or pass --listen with another path"));
    }
    ::unlink(path.c_str());
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind('", path, "')"));
  }
  if (::chmod(path.c_str(), mode) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chmod('", path, "')"));
  }
  if (::listen(fd.get(), 128) != 0) return ErrnoStatus(errno, "listen");
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("connect('", path, "')"));
  }
  return fd;
}

absl::Status SendPacket(int sock, const std::string& message, int fd_to_pass) {
  if (fd_to_pass < 0) return SendPacket(sock, message, absl::Span<const int>());
  return SendPacket(sock, message, absl::Span<const int>(&fd_to_pass, 1));
}

absl::Status SendPacket(int sock, const std::string& message, absl::Span<const int> fds) {
  if (fds.size() > kMaxPassedFds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot pass ", fds.size(), " fds in one packet (at most ", kMaxPassedFds, ")"));
  }
  iovec iov{const_cast<char*>(message.data()), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  if (!fds.empty()) {
    memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "sendmsg on session socket");
  return absl::OkStatus();
}

absl::StatusOr<std::string> RecvPacket(int sock, UniqueFd* received_fd) {
  std::vector<UniqueFd> fds;
  absl::StatusOr<std::string> packet = RecvPacket(sock, &fds);
  if (packet.ok() && received_fd != nullptr && !fds.empty()) *received_fd = std::move(fds[0]);
  return packet;  // fds beyond the first are closed here
}

absl::StatusOr<std::string> RecvPacket(int sock, std::vector<UniqueFd>* received_fds) {
  std::vector<char> buf(64 * 1024);
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "recvmsg on session socket");
  // Every fd that arrived gets an owner before anything can return.
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
  }
  if (n == 0) return absl::UnavailableError("session socket closed by the peer");
  if (received_fds != nullptr) *received_fds = std::move(fds);
  return std::string(buf.data(), static_cast<size_t>(n));
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

}  // namespace ferry
