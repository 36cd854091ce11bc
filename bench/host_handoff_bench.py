#!/usr/bin/env python3
"""Host-transport handoff: how long a Python trainer spends in next() to get a batch of
torch tensors (device="cpu", zero-copy views, batches of 8 x 128 tokens), with ferry ahead
of it (a busy-wait "training step" between batches) and back to back. Runs on any machine
(no GPU); prints a table, never asserts.

  PYTHONPATH=build/python python3 bench/host_handoff_bench.py --ferryd build/server/ferryd

Side by side, interleaved over --rounds rounds (the machines are noisy: read the ratios):
ferry with batches on the shared-memory batch channel (the default), ferry with batches on
the gRPC stream (FERRY_BATCH_CHANNEL=grpc), and the baseline, torch's DataLoader
(num_workers=2, persistent workers) over the same windows of the same file.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench  # noqa: E402  (start_ferryd, handoff)

SEQ_LEN = 127
BATCH = 8


def dataloader_handoff(path, batches, step_us):
    """p50 / p99 us of next() on torch's DataLoader over the same token windows."""
    data = np.memmap(path, dtype=np.uint16, mode="r")

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return (len(data) - 1) // SEQ_LEN

        def __getitem__(self, i):
            w = data[i * SEQ_LEN:i * SEQ_LEN + SEQ_LEN + 1].astype(np.int64)
            return {"tokens": torch.from_numpy(w), "index": i}

    dl = torch.utils.data.DataLoader(Windows(), batch_size=BATCH, drop_last=True,
                                     num_workers=2, persistent_workers=True, prefetch_factor=8)
    times = []
    while len(times) < batches:
        it = iter(dl)
        time.sleep(0.05)  # let the workers fill their queue
        for _ in range(min(batches - len(times), len(dl))):
            t0 = time.perf_counter_ns()
            next(it)
            times.append(time.perf_counter_ns() - t0)
            end = time.perf_counter_ns() + step_us * 1000
            while time.perf_counter_ns() < end:
                pass
        del it
    times.sort()
    return times[len(times) // 2] / 1e3, times[int(len(times) * 0.99)] / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ferryd", required=True)
    p.add_argument("--batches", type=int, default=2500, help="per row and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step-us", type=int, default=1000,
                   help="busy-wait between batches in the 'ferry ahead' rows")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="ferry-handoff-")
    path = os.path.join(work, "tokens.bin")
    np.arange(32 << 20, dtype=np.uint16).tofile(path)  # 64 MiB: 264,000 windows
    print("host handoff: next() of ferry.Loader(Tokens(seq_len=%d), batch_size=%d, "
          "device='cpu', zero_copy=True), %d batches per row, %d cores"
          % (SEQ_LEN, BATCH, a.batches, os.cpu_count()))
    print("%-5s  %-48s %10s %10s %14s" % ("round", "trainer", "p50 us", "p99 us",
                                          "DataLoader/x"))
    for r in range(1, a.rounds + 1):
        for step, label in ((a.step_us, "ferry ahead, %d us step" % a.step_us),
                            (0, "back to back")):
            rows = []
            for plane, name in (("shm", "ferry, batch channel"), ("grpc", "ferry, gRPC stream")):
                os.environ["FERRY_BATCH_CHANNEL"] = plane
                proc, sock = gpu_bench.start_ferryd(a.ferryd, work)
                try:
                    p50, p99, _ = gpu_bench.handoff(sock, path, "cpu", a.batches, step)
                finally:
                    proc.terminate()
                    proc.wait()
                rows.append(("%s, %s" % (name, label), p50, p99))
            base = dataloader_handoff(path, a.batches, step)
            rows.append(("DataLoader(2 workers), %s" % label, base[0], base[1]))
            for name, p50, p99 in rows:
                print("%-5d  %-48s %10.1f %10.1f %13.2fx" % (r, name, p50, p99,
                                                            base[0] / p50), flush=True)


if __name__ == "__main__":
    main()
