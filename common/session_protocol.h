// The session socket: how ferryd learns who is calling and hands shared memory over.
//
// gRPC's C++ server does not expose a call's socket, so SO_PEERCRED cannot be read in an RPC
// handler. ferryd therefore listens on a second Unix socket (SOCK_SEQPACKET) next to the gRPC
// one ("ferryd.sock" -> "ferryd.session.sock"). A client connects to it first; ferryd reads
// the peer's uid/gid/pid with SO_PEERCRED and answers with a random session token. The client
// sends that token as gRPC metadata (kSessionMetadataKey) on every call, and ferryd treats
// the call as coming from the credentials of that session. The session lasts as long as the
// client keeps the connection open. Unix sockets are also the only way to pass a file
// descriptor (the slab's memfd) to another process that may run as another user; that is
// the session socket's second job.
//
// Messages (one datagram each, ASCII):
//   server -> client, on accept:  "HELLO <token> <server pid>"
//   client -> server:             "FD <attach_id>"
//   server -> client:             "OK <slab bytes>" with the memfd attached (SCM_RIGHTS),
//                                 or "ERR <message>"
//   client -> server:             "CHANNEL <attach_id>"
//   server -> client:             "OK <channel bytes>" with the batch channel's memfd and
//                                 the trainer's ends of its to-trainer and to-daemon wake
//                                 sockets attached, in that order (common/batch_channel.h),
//                                 or "ERR <message>"
#ifndef FERRY_COMMON_SESSION_PROTOCOL_H_
#define FERRY_COMMON_SESSION_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"

namespace ferry {

inline constexpr char kSessionMetadataKey[] = "ferry-session";
inline constexpr char kSystemSocketPath[] = "/run/ferry/ferryd.sock";

// What a ferryd understands, for clients of other versions (DaemonStatus.protocol):
//   0 (absent): ferryds before revision 2;
//   2: a GPU job's spec names no GPU (device "cuda"), and each rank names its own when it
//      attaches (AttachRequest.device), so the ranks of a run on different GPUs share the
//      job.
//   3: ResumeEpoch, the rest of an epoch begun on another number of ranks or batch size.
inline constexpr uint32_t kDaemonProtocol = 3;
inline constexpr uint32_t kSharedGpuJobsProtocol = 2;

// Default gRPC socket: /run/ferry/ferryd.sock for root, $XDG_RUNTIME_DIR/ferry/ferryd.sock
// otherwise, /tmp/ferry-<uid>/ferryd.sock when XDG_RUNTIME_DIR is unset.
std::string DefaultSocketPath();

// "…/ferryd.sock" -> "…/ferryd.session.sock"; any other name gets ".session" appended.
std::string SessionSocketPath(const std::string& grpc_socket_path);

// Creates, binds and listens on a Unix socket of `type` (SOCK_STREAM or SOCK_SEQPACKET) at
// `path`, replacing a stale socket file, with file mode `mode`. Creates missing directories
// with mode 0700, then checks the socket's directory with CheckSocketDirectory: a
// directory another user made (squatting /tmp/ferry-<uid>) is refused, so nobody else can
// swap the socket for their own.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, unsigned mode);

// The uids a ferryd may run as and be trusted, by its clients and for its directories:
// root, this process's own, and the system daemon's user `ferry` where it exists.
bool IsTrustedDaemonUid(unsigned uid);

// The uids the system daemon runs as: root, and the user `ferry` where it exists.
bool IsSystemDaemonUid(unsigned uid);

// OK when the directory holding `socket_path` can hold only a trusted daemon's sockets:
// owned by a trusted uid (IsTrustedDaemonUid) and writable by nobody else (group or others
// may write only to a sticky directory). PERMISSION_DENIED names the directory, its owner
// and what to do.
absl::Status CheckSocketDirectory(const std::string& socket_path);

// OK when the peer of connected socket `sock` (the daemon at `path`) runs as a trusted uid;
// PERMISSION_DENIED naming the uid otherwise: a client never sends its jobs to another
// user's daemon.
absl::Status CheckDaemonPeer(int sock, const std::string& path);

// Connects to the Unix socket at `path`. NOT_FOUND / UNAVAILABLE name the path.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type);

inline constexpr size_t kMaxPassedFds = 4;

// Sends one datagram, optionally with file descriptors attached (at most kMaxPassedFds).
absl::Status SendPacket(int sock, const std::string& message, int fd_to_pass = -1);
absl::Status SendPacket(int sock, const std::string& message, absl::Span<const int> fds);

// Receives one datagram (at most 64 KiB). `received_fd`, if not null, takes the first
// attached fd; `received_fds` takes all of them, in order. Fds nobody takes are closed.
// Returns UNAVAILABLE when the peer has closed the connection.
absl::StatusOr<std::string> RecvPacket(int sock, UniqueFd* received_fd = nullptr);
absl::StatusOr<std::string> RecvPacket(int sock, std::vector<UniqueFd>* received_fds);

struct PeerCredentials {
  int pid = 0;
  unsigned uid = 0;
  unsigned gid = 0;
};

// SO_PEERCRED of a connected Unix socket.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock);

}  // namespace ferry

#endif  // FERRY_COMMON_SESSION_PROTOCOL_H_
