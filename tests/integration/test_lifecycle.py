"""Job lifecycle on a shared daemon: idle jobs are deleted after job_idle_timeout_seconds and
their memory returns to the budget, `ferryctl delete` frees a job at once, status shows idle
jobs as idle, and `ferryctl drain` stops new work, lets attached trainers finish, and ferryd
exits 0."""

import os
import subprocess
import unittest

import numpy as np

import ferry
import ferry_it


def records(directory, n=256):
    path = os.path.join(directory, "records.bin")
    np.arange(n, dtype=np.int64).tofile(path)
    return ferry.Records(path, "int64")


def daemon_status(daemon):
    return ferry_it.ferryctl(daemon.address, "status")


class LifecycleTest(unittest.TestCase):
    def daemon(self, config):
        daemon = ferry_it.FerryDaemon(config=config)
        self.addCleanup(daemon.stop)
        return daemon

    def read_epoch(self, daemon, name):
        loader = ferry.Loader(records(daemon.dir), batch_size=16, address=daemon.address,
                              job_name=name, as_numpy=True, timeout=60)
        seen = sum(len(b["data"]) for b in loader)
        self.assertEqual(seen, 256)
        return loader

    def test_idle_jobs_are_deleted_and_memory_returns_to_zero(self):
        daemon = self.daemon("job_idle_timeout_seconds: 2\n")
        loader = self.read_epoch(daemon, "finished-run")
        job_id = loader.job["id"]
        status = daemon_status(daemon)
        self.assertGreater(int(status["daemon"]["host_memory_in_use_bytes"]), 0)
        self.assertEqual(status["daemon"]["job_idle_timeout_seconds"], 2)
        loader.close()  # the run ends: its job has no consumer from now on
        idle = ferry_it.poll(lambda: daemon_status(daemon)["jobs"][0].get("idle_seconds", 0) > 0,
                             5)
        self.assertTrue(idle, "the job never showed as idle")
        table = ferry_it.run_ferryctl(daemon.address, "jobs").stdout
        self.assertIn("idle", table)
        gone = ferry_it.poll(lambda: not daemon_status(daemon).get("jobs"), 15)
        self.assertTrue(gone, "the idle job was not deleted:\n" + daemon.log())
        memory = int(daemon_status(daemon)["daemon"].get("host_memory_in_use_bytes", 0))
        self.assertEqual(memory, 0)
        self.assertIn("deleted job %s: no consumer" % job_id, daemon.log())

    def test_ferryctl_delete_frees_a_job_at_once(self):
        daemon = self.daemon("job_idle_timeout_seconds: 0\n")  # idle jobs are kept
        loader = self.read_epoch(daemon, "done")
        job_id = loader.job["id"]
        loader.close()
        status = daemon_status(daemon)
        self.assertEqual(len(status["jobs"]), 1)
        self.assertGreater(int(status["daemon"]["host_memory_in_use_bytes"]), 0)
        proc = ferry_it.run_ferryctl(daemon.address, "delete", job_id)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip(), "deleted %s" % job_id)
        status = daemon_status(daemon)
        self.assertFalse(status.get("jobs"))
        self.assertEqual(int(status["daemon"].get("host_memory_in_use_bytes", 0)), 0)
        proc = ferry_it.run_ferryctl(daemon.address, "delete", job_id)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("no job '%s'" % job_id, proc.stderr)

    def test_a_loader_whose_job_is_deleted_stops_with_the_reason(self):
        # It took the broken stream for a lost ferryd and created the job again (5,152
        # batches after `ferryctl delete`).
        daemon = self.daemon("job_idle_timeout_seconds: 0\n")
        loader = ferry.Loader(records(daemon.dir, n=1 << 16), batch_size=16,
                              address=daemon.address, job_name="deleted-run", as_numpy=True,
                              timeout=60)
        self.addCleanup(loader.close)
        it = iter(loader)
        next(it)
        job_id = loader.job["id"]
        proc = ferry_it.run_ferryctl(daemon.address, "delete", job_id)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with self.assertRaises(ferry.FerryError) as cm:
            for _ in it:
                pass
        self.assertEqual(cm.exception.code, "ABORTED")
        self.assertIn("job %s was deleted" % job_id, cm.exception.message)
        self.assertFalse(daemon_status(daemon).get("jobs"), "the job was created again")

    def test_a_raw_stream_that_keeps_its_batches_ends_after_the_grace(self):
        # A consumer of the C API that holds its batches and never gives them back: the
        # delete reached it only when it released them, so its stream never ended. Now it is
        # told drain_timeout_seconds after the delete; what it holds stays readable.
        daemon = self.daemon("job_idle_timeout_seconds: 0\ndrain_timeout_seconds: 1\n")
        from ferry.client import Client
        client = Client(daemon.address)
        self.addCleanup(client.close)
        job = client.create_job({"dataset": records(daemon.dir)._spec(), "batch_size": 16,
                                 "prefetch_depth": 2}, name="held")
        consumer = client.attach(job["id"], 0)
        self.addCleanup(consumer.close)
        consumer.start_epoch(0)
        held = [consumer.next(30000) for _ in range(2)]  # every slot
        with self.assertRaises(ferry.FerryError) as waiting:
            consumer.next(100)  # nothing can come while every slot is held
        self.assertEqual((waiting.exception.code, waiting.exception.reason),
                         ("DEADLINE_EXCEEDED", "NO_BATCH_YET"))
        proc = ferry_it.run_ferryctl(daemon.address, "delete", job["id"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with self.assertRaises(ferry.FerryError) as cm:
            consumer.next(20000)
        self.assertEqual(cm.exception.code, "ABORTED", cm.exception.message)
        self.assertIn("job %s was deleted" % job["id"], cm.exception.message)
        for i, batch in enumerate(held):
            self.assertEqual(batch.arrays()["data"].tolist(), list(range(16 * i, 16 * i + 16)))
        self.assertIn("still holds 2 batch(es)", daemon.log())
        freed = ferry_it.poll(lambda: int(daemon_status(daemon)["daemon"].get(
            "host_memory_in_use_bytes", 0)) == 0, 10)
        self.assertTrue(freed, daemon_status(daemon)["daemon"])

    def test_ferryctl_drain_lets_trainers_finish_then_exits_zero(self):
        daemon = self.daemon(None)
        loader = ferry.Loader(records(daemon.dir), batch_size=16, address=daemon.address,
                              job_name="long-run", as_numpy=True, timeout=60)
        it = iter(loader)
        first = next(it)  # attached and mid-epoch
        drain = ferry_it.run_ferryctl(daemon.address, "drain", "--no-wait")
        self.assertEqual(drain.returncode, 0, drain.stderr)
        self.assertIn("1 consumer(s) attached", drain.stdout)
        self.assertTrue(daemon_status(daemon)["daemon"]["draining"])
        # New work is refused, saying why.
        with self.assertRaises(ferry.FerryError) as refused:
            ferry.Loader(records(daemon.dir, 64), batch_size=16, address=daemon.address,
                         job_name="new-run", timeout=10)
        self.assertEqual(refused.exception.code, "UNAVAILABLE")
        self.assertIn("draining", str(refused.exception))
        # `ferryctl drain` (waiting) follows it to the end: started, and its drain begun,
        # before the trainer goes on.
        waiter = subprocess.Popen([ferry_it.ferryctl_binary(), "--address", daemon.address,
                                   "drain"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        self.addCleanup(lambda: waiter.poll() is None and (waiter.kill(), waiter.wait()))
        self.assertIn("is draining", waiter.stdout.readline())
        # The attached trainer goes on to the end of its epoch, and another one.
        seen = len(first["data"]) + sum(len(b["data"]) for b in it)
        self.assertEqual(seen, 256)
        loader.set_epoch(1)
        self.assertEqual(sum(len(b["data"]) for b in loader), 256)
        self.assertIsNone(daemon.process.poll(), "ferryd left while a trainer was attached")
        loader.close()
        self.assertEqual(daemon.process.wait(30), 0)
        out, err = waiter.communicate(timeout=60)
        self.assertEqual(waiter.returncode, 0, err)
        self.assertIn("ferryd stopped", out)


if __name__ == "__main__":
    unittest.main()
