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
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ferryd", required=True)
    p.add_argument("--data", required=True, help="imagefolder (bench/make_bench_dataset.py)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--warmup", type=int, default=32)
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
    finally:
        for proc, _ in daemons.values():
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
