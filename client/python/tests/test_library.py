"""Library discovery, the C ABI binding, and the errors for a missing daemon."""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import ferry
from ferry import _daemon, _lib


class DiscoveryTest(unittest.TestCase):
    def test_env_variable_wins_and_is_the_only_candidate(self):
        found = _lib.candidates({"FERRY_LIBRARY": "/x/libferry.so"}, "/pkg/ferry")
        self.assertEqual(found, [("/x/libferry.so", "$FERRY_LIBRARY")])

    def test_order_package_then_build_tree_then_linker(self):
        with tempfile.TemporaryDirectory() as repo:
            package = os.path.join(repo, "client", "python", "ferry")
            built = os.path.join(repo, "build-x", "client", "c")
            os.makedirs(built)
            open(os.path.join(built, "libferry.so"), "w").close()
            found = _lib.candidates({}, package)
        self.assertEqual([how for _, how in found], ["package", "build tree", "dynamic linker"])
        self.assertEqual(found[0][0], os.path.join(package, "_lib", "libferry.so"))
        self.assertTrue(found[1][0].endswith("build-x/client/c/libferry.so"))
        self.assertEqual(found[2][0], "libferry.so.1")

    def test_missing_env_library_is_a_clear_error(self):
        # A fresh interpreter: the library must not be loaded already.
        code = ("import ferry\n"
                "try:\n"
                "    ferry.Client('/tmp/x.sock')\n"
                "except ferry.FerryError as e:\n"
                "    print(e.code); print(e.message)\n")
        env = dict(os.environ, FERRY_LIBRARY="/nonexistent/libferry.so")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        self.assertIn("NOT_FOUND", out)
        self.assertIn("/nonexistent/libferry.so ($FERRY_LIBRARY): not found", out)
        self.assertIn("set FERRY_LIBRARY", out)

    def test_loaded_library_matches_the_abi(self):
        lib = _lib.load()
        self.assertEqual(lib.ferry_abi_version(), _lib.ABI_VERSION)
        self.assertTrue(os.path.exists(_lib.path()) or _lib.path().startswith("libferry"))


class MissingDaemonTest(unittest.TestCase):
    def test_client_error_names_the_socket_and_the_fix(self):
        with tempfile.TemporaryDirectory() as d:
            address = os.path.join(d, "ferryd.sock")
            with self.assertRaises(ferry.FerryError) as cm:
                ferry.Client(address)
        e = cm.exception
        self.assertIsInstance(e, RuntimeError)
        self.assertEqual(e.code, "NOT_FOUND")
        self.assertEqual(e.code_value, 5)
        self.assertIn("no ferryd at %s" % address, e.message)
        self.assertIn("start one with 'ferryd' (per-user) or 'systemctl start ferryd'",
                      e.message)
        self.assertTrue(str(e).startswith("NOT_FOUND: "))

    def test_loader_with_an_explicit_address_does_not_start_a_daemon(self):
        with tempfile.TemporaryDirectory() as d:
            address = os.path.join(d, "ferryd.sock")
            with self.assertRaises(ferry.FerryError) as cm:
                ferry.Loader(ferry.Tokens("/t.bin", seq_len=4), batch_size=2, address=address)
            self.assertEqual(os.listdir(d), [])  # no daemon was started there
        self.assertEqual(cm.exception.code, "NOT_FOUND")

    def test_default_address_follows_xdg_runtime_dir(self):
        code = "import ferry; print(ferry.default_address())"
        env = dict(os.environ, XDG_RUNTIME_DIR="/run/user/4242")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        if os.geteuid() == 0:
            self.assertEqual(out, "/run/ferry/ferryd.sock")
        else:
            self.assertEqual(out, "/run/user/4242/ferry/ferryd.sock")


class SquattedDirectoryTest(unittest.TestCase):
    """Another user made this user's on-demand socket directory first (/tmp/ferry-<uid> is
    guessable), with ferryd.conf a link to a file of the victim's: the Loader refuses the
    directory at once, naming its owner, and writes nothing through the link."""

    @unittest.skipUnless(os.geteuid() == 0, "needs root to make a directory another uid owns")
    def test_a_directory_of_another_uid_is_refused_before_anything_is_written(self):
        nobody = 65534
        with tempfile.TemporaryDirectory() as d:
            victim = os.path.join(d, "victim.txt")
            with open(victim, "w") as f:
                f.write("precious\n")
            squatted = os.path.join(d, "ferry")
            os.mkdir(squatted, 0o777)
            os.symlink(victim, os.path.join(squatted, "ferryd.conf"))
            os.chown(squatted, nobody, nobody)
            os.lchown(os.path.join(squatted, "ferryd.conf"), nobody, nobody)
            start = time.monotonic()
            with self.assertRaises(ferry.FerryError) as cm:
                _daemon.ensure(os.path.join(squatted, "ferryd.sock"), timeout=30)
            self.assertLess(time.monotonic() - start, 5)  # no wait for a squatter's lock
            self.assertEqual(cm.exception.code, "PERMISSION_DENIED")
            self.assertIn("belongs to uid %d" % nobody, cm.exception.message)
            with open(victim) as f:
                self.assertEqual(f.read(), "precious\n")

    def test_a_link_in_place_of_the_directory_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "elsewhere"), 0o700)
            os.symlink(os.path.join(d, "elsewhere"), os.path.join(d, "ferry"))
            with self.assertRaises(ferry.FerryError) as cm:
                _daemon.ensure(os.path.join(d, "ferry", "ferryd.sock"), timeout=30)
            self.assertEqual(cm.exception.code, "PERMISSION_DENIED")
            self.assertIn("is not a directory", cm.exception.message)
            self.assertEqual(os.listdir(os.path.join(d, "elsewhere")), [])


