"""This user's on-demand ferryd, for processes that found no daemon running.

When no ferryd answers at the default socket ($XDG_RUNTIME_DIR/ferry/ferryd.sock, else
/tmp/ferry-<uid>/ferryd.sock), the Loader starts one there, so that every process of the user
on this machine (the 8 ranks of a torchrun job, a notebook, a second run) shares it. Starting
is serialised by flock(2) on the socket's directory: the first process starts ferryd and the
others, blocked on the lock, find it answering. The daemon belongs to no process: it exits by
itself once no client has been connected and no consumer attached for a grace period
(FERRY_DAEMON_IDLE_SECONDS, default 30; DaemonConfig.exit_when_idle_seconds) and then
removes its sockets and the directory (remove_socket_directory), so nothing is left behind
whichever process exits first, and however (SIGKILL included). Its log is
$XDG_CACHE_HOME/ferry/ferryd-<host>.log (~/.cache/...), outside /tmp.
"""

import errno
import fcntl
import glob
import os
import shutil
import socket
import subprocess
import time

from ferry.errors import FerryError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def find_binary(environ=None, package_dir=_PACKAGE_DIR, system_dirs=("/usr/sbin",)):
    """Path of ferryd: $FERRY_DAEMON, then the one bundled in this package (ferry/_bin/, by
    a pip install from a ferry build), then PATH and `system_dirs` (where the ferryd package
    puts it), then a build tree (the one this package was copied into, or <repo>/build*/ of
    the source checkout). Raises FerryError(NOT_FOUND) saying where it looked."""
    environ = os.environ if environ is None else environ
    looked = []
    explicit = environ.get("FERRY_DAEMON")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise FerryError("NOT_FOUND", "$FERRY_DAEMON is '%s', which is not an executable file"
                         % explicit)
    looked.append("$FERRY_DAEMON (unset)")
    bundled = os.path.join(package_dir, "_bin", "ferryd")
    if os.access(bundled, os.X_OK):
        return bundled
    looked.append("the package (%s)" % bundled)
    found = shutil.which("ferryd", path=":".join([environ.get("PATH", os.defpath)] +
                                                 list(system_dirs)))
    if found:
        return found
    looked.append("PATH" + "".join(" and " + d for d in system_dirs))
    # <build>/python/ferry -> <build>/server/ferryd
    build = os.path.dirname(os.path.dirname(package_dir))
    tree = [os.path.join(build, "server", "ferryd")]
    # <repo>/client/python/ferry -> <repo>/build*/server/ferryd
    repo = os.path.dirname(os.path.dirname(os.path.dirname(package_dir)))
    tree += sorted(glob.glob(os.path.join(repo, "build*", "server", "ferryd")),
                   key=os.path.getmtime, reverse=True)
    for path in tree:
        if os.access(path, os.X_OK):
            return path
    looked.append("build trees (%s)" % ", ".join(tree))
    raise FerryError("NOT_FOUND", "no ferryd binary to start a daemon; looked in "
                     + "; ".join(looked) + ". Install ferry or set FERRY_DAEMON")


def idle_seconds(environ=None):
    """How long an on-demand ferryd outlives its last client."""
    environ = os.environ if environ is None else environ
    value = environ.get("FERRY_DAEMON_IDLE_SECONDS", "30")
    try:
        seconds = int(value)
    except ValueError:
        seconds = -1
    if seconds < 1:
        raise FerryError("INVALID_ARGUMENT", "FERRY_DAEMON_IDLE_SECONDS must be a whole number "
                         "of seconds >= 1 (got %r)" % value)
    return seconds


def log_path(environ=None):
    """Where an on-demand ferryd writes its log: one file per host (home may be shared)."""
    environ = os.environ if environ is None else environ
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "ferry", "ferryd-%s.log" % socket.gethostname())


