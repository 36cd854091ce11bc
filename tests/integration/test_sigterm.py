"""SIGTERM of ferryd with consumers attached: it drains (refusing new work), waits up to
drain_timeout_seconds for a held batch, exits 0, removes its sockets and leaves nothing in
/dev/shm; the consumers get a FerryError instead of hanging."""

import os
import signal
import time
import unittest

import ferry
import ferry_it

DRAIN_SECONDS = 2


def open_files(pid):
    """What /proc/<pid>/fd points at (fds that close while we look are skipped)."""
    out = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            out.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
        except FileNotFoundError:
            pass
    return out


def dev_shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


class SigtermTest(unittest.TestCase):
    def start(self, cfg):
        proc = ferry_it.start_worker(cfg, cfg["out"] + ".log")
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        return proc

    def test_sigterm_drains_exits_zero_and_cleans_up(self):
        shm_before = dev_shm()
        daemon = ferry_it.FerryDaemon(config="drain_timeout_seconds: %d\n" % DRAIN_SECONDS)
        self.addCleanup(daemon.stop)
        d = daemon.dir
        root = ferry_it.make_image_folder(os.path.join(d, "images"), {"elk": 8, "fox": 8})
        go = os.path.join(d, "go")
        # ferryd is stopped for good: the Loaders do not wait for it to come back.
        common = dict(address=daemon.address, root=root, world_size=2, batch_size=2, seed=1,
                      crop=16, job_name="drain", reattach_seconds=0)
        # Rank 0 takes one batch and holds it (zero-copy) until told to go on; rank 1 keeps
        # consuming epoch after epoch, so SIGTERM finds it mid-stream.
        holder_cfg = dict(common, rank=0, epochs=3, zero_copy=True, pause_after=1,
                          ready_file=os.path.join(d, "ready0"), go_file=go,
                          out=os.path.join(d, "rank0.json"))
        runner_cfg = dict(common, rank=1, epochs=10000, pause_after=1,
                          ready_file=os.path.join(d, "ready1"), go_file=os.path.join(d, "go1"),
                          out=os.path.join(d, "rank1.json"))
        open(runner_cfg["go_file"], "w").close()  # rank 1 never waits
        holder = self.start(holder_cfg)
        runner = self.start(runner_cfg)
        ferry_it.wait_for_file(holder_cfg["ready_file"], 60, [holder], "rank 0 readiness")
        ferry_it.wait_for_file(runner_cfg["ready_file"], 60, [runner], "rank 1 readiness")

        job_id = ferry_it.read_json(holder_cfg["out"])["job_id"]
        job = ferry_it.ferryctl(daemon.address, "job", job_id)
        self.assertGreaterEqual(ferry_it.rank_status(job, 0)["slots_leased"], 1, job)
        self.assertTrue(ferry_it.rank_status(job, 1)["attached"], job)
        # The slabs are memfds held by ferryd, never files in /dev/shm.
        fds = open_files(daemon.pid)
        self.assertTrue(any(f.startswith("/memfd:ferry-") for f in fds), fds)
        self.assertEqual([n for n in dev_shm() if "ferry" in n], [])

        daemon.terminate()
        sent = time.monotonic()
        # While it drains, new jobs are refused with UNAVAILABLE.
        refused = None
        while refused is None and time.monotonic() - sent < DRAIN_SECONDS - 0.5:
            try:
                with ferry.Client(daemon.address) as client:
                    client.create_job({"dataset": {"image_folder": {"root": root}},
                                       "transform": {"center_crop": {"size": 8}},
                                       "batch_size": 2}, name="during-drain")
                time.sleep(0.02)  # SIGTERM not handled yet
            except ferry.FerryError as e:
                refused = e
        self.assertIsNotNone(refused, "CreateJob kept succeeding during the drain")
        self.assertEqual(refused.code, "UNAVAILABLE", refused)
        self.assertIn("ferryd is shutting down", refused.message)

        code = daemon.process.wait(DRAIN_SECONDS + 8)
        elapsed = time.monotonic() - sent
        self.assertEqual(code, 0, daemon.log())
        # Rank 0 never released its batch, so the drain used its whole timeout, and no more.
        self.assertGreaterEqual(elapsed, DRAIN_SECONDS - 0.2)
        self.assertLess(elapsed, DRAIN_SECONDS + 3)
        self.assertIn("ferryd stopped", daemon.log())
        self.assertFalse(os.path.exists(daemon.address), "gRPC socket left behind")
        self.assertFalse(os.path.exists(daemon.session_address), "session socket left behind")

        # Rank 1 was consuming: its stream broke with an error, not a hang.
        self.assertEqual(runner.wait(15), 0, ferry_it.tail(runner_cfg["out"] + ".log"))
        r1 = ferry_it.read_json(runner_cfg["out"])
        self.assertFalse(r1["done"])
        self.assertIn("error", r1)
        self.assertEqual(r1["error"]["code"], "UNAVAILABLE", r1["error"])
        self.assertIn("Consume to ferryd at %s" % daemon.address, r1["error"]["message"])
        # It held no batch, so ferryd ended its stream itself, saying why.
        self.assertIn("ferryd is shutting down", r1["error"]["message"])
        # Rank 0 goes on after the daemon is gone: it may still read the batches that had
        # arrived before (their memory is its own mapping), then gets an error, no hang.
        open(go, "w").close()
        self.assertEqual(holder.wait(15), 0, ferry_it.tail(holder_cfg["out"] + ".log"))
        r0 = ferry_it.read_json(holder_cfg["out"])
        self.assertFalse(r0["done"])
        self.assertIn("error", r0, r0)
        self.assertEqual(r0["error"]["code"], "UNAVAILABLE", r0["error"])
        self.assertIn("ferryd at %s" % daemon.address, r0["error"]["message"])
        self.assertLessEqual(len(r0["epochs"]["0"]["index"]), 4)

        new = sorted(dev_shm() - shm_before)
        self.assertEqual(new, [], "ferryd or its clients left entries in /dev/shm")
        self.assertEqual([n for n in dev_shm() if "ferry" in n], [])

    def test_a_second_sigterm_while_draining_ends_ferryd_at_once(self):
        # A drain that waits (here for a held batch, up to 60 s) is cut short by a second
        # signal: ferryd exits 1 at once, as an administrator who sends it twice expects.
        os.environ["FERRY_REATTACH_SECONDS"] = "0"
        self.addCleanup(os.environ.pop, "FERRY_REATTACH_SECONDS", None)
        daemon = ferry_it.FerryDaemon(config="drain_timeout_seconds: 60\n")
        self.addCleanup(daemon.stop)
        loader = ferry_it.tokens_loader(daemon, 1 << 13, seq_len=16, batch_size=4)
        self.addCleanup(loader.close)
        it = iter(loader)
        next(it)  # its arrays are the slot's memory: held until the next batch
        job = ferry_it.ferryctl(daemon.address, "job", loader.job["id"])
        self.assertGreaterEqual(ferry_it.rank_status(job, 0)["slots_leased"], 1, job)
        daemon.terminate()
        self.assertTrue(ferry_it.poll(lambda: "draining" in daemon.log(), 10), daemon.log())
        time.sleep(0.5)
        self.assertIsNone(daemon.process.poll(), "the drain did not wait for the held batch")
        sent = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        code = daemon.process.wait(10)
        self.assertEqual(code, 1, daemon.log())
        self.assertLess(time.monotonic() - sent, 5)
        self.assertIn("received Terminated while draining; exiting now", daemon.log())


class CrashTest(unittest.TestCase):
    def test_a_crash_logs_the_signal_and_the_stack_and_ferryd_dies_of_it(self):
        # What an operator has to go on after a crash: the log names the signal and shows
        # where it hit, and ferryd dies of the signal (systemd's Restart= and a core dump
        # see the crash as it was).
        daemon = ferry_it.FerryDaemon()
        self.addCleanup(daemon.stop)
        loader = ferry_it.tokens_loader(daemon, 1 << 12, seq_len=16, batch_size=4)
        self.addCleanup(loader.close)
        next(iter(loader))  # the workers and the stream's threads are running
        daemon.process.send_signal(signal.SIGSEGV)
        code = daemon.process.wait(30)
        self.assertEqual(code, -signal.SIGSEGV, daemon.log())
        log = daemon.log()
        self.assertIn("*** SIGSEGV received", log)
        self.assertRegex(log, r"@\s+0x[0-9a-f]+", "no stack frame in the log")


if __name__ == "__main__":
    unittest.main()