class ExitingDaemonTest(unittest.TestCase):
    """A daemon stopping after its idle time still holds its session socket for a while,
    answering nothing: a Loader made then waits for it to go and starts the next one (a
    ferryd started at once was refused the socket and the Loader failed)."""

    def test_the_next_daemon_starts_once_the_exiting_one_is_gone(self):
        with tempfile.TemporaryDirectory() as d:
            directory = os.path.join(d, "ferry")
            os.mkdir(directory, 0o700)
            address = os.path.join(directory, "ferryd.sock")
            exiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            exiting.bind(os.path.join(directory, "ferryd.session.sock"))
            exiting.listen(16)
            started = []
            gone = threading.Event()

            def start(binary, address, idle, timeout, directory_fd):
                started.append(gone.is_set())
                return 4242

            def go():
                time.sleep(0.5)
                gone.set()
                exiting.close()
                os.unlink(os.path.join(directory, "ferryd.session.sock"))

            saved = (_daemon._answers, _daemon._start, _daemon.find_binary)
            _daemon._answers = lambda address: None
            _daemon._start = start
            _daemon.find_binary = lambda: "ferryd"
            stopper = threading.Thread(target=go)
            try:
                stopper.start()
                daemon = _daemon.ensure(address, timeout=10)
            finally:
                stopper.join()
                _daemon._answers, _daemon._start, _daemon.find_binary = saved
            self.assertEqual(started, [True], "a ferryd was started while the exiting one "
                             "held the socket")
            self.assertEqual(daemon.pid, 4242)
            self.assertTrue(daemon.started)


class DirectoryLockTest(unittest.TestCase):
    """The socket directory is removed by an exiting daemon and made again by the next
    process that starts one; taking its lock copes with either at any moment."""

    def test_a_directory_removed_during_makedirs_is_made_again(self):
        with tempfile.TemporaryDirectory() as d:
            directory = os.path.join(d, "ferry")
            os.mkdir(directory, 0o700)
            real = os.makedirs
            calls = []

            def racing_makedirs(name, mode=0o777, exist_ok=False):
                calls.append(name)
                if len(calls) == 1:
                    # mkdir found it; the exiting daemon removed it before makedirs looked.
                    os.rmdir(name)
                    raise FileExistsError(17, "File exists", name)
                return real(name, mode, exist_ok)

            _daemon.os.makedirs = racing_makedirs
            try:
                with _daemon._DirectoryLock(directory, timeout=5) as lock:
                    self.assertTrue(os.path.isdir(directory))
                    self.assertEqual(os.fstat(lock.fd).st_ino, os.stat(directory).st_ino)
            finally:
                _daemon.os.makedirs = real
            self.assertEqual(len(calls), 2)

    def test_a_file_in_place_of_the_directory_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            directory = os.path.join(d, "ferry")
            with open(directory, "w"):
                pass
            with self.assertRaises(ferry.FerryError) as cm:
                with _daemon._DirectoryLock(directory, timeout=5):
                    pass
            self.assertEqual(cm.exception.code, "PERMISSION_DENIED")
            self.assertIn("is not a directory", cm.exception.message)


class DaemonBinaryTest(unittest.TestCase):
    def test_env_variable_must_be_executable(self):
        with self.assertRaisesRegex(ferry.FerryError, "FERRY_DAEMON is '/nope/ferryd'"):
            _daemon.find_binary({"FERRY_DAEMON": "/nope/ferryd"})

    def test_not_found_says_where_it_looked(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(ferry.FerryError) as cm:
                # No system directory: an installed ferryd package must not answer here.
                _daemon.find_binary({"PATH": d}, os.path.join(d, "python", "ferry"),
                                    system_dirs=())
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIn("PATH", cm.exception.message)
        self.assertIn(os.path.join(d, "server", "ferryd"), cm.exception.message)
        self.assertIn("set FERRY_DAEMON", cm.exception.message)

    def test_build_tree_binary_is_found(self):
        with tempfile.TemporaryDirectory() as d:
            binary = os.path.join(d, "server", "ferryd")
            os.makedirs(os.path.dirname(binary))
            with open(binary, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(binary, 0o755)
            self.assertEqual(
                _daemon.find_binary({"PATH": "/nonexistent"}, os.path.join(d, "python", "ferry"),
                                    system_dirs=()),
                binary)


if __name__ == "__main__":
    unittest.main()