def on_demand_address(environ=None):
    """Where this user's on-demand ferryd listens: $XDG_RUNTIME_DIR/ferry/ferryd.sock, else
    /tmp/ferry-<uid>/ferryd.sock (the default socket of a user other than root; root's
    default is the system daemon's, which an on-demand daemon must not pose as)."""
    environ = os.environ if environ is None else environ
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "ferry", "ferryd.sock")
    return "/tmp/ferry-%d/ferryd.sock" % os.geteuid()


def running(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _tail(path, limit=2000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _answers(address):
    """The daemon's pid when a ferryd answers GetStatus at `address`, else None. Other
    errors (another user's daemon, a squatted directory) are raised."""
    from ferry.client import Client  # late: needs libferry
    try:
        with Client(address) as client:
            client.status()  # the session socket opens first: wait for the gRPC server too
            return client.daemon_pid
    except FerryError as e:
        if e.code in ("NOT_FOUND", "UNAVAILABLE", "DEADLINE_EXCEEDED"):
            return None
        raise


def _session_socket(address):
    """ferryd's session socket beside `address` (common/session_protocol.h)."""
    return address[:-5] + ".session.sock" if address.endswith(".sock") else address + ".session"


def _session_socket_accepts(address):
    """Whether a ferryd holds `address`'s session socket (connect succeeds): one that is
    starting or, after its idle time, draining, which answers no status meanwhile."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(_session_socket(address))
            return True
        except OSError:
            return False


class _DirectoryLock:
    """flock(2) on the socket directory, held while a process checks for and starts the
    daemon. The directory may be removed by an exiting daemon (which takes the lock first,
    without waiting) and made again: the lock is good only while the path still names the
    directory locked, which acquire() checks, retrying otherwise."""

    def __init__(self, directory, timeout):
        self.directory = directory
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
            except FileExistsError:
                pass  # not a directory, or one an exiting daemon removed: open() below says
            except OSError as e:
                raise FerryError("PERMISSION_DENIED", "cannot create ferryd's socket directory "
                                 "%s: %s; set FERRY_ADDRESS or XDG_RUNTIME_DIR"
                                 % (self.directory, e.strerror))
            try:
                # O_NOFOLLOW: a link in its place (another user's) is no directory of ours.
                fd = os.open(self.directory,
                             os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue  # removed between the two calls
            except OSError as e:
                raise FerryError("PERMISSION_DENIED", "ferryd's socket directory %s is not a "
                                 "directory (%s): another user may have put a link there; "
                                 "remove it, or set FERRY_ADDRESS or XDG_RUNTIME_DIR"
                                 % (self.directory, e.strerror))
            # Before waiting for its lock or writing into it: the directory must be this
            # user's and writable by nobody else, or another user could hold the lock (and
            # make this process wait) or swap what is written there for links.
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                os.close(fd)
                raise FerryError("PERMISSION_DENIED", "ferryd's socket directory %s belongs to "
                                 "uid %d (you are uid %d) or is writable by others (mode %o): "
                                 "another user may have made it to receive your jobs. Remove it "
                                 "(as its owner or root), or set FERRY_ADDRESS or "
                                 "XDG_RUNTIME_DIR" % (self.directory, st.st_uid, os.geteuid(),
                                                      st.st_mode & 0o7777))
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        os.close(fd)
                        raise
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise FerryError("DEADLINE_EXCEEDED", "another process held the lock on %s "
                                     "for %.0f s while starting ferryd" % (self.directory,
                                                                           self.timeout))
                time.sleep(0.02)
            try:
                same = os.stat(self.directory).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)  # locked a directory that is gone: lock the new one

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock


def _open_log(log):
    """The log opened for appending, never through a link; None when it cannot be."""
    try:
        os.makedirs(os.path.dirname(log), mode=0o700, exist_ok=True)
        return os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
    except OSError:
        return None


def _start(binary, address, idle, timeout, directory_fd):
    """Starts ferryd on `address` (the lock is held on its directory, `directory_fd`, which
    belongs to this user) and waits until it answers."""
    directory = os.path.dirname(address)
    config = os.path.join(directory, "ferryd.conf")
    # Written through the directory's descriptor, never through a link: a leftover (or a
    # planted) ferryd.conf is removed first (unlink removes a link, not what it names).
    try:
        os.unlink("ferryd.conf", dir_fd=directory_fd)
    except FileNotFoundError:
        pass
    fd = os.open("ferryd.conf", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                 os.O_CLOEXEC, 0o600, dir_fd=directory_fd)
    with os.fdopen(fd, "w") as f:
        # Only this user can reach it. A daemon not on the system socket may read any
        # dataset path its user can (it reads nothing the user could not read anyway).
        f.write("unix_socket_mode: 384  # 0600\n"
                "exit_when_idle_seconds: %d\n"
                "remove_socket_directory: true\n" % idle)
    log = log_path()
    log_fd = _open_log(log)
    if log_fd is None:
        log = None
    # Started through sh in the background, so that it is nobody's child (no zombie in a
    # trainer that outlives it) and in a session of its own (a trainer's Ctrl-C or kill is
    # not for it). Its output goes to the log opened above (sh's stdout; not reopened by
    # path); sh reports ferryd's pid on its stderr.
    out = log_fd if log_fd is not None else os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        launched = subprocess.run(
            ["/bin/sh", "-c", '"$@" </dev/null 2>&1 & echo $! >&2', "sh",
             binary, "--config", config, "--listen", address],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
    finally:
        os.close(out)
    try:
        child = int(launched.stderr.strip())
    except ValueError:
        raise FerryError("UNAVAILABLE", "could not start ferryd (%s): %s"
                         % (binary, launched.stderr.strip()))
    try:
        deadline = time.monotonic() + timeout
        while True:
            pid = _answers(address)
            if pid is not None:
                return pid
            if not running(child):
                raise FerryError("UNAVAILABLE", "ferryd (%s, pid %d) exited before answering "
                                 "on %s; its log (%s) ends with:\n%s"
                                 % (binary, child, address, log, _tail(log) if log else ""))
            if time.monotonic() > deadline:
                os.kill(child, 9)
                raise FerryError("DEADLINE_EXCEEDED", "ferryd (%s) did not answer on %s within "
                                 "%.0f s; its log (%s) ends with:\n%s"
                                 % (binary, address, timeout, log, _tail(log) if log else ""))
            time.sleep(0.05)
    finally:
        try:
            # Read at start; ferryd.conf must not outlive the daemon.
            os.unlink("ferryd.conf", dir_fd=directory_fd)
        except FileNotFoundError:
            pass


class OnDemandDaemon:
    """The user's shared ferryd a Loader uses: where it listens, its pid, its log."""

    def __init__(self, address, pid, started):
        self.address = address
        self.pid = pid
        self.started = started  # this process started it
        self.log_path = log_path()

    def describe_exit(self):
        """'' while it runs, else that it is gone and where its log is."""
        if running(self.pid):
            return ""
        return "the on-demand ferryd (pid %d) is gone; its log: %s" % (self.pid, self.log_path)


def ensure(address, timeout=None):
    """The on-demand ferryd at `address` (the default socket), started if none answers."""
    if timeout is None:
        timeout = float(os.environ.get("FERRY_DAEMON_TIMEOUT", "60"))
    pid = _answers(address)
    if pid is not None:
        return OnDemandDaemon(address, pid, started=False)
    binary = find_binary()
    idle = idle_seconds()
    with _DirectoryLock(os.path.dirname(address), timeout) as lock:
        # Another process may have started it meanwhile. A daemon that holds the socket but
        # does not answer is starting, or stopping after its idle time: a second one would
        # be refused the socket, so wait until it answers or is gone.
        deadline = time.monotonic() + timeout
        while True:
            pid = _answers(address)
            if pid is not None:
                return OnDemandDaemon(address, pid, started=False)
            if not _session_socket_accepts(address) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return OnDemandDaemon(address, _start(binary, address, idle, timeout, lock.fd),
                              started=True)
