"""Exact resume for the LLM dataset kinds (token_shards, indexed with position_ids and
cu_seqlens, and a blend of those with a flat token file): a trainer killed with -9 and
resumed on the same ferryd, a trainer and ferryd both killed and the job recreated on a
new ferryd, and a trainer that lives through a ferryd restart and goes on by itself. Each
stream is compared with an uninterrupted run by sample index and by a digest of every
field of every row."""

import os
import signal
import sys
import unittest

import numpy as np

import ferry_it
from test_resume_and_nodes import Harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing"))
import megatron_indexed  # noqa: E402

SEQ_LEN = 16
PAUSE = 3  # batches taken before the interruption


class TokenResumeTest(Harness):
    def setUp(self):
        self.daemon = self.make_daemon()
        self.dir = self.daemon.dir
        rng = np.random.default_rng(4)
        for i, n in enumerate((300, 170, 401)):
            rng.integers(0, 2**16, size=n, dtype=np.uint16).astype("<u2").tofile(
                os.path.join(self.dir, "web-%d.bin" % i))
        documents = [[list(rng.integers(0, 2**31 - 1, size=rng.integers(1, 40)))
                      for _ in range(rng.integers(1, 3))] for _ in range(60)]
        megatron_indexed.write_indexed(os.path.join(self.dir, "wiki"), documents,
                                       dtype=np.int32)
        rng.integers(0, 2**16, size=500, dtype=np.uint16).astype("<u2").tofile(
            os.path.join(self.dir, "code.bin"))
        shards = "ferry.TokenShards(%r, %d)" % (os.path.join(self.dir, "web-{0..2}.bin"),
                                                SEQ_LEN)
        indexed = "ferry.IndexedDataset(%r, %d, position_ids=True, cu_seqlens=True)" % (
            os.path.join(self.dir, "wiki"), SEQ_LEN)
        # The blend's sources deliver the same fields: tokens and index.
        blend = ("ferry.Blend([%s, ferry.IndexedDataset(%r, %d), ferry.Tokens(%r, %d)], "
                 "weights=[0.5, 0.3, 0.2], names=['web', 'wiki', 'code'])" % (
                     shards, os.path.join(self.dir, "wiki"), SEQ_LEN,
                     os.path.join(self.dir, "code.bin"), SEQ_LEN))
        self.datasets = {"token_shards": shards, "indexed": indexed, "blend": blend}

    def run_case(self, kind, restart_ferryd):
        dataset = self.datasets[kind]
        tag = "%s-%s" % (kind, "both" if restart_ferryd else "trainer")
        ref = self.finish(*self.worker(self.daemon, None, "ref-" + tag, epochs=[0, 1],
                                       dataset=dataset, job_name="ref-" + tag), "ref-" + tag)
        self.assertGreater(ref["len"], PAUSE + 1)
        victim, before = self.pause(self.daemon, None, "victim-" + tag, PAUSE, epochs=[0, 1],
                                    dataset=dataset, job_name=tag)
        self.assertEqual(before["state"]["batches_done"], PAUSE)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        if restart_ferryd:
            self.daemon.restart(signal.SIGKILL)
        after = self.finish(*self.worker(self.daemon, None, "resumed-" + tag, epochs=[0, 1],
                                         dataset=dataset, resume=before["state"],
                                         job_name=tag), "resumed-" + tag)
        if restart_ferryd:
            self.assertNotEqual(after["job_id"], before["job_id"])
        for key in ("index", "digest"):
            self.assertEqual(self.stream(before, 0, key)[:PAUSE] + self.stream(after, 0, key),
                             self.stream(ref, 0, key), (kind, key))
            self.assertEqual(self.stream(after, 1, key), self.stream(ref, 1, key), (kind, key))
        return ref

    def test_trainer_kill_9_resumes_exactly(self):
        for kind in self.datasets:
            with self.subTest(kind=kind):
                self.run_case(kind, restart_ferryd=False)

    def test_trainer_and_ferryd_kill_9_resume_exactly(self):
        for kind in self.datasets:
            with self.subTest(kind=kind):
                self.run_case(kind, restart_ferryd=True)

    def test_a_blend_goes_on_by_itself_after_ferryd_restarts(self):
        dataset = self.datasets["blend"]
        ref = self.finish(*self.worker(self.daemon, None, "ref", epochs=[0, 1], dataset=dataset,
                                       job_name="ref"), "ref")
        go = os.path.join(self.dir, "survivor.go")
        ready = os.path.join(self.dir, "survivor.ready")
        proc, out = self.worker(self.daemon, None, "survivor", epochs=[0, 1], pause_after=PAUSE,
                                go_file=go, ready_file=ready, dataset=dataset)
        ferry_it.wait_for_file(ready, 60, [proc], "survivor readiness")
        self.daemon.restart(signal.SIGTERM)
        open(go, "w").close()
        result = self.finish(proc, out, "survivor")
        for key in ("index", "digest"):
            for epoch in (0, 1):
                self.assertEqual(self.stream(result, epoch, key), self.stream(ref, epoch, key),
                                 (epoch, key))


if __name__ == "__main__":
    unittest.main()
