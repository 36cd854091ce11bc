"""ferryd out of file descriptors (a local user opens more idle connections than its
RLIMIT_NOFILE allows): while they are open it stays up, and once they close it answers
again. gRPC's own listener stopped accepting for good after one EMFILE; ferryd's acceptor
sheds the waiting connections and recovers."""

import resource
import socket
import subprocess
import time
import unittest

import ferry_it

LIMIT = 256


def low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


class FdExhaustionTest(unittest.TestCase):
    def test_ferryd_answers_again_after_running_out_of_descriptors(self):
        daemon = ferry_it.FerryDaemon(preexec_fn=low_fd_limit)
        self.addCleanup(daemon.stop)
        idle = []
        deadline = time.monotonic() + 20
        while len(idle) < LIMIT + 44 and time.monotonic() < deadline:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            if s.connect_ex(daemon.address) == 0:  # accepted, shed or waiting: held open
                idle.append(s)
            else:  # the listen backlog is full for now
                s.close()
                time.sleep(0.001)
        out_of_fds = ferry_it.poll(lambda: any(
            m in daemon.log() for m in ("out of file descriptors", "Too many open files")), 20)
        self.assertTrue(out_of_fds, "ferryd never ran out of descriptors; log:\n%s" % daemon.log())
        self.assertIsNone(daemon.process.poll(), daemon.log())
        for s in idle:
            s.close()
        def answers():
            try:
                return ferry_it.run_ferryctl(daemon.address, "--json", "status",
                                             timeout=5).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        answered = ferry_it.poll(answers, 30)
        self.assertTrue(answered, "ferryctl status got no answer after the connections closed; "
                        "log:\n%s" % daemon.log())
        self.assertEqual(ferry_it.ferryctl(daemon.address, "status")["daemon"]["pid"],
                         daemon.pid)


if __name__ == "__main__":
    unittest.main()
