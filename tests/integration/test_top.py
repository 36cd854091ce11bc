"""`ferryctl top` and `--watch` in a pseudo-terminal against a real ferryd with a trainer
attached: the screen shows the daemon's header and the running rank's row, a resize redraws
it to the new width, q and Ctrl-C quit with status 0 and give the terminal back (raw mode
undone, cursor shown, alternate screen left), and a ferryd that goes away is reported and
retried, not fatal. Without a terminal, top prints one plain snapshot."""

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
import unittest

import numpy as np

import ferry
import ferry_it

ENTER_SCREEN = b"\x1b[?1049h"
LEAVE_SCREEN = b"\x1b[?1049l"
HIDE_CURSOR = b"\x1b[?25l"
SHOW_CURSOR = b"\x1b[?25h"
HOME = b"\x1b[H"
ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def frames(output):
    """The complete frames drawn in `output` (cursor home ... erase below), as lists of
    lines with the escape sequences taken out."""
    out = []
    for chunk in output.split(HOME)[1:]:
        end = chunk.find(b"\x1b[J")
        if end < 0:
            continue  # still being written
        text = ESCAPE.sub(b"", chunk[:end]).decode(errors="replace")
        out.append(text.replace("\r", "").split("\n"))
    return out


class PtyProcess:
    """A process on the slave side of a fresh pseudo-terminal (its controlling terminal,
    rows x cols), its output collected from the master side."""

    def __init__(self, argv, rows=30, cols=120):
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        self.termios_before = termios.tcgetattr(self.slave)
        self.output = b""
        self.process = subprocess.Popen(
            argv, stdin=self.slave, stdout=self.slave, stderr=self.slave,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))

    def resize(self, rows, cols):
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def read(self, timeout):
        """Reads what is there within `timeout` seconds; returns whether anything came."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: no process has the slave open
            return False
        self.output += data
        return bool(data)

    def read_until(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate(self.output):
            if time.monotonic() > deadline:
                last = frames(self.output)
                raise AssertionError("no %s within %g s; last screen:\n%s\nexit status: %s"
                                     % (what, timeout, "\n".join(last[-1]) if last else
                                        self.output[-2000:], self.process.poll()))
            self.read(0.1)

    def send(self, data):
        os.write(self.master, data)

    def wait(self, timeout=20):
        code = self.process.wait(timeout)
        while self.read(0.2):  # what it wrote last
            pass
        return code

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        os.close(self.master)
        os.close(self.slave)


def screen_has(*needles):
    def predicate(output):
        shown = frames(output)
        return bool(shown) and all(any(n in line for line in shown[-1]) for n in needles)
    return predicate


class TopTest(unittest.TestCase):
    def daemon(self):
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        return daemon

    def attached_trainer(self, daemon):
        """A trainer mid-epoch (attached, holding its first batch); returns the job id."""
        path = os.path.join(daemon.dir, "records.bin")
        np.arange(4096, dtype=np.int64).tofile(path)
        loader = ferry.Loader(ferry.Records(path, "int64"), batch_size=16,
                              address=daemon.address, job_name="top-run", as_numpy=True,
                              timeout=60)
        self.addCleanup(loader.close)
        it = iter(loader)
        self.assertEqual(len(next(it)["data"]), 16)
        self.addCleanup(lambda: it)  # keeps the iterator (and its lease) alive
        return loader.job["id"]

    def top(self, daemon, *args, rows=30, cols=120):
        term = PtyProcess([ferry_it.ferryctl_binary(), "--address", daemon.address, "top"]
                          + list(args), rows=rows, cols=cols)
        self.addCleanup(term.close)
        return term

    def assert_terminal_restored(self, term):
        out = term.output
        self.assertTrue(out.startswith(ENTER_SCREEN + HIDE_CURSOR), out[:80])
        last_frame = out.rfind(HOME)
        self.assertGreater(out.rfind(SHOW_CURSOR), last_frame, out[-200:])
        self.assertGreater(out.rfind(LEAVE_SCREEN), last_frame, out[-200:])
        after = termios.tcgetattr(term.slave)
        self.assertEqual(after, term.termios_before, "termios not restored")
        self.assertTrue(after[3] & termios.ICANON and after[3] & termios.ECHO)

    def test_shows_the_running_rank_resizes_and_quits_on_q(self):
        daemon = self.daemon()
        job_id = self.attached_trainer(daemon)
        # A long interval: any redraw within the test comes from a resize, not a refresh.
        term = self.top(daemon, "-n", "60")
        term.read_until(screen_has("ferryd ", "top-run"), 30, "screen with the rank's row")
        screen = frames(term.output)[-1]
        self.assertRegex(screen[0], r"^ferryd \S+  pid %d  up \S+.*  workers \d+ \(\d+%% busy\)"
                         % daemon.pid)
        self.assertTrue(screen[1].startswith("memory: host "), screen)
        row = [line for line in screen if line.startswith(job_id)]
        self.assertEqual(len(row), 1, screen)
        # Samples/s, stall %, stage, queue (ready/slots), leased, ring memory.
        self.assertRegex(row[0], r"^%s\s+top-run\s+0\s+active\s+[\d.]+\s+\d+%%\s+\S+\s+"
                         r"\d+/\d+\s+\d+\s+[\d.]+ [KMG]?i?B$" % re.escape(job_id))
        self.assertTrue(all(len(line) <= 120 for line in screen), screen)

        # A narrower terminal: the next frame fits it (drawn on SIGWINCH).
        drawn = len(frames(term.output))
        term.resize(30, 50)
        term.read_until(
            lambda out: len(frames(out)) > drawn and
            all(len(line) <= 50 for line in frames(out)[-1]) and
            any(line.startswith(job_id[:8]) for line in frames(out)[-1]),
            20, "frame redrawn 50 columns wide")

        term.send(b"q")
        self.assertEqual(term.wait(), 0, term.output[-500:])
        self.assert_terminal_restored(term)

    def test_ctrl_c_quits_and_restores_the_terminal(self):
        daemon = self.daemon()
        self.attached_trainer(daemon)
        term = self.top(daemon, "-n", "0.5")
        term.read_until(screen_has("ferryd ", "top-run"), 30, "screen with the rank's row")
        term.send(b"\x03")  # the line discipline turns it into SIGINT for top
        self.assertEqual(term.wait(), 0, term.output[-500:])
        self.assert_terminal_restored(term)

    def test_sigterm_restores_the_terminal_too(self):
        daemon = self.daemon()
        term = self.top(daemon, "-n", "0.5")
        term.read_until(screen_has("ferryd ", "no jobs"), 30, "screen without jobs")
        term.process.send_signal(signal.SIGTERM)
        self.assertEqual(term.wait(), 128 + signal.SIGTERM, term.output[-500:])
        self.assert_terminal_restored(term)

    def test_a_ferryd_that_goes_away_is_retried_not_fatal(self):
        daemon = self.daemon()
        term = self.top(daemon, "-n", "0.2")
        term.read_until(screen_has("ferryd ", "no jobs"), 30, "first screen")
        daemon.process.kill()
        daemon.process.wait(30)
        term.read_until(screen_has("ferryd unreachable: "), 30, "unreachable notice")
        self.assertIsNone(term.process.poll(), "top exited when ferryd went away")
        # Still retrying a few refreshes later.
        drawn = len(frames(term.output))
        term.read_until(lambda out: len(frames(out)) > drawn + 2, 20, "further refreshes")
        self.assertIsNone(term.process.poll())
        term.send(b"q")
        self.assertEqual(term.wait(), 0, term.output[-500:])
        self.assert_terminal_restored(term)

    def test_watch_redraws_another_command(self):
        daemon = self.daemon()
        job_id = self.attached_trainer(daemon)
        term = PtyProcess([ferry_it.ferryctl_binary(), "--address", daemon.address, "-n", "0.5",
                           "jobs"])
        self.addCleanup(term.close)
        term.read_until(screen_has("every 500ms: ferryctl jobs", job_id), 30, "jobs table")
        screen = frames(term.output)[-1]
        self.assertTrue(screen[1].startswith("ID "), screen)
        drawn = len(frames(term.output))
        term.read_until(lambda out: len(frames(out)) > drawn, 20, "a second refresh")
        term.send(b"q")
        self.assertEqual(term.wait(), 0, term.output[-500:])
        self.assert_terminal_restored(term)

    def test_without_a_terminal_top_prints_one_snapshot(self):
        daemon = self.daemon()
        job_id = self.attached_trainer(daemon)
        proc = ferry_it.run_ferryctl(daemon.address, "top")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("\x1b", proc.stdout)
        lines = proc.stdout.splitlines()
        self.assertTrue(lines[0].startswith("ferryd "), proc.stdout)
        self.assertIn("STALL", proc.stdout)
        self.assertEqual(len([l for l in lines if l.startswith(job_id)]), 1, proc.stdout)
        # -n without a terminal: the command's output once, as without it.
        proc = ferry_it.run_ferryctl(daemon.address, "-n", "1", "jobs")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(proc.stdout.startswith("ID "), proc.stdout)
        for args, message in [(("-n", "0", "top"), "want seconds"),
                              (("--watch", "delete", job_id), "not delete"),
                              (("--once", "jobs"), "--once is for top")]:
            proc = ferry_it.run_ferryctl(daemon.address, *args)
            self.assertEqual(proc.returncode, 2, (args, proc.stderr))
            self.assertIn(message, proc.stderr)

    def test_once_without_a_daemon_fails(self):
        directory = ferry_it.short_tempdir("ferry-it-")
        self.addCleanup(os.rmdir, directory)
        missing = os.path.join(directory, "none.sock")
        proc = ferry_it.run_ferryctl(missing, "top", "--once")
        self.assertEqual(proc.returncode, 1)
        self.assertIn(missing, proc.stderr)


if __name__ == "__main__":
    unittest.main()
