#!/usr/bin/python3
"""Remote datasets: WebDataset shards of ImageNet-like JPEGs, the same JPEGs as an image
folder of one object each, and token shards in an S3-compatible store (s3rver on this machine, testing/s3rver), read through ferryd's node
cache, next to the store's own GET throughput and the same shards on local disk. Prints a
table; never asserts.

  python3 bench/remote_bench.py [--build-dir build] [--data DIR] [--images 3000]
      [--tokens-mb 256] [--block-mb 16] [--connections 16] [--store-mb-per-s R]
      [--kinds webdataset,webdataset_index,...] [--keep]

Kinds: webdataset (shards named by a pattern: the job's creation reads every shard to
index it), webdataset_index (the same shards named by their shard index, widsindex's JSON
with each shard's sample count, put in the store: the job starts on the index alone and
each shard is indexed when the epoch first reads it), image_folder, token_shards,
token_blocks.

Rows, all in one run on one machine:
  GET peak      every shard fetched whole by --connections threads at once with a plain
                HTTP client (no ferry): the store's throughput with the connections ferryd
                uses (remote.fetch_connections).
  cold          a ferryd with an empty cache: the job's creation (which fetches the shards
                ahead, then indexes them; for the image folder, lists the keys) and its
                first epoch, from the Loader's creation to the last batch, the images
                fetched ahead of the workers in the sampler's order (remote.read_ahead_*).
                MB/s vs GET peak (target >= 0.9x), then the slower of GET peak and the
                warm epoch over the cold epoch's time (1.00x: fetching adds nothing to
                what the store or the pipeline costs anyway).
  cold, no RA   the same with read_ahead_objects 0 (image folder and token blocks only):
                each image, or block, is fetched by the worker that reads it.
  warm          a second job (another batch size) on the same ferryd: its creation and
                epoch, served from the cache; images/s vs local (target >= 0.95x), then the
                same for the epochs alone (the jobs' creation left out: the warm job's
                makes a HEAD per object), and the bytes it downloaded (target 0).
  local         the same shards on local disk (in the page cache), a fresh ferryd.
The image pipeline: WebDataset (shuffle buffer of one shard's samples) or image folder,
batch 64, RandomResizedCrop(224, flip), shuffle, device
"cpu"; the trainer touches each batch's shape only. Tokens: TokenShards(seq_len 2048),
batch 16; token_blocks is the same shards read in blocks of --block-mb (whole_object_max_bytes
below the shard size), their blocks fetched ahead in the sampler's order. CPU: ferryd's and this process's CPU seconds (user + system) over the row, and
for GET peak this process's alone. The store runs on the same machine: its CPU competes
with ferryd's, and on a small machine the image rows measure decoding, not the network.
--store-mb-per-s R puts the store behind a link of R MB/s that all connections share
(testing/s3rver's S3RVER_MB_PER_S), as a store across a network is; every row, GET peak
included, goes through it. Unset: loopback, faster than any store across a network.
"""

