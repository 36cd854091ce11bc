#!/usr/bin/env python3
"""ferry against the anchors, side by side in one run on the GPU machine. Prints a table.

  python3 bench/anchors.py --ferryd PATH --data DIR [--rounds 5] [--json OUT.json]

DIR is written by bench/make_bench_dataset.py (imagefolder/, shards/, tokens.u16): an
ImageNet-like corpus of about 105 KiB a file, with a few progressive, grayscale and CMYK
JPEGs and one PNG named .JPEG (bench/corpus_stats.py describes it). ferryd
runs as a separate process on a private socket with one worker per CPU; the DataLoader
gets the same CPUs (num_workers = CPUs - 1, plus the main process). Measured:

  1. JPEG pipeline, decode -> RandomResizedCrop(224) -> flip -> normalized bf16 CHW in GPU
     memory, batch 256. ferry: ImageFolder + RandomResizedCrop(224, flip) with
     image_dtype="bfloat16" (normalized by ferryd's kernel). DataLoader: torchvision
     decode_image (decode_jpeg for the JPEGs; the PNG named .JPEG too) + transforms.v2
     RandomResizedCrop(224, antialias) + RandomHorizontalFlip in workers, pin_memory,
     persistent workers, prefetch_factor 4; the trainer copies the uint8 batch to the GPU
     and normalizes it to bf16 there (the same work). Rounds interleave the two; each
     round is one epoch of each. Reported: images/s, and CPU-seconds per 1000 images over
     every process and thread (ferryd + trainer, or trainer + workers), from /proc.
  2. Scaling: ferry's images/s vs CPUs x its own single-thread decode + crop rate
     (bench/host_pipeline_bench measures that rate on the same files).
  3. Tokens: GB/s into the trainer's GPU vs the pinned cudaMemcpyAsync peak of the same
     chunk size and vs DataLoader(pin_memory) (bench/gpu_bench.py's measurements).
  4. Handoff p50/p99 with ferry ahead of the trainer (gpu_bench.py), and start-up: time
     from constructing the loader to holding the first batch: ferry with a new job (cold),
     ferry attaching to a job that exists (warm: another rank or a restarted trainer), and
     the DataLoader (spawning its workers).
  5. Training: torchvision ResNet-50, bf16 autocast, channels_last, SGD, batch 256: step
     time with synthetic data already on the GPU vs fed by ferry vs fed by the DataLoader.

Targets (reported, never asserted): JPEG >= 2x DataLoader images/s and <= 0.5x its
CPU-seconds per image; tokens >= 0.9x peak; handoff p50 <= 50 us; ResNet-50 with ferry
<= 1.03x synthetic step time.
"""

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (tokens and handoff measurements)

import ferry  # noqa: E402

try:
    from torchvision.transforms import v2 as transforms
except ImportError:  # torchvision < 0.15 (a CPU-only smoke run on Debian 12)
    from torchvision import transforms

BATCH = 256
MEAN = torch.tensor([0.485, 0.456, 0.406]) * 255
STD = torch.tensor([0.229, 0.224, 0.225]) * 255
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of every thread of process `pid` so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def own_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- the DataLoader anchor

class JpegFolder(torch.utils.data.Dataset):
    """root/<class>/<file>.JPEG -> (uint8 CHW 224x224, label), as torchvision users write it."""

    def __init__(self, root):
        classes = sorted(os.listdir(root))
        self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = transforms.Compose([
            transforms.RandomResizedCrop(224, antialias=True),
            transforms.RandomHorizontalFlip(),
        ])

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        data = torchvision.io.read_file(path)
        # decode_image: decode_jpeg for JPEGs (gray and CMYK ones to RGB too), and the corpus's
        # PNG named .JPEG, which decode_jpeg would refuse.
        image = torchvision.io.decode_image(data, mode=torchvision.io.ImageReadMode.RGB)
        return self.transform(image), label


def make_dataloader(root, workers):
    return torch.utils.data.DataLoader(
        JpegFolder(root), batch_size=BATCH, shuffle=True, drop_last=True,
        num_workers=workers, pin_memory=True, persistent_workers=True, prefetch_factor=4)


def dataloader_batches(dl, device):
    """Yields normalized bf16 CHW GPU batches from the DataLoader, epoch after epoch."""
    mean = MEAN.to(device).view(1, 3, 1, 1)
    std = STD.to(device).view(1, 3, 1, 1)
    while True:
        for image, label in dl:
            x = image.to(device, non_blocking=True).float().sub_(mean).div_(std)
            yield x.to(torch.bfloat16), label.to(device, non_blocking=True)


