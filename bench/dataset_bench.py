#!/usr/bin/python3
"""Dataset-format benchmark of the host JPEG pipeline, run on the CPU. Prints a table; never
asserts.

  python3 bench/dataset_bench.py [--build-dir build] [--ferryd PATH] [--data DIR]
      [--classes 20] [--images-per-class 100] [--rounds 5] [--epochs 2]

Two questions, answered on the same images in one run:
  (a) corrupt: how fast is an imagefolder in which 1% of the files are damaged, against the
      clean imagefolder (target: >= 0.95x)? The damaged files are every 100th in ferryd's
      sample order: one replaced by text, the others alternately truncated to half or
      overwritten with random bytes in the middle of their entropy-coded data. Under the
      default on_corrupt_sample="skip" each is replaced by a deterministic substitute and
      quarantined (never read again by that job), so the first epoch, which finds them,
      and the later epochs, which only skip them, are reported apart.
  (b) tar: the same images as WebDataset tar shards (<key>.jpg + <key>.cls, ~100 samples a
      shard, written in a shuffled order as real shards are) against the imagefolder.

Every variant runs the same pipeline: ferry.Loader(batch_size=64,
RandomResizedCrop(224, flip=True), shuffle, drop_last, device="cpu") on a private ferryd
(one worker per core), the trainer reading only each batch's shape, one pixel and its
small index and label arrays. Images/s = images delivered / wall seconds, per phase: the
first epoch is timed from iter() (ferryd fills nothing before it) to its last batch, the
later epochs likewise. Machines are noisy, so the variants run interleaved: each round
runs clean, corrupt and tar once each, in an order rotated every round, each as a fresh
job (own name, deleted afterwards: nothing, quarantine included, carries over); the
table gives median, min and max over the rounds and the ratio of medians to the clean
imagefolder's same phase. Before the rounds every file is read once (page cache) and
one untimed clean epoch warms ferryd.

Also printed: the bad samples each corrupt job counted (errors, quarantined after the
first epoch and at the end, substitutes served), which damaged files it found, and label
mismatches (delivered label vs the class of the delivered index) as a sanity check.

Needs numpy and PIL (Debian: python3-numpy python3-pil); torch is not needed.
"""

import argparse
import io
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("clean", "corrupt", "tar")
DESCRIPTIONS = {"clean": "imagefolder, clean",
                "corrupt": "imagefolder, 1% corrupt",
                "tar": "WebDataset tar shards"}


# ---------------------------------------------------------------------------------------
# Datasets

