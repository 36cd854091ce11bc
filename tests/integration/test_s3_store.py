"""s3:// shards on a real S3-compatible server (s3rver, testing/s3rver/serve.js, which checks
every request's SigV4 signature against its key's secret) read with the trainer's own
credentials: from its environment or a profile of its shared credentials file, sent with
the job to a ferryd that has none of its own. A job whose credentials the store refuses is
refused, though another job already brought the objects into the node's cache, and no
secret appears in what ferryd says, shows or logs."""

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
import urllib.request

import numpy as np

import ferry
import ferry_it

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "testing"))
import megatron_indexed  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVE = os.path.join(ROOT, "testing", "s3rver", "serve.js")
ALICE = ("AKIDALICEFERRY", "alice-secret-never-shown")
BOB = ("AKIDBOBFERRY", "bob-secret-never-shown")
NOBODY = 65534
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_REGION",
                 "AWS_DEFAULT_REGION")


class S3Server:
    """serve.js on an unused port, storing under a temporary directory; a private bucket
    "bucket" that ALICE's key pair may read; objects are uploaded unsigned."""

    def __init__(self, users=(ALICE,), **env):
        """users: the key pairs the store accepts. env: serve.js's settings (S3RVER_FLAKY,
        S3RVER_GATHER)."""
        if not os.path.isdir(os.path.join(ROOT, "testing", "s3rver", "node_modules")):
            raise RuntimeError(
                "s3rver is not installed: run `npm ci --prefix testing/s3rver` "
                "(scripts/test.sh does)")
        self.dir = tempfile.mkdtemp(prefix="ferry-s3rver-")
        self.process = subprocess.Popen(
            ["node", "--openssl-legacy-provider", SERVE, self.dir, "bucket"] +
            ["%s:%s" % pair for pair in users],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, **env))
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError("s3rver did not start: %r %s" % (line, self.process.stderr.read()))
        self.endpoint = "http://127.0.0.1:%d" % int(line.split()[1])

    def put(self, key, data):
        request = urllib.request.Request("%s/bucket/%s" % (self.endpoint, key), data=data,
                                         method="PUT")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200, answer.status

    def stop(self):
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def trainer_environment(**values):
    """The AWS variables of this process (the trainer's) set to `values` only."""
    saved = {name: os.environ.get(name) for name in AWS_VARIABLES + ("HOME",)}
    for name in AWS_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def upload_image_folder(store, local):
    """An image folder of 3 classes under <local>/images, put under images/ in the bucket."""
    images = ferry_it.make_image_folder(os.path.join(local, "images"),
                                        {"cat": 7, "dog": 5, "emu": 6})
    for directory, _, files in os.walk(images):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                store.put(os.path.relpath(path, local), f.read())
    return images


def upload_tokens(store, local, key, count, seed):
    """`count` random uint16 tokens written to <local>/<key's last part> and put under `key`;
    returns the local path."""
    path = os.path.join(local, key.rsplit("/", 1)[-1])
    np.random.default_rng(seed).integers(0, 2**16, size=count, dtype=np.uint16).tofile(path)
    with open(path, "rb") as f:
        store.put(key, f.read())
    return path


def remote_config(store, cache_bytes, settings=""):
    """settings: more RemoteStorage fields, in text format."""
    config = ('remote { cache_dir: "%%s/cache" cache_bytes: %d s3_endpoint: "%s" %s }'
              % (cache_bytes, store.endpoint, settings))
    return lambda d: config % d


class StoreTestCase(unittest.TestCase):
    """A test class's s3rver (cls.store), local copies of its data (cls.local) and ferryd
    (cls.daemon), made by setUpClass."""

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.store.stop()
        shutil.rmtree(cls.local, ignore_errors=True)

    @classmethod
    def serve_image_folder(cls, settings="", users=(ALICE,), **store_env):
        """setUpClass of a class whose store (S3Server(users, **store_env)) holds
        upload_image_folder's images (cls.images, the local copy) and whose ferryd has a
        100 MB cache and `settings` (remote)."""
        cls.store = S3Server(users=users, **store_env)
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        cls.images = upload_image_folder(cls.store, cls.local)
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(cls.store, 10**8, settings))

    def batches(self, shards, batch_size):
        """The token batches of TokenShards(shards, 31), read through cls.daemon with the
        trainer's environment as it is."""
        loader = ferry.Loader(ferry.TokenShards(shards, 31), batch_size=batch_size,
                              address=self.daemon.address, as_numpy=True, timeout=60)
        try:
            return [b["tokens"].copy() for b in loader]
        finally:
            loader.close()

    def assert_same_tokens(self, local, remote, batch_size=8):
        expected, got = self.batches(local, batch_size), self.batches(remote, batch_size)
        self.assertEqual(len(got), len(expected))
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)

    def image_batches(self, dataset, **options):
        loader = ferry.Loader(dataset, batch_size=4, address=self.daemon.address,
                              as_numpy=True, timeout=60, transform=ferry.CenterCrop(24),
                              **options)
        try:
            return [{k: b[k].copy() for k in ("image", "label")} for b in loader]
        finally:
            loader.close()

    def assert_same_images(self, local, remote):
        self.assertEqual(len(remote), len(local))
        for a, b in zip(local, remote):
            np.testing.assert_array_equal(a["label"], b["label"])
            np.testing.assert_array_equal(a["image"], b["image"])