def dataloader_pids(it):
    return [w.pid for w in getattr(it, "_workers", [])]


# ---------------------------------------------------------------- ferry

def make_ferry(sock, root, device, seed=0, job_name=None):
    return ferry.Loader(ferry.ImageFolder(root), batch_size=BATCH,
                        transform=ferry.RandomResizedCrop(224, flip=True), shuffle=True,
                        seed=seed, drop_last=True, device=device, address=sock,
                        image_dtype="bfloat16" if device != "cpu" else "uint8",
                        job_name=job_name, prefetch=8)


def ferry_batches(loader, device):
    """Yields (bf16 CHW image, label) GPU batches, epoch after epoch."""
    epoch = 0
    mean = MEAN.to(device).view(1, 3, 1, 1)
    std = STD.to(device).view(1, 3, 1, 1)
    while True:
        loader.set_epoch(epoch)
        for b in loader:
            x = b["image"]
            if x.dtype == torch.uint8:  # cpu transport (smoke runs without a GPU)
                x = x.permute(0, 3, 1, 2).float().sub_(mean).div_(std).to(torch.bfloat16)
            yield x, b["label"]
        epoch += 1


# ---------------------------------------------------------------- measurements

def sync(device):
    if device != "cpu":
        torch.cuda.synchronize(device)


def timed_images(batches, n_batches, device, pids):
    """Consumes n_batches; returns (images/s, CPU-seconds per 1000 images)."""
    cpu0 = own_cpu_seconds() + sum(cpu_seconds(p) for p in pids)
    sync(device)
    t0 = time.perf_counter()
    images = 0
    for _ in range(n_batches):
        x, _ = next(batches)
        images += x.shape[0]
    sync(device)
    seconds = time.perf_counter() - t0
    cpu = own_cpu_seconds() + sum(cpu_seconds(p) for p in pids) - cpu0
    return images / seconds, 1000 * cpu / images


def startup(make, device):
    """Seconds from constructing a loader to holding its first batch on the device."""
    t0 = time.perf_counter()
    loader, batches = make()
    x, _ = next(batches)
    sync(device)
    return time.perf_counter() - t0, loader


def train_steps(batches, steps, model, optimizer, device):
    """Mean seconds per ResNet-50 training step over `steps` steps."""
    loss_fn = torch.nn.CrossEntropyLoss()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device_type="cuda" if device != "cpu" else "cpu", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    sync(device)
    return (time.perf_counter() - t0) / steps


def synthetic(device, classes):
    x = torch.randn(BATCH, 3, 224, 224, device=device).to(torch.bfloat16)
    y = torch.randint(0, classes, (BATCH,), device=device)
    while True:
        yield x, y


