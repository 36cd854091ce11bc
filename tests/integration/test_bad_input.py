"""Bad input through the Python API: every error is a FerryError with the right code and a
message naming the thing and the value; a corrupt JPEG costs a sample, not the epoch."""

import json
import os
import random
import re
import subprocess
import time
import sys
import unittest

import numpy as np

import ferry
import ferry_it

NOBODY = 65534


def image_spec(root, batch_size=2, transform=None):
    return {"dataset": {"image_folder": {"root": root}},
            "transform": transform or {"center_crop": {"size": 8}}, "batch_size": batch_size}


def token_spec(path, seq_len=4, token_dtype="UINT16", batch_size=2):
    tokens = {"path": path, "seq_len": seq_len}
    if token_dtype is not None:
        tokens["token_dtype"] = token_dtype
    return {"dataset": {"tokens": tokens}, "batch_size": batch_size}


def slot_bytes(batch, crop):
    """An image job's slot size by docs/protocol.md: fields image, label, index of `batch`
    rows each, each field at a multiple of 256 bytes, the slot a multiple of the page size."""
    offset = 0
    for row_bytes in (crop * crop * 3, 8, 8):
        offset = -(-offset // 256) * 256 + batch * row_bytes
    page = os.sysconf("SC_PAGE_SIZE")
    return -(-offset // page) * page


def default_slots(slot, depth=4, prefetch_bytes=64 << 20, most=32):
    """Slots per rank of a job with no prefetch, by DaemonConfig.default_prefetch_bytes:
    the default depth, more for small batches up to 64 MiB of slots and at most 32."""
    return max(depth, min(most, -(-prefetch_bytes // slot)))


class DaemonTestCase(unittest.TestCase):
    CONFIG = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = ferry_it.FerryDaemon(config=cls.CONFIG)
        cls.dir = cls.daemon.dir

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def client(self):
        client = ferry.Client(self.daemon.address)
        self.addCleanup(client.close)
        return client

    def loader(self, dataset, **kwargs):
        args = dict(batch_size=2, transform=ferry.CenterCrop(8), address=self.daemon.address,
                    as_numpy=True, timeout=30)
        args.update(kwargs)
        loader = ferry.Loader(dataset, **args)
        self.addCleanup(loader.close)
        return loader

    def assertFerryError(self, code, fn, *args, **kwargs):
        with self.assertRaises(ferry.FerryError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.code, code, cm.exception)
        return cm.exception.message


class SpecErrorsTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.images = ferry_it.make_image_folder(os.path.join(cls.dir, "images"),
                                                {"a": 2, "b": 2})
        cls.tokens = os.path.join(cls.dir, "tokens.bin")
        np.arange(200, dtype=np.uint16).tofile(cls.tokens)

    def test_missing_dataset_path_is_not_found_naming_the_path(self):
        missing = os.path.join(self.dir, "no-such-dir")
        message = self.assertFerryError("NOT_FOUND", self.loader, ferry.ImageFolder(missing))
        self.assertIn("dataset path '%s' does not exist" % missing, message)
        missing_file = os.path.join(self.dir, "no-such-tokens.bin")
        message = self.assertFerryError("NOT_FOUND", self.loader,
                                        ferry.Tokens(missing_file, seq_len=4))
        self.assertIn("'%s' does not exist" % missing_file, message)

    def test_batch_size_zero(self):
        with self.assertRaisesRegex(ValueError, r"batch_size must be >= 1, got 0"):
            self.loader(ferry.ImageFolder(self.images), batch_size=0)
        # The daemon checks it too, for clients that do not validate.
        message = self.assertFerryError("INVALID_ARGUMENT", self.client().create_job,
                                        image_spec(self.images, batch_size=0))
        self.assertIn("batch_size must be in [1, 1048576] (got 0)", message)

    def test_seq_len_zero(self):
        with self.assertRaisesRegex(ValueError, r"seq_len must be >= 1, got 0"):
            ferry.Tokens(self.tokens, seq_len=0)
        message = self.assertFerryError("INVALID_ARGUMENT", self.client().create_job,
                                        token_spec(self.tokens, seq_len=0))
        self.assertIn("dataset.tokens.seq_len must be at least 1 (got 0)", message)

    def test_crop_size_zero(self):
        with self.assertRaisesRegex(ValueError, r"RandomResizedCrop size must be >= 1, got 0"):
            ferry.RandomResizedCrop(0)
        with self.assertRaisesRegex(ValueError, r"CenterCrop size must be >= 1, got 0"):
            ferry.CenterCrop(0)
        client = self.client()
        for kind in ("random_resized_crop", "center_crop"):
            message = self.assertFerryError(
                "INVALID_ARGUMENT", client.create_job,
                image_spec(self.images, transform={kind: {"size": 0}}))
            self.assertIn("transform.%s.size must be at least 1 (got 0)" % kind, message)

    def test_unknown_token_dtype(self):
        with self.assertRaisesRegex(ValueError, r"Tokens dtype must be one of \['uint16', "
                                    r"'uint32'\], got 'int8'"):
            ferry.Tokens(self.tokens, seq_len=4, dtype="int8")
        client = self.client()
        # A DType the daemon does not take for tokens.
        message = self.assertFerryError("INVALID_ARGUMENT", client.create_job,
                                        token_spec(self.tokens, token_dtype="FLOAT32"))
        self.assertIn("dataset.tokens.token_dtype must be UINT16 or UINT32 (got FLOAT32)",
                      message)
        # None at all: ferryd applies the default, and the job's spec says which.
        job = client.create_job(token_spec(self.tokens, token_dtype=None), name="default-dtype")
        self.assertEqual(job["spec"]["dataset"]["tokens"]["token_dtype"], "UINT16")
        client.delete_job(job["id"])
        # A name that is no DType at all: the client library's JSON parser refuses it.
        message = self.assertFerryError("INVALID_ARGUMENT", client.create_job,
                                        token_spec(self.tokens, token_dtype="UINT64"))
        self.assertIn("dataset.tokens.token_dtype", message)
        self.assertIn('"UINT64"', message)

    def test_rank_outside_world_size(self):
        client = self.client()
        job = client.create_job(dict(image_spec(self.images), world_size=2), name="ranks")
        message = self.assertFerryError("INVALID_ARGUMENT", client.attach, job["id"], 2)
        self.assertIn("rank must be in [0, 2) for job %s (got 2)" % job["id"], message)


class CorruptJpegTest(DaemonTestCase):
    def test_corrupt_files_are_replaced_and_reported(self):
        root = ferry_it.make_image_folder(os.path.join(self.dir, "images"),
                                          {"cat": 15, "dog": 15})
        truncated = os.path.join(root, "cat", "truncated.jpg")
        with open(os.path.join(root, "cat", "3.jpg"), "rb") as f:
            good = f.read()
        with open(truncated, "wb") as f:
            f.write(good[:100])  # cut inside the quantisation tables
        junk = os.path.join(root, "dog", "junk.jpg")
        with open(junk, "wb") as f:
            f.write(bytes(random.Random(7).getrandbits(8) for _ in range(600)))
        expected = ferry_it.expected_samples(root)
        self.assertEqual(len(expected), 32)
        corrupt = {i for i, (path, _) in enumerate(expected) if path in (truncated, junk)}
        self.assertEqual(len(corrupt), 2)

        loader = self.loader(ferry.ImageFolder(root), batch_size=8, shuffle=True, seed=3,
                             transform=ferry.RandomResizedCrop(16, flip=True),
                             job_name="corrupt")
        self.assertEqual(len(loader), 4)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            batches = list(loader)
            self.assertEqual(len(batches), 4)
            for b in batches:
                # Full batches: a replacement sample fills the corrupt one's row, and the
                # index field names the sample really delivered.
                self.assertEqual(b["image"].shape, (8, 16, 16, 3))
                self.assertEqual(len(b["index"]), 8)
                for image, label, index in zip(b["image"], b["label"], b["index"]):
                    self.assertNotIn(int(index), corrupt)
                    self.assertEqual(int(label), expected[int(index)][1])
                    self.assertEqual(ferry_it.nearest_class(image.mean(axis=(0, 1))),
                                     int(label))

        status = ferry_it.ferryctl(self.daemon.address, "job", loader.job["id"])
        # Each bad file counted once (then quarantined); a substitute in each epoch.
        self.assertEqual(int(status["errors"]), 2, status)
        self.assertEqual(int(status["quarantined"]), 2, status)
        self.assertGreaterEqual(int(status["substituted"]), 4, status)
        paths = {e["path"] for e in status["recent_errors"]}
        self.assertIn(truncated, paths)
        self.assertIn(junk, paths)
        for e in status["recent_errors"]:
            self.assertIn("JPEG", e["message"], e)
            self.assertIn(int(e["index"]), corrupt, e)
        # The daemon is fine and still serves.
        self.assertEqual(ferry_it.run_ferryctl(self.daemon.address, "status").returncode, 0)
        self.assertEqual(len(list(loader)), 4)


class DatasetRootsTest(DaemonTestCase):
    CONFIG = staticmethod(lambda d: 'dataset_roots: "%s/allowed"\n' % d)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.allowed = os.path.join(cls.dir, "allowed")
        cls.inside = ferry_it.make_image_folder(os.path.join(cls.allowed, "images"), {"a": 2})
        cls.outside = ferry_it.make_image_folder(os.path.join(cls.dir, "other"), {"a": 2})
        os.symlink(cls.outside, os.path.join(cls.allowed, "link"))
        # Links planted inside an allowed tree, leading out of it: a class directory and a
        # file of an otherwise ordinary class.
        cls.planted = ferry_it.make_image_folder(os.path.join(cls.allowed, "planted"), {"a": 2})
        os.symlink(os.path.join(cls.outside, "a"), os.path.join(cls.planted, "b"))
        cls.planted_file = ferry_it.make_image_folder(os.path.join(cls.allowed, "planted_file"),
                                                      {"a": 2})
        secret = os.path.join(cls.dir, "secret.jpg")
        with open(secret, "wb") as f:
            f.write(b"TOP SECRET, not a JPEG")
        os.symlink(secret, os.path.join(cls.planted_file, "a", "zz.jpg"))

    def assertDenied(self, path, fn, *args):
        message = self.assertFerryError("PERMISSION_DENIED", fn, *args)
        self.assertIn("dataset path '%s' is not under any configured dataset_roots (%s)"
                      % (path, self.allowed), message)
        self.assertIn("add its directory to dataset_roots in %s" % self.daemon.config_path,
                      message)

    def assertLinkRefused(self, path, fn, *args):
        message = self.assertFerryError("PERMISSION_DENIED", fn, *args)
        self.assertIn("dataset path '%s' passes through a symbolic link" % path, message)
        self.assertIn("follow_symlinks_within_roots: true in %s" % self.daemon.config_path,
                      message)
        self.assertNotIn("TOP SECRET", message)

    def test_path_outside_the_roots_is_denied(self):
        self.assertDenied(self.outside, self.loader, ferry.ImageFolder(self.outside))

    def test_symlink_and_dotdot_out_of_a_root_are_denied(self):
        link = os.path.join(self.allowed, "link")
        self.assertLinkRefused(link, self.loader, ferry.ImageFolder(link))
        # The Python layer normalises "..", so send it raw.
        dotdot = os.path.join(self.allowed, "..", "other")
        self.assertDenied(os.path.join(self.dir, "other"), self.client().create_job,
                          image_spec(dotdot))

    def test_links_planted_inside_a_root_are_refused_by_name(self):
        self.assertLinkRefused(os.path.join(self.planted, "b"), self.loader,
                               ferry.ImageFolder(self.planted))
        self.assertLinkRefused(os.path.join(self.planted_file, "a", "zz.jpg"), self.loader,
                               ferry.ImageFolder(self.planted_file))

    def test_path_inside_a_root_is_served_and_status_shows_the_roots(self):
        loader = self.loader(ferry.ImageFolder(self.inside))
        self.assertEqual(len(list(loader)), 1)
        daemon = ferry_it.ferryctl(self.daemon.address, "status")["daemon"]
        self.assertEqual(daemon["dataset_roots"], [self.allowed])
        self.assertEqual(daemon["config_path"], self.daemon.config_path)


class FollowSymlinksWithinRootsTest(DaemonTestCase):
    CONFIG = staticmethod(lambda d: 'dataset_roots: "%s/allowed"\n'
                          "follow_symlinks_within_roots: true\n" % d)

    def test_links_within_the_roots_are_served_and_links_out_are_not(self):
        allowed = os.path.join(self.dir, "allowed")
        images = ferry_it.make_image_folder(os.path.join(allowed, "images"), {"a": 2, "b": 2})
        outside = ferry_it.make_image_folder(os.path.join(self.dir, "other"), {"a": 2})
        linked = os.path.join(allowed, "linked")
        os.makedirs(linked)
        os.symlink(os.path.join(images, "a"), os.path.join(linked, "a"))
        os.symlink(os.path.join(images, "b"), os.path.join(linked, "b"))
        loader = self.loader(ferry.ImageFolder(linked), batch_size=2)
        self.assertEqual(sorted(int(i) for batch in loader for i in batch["index"]),
                         [0, 1, 2, 3])
        os.symlink(os.path.join(outside, "a"), os.path.join(linked, "c"))
        message = self.assertFerryError("PERMISSION_DENIED", self.loader,
                                        ferry.ImageFolder(linked), batch_size=2,
                                        job_name="with-c")
        self.assertIn("leads outside dataset_roots", message)


class MemoryBudgetTest(DaemonTestCase):
    BUDGET = 1000000
    CONFIG = "host_memory_budget_bytes: %d\n" % BUDGET

    def test_job_over_the_budget_is_resource_exhausted(self):
        root = ferry_it.make_image_folder(os.path.join(self.dir, "images"), {"a": 8})
        big_slot = slot_bytes(8, 224)
        small_slot = slot_bytes(8, 32)
        small_slots = default_slots(small_slot)

        # A job's index (here 8 file names) counts against the budget too: a few hundred
        # bytes.
        index_at_most = 4096

        def over_budget(free):
            message = self.assertFerryError(
                "RESOURCE_EXHAUSTED", self.loader, ferry.ImageFolder(root), batch_size=8,
                transform=ferry.CenterCrop(224), job_name="big")
            # A job on the default prefetch is refused only when even the minimum of 2
            # slots does not fit (with fewer free bytes it would get fewer slots).
            self.assertIn("job 'big' needs %d bytes per rank (2 slots of %d bytes)"
                          % (2 * big_slot, big_slot), message)
            said = re.search(r"has (\d+) of %d bytes free" % self.BUDGET, message)
            self.assertIsNotNone(said, message)
            self.assertLessEqual(int(said.group(1)), free)
            self.assertGreater(int(said.group(1)), free - 2 * index_at_most)
            self.assertIn("raise host_memory_budget_bytes in %s" % self.daemon.config_path,
                          message)
            self.assertIn("Lower batch_size or prefetch_depth", message)

        over_budget(self.BUDGET)
        # A job that fits is served, and its slab counts against the budget.
        small = self.loader(ferry.ImageFolder(root), batch_size=8,
                            transform=ferry.CenterCrop(32), job_name="small")
        self.assertEqual(small.job["slot_bytes"], str(small_slot))
        self.assertEqual(len(list(small)), 1)
        daemon = ferry_it.ferryctl(self.daemon.address, "status")["daemon"]
        self.assertEqual(int(daemon["host_memory_budget_bytes"]), self.BUDGET)
        in_use = int(daemon["host_memory_in_use_bytes"])
        self.assertGreater(in_use, small_slots * small_slot)  # and the index
        self.assertLess(in_use, small_slots * small_slot + index_at_most)
        over_budget(self.BUDGET - small_slots * small_slot)


OTHER_UID_SCRIPT = r"""
import json, sys
import ferry
address, job_id = sys.argv[1], sys.argv[2]
out = {}
with ferry.Client(address) as client:
    for name, call in (("attach", lambda: client.attach(job_id, 0)),
                       ("get_job", lambda: client.get_job(job_id))):
        try:
            call()
            out[name] = {"code": "OK", "message": ""}
        except ferry.FerryError as e:
            out[name] = {"code": e.code, "message": e.message}
    out["list_jobs"] = [j["id"] for j in client.list_jobs()]
print(json.dumps(out))
"""


class SharedDaemonTestCase(DaemonTestCase):
    """A ferryd other uids can reach: sockets any user may connect to (0666), in a directory
    any user may enter (0755)."""
    CONFIG = "unix_socket_mode: 0666\n"

    @classmethod
    def setUpClass(cls):
        cls.daemon = ferry_it.FerryDaemon(config=cls.CONFIG, dir_mode=0o755)
        cls.dir = cls.daemon.dir


@unittest.skipUnless(os.geteuid() == 0, "needs root: another uid's attach is tested by "
                     "creating a job as root and attaching as uid %d" % NOBODY)
class OtherUidTest(SharedDaemonTestCase):

    def test_other_uid_cannot_attach_or_see_the_job(self):
        self.assertEqual(os.stat(self.daemon.address).st_mode & 0o777, 0o666)
        self.assertEqual(os.stat(self.daemon.session_address).st_mode & 0o777, 0o666)
        root = ferry_it.make_image_folder(os.path.join(self.dir, "images"), {"a": 2})
        job = self.client().create_job(image_spec(root), name="roots-job")
        env = {"PYTHONPATH": os.environ["PYTHONPATH"], "PYTHONDONTWRITEBYTECODE": "1",
               "HOME": "/", "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(
            ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
             sys.executable, "-c", OTHER_UID_SCRIPT, self.daemon.address, job["id"]],
            capture_output=True, text=True, timeout=60, env=env, cwd="/")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        out = json.loads(proc.stdout)
        want = "job '%s' belongs to uid 0, not to uid %d" % (job["id"], NOBODY)
        for call in ("attach", "get_job"):
            self.assertEqual(out[call]["code"], "PERMISSION_DENIED", out)
            self.assertIn(want, out[call]["message"])
        self.assertEqual(out["list_jobs"], [])
        # The owner still attaches normally.
        consumer = self.client().attach(job["id"], 0)
        self.addCleanup(consumer.close)
        self.assertEqual(consumer.batches_per_epoch, 1)


class PerUserDaemonTest(DaemonTestCase):
    def test_sockets_are_the_owners_only(self):
        # Any daemon but the system one answers its own user only, unless configured.
        self.assertEqual(os.stat(self.daemon.address).st_mode & 0o777, 0o600)
        self.assertEqual(os.stat(self.daemon.session_address).st_mode & 0o777, 0o600)
        self.assertEqual(ferry_it.run_ferryctl(self.daemon.address, "status").returncode, 0)


IDLE_SESSIONS_SCRIPT = r"""
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
path, count = sys.argv[1], int(sys.argv[2])
held, greetings = [], {}
for _ in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(30)
    s.connect(path)
    word = s.recv(65536).decode()
    key = word.split(" ")[0] if word.startswith("HELLO") else word
    greetings[key] = greetings.get(key, 0) + 1
    held.append(s)
print(repr(greetings), flush=True)
sys.stdin.readline()  # hold every session open until told
"""


@unittest.skipUnless(os.geteuid() == 0, "needs root: the idle sessions are another uid's")
class IdleSessionsTest(SharedDaemonTestCase):

    def test_two_thousand_idle_sessions_of_one_user_lock_nobody_else_out(self):
        proc = subprocess.Popen(
            ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
             sys.executable, "-c", IDLE_SESSIONS_SCRIPT, self.daemon.session_address, "2000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd="/", env={"PATH": "/usr/bin:/bin"})
        self.addCleanup(proc.stderr.close)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stdin.close)
        self.addCleanup(proc.kill)
        greetings = eval(proc.stdout.readline() or "{}")
        self.assertEqual(greetings.get("HELLO"), 1024, (greetings, proc.stderr.read()
                                                       if proc.poll() is not None else ""))
        refusal = ("ERR uid %d has 1024 sessions open, the most ferryd allows one user "
                   "(max_sessions_per_uid); close idle clients" % NOBODY)
        self.assertEqual(greetings.get(refusal), 976, greetings)
        # With that uid's sessions all open: status answers at once, a trainer is served.
        start = time.monotonic()
        status = ferry_it.run_ferryctl(self.daemon.address, "status")
        self.assertEqual(status.returncode, 0, status.stderr)
        self.assertLess(time.monotonic() - start, 10)
        root = ferry_it.make_image_folder(os.path.join(self.dir, "images"), {"a": 2})
        self.assertEqual(len(list(self.loader(ferry.ImageFolder(root)))), 1)
        proc.stdin.write("\n")
        proc.stdin.flush()
        self.assertEqual(proc.wait(timeout=60), 0)


class NoDaemonTest(unittest.TestCase):
    def test_missing_socket_names_the_path_and_how_to_start_ferryd(self):
        d = ferry_it.short_tempdir("ferry-it-")
        self.addCleanup(os.rmdir, d)
        address = os.path.join(d, "ferryd.sock")
        hint = "start one with 'ferryd' (per-user) or 'systemctl start ferryd'"
        for fn in (lambda: ferry.Client(address),
                   lambda: ferry.Loader(ferry.ImageFolder(d), batch_size=2,
                                        transform=ferry.CenterCrop(8), address=address)):
            with self.assertRaises(ferry.FerryError) as cm:
                fn()
            self.assertEqual(cm.exception.code, "NOT_FOUND", cm.exception)
            self.assertIn("no ferryd at %s" % address, cm.exception.message)
            self.assertIn(os.path.join(d, "ferryd.session.sock"), cm.exception.message)
            self.assertIn(hint, cm.exception.message)
        proc = ferry_it.run_ferryctl(address, "status")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("no ferryd at %s" % address, proc.stderr)
        self.assertIn(hint, proc.stderr)


if __name__ == "__main__":
    unittest.main()
