"""A private ferryd for a process that found no daemon running.

One per Python process, shared by all Loaders of that process (reference counted). It
listens on a socket in a fresh 0700 temporary directory, so only this user can reach it,
and it is stopped (SIGTERM, then wait) when the last Loader using it closes, at interpreter
exit, and by the kernel when this process dies (PR_SET_PDEATHSIG). The death signal is tied
to the thread that started the daemon: create the first Loader from a thread that lives as
long as the training does (normally the main thread).
"""

import atexit
import ctypes
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from ferry.errors import FerryError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PR_SET_PDEATHSIG = 1


def find_binary(environ=None, package_dir=_PACKAGE_DIR):
    """Path of ferryd: $FERRY_DAEMON, then the one bundled in this package (ferry/_bin/, by
    a pip install from a ferry build), then PATH (and /usr/sbin), then a build tree (the one
    this package was copied into, or <repo>/build*/ of the source checkout). Raises
    FerryError(NOT_FOUND) saying where it looked."""
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
    found = shutil.which("ferryd", path=environ.get("PATH", os.defpath) + ":/usr/sbin")
    if found:
        return found
    looked.append("PATH and /usr/sbin")
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
    raise FerryError("NOT_FOUND", "no ferryd binary to start a private daemon; looked in "
                     + "; ".join(looked) + ". Install ferry or set FERRY_DAEMON")


def _tail(path, limit=2000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


class PrivateDaemon:
    """A ferryd child process. Use acquire()/release() (module functions)."""

    def __init__(self, binary, timeout):
        base = tempfile.gettempdir()
        if len(base) > 60:  # Unix socket paths are limited to 107 bytes
            base = "/tmp"
        self.dir = tempfile.mkdtemp(prefix="ferry-", dir=base)
        self.address = os.path.join(self.dir, "ferryd.sock")
        self.log_path = os.path.join(self.dir, "ferryd.log")
        config = os.path.join(self.dir, "ferryd.conf")
        with open(config, "w") as f:
            # Only this user can reach it. ferryd lets a daemon on a non-system socket read
            # any dataset path (it reads only what its user could read anyway).
            f.write("unix_socket_mode: 384  # 0600\n")
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
        parent = os.getpid()

        def die_with_parent():  # runs in the child between fork and exec
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

        self.binary = binary
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [binary, "--config", config, "--listen", self.address],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                start_new_session=True,  # a terminal's Ctrl-C is for the trainer, not ferryd
                preexec_fn=die_with_parent)
        self.users = 0
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout):
        from ferry.client import Client  # late: needs libferry
        deadline = time.monotonic() + timeout
        last = None
        while True:
            code = self.process.poll()
            if code is not None:
                raise FerryError("UNAVAILABLE", "private ferryd (%s) exited with code %d before "
                                 "answering; its output ends with:\n%s"
                                 % (self.binary, code, _tail(self.log_path)))
            try:
                # GetStatus, not just the session socket: ferryd opens that one first.
                with Client(self.address) as client:
                    client.status()
                return
            except FerryError as e:
                last = e
            if time.monotonic() > deadline:
                raise FerryError("DEADLINE_EXCEEDED",
                                 "private ferryd (%s) did not answer on %s within %.0f s (%s); "
                                 "its output ends with:\n%s"
                                 % (self.binary, self.address, timeout, last,
                                    _tail(self.log_path)))
            time.sleep(0.05)

    def describe_exit(self):
        """'' while running, else how it ended and the tail of its output."""
        try:
            # Its sockets close before the kernel reports it dead: give that a moment.
            code = self.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return ""
        return "private ferryd exited with code %d; its output ends with:\n%s" % (
            code, _tail(self.log_path))

    def stop(self, timeout=15.0):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_lock = threading.Lock()
_daemon = None


def acquire(timeout=None):
    """The process's private daemon, started if needed; pair with release()."""
    global _daemon
    if timeout is None:
        timeout = float(os.environ.get("FERRY_DAEMON_TIMEOUT", "60"))
    with _lock:
        if _daemon is not None and _daemon.process.poll() is not None:
            _daemon.stop()
            _daemon = None
        if _daemon is None:
            _daemon = PrivateDaemon(find_binary(), timeout)
        _daemon.users += 1
        return _daemon


def release(daemon):
    global _daemon
    with _lock:
        daemon.users -= 1
        if daemon.users > 0:
            return
        if _daemon is daemon:
            _daemon = None
    daemon.stop()


@atexit.register
def _stop_at_exit():
    global _daemon
    with _lock:
        daemon, _daemon = _daemon, None
    if daemon is not None:
        daemon.stop()
