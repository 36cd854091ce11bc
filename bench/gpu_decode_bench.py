#!/usr/bin/env python3
"""JPEG decode on the GPU (nvJPEG) against ferry's CPU decode and the DataLoader, side by side
in one run on the GPU machine. Prints a table; never asserts.

  python3 bench/gpu_decode_bench.py --ferryd PATH --data IMAGEFOLDER [--rounds 3]
      [--batches 64] [--warmup 32] [--json OUT.json]

The pipeline is anchors.py's: JPEG -> RandomResizedCrop(224) -> flip -> normalized bf16 CHW
in GPU memory, batch 256. Variants, each a ferryd of its own with one worker per CPU:
  - ferry gpu_decode "cpu": the workers decode everything (what ferry did before);
  - ferry gpu_decode "auto": the share the split measures (GpuDecodeSplit);
  - ferry gpu_decode "gpu": every file the GPU can decode goes to it;
  - DataLoader: torchvision decode_jpeg + v2 RandomResizedCrop + flip in CPUs - 1 workers,
    pin_memory (anchors.make_dataloader).
Rounds interleave the variants (order rotated), each after a warm-up past the first wave
of prefetched batches. Reported: images/s and CPU-seconds per 1000 images (every process
and thread) as median (min-max), ratios to the DataLoader and to ferry "cpu", and each
ferry variant's gpu_decode status (share, images per decoder, fallbacks by reason).

With --train-steps N (> 0), then the cost to a trainer: step time of each torchvision model
of --models (bf16 autocast, channels_last, SGD, batch 256) fed by each ferry variant against
the same step on a batch already in GPU memory ("synthetic"), one loader open at a time,
rounds alternating the order; the ratio is the median of the per-round ratios. ResNet-50
is compute-bound on an H100 (the workers alone keep ahead of it); ResNet-18 is input-bound
(its step wants more images per second than the CPUs decode).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors  # noqa: E402
import gpu_bench  # noqa: E402

import ferry  # noqa: E402

MODES = ("cpu", "auto", "gpu")


def report(args, results, status, cpus, device):
    """Prints (and with --json writes) the throughput table."""
    base = {k: statistics.median(results["DataLoader"][i]) for i, k in enumerate(("r", "c"))}
    cpu_only = {k: statistics.median(results["ferry cpu"][i]) for i, k in enumerate(("r", "c"))}
    print("\nJPEG -> RandomResizedCrop(224) -> flip -> bf16, batch %d, %s, %d CPUs, %d rounds x "
          "%d batches" % (anchors.BATCH, torch.cuda.get_device_name(device), cpus, args.rounds,
                          args.batches))
    print("%-18s %22s %8s %10s %22s %8s" % ("variant", "img/s median (min-max)", "vs DL",
                                            "vs cpu", "CPU-s/1000 img", "vs DL"))
    table = {}
    for name, (rates, cpu_s) in results.items():
        mr, mc = statistics.median(rates), statistics.median(cpu_s)
        table[name] = {"images_per_s": anchors.summary(rates),
                       "cpu_s_per_1000": anchors.summary(cpu_s),
                       "rate_vs_dataloader": mr / base["r"], "rate_vs_ferry_cpu": mr / cpu_only["r"],
                       "cpu_vs_dataloader": mc / base["c"], "gpu_decode": status.get(name)}
        print("%-18s %8.0f (%5.0f-%5.0f) %7.2fx %9.2fx %8.2f (%5.2f-%5.2f) %7.2fx"
              % (name, mr, min(rates), max(rates), mr / base["r"], mr / cpu_only["r"], mc,
                 min(cpu_s), max(cpu_s), mc / base["c"]))
    for name, s in status.items():
        print("%-18s gpu_decode %s" % (name, json.dumps(s)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


def train(args, daemons, device, arch):
    """`arch`'s step time fed by each ferry variant vs synthetic (see the docstring)."""
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, arch)(num_classes=1000).to(device).to(
        memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    syn = anchors.synthetic(device, 1000)
    anchors.train_steps(syn, 15, model, optimizer, device)  # cudnn autotuning, allocator
    names = ["synthetic"] + ["ferry " + m for m in MODES]
    steps = {n: [] for n in names}
    for r in range(args.train_rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            if name == "synthetic":
                steps[name].append(anchors.train_steps(syn, args.train_steps, model, optimizer,
                                                       device))
                continue
            proc, sock = daemons[name.split()[1]]
            loader = anchors.make_ferry(sock, args.data, device, seed=100 + r,
                                        job_name="train-%s-%s-%d" % (arch, name.split()[1], r))
            batches = anchors.ferry_batches(loader, device)
            anchors.train_steps(batches, 8, model, optimizer, device)  # ring full, split settled
            steps[name].append(anchors.train_steps(batches, args.train_steps, model, optimizer,
                                                   device))
            gpu = loader.job_status().get("gpu_decode", {})
            share, demand = gpu.get("gpu_share", 0), gpu.get("demand", 0)
            job_id = loader.job["id"]
            loader.close()
            with ferry.Client(sock) as c:
                c.delete_job(job_id)
            del batches, loader
            print("train %s round %d %-14s %7.1f ms/step (gpu share %.2f, demand %.2f)"
                  % (arch, r, name, 1e3 * steps[name][-1], share, demand), flush=True)
        print("train %s round %d synthetic %7.1f ms/step"
              % (arch, r, 1e3 * steps["synthetic"][-1]), flush=True)
    print("\n%s bf16 channels_last, batch %d: ms/step median (min-max), vs synthetic "
          "(median of per-round ratios)" % (arch, anchors.BATCH))
    for name in names:
        ratios = [t / s for t, s in zip(steps[name], steps["synthetic"])]
        print("%-18s %8.1f (%6.1f-%6.1f) %7.3fx" % (
            name, 1e3 * statistics.median(steps[name]), 1e3 * min(steps[name]),
            1e3 * max(steps[name]), statistics.median(ratios)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ferryd", required=True)
    p.add_argument("--data", required=True, help="imagefolder (bench/make_bench_dataset.py)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--train-steps", type=int, default=0,
                   help="timed steps per model, variant and round (0: no training rows)")
    p.add_argument("--train-rounds", type=int, default=2)
    p.add_argument("--models", default="resnet50,resnet18",
                   help="torchvision models to train (comma-separated)")
    p.add_argument("--json")
    args = p.parse_args()
    cpus = len(os.sched_getaffinity(0))
    device = args.device
    tmp = tempfile.TemporaryDirectory()
    daemons = {m: gpu_bench.start_ferryd(args.ferryd, tmp.name, name="ferryd-" + m,
                                         config='gpu_decode: "%s"\n' % m) for m in MODES}
    names = ["ferry " + m for m in MODES] + ["DataLoader"]
    results = {n: ([], []) for n in names}
    status = {}
    try:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                if name == "DataLoader":
                    dl = anchors.make_dataloader(args.data, cpus - 1)
                    batches = anchors.dataloader_batches(dl, device)
                    owner = dl
                else:
                    proc, sock = daemons[name.split()[1]]
                    owner = anchors.make_ferry(sock, args.data, device, seed=r,
                                               job_name="dec-%s-%d" % (name.split()[1], r))
                    batches = anchors.ferry_batches(owner, device)
                for _ in range(args.warmup):
                    next(batches)
                if name == "DataLoader":
                    pids = anchors.dataloader_pids(getattr(owner, "_iterator", None))
                else:
                    pids = [proc.pid]
                rate, cpu = anchors.timed_images(batches, args.batches, device, pids)
                results[name][0].append(rate)
                results[name][1].append(cpu)
                print("round %d %-18s %7.0f img/s %6.2f CPU-s/1000" % (r, name, rate, cpu),
                      flush=True)
                if name != "DataLoader":
                    job = owner.job_status()
                    status[name] = job.get("gpu_decode", {})
                    job_id = owner.job["id"]
                    owner.close()
                    with ferry.Client(sock) as c:
                        c.delete_job(job_id)
                del batches, owner
        report(args, results, status, cpus, device)
        if args.train_steps > 0:
            for arch in args.models.split(","):
                train(args, daemons, device, arch)
    finally:
        for proc, _ in daemons.values():
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