class S3StoreTest(StoreTestCase):
    FLAKY = False  # FlakyStoreTest runs every test again against a store having a bad day
    SETTINGS = ""  # more RemoteStorage fields (BlockReadsTest's)

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server(S3RVER_FLAKY="1" if cls.FLAKY else "0", S3RVER_CUT_FIRST="/cut/")
        rng = np.random.default_rng(11)
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        for i, n in enumerate((4001, 2900, 3333)):
            tokens = rng.integers(0, 2**16, size=n, dtype=np.uint16)
            tokens.tofile(os.path.join(cls.local, "shard-%d.bin" % i))
            cls.store.put("train/shard-%d.bin" % i, tokens.tobytes())
        # An image folder (its keys listed by ferryd) and WebDataset shards.
        cls.images = upload_image_folder(cls.store, cls.local)
        for s in range(2):
            path = os.path.join(cls.local, "wds-%d.tar" % s)
            with tarfile.open(path, "w") as tar:
                for n in range(5):
                    for ext, data in ((".jpg", ferry_it.jpeg_bytes((40 * n, 90, 30 * s), variant=n)),
                                      (".cls", str(n + 10 * s).encode())):
                        info = tarfile.TarInfo("%d_%06d%s" % (s, n, ext))
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            with open(path, "rb") as f:
                cls.store.put("wds/shard-%d.tar" % s, f.read())
        # One file of each mapped kind: raw tokens, a Megatron indexed dataset, fixed-size
        # records, a .npy array.
        tokens = rng.integers(0, 2**16, size=5000, dtype=np.uint16)
        tokens.tofile(os.path.join(cls.local, "tokens.bin"))
        documents = [[list(rng.integers(1, 999, size=int(n))) for n in rng.integers(5, 90, 3)]
                     for _ in range(40)]
        megatron_indexed.write_indexed(os.path.join(cls.local, "wiki"), documents)
        rng.integers(0, 2**31, size=(300, 6), dtype=np.int32).tofile(
            os.path.join(cls.local, "records.bin"))
        np.save(os.path.join(cls.local, "array.npy"),
                rng.standard_normal((250, 3, 4)).astype(np.float32))
        for name in ("tokens.bin", "wiki.bin", "wiki.idx", "records.bin", "array.npy"):
            with open(os.path.join(cls.local, name), "rb") as f:
                cls.store.put("kinds/" + name, f.read())
        with trainer_environment():  # ferryd itself has no credentials
            cls.daemon = ferry_it.FerryDaemon(
                config=remote_config(cls.store, 100000000, cls.SETTINGS))

    def assert_same_as_local(self, batch_size):
        self.assert_same_tokens(os.path.join(self.local, "shard-{0..2}.bin"),
                                "s3://bucket/train/shard-{0..2}.bin", batch_size)

    def assert_no_secret_shown(self):
        status = ferry_it.run_ferryctl(self.daemon.address, "status", "--json").stdout
        jobs = ferry_it.run_ferryctl(self.daemon.address, "jobs", "--json").stdout
        with open(self.daemon.log_path) as f:
            log = f.read()
        for text in (status, jobs, log):
            self.assertNotIn(ALICE[1], text)
            self.assertNotIn("wrong-secret", text)

    def test_the_trainers_environment_credentials(self):
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assert_same_as_local(16)
        self.assert_no_secret_shown()

    def test_an_image_folder_under_a_prefix_is_listed_and_read(self):
        local = self.image_batches(ferry.ImageFolder(self.images))
        self.assertEqual(sum(len(b["label"]) for b in local), 18)
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            remote = self.image_batches(ferry.ImageFolder("s3://bucket/images"))
            self.assert_same_images(local, remote)
            with self.assertRaises(ferry.FerryError) as raised:
                self.image_batches(ferry.ImageFolder("s3://bucket/no-such-folder"))
        self.assertEqual(raised.exception.code, "NOT_FOUND")
        self.assertIn("no-such-folder/", str(raised.exception))

    def test_webdataset_shards(self):
        local = self.image_batches(ferry.WebDataset(os.path.join(self.local, "wds-{0..1}.tar")))
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            remote = self.image_batches(ferry.WebDataset("s3://bucket/wds/shard-{0..1}.tar"))
        self.assert_same_images(local, remote)

    def remote_status(self):
        status = json.loads(ferry_it.run_ferryctl(self.daemon.address, "status", "--json").stdout)
        return status["daemon"]["remote"]

    def test_a_second_job_downloads_nothing_and_status_shows_the_cache(self):
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assertTrue(self.batches("s3://bucket/train/shard-{0..2}.bin", 10))
            before = self.remote_status()
            self.assertTrue(self.batches("s3://bucket/train/shard-{0..2}.bin", 11))
            after = self.remote_status()
        self.assertEqual(after["downloaded_bytes"], before["downloaded_bytes"], "0 bytes downloaded")
        self.assertEqual(after.get("cache_misses"), before.get("cache_misses"))
        self.assertGreaterEqual(int(after["cache_hits"]) - int(before.get("cache_hits", 0)), 3)
        self.assertEqual(int(after["cache_capacity_bytes"]), 100000000)
        self.assertGreaterEqual(int(after["cache_bytes"]), 4001 * 2 + 2900 * 2 + 3333 * 2)
        self.assertEqual({r["reason"] for r in after["retries"]},
                         {"connection", "throttled", "server", "short"})
        text = ferry_it.run_ferryctl(self.daemon.address, "status").stdout
        self.assertIn("remote cache", text)
        self.assertIn("remote reads", text)

    def test_every_mapped_kind_reads_as_the_local_file(self):
        def kinds(where):
            return {
                "tokens": ferry.Tokens(where + "tokens.bin", 63),
                "indexed": ferry.IndexedDataset(where + "wiki", 31, position_ids=True),
                "megatron_gpt": ferry.MegatronGPT([where + "wiki"], 16, eod_token=0,
                                                  num_samples=100),
                "records": ferry.Records(where + "records.bin", "int32", (6,)),
                "npy": ferry.Npy(where + "array.npy"),
            }
        local, remote = kinds(self.local + "/"), kinds("s3://bucket/kinds/")
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            for name in local:
                got = []
                for dataset in (local[name], remote[name]):
                    loader = ferry.Loader(dataset, batch_size=8, address=self.daemon.address,
                                          as_numpy=True, timeout=60)
                    try:
                        got.append([{k: v.copy() for k, v in b.items()} for b in loader])
                    finally:
                        loader.close()
                self.assertTrue(got[0], name)
                self.assertEqual(len(got[0]), len(got[1]), name)
                for a, b in zip(*got):
                    self.assertEqual(sorted(a), sorted(b), name)
                    for k in a:
                        np.testing.assert_array_equal(a[k], b[k], err_msg=name)

    def test_a_profile_of_the_trainers_shared_credentials_file(self):
        home = tempfile.mkdtemp(prefix="ferry-home-")
        try:
            os.makedirs(os.path.join(home, ".aws"))
            with open(os.path.join(home, ".aws", "credentials"), "w") as f:
                f.write("[default]\naws_access_key_id = AKIDNOBODY\naws_secret_access_key = x\n"
                        "[training]\naws_access_key_id = %s\naws_secret_access_key = %s\n"
                        % ALICE)
            with trainer_environment(HOME=home, AWS_PROFILE="training"):
                self.assert_same_as_local(9)
        finally:
            shutil.rmtree(home)

    def test_a_wrong_secret_is_refused_though_another_job_cached_the_objects(self):
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assertTrue(self.batches("s3://bucket/train/shard-{0..2}.bin", 12))
        # Another job (another batch size) of a trainer whose secret is wrong: the store
        # refuses its HEAD, so the cached objects are not served to it.
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY="wrong-secret"):
            with self.assertRaises(ferry.FerryError) as raised:
                self.batches("s3://bucket/train/shard-{0..2}.bin", 13)
        self.assertEqual(raised.exception.code, "PERMISSION_DENIED")
        message = str(raised.exception)
        self.assertIn("s3://bucket/train/shard-0.bin", message)
        self.assertIn("SignatureDoesNotMatch", message)
        self.assert_no_secret_shown()

    def test_no_credentials_anywhere_is_refused_by_the_store(self):
        home = tempfile.mkdtemp(prefix="ferry-home-")  # no ~/.aws
        try:
            with trainer_environment(HOME=home):
                with self.assertRaises(ferry.FerryError) as raised:
                    self.batches("s3://bucket/train/shard-{0..2}.bin", 14)
        finally:
            shutil.rmtree(home)
        self.assertEqual(raised.exception.code, "PERMISSION_DENIED")
        self.assertIn("AccessDenied", str(raised.exception))

    def test_an_unknown_profile_is_named_by_the_trainer(self):
        home = tempfile.mkdtemp(prefix="ferry-home-")
        try:
            os.makedirs(os.path.join(home, ".aws"))
            with open(os.path.join(home, ".aws", "credentials"), "w") as f:
                f.write("[default]\naws_access_key_id = A\naws_secret_access_key = B\n")
            with trainer_environment(HOME=home, AWS_PROFILE="nosuch"):
                with self.assertRaises(ferry.FerryError) as raised:
                    self.batches("s3://bucket/train/shard-{0..2}.bin", 16)
            self.assertIn("[nosuch]", str(raised.exception))
        finally:
            shutil.rmtree(home)