import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from dataset_bench import start_ferryd  # noqa: E402


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` (its threads included)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Store:
    """serve.js with public reads on an unused port."""

    def __init__(self, directory, mb_per_s=0):
        serve = os.path.join(REPO, "testing", "s3rver", "serve.js")
        if not os.path.isdir(os.path.join(REPO, "testing", "s3rver", "node_modules")):
            sys.exit("s3rver is not installed: npm ci --prefix testing/s3rver")
        self.process = subprocess.Popen(["node", "--openssl-legacy-provider", serve, directory,
                                         "bucket"],
                                        stdout=subprocess.PIPE, text=True,
                                        env=dict(os.environ, S3RVER_PUBLIC="1",
                                                 S3RVER_MB_PER_S=str(mb_per_s or "")))
        line = self.process.stdout.readline()
        if not line.startswith("PORT "):
            sys.exit("s3rver did not start: %r" % line)
        self.endpoint = "http://127.0.0.1:%d" % int(line.split()[1])

    def url(self, key):
        return "%s/bucket/%s" % (self.endpoint, key)

    def put(self, key, path):
        with open(path, "rb") as f:
            request = urllib.request.Request(self.url(key), data=f.read(), method="PUT")
        with urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()

    def stop(self):
        self.process.kill()
        self.process.wait()


def get_peak(store, keys, connections):
    """(MB/s, seconds, bytes): every key fetched whole, `connections` at a time."""
    def fetch(key):
        with urllib.request.urlopen(store.url(key), timeout=300) as answer:
            n = 0
            while True:
                chunk = answer.read(1 << 20)
                if not chunk:
                    return n
                n += len(chunk)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(connections) as pool:
        total = sum(pool.map(fetch, keys))
    seconds = time.monotonic() - start
    return total / seconds / 1e6, seconds, total


def shard_samples(path):
    """A WebDataset shard's samples as WebDataset counts them: runs of members sharing a
    basename (the part of the file name before its first '.')."""
    count, last = 0, None
    with tarfile.open(path) as tar:
        for member in tar:
            directory, _, name = member.name.rpartition("/")
            if "." not in name or name.startswith("."):
                continue
            key = directory + "/" + name.split(".", 1)[0]
            if key != last:
                count, last = count + 1, key
    return count


def epoch(ferry, sock, dataset, batch_size, transform, proc, created=None):
    """(seconds, samples, ferryd + own CPU seconds) of a new job's creation and first epoch;
    `created`, a list, gets the seconds of the creation alone (the Loader's construction)."""
    cpu0 = cpu_seconds(proc.pid) + own_cpu()
    start = time.monotonic()
    loader = ferry.Loader(dataset, batch_size=batch_size, transform=transform, shuffle=True,
                          seed=1, address=sock, as_numpy=True, device="cpu", timeout=600)
    if created is not None:
        created.append(time.monotonic() - start)
    samples = 0
    try:
        for batch in loader:
            samples += next(iter(batch.values())).shape[0]
    finally:
        loader.close()
    return time.monotonic() - start, samples, cpu_seconds(proc.pid) + own_cpu() - cpu0


def downloaded(ctl, sock):
    out = subprocess.run([ctl, "--address", sock, "--json", "status"], capture_output=True,
                         text=True, check=True).stdout
    return int(json.loads(out)["daemon"].get("remote", {}).get("downloaded_bytes", 0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--data", help="a make_bench_dataset.py output (default: made here)")
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--tokens-mb", type=int, default=256)
    p.add_argument("--block-mb", type=int, default=16,
                   help="block_bytes of the token_blocks rows, in MiB")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--store-mb-per-s", type=float, default=0,
                   help="the store's link, shared by every connection (default: loopback)")
    p.add_argument("--kinds", default="webdataset,webdataset_index,image_folder,token_shards,"
                   "token_blocks", help="the kinds to measure, comma-separated")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = p.parse_args()
    build = os.path.abspath(a.build_dir)
    sys.path.insert(0, os.path.join(build, "python"))
    import ferry
    ferryd = os.path.join(build, "server", "ferryd")
    ctl = os.path.join(build, "client", "ferryctl", "ferryctl")

    work = tempfile.mkdtemp(prefix="ferry-remote-bench-", dir="/tmp")
    store = None
    procs = []
    try:
        data = a.data
        if data is None:
            data = os.path.join(work, "data")
            subprocess.run([sys.executable, os.path.join(HERE, "make_bench_dataset.py"), data,
                            "--images", str(a.images), "--classes", "20", "--shard-size", "100",
                            "--tokens-mb", "0"], check=True, stdout=subprocess.DEVNULL)
        shards = sorted(os.listdir(os.path.join(data, "shards")))
        folder = os.path.join(data, "imagefolder")
        image_paths = sorted(os.path.join(d, n) for d, _, names in os.walk(folder)
                             for n in names)
        image_keys = [os.path.relpath(p, folder) for p in image_paths]
        shard_paths = [os.path.join(data, "shards", s) for s in shards]
        token_paths = []
        tokens_dir = os.path.join(work, "tokens")
        os.makedirs(tokens_dir)
        import numpy as np
        rng = np.random.default_rng(0)
        per_shard = 32 << 20
        for i in range(max(1, (a.tokens_mb << 20) // per_shard)):
            path = os.path.join(tokens_dir, "tokens-%03d.bin" % i)
            rng.integers(0, 50257, size=per_shard // 2, dtype=np.uint16).tofile(path)
            token_paths.append(path)

        store = Store(os.path.join(work, "store"), a.store_mb_per_s)
        for path in shard_paths:
            store.put("wds/" + os.path.basename(path), path)
        for path in token_paths:
            store.put("tokens/" + os.path.basename(path), path)
        for path, key in zip(image_paths, image_keys):
            store.put("images/" + key, path)
        for path in shard_paths + token_paths + image_paths:  # local rows: the page cache
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        # The shards' index, as `widsindex create` writes it: in the store next to the
        # shards (URLs relative to it), and on disk for the local row.
        counts = [shard_samples(p) for p in shard_paths]
        index = os.path.join(work, "index.json")
        for name, urls in (("index.json", shards), ("index-local.json", shard_paths)):
            with open(os.path.join(work, name), "w") as f:
                json.dump({"__kind__": "wids-shard-index-v1", "wids_version": 1,
                           "shardlist": [{"url": u, "nsamples": n}
                                         for u, n in zip(urls, counts)]}, f)
        store.put("wds/index.json", index)
        shard_bytes = sum(os.path.getsize(p) for p in shard_paths)
        token_bytes = sum(os.path.getsize(p) for p in token_paths)
        image_bytes = sum(os.path.getsize(p) for p in image_paths)
        print("%d WebDataset shards (%.0f MiB, %d images), the images as objects (%.0f MiB) "
              "and %d token shards (%.0f MiB) in s3rver at %s (%s); %d connections; %d CPUs" % (
                  len(shards), shard_bytes / 2**20, a.images, image_bytes / 2**20,
                  len(token_paths), token_bytes / 2**20, store.endpoint,
                  "a link of %g MB/s" % a.store_mb_per_s if a.store_mb_per_s else "loopback",
                  a.connections, os.cpu_count()))

        crop = ferry.RandomResizedCrop(224, flip=True)
        token_keys = [os.path.basename(p) for p in token_paths]
        token_remote = lambda prefix: ferry.TokenShards(  # noqa: E731
            [prefix + "tokens/" + k for k in token_keys], 2048)
        # Shards over whole_object_max_bytes are read in blocks.
        blocks = "whole_object_max_bytes: %d block_bytes: %d" % (
            per_shard // 2, a.block_mb << 20)
        # WebDataset's shuffle buffer holds one shard's samples: over a corpus of millions,
        # its default 1000 spans a few shards; over these 1000 images it would span all.
        buffer = max(1, counts[0])
        kinds = [
            ("webdataset", shards, shard_bytes, 64, crop,
             lambda prefix: ferry.WebDataset(prefix + "wds/{%s}" % ",".join(shards),
                                             shuffle_buffer=buffer),
             ferry.WebDataset(shard_paths, shuffle_buffer=buffer), ""),
            ("webdataset_index", shards, shard_bytes, 64, crop,
             lambda prefix: ferry.WebDataset(shard_index=prefix + "wds/index.json",
                                             shuffle_buffer=buffer),
             ferry.WebDataset(shard_index=os.path.join(work, "index-local.json"),
                              shuffle_buffer=buffer), ""),
            ("image_folder", image_keys, image_bytes, 64, crop,
             lambda prefix: ferry.ImageFolder(prefix + "images"), ferry.ImageFolder(folder), ""),
            ("token_shards", token_keys, token_bytes, 16, None, token_remote,
             ferry.TokenShards(token_paths, 2048), ""),
            ("token_blocks", token_keys, token_bytes, 16, None, token_remote,
             ferry.TokenShards(token_paths, 2048), blocks),
        ]
        wanted = a.kinds.split(",")
        unknown = set(wanted) - {k[0] for k in kinds}
        if unknown:
            p.error("unknown kinds: %s" % ", ".join(sorted(unknown)))
        rows = []
        for name, keys, nbytes, batch, transform, remote, local, kind_settings in kinds:
            if name not in wanted:
                continue
            prefix = {"webdataset": "wds/", "webdataset_index": "wds/",
                      "image_folder": "images/"}.get(name, "tokens/")
            mbs, seconds, _ = get_peak(store, [prefix + k for k in keys], a.connections)
            rows.append((name, "GET peak", seconds, None, None, "%.0f MB/s" % mbs, "1.00x", ""))
            peak = mbs
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}

            def remote_ferryd(suffix, settings=""):
                workdir = os.path.join(work, "ferryd-%s%s" % (name, suffix))
                os.makedirs(workdir)
                config = ('remote { cache_dir: "%s/cache" cache_bytes: %d s3_endpoint: "%s" '
                          'fetch_connections: %d %s }' % (
                              workdir, 4 * (shard_bytes + token_bytes + image_bytes),
                              store.endpoint, a.connections, kind_settings + " " + settings))
                proc, sock, _ = start_ferryd(ferryd, workdir, ferry, config, env)
                procs.append(proc)
                return proc, sock

            if name in ("image_folder", "token_blocks"):
                proc, sock = remote_ferryd("-no-ra", "read_ahead_objects: 0")
                t, n, cpu = epoch(ferry, sock, remote("s3://bucket/"), batch, transform, proc)
                no_ra_row = (name, "cold, no RA", t, n, cpu, "%.0f MB/s" % (nbytes / t / 1e6),
                             "%.2fx" % (nbytes / t / 1e6 / peak), "")
            proc, sock = remote_ferryd("")
            t, n, cpu = epoch(ferry, sock, remote("s3://bucket/"), batch, transform, proc)
            cold_mbs = nbytes / t / 1e6
            cold_row = len(rows)
            rows.append(None)  # the cold row, once the warm epoch is known
            before = downloaded(ctl, sock)
            created = []
            t_warm, n_warm, cpu_warm = epoch(ferry, sock, remote("s3://bucket/"), batch + 1,
                                             transform, proc, created)
            got = downloaded(ctl, sock) - before
            local_dir = os.path.join(work, "ferryd-local-" + name)
            os.makedirs(local_dir)
            lproc, lsock, _ = start_ferryd(ferryd, local_dir, ferry)
            procs.append(lproc)
            epoch(ferry, lsock, local, batch + 2, transform, lproc)  # untimed: start-up
            t_local, n_local, cpu_local = epoch(ferry, lsock, local, batch + 1, transform, lproc,
                                                created)
            warm_rate, local_rate = n_warm / t_warm, n_local / t_local
            # The cold epoch against the store (GET peak), and against the slower of the
            # store and the pipeline (1.00x: fetching costs nothing beyond that).
            rows[cold_row] = (name, "cold", t, n, cpu, "%.0f MB/s" % cold_mbs,
                              "%.2fx, %.2fx" % (cold_mbs / peak, max(seconds, t_warm) / t),
                              "%.0f MiB" % (before / 2**20))
            if name in ("image_folder", "token_blocks"):
                rows.append(no_ra_row)
            # Also without the jobs' creation (the warm job's makes one HEAD per object,
            # the check that its credentials may read what the cache holds).
            epoch_ratio = (t_local - created[1]) / (t_warm - created[0])
            rows.append((name, "warm", t_warm, n_warm, cpu_warm, "%.0f samples/s" % warm_rate,
                         "%.2fx; %.2fx" % (warm_rate / local_rate, epoch_ratio), "%d B" % got))
            rows.append((name, "local", t_local, n_local, cpu_local,
                         "%.0f samples/s" % local_rate, "1.00x", ""))
        print("%-13s %-11s %8s %8s %8s %16s %14s %12s" % (
            "kind", "row", "seconds", "samples", "CPU s", "rate", "ratio", "downloaded"))
        for name, row, t, n, cpu, rate, ratio, got in rows:
            print("%-13s %-11s %8.2f %8s %8s %16s %14s %12s" % (
                name, row, t, "" if n is None else n, "" if cpu is None else "%.1f" % cpu,
                rate, ratio, got))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        if store is not None:
            store.stop()
        if a.keep:
            print("kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
