"""Remote datasets: shards in an S3-compatible store (a fake one here, which checks that
requests are signed) and on an HTTP server are read through ferryd's node cache: the
batches equal those of the same files read locally, each object is downloaded once for
every job of the node and again after a ferryd restart not at all, missing objects are
named, and the credentials appear nowhere ferryd shows or logs."""

import http.server
import json
import os
import re
import threading
import unittest

import numpy as np

import ferry
import ferry_it

ACCESS_KEY = "AKIDFERRYTEST"
SECRET = "ferry-test-secret-never-shown"


class FakeStore(http.server.ThreadingHTTPServer):
    """Objects by path ("/bucket/key"), HEAD and ranged GET; requests under /bucket/ must be
    signed with ACCESS_KEY (403 otherwise); counts the GETs of each path."""

    def __init__(self):
        self.objects = {}
        self.gets = {}
        self.authorizations = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), FakeStoreHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def get_count(self):
        with self.lock:
            return sum(self.gets.values())


class FakeStoreHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _object(self):
        store = self.server
        auth = self.headers.get("Authorization", "")
        with store.lock:
            store.authorizations.append(auth)
        if self.path.startswith("/bucket/") and not auth.startswith(
                "AWS4-HMAC-SHA256 Credential=%s/" % ACCESS_KEY):
            self._error(403, "AccessDenied")
            return None
        data = store.objects.get(self.path)
        if data is None:
            self._error(404, "NoSuchKey")
        return data

    def _error(self, status, code):
        body = ("<Error><Code>%s</Code></Error>" % code).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        data = self._object()
        if data is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", '"%08x"' % (hash(data) & 0xffffffff))
        self.end_headers()

    def do_GET(self):
        data = self._object()
        if data is None:
            return
        with self.server.lock:
            self.server.gets[self.path] = self.server.gets.get(self.path, 0) + 1
        m = re.match(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        begin, end = (int(m.group(1)), int(m.group(2))) if m else (0, len(data) - 1)
        part = data[begin:end + 1]
        self.send_response(206 if m else 200)
        if m:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (begin, end, len(data)))
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        self.wfile.write(part)


class RemoteDatasetsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = FakeStore()
        rng = np.random.default_rng(7)
        cls.local = ferry_it.short_tempdir("ferry-remote-")
        for i, n in enumerate((3001, 2500)):
            tokens = rng.integers(0, 2**16, size=n, dtype=np.uint16)
            tokens.tofile(os.path.join(cls.local, "shard-%d.bin" % i))
            cls.store.objects["/bucket/train/shard-%d.bin" % i] = tokens.tobytes()
            cls.store.objects["/public/shard-%d.bin" % i] = tokens.tobytes()
        os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                           "AWS_REGION": "eu-central-1"})
        config = ('remote { cache_dir: "%%s/cache" cache_bytes: 100000000 s3_endpoint: "%s" }'
                  % cls.store.endpoint)
        cls.daemon = ferry_it.FerryDaemon(config=lambda d: config % d)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.store.shutdown()
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
            os.environ.pop(name, None)

    def batches(self, shards, batch_size=16, address=None):
        loader = ferry.Loader(ferry.TokenShards(shards, 31), batch_size=batch_size,
                              address=address or self.daemon.address, as_numpy=True,
                              timeout=60)
        try:
            return [b["tokens"].copy() for b in loader]
        finally:
            loader.close()

    def test_remote_shards_read_as_the_local_files_once_per_node(self):
        def gets():
            with self.store.lock:
                return {p: n for p, n in self.store.gets.items() if p.startswith("/bucket/")}

        local = self.batches(os.path.join(self.local, "shard-{0..1}.bin"))
        start = gets()
        remote = self.batches("s3://bucket/train/shard-{0..1}.bin")
        self.assertEqual(len(remote), len(local))
        for a, b in zip(local, remote):
            np.testing.assert_array_equal(a, b)
        first = gets()
        for path in ("/bucket/train/shard-0.bin", "/bucket/train/shard-1.bin"):
            # Downloaded now, or by an earlier test of this class on the same ferryd.
            self.assertIn(first.get(path, 0) - start.get(path, 0), (0, 1), path)
            self.assertGreaterEqual(first.get(path, 0), 1, path)
        # Another job (another batch size) over the same objects: no download.
        again = self.batches("s3://bucket/train/shard-{0..1}.bin", batch_size=7)
        self.assertEqual(sum(len(b) for b in again), sum(len(b) for b in local))
        self.assertEqual(gets(), first, "one download per node")
        # Plain HTTP(S) URLs go through the same cache.
        url = self.store.endpoint + "/public/shard-{0..1}.bin"
        for a, b in zip(local, self.batches(url)):
            np.testing.assert_array_equal(a, b)
        # Every request to the bucket was signed with ferryd's credentials; the secret is
        # nowhere ferryd shows or logs.
        signed = [a for a in self.store.authorizations if a]
        self.assertTrue(signed)
        self.assertTrue(all("Credential=%s/" % ACCESS_KEY in a and "/eu-central-1/s3/" in a
                            for a in signed))
        status = ferry_it.run_ferryctl(self.daemon.address, "status", "--json").stdout
        with open(self.daemon.log_path) as f:
            log = f.read()
        for text in (status, log):
            self.assertNotIn(SECRET, text)

    def test_the_cache_outlives_a_ferryd_restart(self):
        self.batches("s3://bucket/train/shard-{0..1}.bin")
        before = self.store.get_count()
        self.daemon.restart()
        self.batches("s3://bucket/train/shard-{0..1}.bin", batch_size=5)
        self.assertEqual(self.store.get_count(), before, "the restarted ferryd kept its cache")

    def test_a_missing_object_is_named(self):
        with self.assertRaises(ferry.FerryError) as raised:
            self.batches("s3://bucket/train/shard-{0..2}.bin")
        self.assertEqual(raised.exception.code, "NOT_FOUND")
        self.assertIn("s3://bucket/train/shard-2.bin", str(raised.exception))

    def test_allowed_prefixes_bound_what_a_job_may_name(self):
        config = ('remote { cache_dir: "%%s/cache" cache_bytes: 100000000 s3_endpoint: "%s" '
                  'allowed_prefixes: "s3://bucket/train/" }' % self.store.endpoint)
        bounded = ferry_it.FerryDaemon(config=lambda d: config % d)
        try:
            self.assertTrue(self.batches("s3://bucket/train/shard-{0..1}.bin",
                                         address=bounded.address))
            with self.assertRaises(ferry.FerryError) as raised:
                self.batches(self.store.endpoint + "/public/shard-{0..1}.bin",
                             address=bounded.address)
            self.assertEqual(raised.exception.code, "PERMISSION_DENIED")
            self.assertIn("allowed_prefixes", str(raised.exception))
        finally:
            bounded.stop()

    def test_a_ferryd_without_remote_settings_says_what_to_configure(self):
        plain = ferry_it.FerryDaemon()
        try:
            with self.assertRaises(ferry.FerryError) as raised:
                self.batches("s3://bucket/train/shard-{0..1}.bin", address=plain.address)
            self.assertIn("remote", str(raised.exception))
            self.assertIn("cache_dir", str(raised.exception))
        finally:
            plain.stop()


if __name__ == "__main__":
    unittest.main()