class BlockReadsTest(S3StoreTest):
    """Every test of S3StoreTest with every object over 4 KiB (shards, .bin files, tars) read
    in blocks of 4 KiB, fetched with range reads ahead of the workers (a window of 8 blocks)
    or as the workers need them: the same samples, each once; a second job downloads
    nothing."""

    SETTINGS = "whole_object_max_bytes: 4096 block_bytes: 4096 read_ahead_objects: 8"

    def test_only_the_blocks_read_are_downloaded(self):
        # A batch of 2 windows of 63 tokens from a 200,000-token file (400,000 bytes, 98
        # blocks): the job downloads the blocks its samples touch, not the file.
        tokens = np.random.default_rng(5).integers(0, 2**16, size=200000, dtype=np.uint16)
        self.store.put("blocks/tokens.bin", tokens.tobytes())
        before = self.remote_status()
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = ferry.Loader(ferry.Tokens("s3://bucket/blocks/tokens.bin", 63), batch_size=2,
                                  prefetch=2, shuffle=True, seed=4, address=self.daemon.address,
                                  as_numpy=True, timeout=60)
            try:
                batch = next(iter(loader))
            finally:
                loader.close()
        for row, index in zip(batch["tokens"], batch["index"]):
            np.testing.assert_array_equal(row, tokens[index * 63:index * 63 + 64])
        after = self.remote_status()
        downloaded = int(after["downloaded_bytes"]) - int(before.get("downloaded_bytes", 0))
        # The first 64 KiB (the check that the file holds tokens), at most two blocks a
        # window of the batches the two slots filled, and the read-ahead's window of 8 blocks.
        self.assertGreater(downloaded, 0)
        self.assertLessEqual(downloaded, 64 * 1024 + 8 * 4096 + 8 * 4096)


