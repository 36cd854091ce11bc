#!/usr/bin/env python3
"""What feeding a training step costs the step: its time with batches from ferry's GPU
transport vs the same step on a batch already in GPU memory. Run on the GPU machine;
prints a table, never asserts.

  python3 bench/gpu_step_bench.py --ferryd PATH [--batches 64,256] [--layers 4,16]
                                  [--steps 300] [--rounds 3]

The trainer reads raw int64 records (rows of 2048, as bench/gpu_bench.py) with
ferry.Loader(device="cuda:0") in its default (safe, copying) mode, and per batch runs a
compute-bound step: an embedding lookup of the batch's first 512 columns into a
[rows, 512, 1024] bf16 activation, then `layers` matmuls with a 1024 x 1024 weight.
Ferry is far ahead of such a trainer, so what a step loses is the transport's share of
the GPU: kernels in ferryd's CUDA context (the page-cache gather, the tokens' widening)
time-slice with the trainer's (without MPS: scripts/gpu-mps.sh runs this under MPS too),
where the copy engine moves slot copies beside the trainer's kernels. Rows, each against "synthetic" (the same step on one tensor made
before the loop, no loader) in the same round:
  - records, default: ferryd gathers only batches made while the trainer waits, and
    workers copy the rows of the others (the status counts are printed);
  - records, gather_every_batch: a ferryd that gathers every batch with its kernels;
  - records, slot copy: a ferryd with disable_page_cache_gather;
  - tokens: the same file as uint16 tokens, copied and widened to int64 by a kernel of
    ferryd's (for comparison: every batch runs one kernel there);
  - tokens, widen_tokens_on_host: the same tokens widened by the workers, and int64 rows
    copied (4x the PCIe bytes, no kernel).
Each figure is the median over rounds of the mean step time over `steps` steps after
a warm-up; the ratio is the median of the per-round ratios (1.00 = free).
"""

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import ferry
from gpu_bench import start_ferryd  # bench/ is on the path: this script's folder

SEQ = 2048  # int64 columns per record
WIDTH = 1024
VOCAB = 4096


class Step:
    """A compute-bound step over an int64 batch of [rows, SEQ]."""

    def __init__(self, layers, device):
        g = torch.Generator(device="cpu").manual_seed(0)
        self.table = (torch.randn(VOCAB, WIDTH, generator=g) * 0.02).to(device, torch.bfloat16)
        self.weight = (torch.randn(WIDTH, WIDTH, generator=g) / WIDTH ** 0.5).to(
            device, torch.bfloat16)
        self.layers = layers

    def __call__(self, batch):
        h = self.table[batch[:, :512] % VOCAB]
        for _ in range(self.layers):
            h = torch.tanh(h @ self.weight)
        return h[:, 0, 0].float().sum()


def timed_steps(step, batches, steps, warmup=30):
    """Mean seconds per step over `steps` steps after `warmup`; `batches` yields tensors."""
    acc = torch.zeros((), device="cuda")
    it = iter(batches)
    for _ in range(warmup):
        acc += step(next(it))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        acc += step(next(it))
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def forever(loader, field):
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for b in loader:
            yield b[field]
        epoch += 1


def gathered(sock):
    """(batches gathered, batches copied) over the ferryd's ranks so far (status)."""
    copied = gathered = 0
    with ferry.Client(sock) as c:
        for job in c.status().get("jobs", []):
            for r in job.get("ranks", []):
                copied += int(r.get("batches_copied", r.get("batchesCopied", 0)))
                gathered += int(r.get("batches_gathered", r.get("batchesGathered", 0)))
    return gathered, copied


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ferryd", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--records-mb", type=int, default=512)
    p.add_argument("--batches", default="64,256", help="rows per batch (1 MiB, 4 MiB)")
    p.add_argument("--layers", default="4,16", help="matmuls per step (step lengths)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.cuda.set_device(torch.device(a.device))
    workdir = tempfile.mkdtemp(prefix="ferry-step-bench-")
    path = os.path.join(workdir, "records.i64")
    rows_in_file = a.records_mb * (1 << 20) // (SEQ * 8)
    np.random.default_rng(0).integers(0, 1 << 40, size=(rows_in_file, SEQ),
                                      dtype=np.int64).tofile(path)
    # One ferryd per feed, so each one's status counts only its own batches.
    daemons = [start_ferryd(a.ferryd, workdir, "default"),
               start_ferryd(a.ferryd, workdir, "every", "gather_every_batch: true\n"),
               start_ferryd(a.ferryd, workdir, "copy", "disable_page_cache_gather: true\n"),
               start_ferryd(a.ferryd, workdir, "tokens"),
               start_ferryd(a.ferryd, workdir, "tokens-host", "widen_tokens_on_host: true\n")]
    records = ferry.Records(path, dtype="int64", shape=(SEQ,))
    tokens = ferry.Tokens(path, seq_len=SEQ - 1, dtype="uint16", output_dtype="int64")
    feeds = (("records, default", daemons[0][1], records, "data"),
             ("records, gather_every_batch", daemons[1][1], records, "data"),
             ("records, slot copy", daemons[2][1], records, "data"),
             ("tokens u16->int64", daemons[3][1], tokens, "tokens"),
             ("tokens, widen_tokens_on_host", daemons[4][1], tokens, "tokens"))
    try:
        print("step = embedding of 512 columns -> [rows, 512, %d] bf16, then N matmuls %dx%d; "
              "mean step time (median of %d rounds of %d steps), ratio to synthetic (median, "
              "min-max)" % (WIDTH, WIDTH, WIDTH, a.rounds, a.steps))
        print("%-72s %10s %8s %13s" % ("trainer step fed by", "ms/step", "vs synth", "(min-max)"))
        for rows in (int(v) for v in a.batches.split(",")):
            for layers in (int(v) for v in a.layers.split(",")):
                step = Step(layers, a.device)
                synthetic_batch = torch.from_numpy(
                    np.fromfile(path, dtype=np.int64, count=rows * SEQ).reshape(rows, SEQ)
                ).to(a.device)
                runs = {}
                record_socks = {name: sock for name, sock, _, field in feeds if field == "data"}
                before = {name: gathered(sock) for name, sock in record_socks.items()}
                for _ in range(a.rounds):
                    base = timed_steps(step, itertools.repeat(synthetic_batch), a.steps)
                    runs.setdefault("synthetic", []).append((base, 1.0))
                    for name, sock, dataset, field in feeds:
                        loader = ferry.Loader(dataset, batch_size=rows, shuffle=True,
                                              drop_last=True, device=a.device, address=sock)
                        t = timed_steps(step, forever(loader, field), a.steps)
                        loader.close()
                        runs.setdefault(name, []).append((t, t / base))
                counts = {}
                for name, sock in record_socks.items():
                    (g0, c0), (g1, c1) = before[name], gathered(sock)
                    counts[name] = "gathered %d of %d" % (g1 - g0, c1 - c0)
                for name, vals in runs.items():
                    ratios = [v[1] for v in vals]
                    label = "%s, %.0f MiB, %d matmuls%s" % (
                        name, rows * SEQ * 8 / 2**20, layers,
                        " (%s)" % counts[name] if name in counts else "")
                    print("%-72s %10.3f %8.3f %6.3f-%-6.3f" % (
                        label, statistics.median(v[0] for v in vals) * 1e3,
                        statistics.median(ratios), min(ratios), max(ratios)))
                sys.stdout.flush()
    finally:
        for proc, _ in daemons:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
