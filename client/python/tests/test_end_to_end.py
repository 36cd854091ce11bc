"""End to end against a real ferryd: the on-demand daemon a Loader starts (FERRY_DAEMON or the
build tree) in a temporary XDG_RUNTIME_DIR. Skipped when no ferryd binary can be found."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import numpy as np

import ferry
from ferry import _daemon

try:
    _daemon.find_binary()
    HAVE_FERRYD = True
except ferry.FerryError:
    HAVE_FERRYD = False

SEQ = 8
IDLE = 3  # FERRY_DAEMON_IDLE_SECONDS for the on-demand daemon of these tests


def ferryctl_binary():
    if os.environ.get("FERRY_CTL"):
        return os.environ["FERRY_CTL"]
    build = os.path.dirname(os.path.dirname(os.path.dirname(ferry.__file__)))
    return os.path.join(build, "client", "ferryctl", "ferryctl")


@unittest.skipUnless(HAVE_FERRYD, "no ferryd binary (set FERRY_DAEMON)")
class EndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        # 64 samples of SEQ + 1 tokens: sample i = tokens[i * SEQ : i * SEQ + SEQ + 1].
        cls.tokens = (np.arange(64 * SEQ + 1) * 7 % 65521).astype(np.uint16)
        cls.token_path = os.path.join(cls.tmp.name, "tokens.bin")
        cls.tokens.tofile(cls.token_path)
        os.environ.pop("FERRY_ADDRESS", None)
        # Make sure the Loaders below start an on-demand daemon rather than find a real one.
        os.environ["XDG_RUNTIME_DIR"] = cls.tmp.name
        os.environ["XDG_CACHE_HOME"] = os.path.join(cls.tmp.name, "cache")  # its log
        os.environ["FERRY_DAEMON_IDLE_SECONDS"] = str(IDLE)

    @classmethod
    def tearDownClass(cls):
        # The on-demand daemon stops by itself and takes its directory with it.
        runtime = os.path.join(cls.tmp.name, "ferry")
        deadline = time.monotonic() + IDLE + 15
        while os.path.exists(runtime) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftover = os.listdir(runtime) if os.path.exists(runtime) else None
        cls.tmp.cleanup()
        if leftover is not None:
            raise AssertionError("the on-demand ferryd left %s behind: %s" % (runtime, leftover))

    def loader(self, **kwargs):
        args = dict(dataset=ferry.Tokens(self.token_path, seq_len=SEQ), batch_size=4,
                    prefetch=2, as_numpy=True, timeout=30)
        args.update(kwargs)
        loader = ferry.Loader(**args)
        self.addCleanup(loader.close)
        return loader

    def daemon_log(self):
        """The end of the on-demand daemons' log, for a failure's message."""
        try:
            with open(_daemon.log_path(), errors="replace") as f:
                return "ferryd's log ends:\n" + "".join(f.readlines()[-40:])
        except OSError as e:
            return "no ferryd log (%s)" % e

    def check_batch(self, batch):
        self.assertEqual(batch["tokens"].dtype, np.int64)
        self.assertEqual(batch["tokens"].shape[1], SEQ + 1)
        for row, index in zip(batch["tokens"], batch["index"]):
            np.testing.assert_array_equal(row, self.tokens[index * SEQ:index * SEQ + SEQ + 1])

    def indices(self, loader):
        return [int(i) for b in loader for i in b["index"]]

    def test_epoch_delivers_every_sample_with_correct_data(self):
        loader = self.loader()
        self.assertEqual(len(loader), 16)
        batches = list(loader)  # safe mode: kept batches are copies, never overwritten
        self.assertEqual(len(batches), 16)
        for b in batches:
            self.check_batch(b)
        # Safe-mode arrays are plain writable numpy arrays: DLPack export works.
        np.testing.assert_array_equal(np.from_dlpack(batches[0]["index"]), batches[0]["index"])
        self.assertEqual(sorted(int(i) for b in batches for i in b["index"]), list(range(64)))

    def test_two_ranks_split_the_epoch(self):
        common = dict(shuffle=True, seed=3, world_size=2, job_name="two-ranks")
        rank0 = self.loader(rank=0, **common)
        rank1 = self.loader(rank=1, **common)
        self.assertEqual(rank0.job["id"], rank1.job["id"])
        self.assertEqual(len(rank0), len(rank1))
        a, b = self.indices(rank0), self.indices(rank1)
        self.assertEqual(len(a), 32)
        self.assertFalse(set(a) & set(b))
        self.assertEqual(sorted(a + b), list(range(64)))

    def test_same_epoch_repeats_and_set_epoch_reshuffles(self):
        loader = self.loader(shuffle=True, seed=1)
        first, again = self.indices(loader), self.indices(loader)
        self.assertEqual(first, again)
        loader.set_epoch(1)
        self.assertNotEqual(self.indices(loader), first)

    def test_break_mid_epoch_then_iterate_again(self):
        loader = self.loader(shuffle=True, seed=2)
        full = self.indices(loader)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        self.assertEqual(self.indices(loader), full)

    def test_resume_from_state_dict(self):
        loader = self.loader(shuffle=True, seed=5)
        loader.set_epoch(2)
        full = self.indices(loader)
        it = iter(loader)
        for _ in range(3):
            next(it)
        state = loader.state_dict()
        keys = ("epoch", "batches_done", "consumed", "quarantined")
        self.assertEqual({k: state[k] for k in keys},
                         {"epoch": 2, "batches_done": 3, "consumed": [[0, 12]], "quarantined": []})
        del it
        loader.load_state_dict(state)
        self.assertEqual(self.indices(loader), full[3 * 4:])

    def test_resume_keeps_dataloader_habits(self):
        # The loop a DataLoader user writes: load the state, then set_epoch at the top of
        # each epoch. Setting the state's epoch keeps the saved position (torchdata's
        # StatefulDataLoader); another epoch starts at its first batch.
        loader = self.loader(shuffle=True, seed=7, job_name="habits")
        loader.set_epoch(1)
        epoch1 = self.indices(loader)
        loader.set_epoch(2)
        epoch2 = self.indices(loader)
        loader.set_epoch(1)
        it = iter(loader)
        for _ in range(5):
            next(it)
        mid = loader.state_dict()
        del it

        resumed = self.loader(shuffle=True, seed=7, job_name="habits-resumed")
        resumed.load_state_dict(mid)
        resumed.set_epoch(1)
        self.assertEqual(self.indices(resumed), epoch1[5 * 4:])
        resumed.load_state_dict(mid)
        resumed.set_epoch(2)  # another epoch: from its start
        self.assertEqual(self.indices(resumed), epoch2)

        # A state saved after the last batch of an epoch resumes at the next one.
        loader.set_epoch(1)
        self.assertEqual(self.indices(loader), epoch1)
        end = loader.state_dict()
        self.assertEqual((end["epoch"], end["batches_done"], end["consumed"]), (2, 0, []))
        resumed.load_state_dict(end)
        self.assertEqual(self.indices(resumed), epoch2)  # no set_epoch: the next epoch
        resumed.load_state_dict(end)
        resumed.set_epoch(2)  # the loop's own set_epoch for that next epoch
        self.assertEqual(self.indices(resumed), epoch2)

    def test_a_loader_made_again_right_after_close_takes_the_rank(self):
        # close() ends the consumer's stream; ferryd sees the end a moment later. A Loader made
        # at once for the same rank must not fail with "already has a live consumer" (it
        # did about once in 30 tries).
        for _ in range(40):
            loader = ferry.Loader(ferry.Tokens(self.token_path, seq_len=SEQ), batch_size=4,
                                  prefetch=2, as_numpy=True, timeout=30, job_name="reopen")
            self.check_batch(next(iter(loader)))
            loader.close()

    def test_a_rank_whose_earlier_loader_is_garbage_is_taken_over(self):
        old = ferry.Loader(ferry.Tokens(self.token_path, seq_len=SEQ), batch_size=4,
                           prefetch=2, as_numpy=True, timeout=30, job_name="takeover")
        next(iter(old))
        old.cycle = old  # unreachable after `del`, but only the cycle collector frees it
        del old
        new = self.loader(job_name="takeover")
        self.assertEqual(len(self.indices(new)), 64)

    def test_a_rank_held_by_an_open_loader_says_what_to_do(self):
        old = self.loader(job_name="held")
        next(iter(old))
        with self.assertRaises(ferry.FerryError) as cm:
            self.loader(job_name="held")
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
        self.assertIn("another ferry.Loader of this process, which is still open", str(cm.exception))
        self.assertIn("loader.close()", str(cm.exception))
        old.close()
        self.assertEqual(len(self.indices(self.loader(job_name="held"))), 64)

    def test_a_rank_held_by_another_process_names_it(self):
        code = ("import sys, time, ferry\n"
                "l = ferry.Loader(ferry.Tokens(sys.argv[1], seq_len=8), batch_size=4, "
                "prefetch=2, job_name='other-process')\n"
                "next(iter(l))\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)\n")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ferry.__file__)))
        proc = subprocess.Popen([sys.executable, "-c", code, self.token_path], env=env,
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        self.assertEqual(proc.stdout.readline().strip(), "ready")
        with mock.patch.object(ferry.loader, "_TAKEOVER_SECONDS", 0.5):
            with self.assertRaises(ferry.FerryError) as cm:
                self.loader(job_name="other-process")
        self.assertIn("being consumed by process %d" % proc.pid, str(cm.exception))
        self.assertEqual(cm.exception.reason, "RANK_HELD")  # what code acts on

    def test_zero_copy_views_are_read_only_and_correct(self):
        loader = self.loader(zero_copy=True)
        for batch in loader:
            self.assertFalse(batch["tokens"].flags.writeable)
            self.check_batch(batch)

    def test_releases_in_bursts_keep_the_ring_going(self):
        # Every batch of the ring held, then all released at once, over several rounds: the
        # client packs queued releases into one message (ConsumeRequest.releases), which
        # ferryd must take in order, and every slot comes back.
        loader = self.loader(prefetch=8, shuffle=True, seed=4)
        consumer = loader._consumer
        for epoch in range(3):
            consumer.start_epoch(epoch)
            seen = []
            while True:
                held = []
                for _ in range(8):
                    b = consumer.next(10000)
                    if b is None:
                        break
                    self.check_batch(b.arrays())
                    seen.extend(int(i) for i in b.arrays()["index"])
                    held.append(b)
                for b in held:
                    b.release()
                if len(held) < 8:
                    break
            self.assertEqual(sorted(seen), list(range(64)))

    def test_torch_tensors_by_default(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        loader = self.loader(as_numpy=False)
        batch = next(iter(loader))
        self.assertIsInstance(batch["tokens"], torch.Tensor)
        self.assertEqual(batch["tokens"].dtype, torch.int64)
        self.assertEqual(tuple(batch["tokens"].shape), (4, SEQ + 1))
        self.assertTrue(torch.equal(torch.utils.dlpack.from_dlpack(batch["index"]),
                                    batch["index"]))
        z = self.loader(as_numpy=False, zero_copy=True, job_name="torch-zero-copy")
        zb = next(iter(z))
        self.assertTrue(torch.equal(torch.utils.dlpack.from_dlpack(zb["index"]), zb["index"]))

    def test_torch_batches_stay_correct_as_slots_are_reused(self):
        # Views of a slot are made once per (slot, rows) and reused: every batch, over
        # several epochs with a short last batch, must still hold its own rows; copies kept
        # in safe mode stay untouched, and in zero-copy mode a caller reshaping its tensors
        # in place does not reshape a later batch of the same slot.
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        for zero_copy in (False, True):
            loader = self.loader(as_numpy=False, zero_copy=zero_copy, batch_size=5,
                                 shuffle=True, seed=3, job_name="reuse-%s" % zero_copy)
            for epoch in range(3):
                loader.set_epoch(epoch)
                kept, seen, sizes = [], [], []
                for b in loader:
                    self.assertIsInstance(b["tokens"], torch.Tensor)
                    self.assertEqual(b["tokens"].dim(), 2)
                    self.check_batch({k: v.numpy() for k, v in b.items()})
                    seen.extend(int(i) for i in b["index"])
                    sizes.append(len(b["index"]))
                    if zero_copy:
                        b["tokens"].unsqueeze_(0)  # the caller's business only
                    else:
                        kept.append(b)
                self.assertEqual(sorted(seen), list(range(64)))
                self.assertEqual(sizes, [5] * 12 + [4])  # 64 = 12 * 5 + 4
                for b in kept:  # copies: untouched by the slots' later batches
                    self.check_batch({k: v.numpy() for k, v in b.items()})
            loader.close()

    def test_image_folder(self):

        from PIL import Image
        root = os.path.join(self.tmp.name, "images")
        for c, color in (("cat", (200, 10, 10)), ("dog", (10, 10, 200))):
            os.makedirs(os.path.join(root, c))
            for i in range(3):
                Image.new("RGB", (40 + i, 30), color).save(os.path.join(root, c, "%d.jpg" % i))
        loader = self.loader(dataset=ferry.ImageFolder(root), batch_size=2,
                             transform=ferry.CenterCrop(16))
        labels = []
        for b in loader:
            self.assertEqual(b["image"].shape, (2, 16, 16, 3))
            self.assertEqual(b["image"].dtype, np.uint8)
            for image, label in zip(b["image"], b["label"]):
                red, blue = int(image[..., 0].mean()), int(image[..., 2].mean())
                self.assertEqual(int(label), 0 if red > blue else 1)
                labels.append(int(label))
        self.assertEqual(sorted(labels), [0, 0, 0, 1, 1, 1])

    def test_bad_spec_is_a_ferry_error_from_the_daemon(self):
        with self.assertRaises(ferry.FerryError) as cm:
            self.loader(dataset=ferry.Tokens(os.path.join(self.tmp.name, "missing.bin"),
                                             seq_len=SEQ))
        self.assertIn("missing.bin", cm.exception.message)

    def test_a_rank_names_its_device_at_attach(self):
        # Through the C ABI's ferry_client_attach_on: a host job's rank may say "cpu"; a GPU
        # device for it is refused, naming the job and what to create instead.
        loader = self.loader(world_size=2)  # starts (or finds) the daemon, makes the job
        with ferry.Client(loader.address) as client:
            consumer = client.attach(loader.job["id"], 1, "cpu")
            consumer.close()
            with self.assertRaises(ferry.FerryError) as cm:
                client.attach(loader.job["id"], 1, "cuda:0")
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
            self.assertIn("GPU ranks need a job made with device \"cuda\"", cm.exception.message)
            ranks = {r["rank"]: r.get("device") for r in client.get_job(loader.job["id"])["ranks"]}
            self.assertEqual(ranks.get(1), "cpu")

    def test_ferryctl_tables_and_json(self):
        ctl = ferryctl_binary()
        if not os.access(ctl, os.X_OK):
            self.skipTest("no ferryctl at %s" % ctl)
        loader = self.loader(job_name="ctl-job")
        next(iter(loader))
        address = loader.address
        run = lambda *args: subprocess.run([ctl, "--address", address] + list(args),
                                           capture_output=True, text=True, timeout=30)
        status = run("status")
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertIn("uptime", status.stdout)
        self.assertIn("ctl-job", status.stdout)
        jobs = run("--json", "jobs")
        self.assertEqual(jobs.returncode, 0, jobs.stderr)
        names = [j["name"] for j in json.loads(jobs.stdout)["jobs"]]
        self.assertIn("ctl-job", names)
        job = run("job", loader.job["id"])
        self.assertEqual(job.returncode, 0, job.stderr)
        self.assertIn("RANK", job.stdout)
        missing = run("job", "no-such-job")
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn("no-such-job", missing.stderr)

    def test_on_demand_daemon_outlives_the_process_that_started_it(self):
        # A process starts the daemon and is killed; the daemon serves this one, which joins
        # it rather than starting another.
        code = ("import os, sys, ferry\n"
                "l = ferry.Loader(ferry.Tokens(sys.argv[1], seq_len=8), batch_size=4)\n"
                "print(l._daemon.pid, l._daemon.started, flush=True)\n"
                "os.kill(os.getpid(), 9)\n")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ferry.__file__)))
        proc = subprocess.run([sys.executable, "-c", code, self.token_path], env=env,
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, -9, proc.stderr)
        pid = int(proc.stdout.split()[0])
        self.assertTrue(_daemon.running(pid), "the daemon died with the process that started it")
        loader = self.loader(job_name="joined")
        self.assertEqual(loader._daemon.pid, pid)
        self.assertFalse(loader._daemon.started)
        self.assertEqual(len(self.indices(loader)), 64)

    def test_zy_sigterm_of_the_daemon_is_survived_by_reattaching(self):
        # A stopped on-demand daemon is started again and the epoch goes on where it was.
        loader = self.loader(job_name="sigterm", shuffle=True, seed=5)
        it = iter(loader)
        seen = [int(i) for i in next(it)["index"]]
        old = loader._daemon.pid
        os.kill(old, signal.SIGTERM)
        self.wait_until_gone(old)
        seen += [int(i) for b in it for i in b["index"]]
        self.assertEqual(sorted(seen), list(range(64)), self.daemon_log())
        self.assertNotEqual(loader._daemon.pid, old, self.daemon_log())

    def wait_until_gone(self, pid):
        """Waits for the killed daemon to exit (a SIGTERM drains first, up to the drain
        timeout): a daemon still serving could hand over the epoch's few remaining batches
        before it meets the signal, and nothing would need taking back."""
        deadline = time.monotonic() + 30
        while _daemon.running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(_daemon.running(pid), self.daemon_log())

    def test_zz_daemon_death_is_survived_by_reattaching(self):
        loader = self.loader(job_name="death", shuffle=True, seed=6)
        it = iter(loader)
        seen = [int(i) for i in next(it)["index"]]
        os.kill(loader._daemon.pid, signal.SIGKILL)
        self.wait_until_gone(loader._daemon.pid)
        start = time.monotonic()
        seen += [int(i) for b in it for i in b["index"]]
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(sorted(seen), list(range(64)))


if __name__ == "__main__":
    unittest.main()
