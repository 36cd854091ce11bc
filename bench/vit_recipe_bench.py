#!/usr/bin/env python3
"""The ViT-style augmentation recipe, ferry against torch's DataLoader with torchvision v2,
side by side in one run on the GPU machine. Prints a table; never asserts.

  python3 bench/vit_recipe_bench.py --ferryd PATH --data IMAGEFOLDER [--rounds 3]
      [--batches 64] [--warmup 32] [--json OUT.json]

Recipe (torchvision's classification reference, "ta_wide" + random erasing, plus
ColorJitter): RandomResizedCrop(224), RandomHorizontalFlip(),
TrivialAugmentWide(), ColorJitter(0.4, 0.4, 0.4), Normalize(ImageNet), RandomErasing(0.25),
batch 256, delivered as normalized bf16 CHW in GPU memory.

  - ferry (GPU photometric): ferry.transforms.Compose of those ops on a GPU job with
    image_dtype="bfloat16": the workers decode, crop, flip and run TrivialAugmentWide; the
    ColorJitter, Normalize and RandomErasing run fused on the GPU (server/kernels/
    photometric.h) with parameters the workers drew.
  - ferry (all on CPU): the same ops up to ColorJitter on the workers, uint8 over PCIe, the
    trainer normalizes and erases on the GPU itself (what a job without the fused stage
    costs the workers).
  - DataLoader: torchvision.io.decode_jpeg + the same v2 ops in num_workers = CPUs - 1
    worker processes, pin_memory, persistent workers, prefetch_factor 4; ToDtype +
    Normalize + RandomErasing on the CPU (as the recipe is written), the trainer casts to
    bf16 on the GPU.

ferryd runs as a separate process with one worker per CPU. Each round runs every variant
once for `--batches` batches after a warm-up, in an order rotated per round. Reported:
images/s and CPU-seconds per 1000 images (every process and thread: ferryd + trainer, or
trainer + workers) as median (min-max), and ratios of medians to the DataLoader.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torchvision
from torchvision.transforms import v2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors  # noqa: E402  (CPU accounting, timing)
import gpu_bench  # noqa: E402  (ferryd start)

import ferry  # noqa: E402
from ferry import transforms as T  # noqa: E402

BATCH = 256
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class RecipeFolder(torch.utils.data.Dataset):
    """root/<class>/<file> -> (normalized float32 CHW 224x224, label), the v2 recipe."""

    def __init__(self, root):
        classes = sorted(os.listdir(root))
        self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = v2.Compose([
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.TrivialAugmentWide(),
            v2.ColorJitter(0.4, 0.4, 0.4),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
            v2.RandomErasing(0.25),
        ])

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        data = torchvision.io.read_file(path)
        try:
            image = torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB)
        except RuntimeError:  # PNG named .JPEG, CMYK: what a user falls back to
            image = torchvision.io.decode_image(data, mode=torchvision.io.ImageReadMode.RGB)
        return self.transform(image), label


def dataloader_variant(root, workers, device):
    dl = torch.utils.data.DataLoader(
        RecipeFolder(root), batch_size=BATCH, shuffle=True, drop_last=True,
        num_workers=workers, pin_memory=True, persistent_workers=True, prefetch_factor=4)

    def batches():
        while True:
            for image, label in dl:
                yield (image.to(device, non_blocking=True).to(torch.bfloat16),
                       label.to(device, non_blocking=True))
    return dl, batches()


def ferry_fused(sock, root, device, name):
    loader = ferry.Loader(
        ferry.ImageFolder(root), batch_size=BATCH, shuffle=True, drop_last=True,
        device=device, address=sock, image_dtype="bfloat16", prefetch=8, job_name=name,
        transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                             T.TrivialAugmentWide(), T.ColorJitter(0.4, 0.4, 0.4),
                             T.Normalize(MEAN, STD), T.RandomErasing(0.25)]))
    return loader, anchors.ferry_batches(loader, device)


def ferry_cpu_ops(sock, root, device, name):
    """Every op but Normalize/RandomErasing on the workers; the trainer finishes on the GPU."""
    loader = ferry.Loader(
        ferry.ImageFolder(root), batch_size=BATCH, shuffle=True, drop_last=True,
        device=device, address=sock, prefetch=8, job_name=name,
        transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                             T.TrivialAugmentWide(), T.ColorJitter(0.4, 0.4, 0.4)]))
    erase = v2.RandomErasing(0.25)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def batches():
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            for b in loader:
                x = b["image"].permute(0, 3, 1, 2).float().sub_(mean).div_(std)
                yield erase(x).to(torch.bfloat16), b["label"]
            epoch += 1
    return loader, batches()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ferryd", required=True)
    p.add_argument("--data", required=True, help="imagefolder (bench/make_bench_dataset.py)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=64, help="timed batches per variant/round")
    p.add_argument("--warmup", type=int, default=32,
                   help="untimed batches first: past the DataLoader's first wave (every worker "
                        "finishing its first batch at once) and ferry's prefetched slots")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (CPUs - 1)")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    cpus = len(os.sched_getaffinity(0))
    workers = args.workers or max(1, cpus - 1)
    device = args.device
    tmp = tempfile.TemporaryDirectory()
    proc, sock = gpu_bench.start_ferryd(args.ferryd, tmp.name)
    results = {"ferry GPU photometric": ([], []), "ferry all ops on CPU": ([], []),
               "DataLoader v2": ([], [])}
    try:
        variants = {
            "ferry GPU photometric": lambda r: ferry_fused(sock, args.data, device, "vit-f%d" % r),
            "ferry all ops on CPU": lambda r: ferry_cpu_ops(sock, args.data, device, "vit-c%d" % r),
            "DataLoader v2": lambda r: dataloader_variant(args.data, workers, device),
        }
        names = list(variants)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                owner, batches = variants[name](r)
                for _ in range(args.warmup):
                    next(batches)
                pids = [proc.pid] if name.startswith("ferry") else []
                if not name.startswith("ferry"):
                    pids = anchors.dataloader_pids(getattr(owner, "_iterator", None))
                rate, cpu = anchors.timed_images(batches, args.batches, device, pids)
                results[name][0].append(rate)
                results[name][1].append(cpu)
                print("round %d %-24s %8.0f img/s %6.2f CPU-s/1000" % (r, name, rate, cpu),
                      flush=True)
                if name.startswith("ferry"):
                    # Frees its slab now, for the next variant's job.
                    job_id = owner.job["id"]
                    owner.close()
                    with ferry.Client(sock) as c:
                        c.delete_job(job_id)
                else:
                    del batches, owner
    finally:
        proc.terminate()
        proc.wait()
    base_rate = statistics.median(results["DataLoader v2"][0])
    base_cpu = statistics.median(results["DataLoader v2"][1])
    print("\nViT recipe, batch %d, %s, %d CPUs (%d DataLoader workers), %d rounds x %d batches"
          % (BATCH, torch.cuda.get_device_name(device), cpus, workers, args.rounds,
             args.batches))
    print("%-24s %22s %10s %22s %10s" % ("variant", "img/s median (min-max)", "vs DL",
                                         "CPU-s/1000 img", "vs DL"))
    table = {}
    for name, (rates, cpus_) in results.items():
        mr, mc = statistics.median(rates), statistics.median(cpus_)
        table[name] = {"images_per_s": anchors.summary(rates),
                       "cpu_s_per_1000": anchors.summary(cpus_),
                       "rate_vs_dataloader": mr / base_rate, "cpu_vs_dataloader": mc / base_cpu}
        print("%-24s %8.0f (%5.0f-%5.0f) %9.2fx %8.2f (%5.2f-%5.2f) %9.2fx"
              % (name, mr, min(rates), max(rates), mr / base_rate, mc, min(cpus_), max(cpus_),
                 mc / base_cpu))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
