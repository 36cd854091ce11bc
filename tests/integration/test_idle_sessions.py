"""Idle client sessions time out (session_idle_timeout_seconds): ferryd closes a session
that sent nothing and has no consumer attached, and the client library opens a new one
when it is next used, so the caller never sees it. A trainer that consumes slowly (longer
between batches than the timeout) keeps its session."""

import os
import time
import unittest

import ferry
import ferry_it


def closed_sessions(daemon):
    return daemon.log().count("closing the session of pid %d " % os.getpid())


class IdleSessionsTest(unittest.TestCase):
    def test_an_idle_session_is_closed_and_the_client_opens_another(self):
        daemon = ferry_it.FerryDaemon(config="session_idle_timeout_seconds: 1\n")
        self.addCleanup(daemon.stop)
        client = ferry.Client(daemon.address)
        self.addCleanup(client.close)
        self.assertEqual(client.status()["daemon"]["pid"], daemon.pid)
        # What this ferryd understands, for clients of other versions (kDaemonProtocol).
        self.assertEqual(client.status()["daemon"]["protocol"], 3)
        self.assertTrue(ferry_it.poll(lambda: closed_sessions(daemon) >= 1, 20),
                        "the idle session was never closed; log:\n%s" % daemon.log())
        # The next call goes through on a new session.
        self.assertEqual(client.status()["daemon"]["pid"], daemon.pid)
        self.assertEqual(client.daemon_pid, daemon.pid)
        client.close()

        # A slow consumer (3 s between batches, the timeout 1 s) keeps its session.
        loader = ferry_it.tokens_loader(daemon, 1 << 12, seq_len=64, batch_size=16)
        self.addCleanup(loader.close)
        before = closed_sessions(daemon)
        seen = []
        for batch in loader:
            seen += [int(i) for i in batch["index"]]
            if len(seen) <= 32:
                time.sleep(3)
        self.assertEqual(sorted(seen), list(range(((1 << 12) - 1) // 64)))
        self.assertEqual(closed_sessions(daemon), before,
                         "a consuming trainer's session was closed; log:\n%s" % daemon.log())


if __name__ == "__main__":
    unittest.main()