def imagefolder_samples(root):
    """[(relative path, label)] in ferryd's sample order: class directories sorted by name
    (label = position), then each one's .jpg/.jpeg files sorted by name (bytewise, as
    server/dataset/image_folder_source.cc sorts them)."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    out = []
    for label, name in enumerate(classes):
        files = sorted(f for f in os.listdir(os.path.join(root, name))
                       if os.path.splitext(f)[1].lower() in (".jpg", ".jpeg") and
                       not os.path.isdir(os.path.join(root, name, f)))
        out.extend((os.path.join(name, f), label) for f in files)
    return out


def entropy_coded_range(jpeg):
    """(start, end) of the first scan's entropy-coded data: from after the SOS segment to
    the EOI marker. None when the markers cannot be followed."""
    pos = 2  # after SOI
    while pos + 4 <= len(jpeg):
        if jpeg[pos] != 0xFF:
            return None
        marker = jpeg[pos + 1]
        length = int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if marker == 0xDA:  # SOS: its header, then the entropy-coded data
            start = pos + 2 + length
            end = len(jpeg) - 2 if jpeg.endswith(b"\xff\xd9") else len(jpeg)
            return (start, end) if start < end else None
        pos += 2 + length
    return None


def damage(jpeg, kind, rng):
    """The bytes of a damaged copy of `jpeg`."""
    if kind == "not-jpeg":
        return b"This file was a JPEG; it is text now.\n" * 4
    if kind == "truncated":
        return jpeg[:len(jpeg) // 2]
    # "garbage": random bytes over a stretch in the middle of the entropy-coded data (not
    # the headers, which would fail every decode at once), found only by a decode whose crop
    # reaches it. libjpeg flags a 0xFF byte followed by a non-zero one there (a stray
    # marker; ferryd treats the warning as an error); a stretch without one decodes
    # silently into wrong pixels (JPEG has no checksum), so the "found" line below may
    # show fewer garbage files than were damaged.
    span = entropy_coded_range(jpeg)
    if span is None:
        return jpeg[:len(jpeg) // 2]
    start, end = span
    n = max(16, min(512, (end - start) // 16))
    at = start + (end - start) // 2 - n // 2
    return jpeg[:at] + bytes(rng.getrandbits(8) for _ in range(n)) + jpeg[at + n:]


def make_corrupt_copy(clean_root, out_root, samples, every):
    """A copy of the imagefolder at out_root whose sample positions every//2, every//2 +
    every, ... are damaged: the first replaced by text, the rest alternately truncated and
    overwritten with garbage. Good files are hard links (same page-cache pages as the clean
    tree); damaged files are new files, so the clean tree is never touched.
    Returns {sample index: kind}."""
    bad = {}
    for i in range(every // 2, len(samples), every):
        bad[i] = "not-jpeg" if not bad else ("truncated" if len(bad) % 2 else "garbage")
    for i, (rel, _) in enumerate(samples):
        src, dst = os.path.join(clean_root, rel), os.path.join(out_root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if i in bad:
            with open(src, "rb") as f:
                data = f.read()
            with open(dst, "wb") as f:
                f.write(damage(data, bad[i], random.Random(i)))
            continue
        try:
            os.link(src, dst)
        except OSError:  # another filesystem (--data elsewhere), or no hard links there
            shutil.copyfile(src, dst)
    return bad


def write_shards(clean_root, out_dir, samples, per_shard):
    """WebDataset shards of the imagefolder's images, per_shard samples each, in a fixed
    shuffled order (as shards are written for training, so a shard mixes classes). Member
    <key>.jpg holds the file's bytes, <key>.cls its class index as decimal text. Returns
    (shard paths in order, labels by ferryd's webdataset sample index, which counts samples
    in shard order, then member order)."""
    order = list(range(len(samples)))
    random.Random(0).shuffle(order)
    os.makedirs(out_dir)
    shards, labels = [], []
    for s, first in enumerate(range(0, len(order), per_shard)):
        path = os.path.join(out_dir, "shard-%06d.tar" % s)
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in order[first:first + per_shard]:
                rel, label = samples[i]
                key = os.path.splitext(rel.replace(os.sep, "_"))[0]
                with open(os.path.join(clean_root, rel), "rb") as f:
                    image = f.read()
                for name, data in ((key + ".jpg", image), (key + ".cls", b"%d" % label)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    info.mtime = 1700000000
                    tar.addfile(info, io.BytesIO(data))
                labels.append(label)
        shards.append(path)
    return shards, labels


def read_all(paths):
    """Reads every file once so the measured runs find them in the page cache."""
    total = 0
    for top in paths:
        files = [top] if os.path.isfile(top) else (
            os.path.join(d, f) for d, _, names in os.walk(top) for f in names)
        for path in files:
            with open(path, "rb") as f:
                while True:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    total += len(chunk)
    return total


# ---------------------------------------------------------------------------------------
# ferryd and runs

def start_ferryd(binary, workdir, ferry, config=None, env=None):
    """A private ferryd on <workdir>/ferryd.sock (with `config`, DaemonConfig text, when
    given), once it answers: (process, socket, log path)."""
    sock = os.path.join(workdir, "ferryd.sock")
    log_path = os.path.join(workdir, "ferryd.log")
    argv = [binary, "--listen", sock]
    if config is not None:
        config_path = os.path.join(workdir, "ferryd.conf")
        with open(config_path, "w") as f:
            f.write(config)
        argv += ["--config", config_path]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError("ferryd exited with %d; see %s" % (proc.returncode, log_path))
        try:
            ferry.Client(sock).close()
            return proc, sock, log_path
        except ferry.FerryError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("ferryd did not answer on %s; see %s" % (sock, log_path))
            time.sleep(0.05)


def run_variant(ferry, sock, dataset, labels, epochs, batch_size, seed, job_name):
    """One fresh job over `epochs` epochs. Returns {"images": [per epoch], "seconds": [per
    epoch], "quarantined": [after each epoch], "errors", "substituted", "recent_errors",
    "label_mismatches"}."""
    loader = ferry.Loader(dataset, batch_size=batch_size,
                          transform=ferry.RandomResizedCrop(224, flip=True), shuffle=True,
                          seed=seed, drop_last=True, device="cpu", address=sock,
                          job_name=job_name, timeout=300)
    client = ferry.Client(sock)
    job_id = loader.job["id"]
    result = {"images": [], "seconds": [], "quarantined": [], "label_mismatches": 0}
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            images = 0
            mismatches = 0
            start = time.perf_counter()
            for batch in loader:
                image = batch["image"]
                images += image.shape[0]
                int(image[0, 0, 0, 0])  # one pixel: the batch really arrived
                # Labels are small; checking them costs microseconds per batch of 64.
                for index, label in zip(batch["index"].tolist(), batch["label"].tolist()):
                    mismatches += labels[index] != label
            seconds = time.perf_counter() - start
            # Status is read between epochs, outside the timed part, for every variant alike.
            status = client.get_job(job_id)
            result["images"].append(images)
            result["seconds"].append(seconds)
            result["quarantined"].append(int(status.get("quarantined", 0)))
            result["label_mismatches"] += mismatches
        result["errors"] = int(status.get("errors", 0))
        result["substituted"] = int(status.get("substituted", 0))
        result["recent_errors"] = status.get("recent_errors", [])
    finally:
        loader.close()
        # A job outlives its Loader; delete it so the next round's job starts from nothing
        # and its slots go back to ferryd's memory budget.
        client.delete_job(job_id)
        client.close()
    return result


def phases(epochs):
    out = [("epoch 0", slice(0, 1))]
    if epochs > 1:
        out.append(("epoch 1" if epochs == 2 else "epochs 1-%d" % (epochs - 1),
                    slice(1, epochs)))
        out.append(("all %d epochs" % epochs, slice(0, epochs)))
    return out


def rate(result, part):
    return sum(result["images"][part]) / sum(result["seconds"][part])


# ---------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", help="build tree holding server/ferryd and python/ferry "
                   "(default: the one --ferryd lies in, else <repo>/build)")
    p.add_argument("--ferryd", help="ferryd binary (default: <build-dir>/server/ferryd)")
    p.add_argument("--data", help="existing imagefolder to use (default: generate one with "
                   "examples/make_demo_dataset.py in the temporary directory)")
    p.add_argument("--classes", type=int, default=20, help="generated classes (default 20)")
    p.add_argument("--images-per-class", type=int, default=100,
                   help="generated JPEGs per class (default 100)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of all variants (default 5)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--corrupt-every", type=int, default=100,
                   help="damage one file in this many (default 100: 1%%)")
    p.add_argument("--shard-size", type=int, default=100, help="samples per tar shard")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory (datasets, ferryd.log); print its path")
    a = p.parse_args()
    if a.rounds < 1 or a.epochs < 1 or a.corrupt_every < 2 or a.shard_size < 1:
        p.error("--rounds, --epochs and --shard-size must be >= 1, --corrupt-every >= 2")

    build_dir = a.build_dir
    if build_dir is None and a.ferryd:
        # <build>/server/ferryd: use that build's Python package too.
        guess = os.path.dirname(os.path.dirname(os.path.abspath(a.ferryd)))
        build_dir = guess if os.path.isdir(os.path.join(guess, "python", "ferry")) else None
    build_dir = os.path.abspath(build_dir or os.path.join(REPO, "build"))
    ferryd = os.path.abspath(a.ferryd or os.path.join(build_dir, "server", "ferryd"))
    if not os.access(ferryd, os.X_OK):
        p.error("no ferryd binary at %s: build first, or pass --build-dir / --ferryd" % ferryd)
    # The build tree's package carries its libferry.so (python/ferry/_lib/).
    sys.path.insert(0, os.path.join(build_dir, "python"))
    try:
        import numpy  # noqa: F401  (ferry.Client needs it; fail here with a clear message)
        import ferry
    except ImportError as e:
        sys.exit("%s: this benchmark needs numpy and PIL (Debian: python3-numpy python3-pil) "
                 "and the ferry package in %s/python; run it with /usr/bin/python3" %
                 (e, build_dir))

    workdir = tempfile.mkdtemp(prefix="ferry-dataset-bench-", dir="/tmp")
    proc = None
    try:
        if a.data:
            clean_root = os.path.abspath(a.data)
        else:
            clean_root = os.path.join(workdir, "clean")
            subprocess.run([sys.executable, os.path.join(REPO, "examples", "make_demo_dataset.py"),
                            clean_root, "--classes", str(a.classes),
                            "--images-per-class", str(a.images_per_class)], check=True)
        samples = imagefolder_samples(clean_root)
        folder_labels = [label for _, label in samples]
        corrupt_root = os.path.join(workdir, "corrupt")
        bad = make_corrupt_copy(clean_root, corrupt_root, samples, a.corrupt_every)
        shards, tar_labels = write_shards(clean_root, os.path.join(workdir, "shards"), samples,
                                          a.shard_size)
        read_all([clean_root, corrupt_root] + shards)
        nbytes = sum(os.path.getsize(os.path.join(clean_root, rel)) for rel, _ in samples)
        kinds = sorted(set(bad.values()))
        print("%d images (%.0f MiB) in %s; %d damaged in the corrupt copy (%s); %d tar shards"
              % (len(samples), nbytes / 2**20, clean_root, len(bad),
                 ", ".join("%d %s" % (list(bad.values()).count(k), k) for k in kinds),
                 len(shards)))

        proc, sock, log_path = start_ferryd(ferryd, workdir, ferry)
        datasets = {"clean": (ferry.ImageFolder(clean_root), folder_labels),
                    "corrupt": (ferry.ImageFolder(corrupt_root), folder_labels),
                    "tar": (ferry.WebDataset(shards), tar_labels)}
        # Untimed: ferryd's first job pays for thread start-up and first allocations.
        run_variant(ferry, sock, datasets["clean"][0], folder_labels, 1, a.batch_size, 999,
                    "dataset-bench-warmup")

        results = {v: [] for v in VARIANTS}
        for r in range(a.rounds):
            order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
            line = []
            for v in order:
                dataset, labels = datasets[v]
                # Same seed for every variant of a round: clean and corrupt decode the same
                # crops of the same samples, apart from the damaged ones.
                res = run_variant(ferry, sock, dataset, labels, a.epochs, a.batch_size, r,
                                  "dataset-bench-%s-r%d" % (v, r))
                results[v].append(res)
                line.append("%s %.0f" % (v, rate(res, slice(0, a.epochs))))
            print("round %d: %s images/s" % (r + 1, ", ".join(line)), flush=True)

        print()
        print("%-26s %-14s %8s %8s %8s %9s" % ("variant", "phase", "median", "min", "max",
                                              "vs clean"))
        clean_median = {}
        for v in VARIANTS:
            for name, part in phases(a.epochs):
                rates = [rate(res, part) for res in results[v]]
                median = statistics.median(rates)
                if v == "clean":
                    clean_median[name] = median
                print("%-26s %-14s %8.0f %8.0f %8.0f %8.3fx"
                      % (DESCRIPTIONS[v], name, median, min(rates), max(rates),
                         median / clean_median[name]))
        print("images/s (median, min, max over %d rounds); %d images per epoch, batch %d, "
              "RandomResizedCrop(224, flip), %d CPUs" % (a.rounds, results["clean"][0]["images"][0],
                                                     a.batch_size, os.cpu_count() or 0))
        print()

        # Did the corrupt job really meet the damaged files?
        for r, res in enumerate(results["corrupt"]):
            print("corrupt round %d: %d bad samples counted (errors), quarantined %s after "
                  "epochs %s, %d substitutes served"
                  % (r + 1, res["errors"], "/".join(str(q) for q in res["quarantined"]),
                     "/".join(str(e) for e in range(a.epochs)), res["substituted"]))
        damaged_paths = {os.path.join(corrupt_root, samples[i][0]): k for i, k in bad.items()}
        found = {}
        for res in results["corrupt"]:
            for e in res["recent_errors"]:
                kind = damaged_paths.get(e.get("path"), "not damaged by us")
                found.setdefault(kind, set()).add(e.get("path"))
        truncated_list = any(res["errors"] > len(res["recent_errors"])
                             for res in results["corrupt"])
        print("damaged files found by any round, by kind: " + ", ".join(
            "%s %d/%d" % (k, len(found.get(k, ())), list(bad.values()).count(k)) for k in kinds) +
            ("; unexpected: %d" % len(found["not damaged by us"])
             if "not damaged by us" in found else "") +
            (" (of the errors the job status still lists: it keeps only the latest)"
             if truncated_list else ""))
        others = {v: sum(res["errors"] for res in results[v]) for v in ("clean", "tar")}
        print("bad samples in the clean and tar jobs: %d, %d; label mismatches: %s"
              % (others["clean"], others["tar"], ", ".join(
                  "%s %d" % (v, sum(res["label_mismatches"] for res in results[v]))
                  for v in VARIANTS)))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if a.keep:
            print("kept %s" % workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