def single_thread_rate(bench_binary, root):
    """ferry's single-thread decode + RandomResizedCrop rate (host_pipeline_bench)."""
    out = subprocess.run([bench_binary, "--data", root, "--batch", "64", "--epochs", "1"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"decode \+ RandomResizedCrop \+ flip, 1 thread\s+(\d+)", out)
    return float(m.group(1)), out


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ferryd", required=True)
    p.add_argument("--data", required=True, help="written by bench/make_bench_dataset.py")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train-steps", type=int, default=30)
    p.add_argument("--train-rounds", type=int, default=3)
    p.add_argument("--handoff-batches", type=int, default=10000)
    p.add_argument("--skip", default="", help="comma list of: tokens,handoff,train,scaling")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    global BATCH
    BATCH = a.batch
    skip = set(filter(None, a.skip.split(",")))
    device = a.device
    root = os.path.join(a.data, "imagefolder")
    cpus = len(os.sched_getaffinity(0))
    workers = max(1, cpus - 1)
    results = {"cpus": cpus, "device": torch.cuda.get_device_name(device) if device != "cpu" else "cpu",
               "torch": torch.__version__, "torchvision": torchvision.__version__}
    n_images = sum(len(f) for _, _, f in os.walk(root))
    batches_per_epoch = n_images // BATCH
    print("anchors: %d JPEGs in %s, %d CPUs, %s, batch %d, %d rounds"
          % (n_images, a.data, cpus, results["device"], BATCH, a.rounds), flush=True)
    for d, _, files in os.walk(root):  # the page cache warm for both sides
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                fh.read()

    workdir = tempfile.mkdtemp(prefix="ferry-anchors-")
    proc, sock = gpu_bench.start_ferryd(a.ferryd, workdir)
    try:
        # 4b. Start-up (first, while nothing is warm but the page cache).
        starts = {"ferry cold": [], "ferry warm": [], "DataLoader": []}
        for r in range(3):
            def cold(r=r):
                loader = make_ferry(sock, root, device, seed=1000 + r)
                return loader, ferry_batches(loader, device)
            s, first = startup(cold, device)
            starts["ferry cold"].append(s)

            def warm(r=r):  # the same spec again: the job exists and has prefetched
                loader = make_ferry(sock, root, device, seed=1000 + r)
                return loader, ferry_batches(loader, device)
            first.close()
            s, second = startup(warm, device)
            second.close()
            starts["ferry warm"].append(s)

            def dl():
                loader = make_dataloader(root, workers)
                return loader, dataloader_batches(loader, device)
            s, loader = startup(dl, device)
            del loader
            starts["DataLoader"].append(s)
        results["startup_seconds"] = {k: summary(v) for k, v in starts.items()}

        # 1. JPEG pipeline, interleaved rounds.
        ferry_loader = make_ferry(sock, root, device)
        fb = ferry_batches(ferry_loader, device)
        dl = make_dataloader(root, workers)
        db = dataloader_batches(dl, device)
        next(fb), next(db)  # start both (workers spawned, job created)
        dl_pids = dataloader_pids(dl._iterator)
        timed_images(fb, batches_per_epoch - 1, device, [proc.pid])  # warm-up epochs
        timed_images(db, batches_per_epoch - 1, device, dl_pids)
        rates = {"ferry": [], "DataLoader": []}
        cpu = {"ferry": [], "DataLoader": []}
        for r in range(a.rounds):
            order = [("ferry", fb, [proc.pid]), ("DataLoader", db, dl_pids)]
            for name, batches, pids in (order if r % 2 == 0 else order[::-1]):
                rate, cpu_per_k = timed_images(batches, batches_per_epoch, device, pids)
                rates[name].append(rate)
                cpu[name].append(cpu_per_k)
            print("  round %d: ferry %.0f images/s (%.1f CPU-s/1000), DataLoader %.0f (%.1f)"
                  % (r, rates["ferry"][-1], cpu["ferry"][-1], rates["DataLoader"][-1],
                     cpu["DataLoader"][-1]), flush=True)
        results["jpeg_images_per_second"] = {k: summary(v) for k, v in rates.items()}
        results["jpeg_cpu_seconds_per_1000"] = {k: summary(v) for k, v in cpu.items()}

        # 2. Scaling efficiency.
        if "scaling" not in skip:
            bench = os.path.join(os.path.dirname(a.ferryd), "host_pipeline_bench")
            if not os.path.exists(bench):  # a build tree: build/server/ferryd, build/bench/...
                bench = os.path.join(os.path.dirname(os.path.dirname(a.ferryd)), "bench",
                                     "host_pipeline_bench")
            one, _ = single_thread_rate(bench, root)
            results["single_thread_images_per_second"] = one
            results["scaling_efficiency"] = statistics.median(rates["ferry"]) / (cpus * one)

        # 5. Training.
        if "train" not in skip:
            torch.backends.cudnn.benchmark = True
            model = torchvision.models.resnet50(num_classes=1000).to(device).to(
                memory_format=torch.channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            syn = synthetic(device, 1000)
            train_steps(syn, 15, model, optimizer, device)  # cudnn autotuning, allocator
            train_steps(fb, 5, model, optimizer, device)
            train_steps(db, 5, model, optimizer, device)
            steps = {"synthetic": [], "ferry": [], "DataLoader": []}
            feeds = {"synthetic": syn, "ferry": fb, "DataLoader": db}
            for r in range(a.train_rounds):
                for name in (["synthetic", "ferry", "DataLoader"] if r % 2 == 0 else
                             ["DataLoader", "ferry", "synthetic"]):
                    steps[name].append(train_steps(feeds[name], a.train_steps, model,
                                                   optimizer, device))
                print("  train round %d: " % r + ", ".join(
                    "%s %.1f ms" % (k, 1e3 * v[-1]) for k, v in steps.items()), flush=True)
            results["resnet50_step_seconds"] = {k: summary(v) for k, v in steps.items()}
        ferry_loader.close()
        del db, dl

        # 3 and 4a. Tokens and handoff (gpu_bench's measurements, same method).
        if "tokens" not in skip and device != "cpu":
            path = os.path.join(a.data, "tokens.u16")
            tok = {}
            for batch in (64, 256):
                chunk = batch * 2048 * 8
                tok["peak_%d" % batch] = gpu_bench.pinned_peak(chunk, device)
                tok["ferry_%d" % batch] = gpu_bench.ferry_tokens(sock, path, 2047, batch, device)
            tok["dataloader_64"] = gpu_bench.dataloader_tokens(path, 2047, 64, device, workers)
            results["tokens_gb_per_second"] = tok
        if "handoff" not in skip and device != "cpu":
            p50, p99, n = gpu_bench.handoff(sock, os.path.join(a.data, "tokens.u16"), device,
                                            a.handoff_batches, 1000)
            results["handoff_us"] = {"p50": p50, "p99": p99, "batches": n}
    finally:
        proc.terminate()
        proc.wait(10)

    print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


def print_table(r):
    def mmm(s, scale=1.0, fmt="%.0f"):
        return (fmt + " (" + fmt + "-" + fmt + ")") % (s["median"] * scale, s["min"] * scale,
                                                         s["max"] * scale)

    rows = []
    ips, cpu = r["jpeg_images_per_second"], r["jpeg_cpu_seconds_per_1000"]
    ratio = ips["ferry"]["median"] / ips["DataLoader"]["median"]
    rows.append(("JPEG -> bf16 on GPU, images/s: ferry", mmm(ips["ferry"]),
                 "%.2fx DataLoader (target >= 2x)" % ratio))
    rows.append(("  DataLoader (%d workers)" % (r["cpus"] - 1), mmm(ips["DataLoader"]), ""))
    cratio = cpu["ferry"]["median"] / cpu["DataLoader"]["median"]
    rows.append(("CPU-seconds per 1000 images: ferry", mmm(cpu["ferry"], fmt="%.1f"),
                 "%.2fx DataLoader (target <= 0.5x)" % cratio))
    rows.append(("  DataLoader", mmm(cpu["DataLoader"], fmt="%.1f"), ""))
    if "scaling_efficiency" in r:
        rows.append(("ferry single-thread decode+crop, images/s",
                     "%.0f" % r["single_thread_images_per_second"],
                     "scaling efficiency %.2f over %d CPUs" % (r["scaling_efficiency"], r["cpus"])))
    if "tokens_gb_per_second" in r:
        t = r["tokens_gb_per_second"]
        for batch in (64, 256):
            rows.append(("tokens GB/s, batch %d x 2048 int64: ferry" % batch,
                         "%.2f" % t["ferry_%d" % batch],
                         "%.2fx pinned peak %.1f (target >= 0.9x)"
                         % (t["ferry_%d" % batch] / t["peak_%d" % batch], t["peak_%d" % batch])))
        rows.append(("  DataLoader(pin_memory), batch 64", "%.2f" % t["dataloader_64"],
                     "%.2fx peak" % (t["dataloader_64"] / t["peak_64"])))
    if "handoff_us" in r:
        h = r["handoff_us"]
        rows.append(("handoff, ferry ahead, p50 / p99 us", "%.1f / %.1f" % (h["p50"], h["p99"]),
                     "target p50 <= 50 (%d batches)" % h["batches"]))
    st = r["startup_seconds"]
    for k in ("ferry cold", "ferry warm", "DataLoader"):
        rows.append(("start-up to first batch, s: " + k, mmm(st[k], fmt="%.2f"), ""))
    if "resnet50_step_seconds" in r:
        s = r["resnet50_step_seconds"]
        for k in ("synthetic", "ferry", "DataLoader"):
            rows.append(("ResNet-50 step, ms: " + k, mmm(s[k], 1e3, "%.1f"),
                         "%.3fx synthetic%s" % (s[k]["median"] / s["synthetic"]["median"],
                                               " (target <= 1.03x)" if k == "ferry" else "")))
    width = max(len(x[0]) for x in rows)
    print()
    print("%-*s  %-26s  %s" % (width, "measurement", "median (min-max)", "ratio"))
    for name, value, note in rows:
        print("%-*s  %-26s  %s" % (width, name, value, note))


if __name__ == "__main__":
    sys.exit(main())