def wait_for_gets(test, gets, count, timeout=60):
    """Waits until gets() (the store's GETs of a read-ahead's objects) reaches count, while the
    trainer holds its first batch; fails `test` saying how many came."""
    deadline = time.monotonic() + timeout
    while gets() < count:
        test.assertLess(time.monotonic(), deadline,
                        "the blocks of the batches after the slots' were not fetched while the "
                        "trainer held its first batch: %d of %d" % (gets(), count))
        time.sleep(0.05)


class BlockReadAheadTest(StoreTestCase):
    """While an epoch of windows of a token file read in blocks runs, ferryd fetches the blocks
    of the ranks' next batches ahead of the workers: the trainer holds its first batch, and
    meanwhile the store serves every block of the file, each once (fetch_connections 1); the
    rest of the epoch downloads nothing, and every window is delivered once, as the file holds
    it."""

    PREFETCH = 2
    TOKENS = 200000  # 400,000 bytes: 98 blocks of 4 KiB

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server()
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        cls.path = upload_tokens(cls.store, cls.local, "blocks/tokens.bin", cls.TOKENS, seed=9)
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(
                cls.store, 10**8, "whole_object_max_bytes: 4096 block_bytes: 4096 "
                "fetch_connections: 1 read_ahead_objects: 1000"))

    def test_the_next_batches_blocks_are_fetched_while_the_trainer_holds_a_batch(self):
        tokens = np.fromfile(self.path, dtype=np.uint16)
        blocks = (self.TOKENS * 2 + 4095) // 4096
        key = "/bucket/blocks/tokens.bin"

        def block_gets():
            return store_stats(self.store)["gets"].count(key)

        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = ferry.Loader(ferry.Tokens("s3://bucket/blocks/tokens.bin", 63),
                                  batch_size=4, shuffle=True, seed=3, prefetch=self.PREFETCH,
                                  address=self.daemon.address, as_numpy=True, timeout=60)
        try:
            batches = iter(loader)
            first = next(batches)
            rows = list(zip(first["index"].tolist(), first["tokens"].copy()))
            # The workers filled the slots' few batches (at most 2 blocks a window); every
            # other block comes from the read-ahead, which does not wait for the trainer.
            wait_for_gets(self, block_gets, blocks)
            for batch in batches:
                rows.extend(zip(batch["index"].tolist(), batch["tokens"].copy()))
            ahead = loader.job_status().get("read_ahead", {})
        finally:
            loader.close()
        self.assertEqual(sorted(i for i, _ in rows), list(range((self.TOKENS - 1) // 63)))
        for index, row in rows:
            np.testing.assert_array_equal(row, tokens[index * 63:index * 63 + 64])
        self.assertEqual(block_gets(), blocks, "a block was downloaded twice")
        slots_blocks = 2 * 4 * (self.PREFETCH + 1)
        self.assertGreaterEqual(int(ahead.get("opened", 0)), blocks - 16 - slots_blocks, ahead)
        self.assertEqual(int(ahead.get("failed", 0)), 0, ahead)


class MegatronBlockReadAheadTest(StoreTestCase):
    """The same for a Megatron GPT dataset whose .bin is read in blocks (its .idx fetched
    whole): while the trainer holds its first micro-batch, ferryd fetches the blocks of the
    samples' pieces of documents ahead of the workers, each once (the whole split: every
    block); the epoch is the local one."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server()
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        rng = np.random.default_rng(12)
        documents = [[list(rng.integers(1, 30000, size=int(n))) for n in rng.integers(20, 400, 2)]
                     for _ in range(300)]
        megatron_indexed.write_indexed(os.path.join(cls.local, "corpus"), documents)
        for name in ("corpus.bin", "corpus.idx"):
            with open(os.path.join(cls.local, name), "rb") as f:
                cls.store.put("mgpt/" + name, f.read())
        cls.bin_bytes = os.path.getsize(os.path.join(cls.local, "corpus.bin"))
        # An epoch reads every token but a tail shorter than a sample (130 bytes), which so
        # never leaves a block unread.
        assert cls.bin_bytes % 4096 == 0 or cls.bin_bytes % 4096 > 130, cls.bin_bytes
        assert os.path.getsize(os.path.join(cls.local, "corpus.idx")) <= 65536
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(
                cls.store, 10**8, "whole_object_max_bytes: 65536 block_bytes: 4096 "
                "fetch_connections: 1 read_ahead_objects: 1000"))

    def epoch(self, where, hold_first=None):
        loader = ferry.Loader(ferry.MegatronGPT([where + "corpus"], 64, eod_token=0,
                                                split="1,0,0"),
                              batch_size=4, prefetch=2, address=self.daemon.address,
                              as_numpy=True, timeout=60)
        try:
            batches = iter(loader)
            rows = [{k: v.copy() for k, v in next(batches).items()}]
            if hold_first is not None:
                hold_first()
            rows += [{k: v.copy() for k, v in b.items()} for b in batches]
            return rows, loader.job_status().get("read_ahead", {})
        finally:
            loader.close()

    def test_the_pieces_blocks_are_fetched_while_the_trainer_holds_a_batch(self):
        blocks = (self.bin_bytes + 4095) // 4096
        key = "/bucket/mgpt/corpus.bin"

        def block_gets():
            return store_stats(self.store)["gets"].count(key)

        local, _ = self.epoch(self.local + "/")
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            remote, ahead = self.epoch("s3://bucket/mgpt/",
                                       lambda: wait_for_gets(self, block_gets, blocks))
        self.assertEqual(len(remote), len(local))
        for a, b in zip(local, remote):
            self.assertEqual(sorted(a), sorted(b))
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], k)
        self.assertEqual(block_gets(), blocks, "a block was downloaded twice")
        self.assertGreater(int(ahead.get("opened", 0)), blocks // 2, ahead)
        self.assertEqual(int(ahead.get("failed", 0)), 0, ahead)


class ShardIndexTest(StoreTestCase):
    """A WebDataset given by its shard index (widsindex's JSON in the bucket, shard URLs
    relative to it) starts while a shard is still downloading: the store holds every GET of
    the last shard until the test releases it, and the batches of the other shards come
    meanwhile. The epoch is the one the same shards give read locally."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server(S3RVER_HOLD="/held/")
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        keys = ["wds/shard-0.tar", "wds/shard-1.tar", "wds/held/shard-2.tar"]
        for s, key in enumerate(keys):
            path = os.path.join(cls.local, "wds-%d.tar" % s)
            with tarfile.open(path, "w") as tar:
                for n in range(5):
                    for ext, data in ((".jpg", ferry_it.jpeg_bytes((40 * n, 90, 30 * s),
                                                                    variant=n)),
                                      (".cls", str(n + 10 * s).encode())):
                        info = tarfile.TarInfo("%d_%06d%s" % (s, n, ext))
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            with open(path, "rb") as f:
                cls.store.put(key, f.read())
        index = {"__kind__": "wids-shard-index-v1", "wids_version": 1,
                 "shardlist": [{"url": key[len("wds/"):], "nsamples": 5} for key in keys]}
        cls.store.put("wds/index.json", json.dumps(index).encode())
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(cls.store, 10**8))

    def loader(self, dataset, **options):
        return ferry.Loader(dataset, batch_size=5, shuffle=False, address=self.daemon.address,
                            as_numpy=True, timeout=60, transform=ferry.CenterCrop(24), **options)

    def test_the_epoch_starts_while_a_shard_is_still_downloading(self):
        copy = lambda b: {k: b[k].copy() for k in ("image", "label", "index")}
        local = self.loader(ferry.WebDataset(os.path.join(self.local, "wds-{0..2}.tar")))
        try:
            expected = [copy(b) for b in local]
        finally:
            local.close()
        self.assertEqual(len(expected), 3)

        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = self.loader(ferry.WebDataset(shard_index="s3://bucket/wds/index.json"),
                                 prefetch=1)
        try:
            self.assertEqual(int(loader.job["num_samples"]), 15)
            batches = iter(loader)
            got = [copy(next(batches)), copy(next(batches))]  # shards 0 and 1
            held = [g for g in store_stats(self.store)["gets"] if "/held/" in g]
            with urllib.request.urlopen(self.store.endpoint + "/__release", timeout=30):
                pass
            got.extend(copy(b) for b in batches)
        finally:
            loader.close()
        self.assertEqual(len(got), len(expected))
        for a, b in zip(expected, got):
            for field in ("index", "label", "image"):
                np.testing.assert_array_equal(a[field], b[field])
        gets = store_stats(self.store)["gets"]
        self.assertEqual(gets.count("/bucket/wds/index.json"), 1)
        self.assertLessEqual(len(held), 1, held)
        self.assertEqual(gets.count("/bucket/wds/held/shard-2.tar"), 1)


class FlakyStoreTest(S3StoreTest):
    """Every test of S3StoreTest against a store that answers the first attempt of every
    request 503 SlowDown and cuts each object's first transfer midway (whatever the order in
    which ferryd's concurrent requests arrive): the same samples, each once; the retries
    counted by cause."""

    FLAKY = True

    def test_the_retries_are_counted_by_cause(self):
        # An object no earlier test read, whose first transfer the store cuts (S3RVER_CUT_FIRST):
        # whatever the order of the requests, one retry is a broken transfer's.
        with open(os.path.join(self.local, "shard-0.bin"), "rb") as f:
            self.store.put("cut/shard-0.bin", f.read())
        before = {r["reason"]: int(r["count"]) for r in self.remote_status()["retries"]}
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assert_same_as_local(15)
            self.assert_same_tokens(os.path.join(self.local, "shard-0.bin"),
                                    "s3://bucket/cut/shard-0.bin", 15)
        retries = {r["reason"]: int(r["count"]) - before.get(r["reason"], 0)
                   for r in self.remote_status()["retries"]}
        self.assertGreater(retries["throttled"], 0)
        self.assertGreater(retries["short"] + retries["connection"], 0)


class PartsTest(S3StoreTest):
    """Every test of S3StoreTest with every object over 4 KiB fetched whole in parts of 4 KiB
    (range GETs of the version its HEAD gave, fetch_connections of them at once): the same
    samples, each once; a second job downloads nothing."""

    SETTINGS = "part_bytes: 4096"

    def test_an_object_comes_in_its_parts_each_once(self):
        size = os.path.getsize(os.path.join(self.local, "shard-1.bin"))  # 5,800 bytes
        with open(os.path.join(self.local, "shard-1.bin"), "rb") as f:
            self.store.put("parts/shard-1.bin", f.read())
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assert_same_tokens(os.path.join(self.local, "shard-1.bin"),
                                    "s3://bucket/parts/shard-1.bin")
        ranges = sorted(r.split(" ", 1)[1] for r in store_stats(self.store)["ranges"]
                        if r.startswith("/bucket/parts/shard-1.bin "))
        self.assertEqual(ranges, ["bytes=0-4095", "bytes=4096-%d" % (size - 1)])


class FlakyPartsTest(FlakyStoreTest):
    """FlakyStoreTest with objects over 8 KiB fetched in parts of 8 KiB: a part cut midway
    resumes from its last byte, a part answered 503 is asked for again."""

    SETTINGS = "part_bytes: 8192"


class FetchAheadTest(StoreTestCase):
    """A new job downloads the shards its spec names several at once (the store holds the
    first GETs until 4 are in flight, so the test does not depend on timing)."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server(S3RVER_GATHER="4")
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        for i in range(6):
            upload_tokens(cls.store, cls.local, "train/shard-%d.bin" % i, 3000 + 17 * i, seed=i)
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(cls.store, 100000000))

    def test_the_shards_download_in_parallel(self):
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assert_same_tokens(os.path.join(self.local, "shard-{0..5}.bin"),
                                    "s3://bucket/train/shard-{0..5}.bin")
        with urllib.request.urlopen(self.store.endpoint + "/__stats", timeout=30) as answer:
            stats = json.loads(answer.read())
        self.assertGreaterEqual(stats["most_gets_at_once"], 4)


def store_stats(store):
    with urllib.request.urlopen(store.endpoint + "/__stats", timeout=30) as answer:
        return json.loads(answer.read())


class ReadAheadTest(StoreTestCase):
    """While an epoch runs, ferryd fetches the images of the ranks' next batches in the order
    the sampler deals them, ahead of the workers: the trainer holds its first batch, and
    meanwhile the store serves every image of the epoch, one at a time (fetch_connections 1),
    in the order the batches then deliver them; the rest of the epoch downloads nothing."""

    PREFETCH = 2

    @classmethod
    def setUpClass(cls):
        cls.serve_image_folder("fetch_connections: 1 read_ahead_objects: 1000")

    def test_the_next_batches_images_are_fetched_in_the_samplers_order(self):
        samples = ferry_it.expected_samples(self.images)
        count = len(samples)
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = ferry.Loader(ferry.ImageFolder("s3://bucket/images"), batch_size=2,
                                  shuffle=True, seed=3, prefetch=self.PREFETCH,
                                  address=self.daemon.address, as_numpy=True, timeout=60,
                                  transform=ferry.CenterCrop(24))
        try:
            batches = iter(loader)
            order = next(batches)["index"].tolist()
            deadline = time.monotonic() + 60
            while len(store_stats(self.store)["gets"]) < count:
                self.assertLess(time.monotonic(), deadline,
                                "the images of the batches after the first were not fetched "
                                "while the trainer held its first batch: %s"
                                % store_stats(self.store)["gets"])
                time.sleep(0.05)
            for batch in batches:
                order.extend(batch["index"].tolist())
            ahead = loader.job_status().get("read_ahead", {})
        finally:
            loader.close()
        self.assertEqual(sorted(order), list(range(count)))
        gets = store_stats(self.store)["gets"]
        self.assertEqual(len(gets), count, "an image was downloaded twice, or late")
        keys = ["/bucket/" + os.path.relpath(samples[i][0], self.local) for i in order]
        self.assertEqual(sorted(gets), sorted(keys))
        # The workers fetch the images of the batches they start themselves (at most the
        # slots, and one more once the trainer gave its first batch back); the read-ahead
        # fetched all the others, in the order they were delivered.
        by_workers = set(keys[:2 * (self.PREFETCH + 1)])
        self.assertEqual([k for k in gets if k not in by_workers],
                         [k for k in keys if k not in by_workers])
        # One request per image, on a cold cache: its GET, of the version the listing gave,
        # proves the job may read it; no HEAD.
        self.assertEqual(store_stats(self.store).get("heads"), [])
        # Status says so: every image but the workers' own was opened ahead, none failed.
        self.assertGreaterEqual(int(ahead.get("opened", 0)), count - len(by_workers), ahead)
        self.assertEqual(int(ahead.get("failed", 0)), 0, ahead)


class ChangedSinceListedTest(StoreTestCase):
    """Objects rewritten in the store after the job listed their folder: the GET of the
    version the listing gave meets another, and ferryd reads each object as it is now (a
    HEAD says which version), never the listed version's name on the new bytes."""

    @classmethod
    def setUpClass(cls):
        cls.serve_image_folder()

    def test_objects_rewritten_after_the_listing_are_read_as_they_are_now(self):
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = ferry.Loader(ferry.ImageFolder("s3://bucket/images"), batch_size=4,
                                  address=self.daemon.address, as_numpy=True, timeout=60,
                                  transform=ferry.CenterCrop(24))
        try:
            self.assertEqual(len(loader), 5)  # the job exists: the folder is listed
            # Every image gets other bytes (another class's colour), in the store and here.
            for c, (directory, _, files) in enumerate(sorted(os.walk(self.images))[1:]):
                for name in files:
                    if not name.endswith(".jpg"):
                        continue
                    data = ferry_it.jpeg_bytes(ferry_it.CLASS_COLORS[(c + 1) % 3],
                                               variant=int(name[:-4]) + 7)
                    path = os.path.join(directory, name)
                    with open(path, "wb") as f:
                        f.write(data)
                    self.store.put(os.path.relpath(path, self.local), data)
            remote = [{k: b[k].copy() for k in ("image", "label")} for b in loader]
        finally:
            loader.close()
        self.assert_same_images(self.image_batches(ferry.ImageFolder(self.images)), remote)
        # Each image: one GET of the listed version (its answer, of another version, is
        # dropped), then a HEAD (two threads opening it at once may both ask) and one GET of
        # the version it gave.
        stats = store_stats(self.store)
        self.assertEqual(len(stats["gets"]), 36)
        self.assertEqual(len(set(stats["gets"])), 18)
        self.assertEqual(len(set(stats["heads"])), 18)


class ListOnlyCredentialsTest(StoreTestCase):
    """Two jobs read a cold image folder: alice's credentials may read it, bob's may only list
    it (S3RVER_LIST_ONLY). Bob's epoch starts first, and the store holds the first GETs for
    10 s (S3RVER_GATHER above what arrives), so alice's job then waits in the node cache for
    the downloads bob's job started. Bob's job is refused; alice's reads every image: she
    never takes the store's answer to him."""

    @classmethod
    def setUpClass(cls):
        cls.serve_image_folder(users=(ALICE, BOB), S3RVER_LIST_ONLY=BOB[0],
                               S3RVER_GATHER="1000")

    def test_a_job_the_store_refuses_never_fails_anothers_reads(self):
        loaders = {}
        for name, (key, secret), batch in (("alice", ALICE, 4), ("bob", BOB, 3)):
            with trainer_environment(AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret):
                loaders[name] = ferry.Loader(
                    ferry.ImageFolder("s3://bucket/images"), batch_size=batch, shuffle=False,
                    address=self.daemon.address, as_numpy=True, timeout=60,
                    transform=ferry.CenterCrop(24))
        results = {}

        def run(name):
            try:
                results[name] = [{k: b[k].copy() for k in ("image", "label")}
                                 for b in loaders[name]]
                results[name + " status"] = loaders[name].job_status()
            except ferry.FerryError as e:
                results[name] = e
            finally:
                loaders[name].close()
        threads = {name: threading.Thread(target=run, args=(name,)) for name in loaders}
        threads["bob"].start()
        deadline = time.monotonic() + 30
        while store_stats(self.store)["most_gets_at_once"] < 2:  # bob's downloads, held
            self.assertLess(time.monotonic(), deadline, "bob's job fetched nothing")
            time.sleep(0.02)
        threads["alice"].start()
        for t in threads.values():
            t.join(120)
        self.assertIsInstance(results.get("bob"), ferry.FerryError, results.get("bob"))
        self.assertIn("AccessDenied", str(results["bob"]))
        self.assertNotIsInstance(results.get("alice"), ferry.FerryError, results.get("alice"))
        self.assert_same_images(
            self.image_batches(ferry.ImageFolder(self.images), shuffle=False), results["alice"])
        # Not even a retried read: each of alice's opens that waited for bob's download asked
        # the store itself once that failed.
        status = results["alice status"]
        self.assertEqual(int(status.get("read_ahead", {}).get("failed", 0)), 0, status)
        self.assertEqual(int(status.get("transient_errors", 0)), 0, status)


class ManyObjectsTest(StoreTestCase):
    """An image folder of more objects than one ListObjectsV2 page holds (1,000): the listing
    follows the store's continuation tokens, and an epoch reads every image once."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server()
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        cls.counts = {"ant": 600, "bee": 403}
        for c, (name, count) in enumerate(sorted(cls.counts.items())):
            for i in range(count):
                cls.store.put("many/%s/%04d.jpg" % (name, i),
                              ferry_it.jpeg_bytes(ferry_it.CLASS_COLORS[c], variant=i % 7))
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(cls.store, 10**8))

    def test_every_page_of_the_listing_is_read(self):
        total = sum(self.counts.values())
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = ferry.Loader(ferry.ImageFolder("s3://bucket/many"), batch_size=64,
                                  shuffle=True, seed=2, address=self.daemon.address,
                                  as_numpy=True, timeout=120, transform=ferry.CenterCrop(8))
        try:
            self.assertEqual(len(loader), (total + 63) // 64)
            indices, labels = [], []
            for batch in loader:
                indices.extend(batch["index"].tolist())
                labels.extend(batch["label"].tolist())
        finally:
            loader.close()
        self.assertEqual(sorted(indices), list(range(total)))
        self.assertEqual(labels.count(0), self.counts["ant"])
        self.assertEqual(labels.count(1), self.counts["bee"])


OTHER_UID_SCRIPT = r"""
import hashlib, json, sys
import ferry
shards, address = sys.argv[1], sys.argv[2]
try:
    loader = ferry.Loader(ferry.TokenShards(shards, 31), batch_size=9, address=address,
                          as_numpy=True, timeout=60)
    digest = hashlib.sha256()
    for batch in loader:
        digest.update(batch["tokens"].tobytes())
    loader.close()
    print(json.dumps({"digest": digest.hexdigest()}))
except ferry.FerryError as e:
    print(json.dumps({"code": e.code, "message": str(e)}))
"""


@unittest.skipUnless(os.geteuid() == 0, "needs root: the second user runs as uid %d" % NOBODY)
class OtherUidTest(StoreTestCase):
    """One ferryd that two users reach (its sockets 0666): root's job brings the shards into
    the node cache; uid nobody's job is served them only with credentials the store accepts
    for them (Bob's), and downloads nothing; with none it is refused though they are cached."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server(users=(ALICE, BOB))
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        upload_tokens(cls.store, cls.local, "train/shard.bin", 5000, seed=5)
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(
                config=lambda d: "unix_socket_mode: 0666\n" + remote_config(cls.store, 10**8)(d),
                dir_mode=0o755)

    def as_nobody(self, **aws):
        env = {"PYTHONPATH": os.environ["PYTHONPATH"], "PYTHONDONTWRITEBYTECODE": "1",
               "HOME": "/", "PATH": "/usr/bin:/bin"}
        env.update(aws)
        proc = subprocess.run(
            ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
             sys.executable, "-c", OTHER_UID_SCRIPT, "s3://bucket/train/shard.bin",
             self.daemon.address],
            capture_output=True, text=True, timeout=120, env=env, cwd="/")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return json.loads(proc.stdout)

    def downloaded(self):
        out = ferry_it.run_ferryctl(self.daemon.address, "--json", "status")
        self.assertEqual(out.returncode, 0, out.stderr)
        return int(json.loads(out.stdout)["daemon"]["remote"].get("downloaded_bytes", 0))

    def test_another_users_job_is_served_the_cache_only_with_access(self):
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            loader = ferry.Loader(ferry.TokenShards("s3://bucket/train/shard.bin", 31),
                                  batch_size=9, address=self.daemon.address, as_numpy=True,
                                  timeout=60)
            digest = hashlib.sha256()
            for batch in loader:
                digest.update(batch["tokens"].tobytes())
            loader.close()
        cached = self.downloaded()
        self.assertGreaterEqual(cached, 10000)
        refused = self.as_nobody()  # no credentials: unsigned requests, a private bucket
        self.assertEqual(refused.get("code"), "PERMISSION_DENIED", refused)
        self.assertIn("AccessDenied", refused["message"])
        self.assertIn("s3://bucket/train/shard.bin", refused["message"])
        served = self.as_nobody(AWS_ACCESS_KEY_ID=BOB[0], AWS_SECRET_ACCESS_KEY=BOB[1])
        self.assertEqual(served, {"digest": digest.hexdigest()})
        self.assertEqual(self.downloaded(), cached)  # Bob's job read root's download


class KillMidDownloadTest(StoreTestCase):
    """ferryd killed while it downloads an object, then restarted: the partial download is
    deleted, never served, and the object is fetched again whole."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server(S3RVER_STALL_FIRST="big")
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        upload_tokens(cls.store, cls.local, "train/big.bin", 40000, seed=9)
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(config=remote_config(cls.store, 100000000))

    def temporary_files(self):
        cache = os.path.join(self.daemon.dir, "cache")
        return [os.path.join(d, n) for d, _, names in os.walk(cache) for n in names
                if ".tmp." in n]

    def test_a_partial_download_is_never_served(self):
        trainer = subprocess.Popen(
            [sys.executable, "-c",
             "import ferry, sys\n"
             "loader = ferry.Loader(ferry.TokenShards(sys.argv[1], 31), batch_size=8,"
             " address=sys.argv[2], timeout=120)\n"
             "for batch in loader: pass\n",
             "s3://bucket/train/big.bin", self.daemon.address],
            env=dict(os.environ, AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # The store sends the first 4 KiB and stalls: ferryd holds a partial temporary file.
            def partial():
                for path in self.temporary_files():
                    try:
                        if os.path.getsize(path) > 0:
                            return True
                    except OSError:  # renamed or deleted since it was listed
                        pass
                return False
            self.assertTrue(ferry_it.poll(partial, timeout=60), "no partial download to kill")
            self.daemon.restart()
        finally:
            trainer.kill()
            trainer.wait()
        self.assertEqual(self.temporary_files(), [], "the restarted ferryd deleted the leftover")
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            self.assert_same_tokens(os.path.join(self.local, "big.bin"),
                                    "s3://bucket/train/big.bin")


class SmallCacheTest(StoreTestCase):
    """A node cache smaller than the image folder: each epoch still delivers every image
    once, as the local folder has it, by evicting what no worker reads."""

    @classmethod
    def setUpClass(cls):
        cls.store = S3Server()
        cls.local = ferry_it.short_tempdir("ferry-s3-")
        cls.images = upload_image_folder(cls.store, cls.local)
        folder_bytes = sum(os.path.getsize(os.path.join(d, n))
                           for d, _, names in os.walk(cls.images) for n in names)
        with trainer_environment():
            cls.daemon = ferry_it.FerryDaemon(
                config=remote_config(cls.store, int(folder_bytes * 0.4)))

    def epochs(self, root, count):
        loader = ferry.Loader(ferry.ImageFolder(root), batch_size=4, shuffle=True, seed=5,
                              address=self.daemon.address, as_numpy=True, timeout=60,
                              transform=ferry.CenterCrop(24))
        try:
            out = []
            for epoch in range(count):
                loader.set_epoch(epoch)
                images = {}
                for b in loader:
                    for i, index in enumerate(b["index"].tolist()):
                        self.assertNotIn(index, images, "delivered twice")
                        images[index] = (int(b["label"][i]), b["image"][i].copy())
                out.append(images)
            return out
        finally:
            loader.close()

    def test_every_epoch_is_exact_though_the_cache_holds_less_than_the_folder(self):
        local = self.epochs(self.images, 1)[0]
        with trainer_environment(AWS_ACCESS_KEY_ID=ALICE[0], AWS_SECRET_ACCESS_KEY=ALICE[1]):
            remote = self.epochs("s3://bucket/images", 2)
        for images in remote:
            self.assertEqual(sorted(images), sorted(local))
            for index, (label, image) in images.items():
                self.assertEqual(label, local[index][0])
                np.testing.assert_array_equal(image, local[index][1])
        status = json.loads(ferry_it.run_ferryctl(self.daemon.address, "status", "--json").stdout)
        remote_status = status["daemon"]["remote"]
        self.assertGreater(int(remote_status["cache_evictions"]), 0)
        self.assertLessEqual(int(remote_status["cache_bytes"]),
                             int(remote_status["cache_capacity_bytes"]))


if __name__ == "__main__":
    unittest.main()
