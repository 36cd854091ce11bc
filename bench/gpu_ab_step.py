#!/usr/bin/env python3
"""Two ferryd builds alternated on one lease (A B A B ...), each started afresh, for the
Python trainer: what an input-bound trainer gets (raw int64 records of 1 MiB, zero-copy,
ratio to the pinned cudaMemcpyAsync peak of the same run) and what a compute-bound one
pays (bench/gpu_step_bench.py's step of 4 matmuls, 0.65 ms on an H100, over the same
records, ratio to the step on a batch made before the loop). For telling a change to the
gather policy from the lease's noise. Run on the GPU machine after scripts/gpu-bundle.sh;
prints, never asserts.

  python3 bench/gpu_ab_step.py A_FERRYD B_FERRYD [--pairs 3] [--steps 300]
"""

import argparse
import itertools
import os
import sys
import tempfile

import numpy as np
import torch

import ferry
import gpu_step_bench as step_bench  # bench/ is on the path: this script's folder
from gpu_bench import ferry_tokens, pinned_peak, start_ferryd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default="cuda:0")
    a = p.parse_args()
    torch.cuda.set_device(torch.device(a.device))
    workdir = tempfile.mkdtemp(prefix="ferry-ab-step-")
    path = os.path.join(workdir, "records.i64")
    seq, rows = step_bench.SEQ, 64  # 64 rows of 2048 int64: 1 MiB
    np.random.default_rng(0).integers(0, 1 << 40, size=((512 << 20) // (seq * 8), seq),
                                      dtype=np.int64).tofile(path)
    records = ferry.Records(path, dtype="int64", shape=(seq,))
    step = step_bench.Step(4, a.device)
    synthetic = torch.from_numpy(
        np.fromfile(path, dtype=np.int64, count=rows * seq).reshape(rows, seq)).to(a.device)
    for pair in range(a.pairs):
        for side, binary in (("A", a.a), ("B", a.b)):
            proc, sock = start_ferryd(binary, workdir, "%s%d" % (side, pair))
            try:
                peak = pinned_peak(rows * seq * 8, a.device)
                rate = ferry_tokens(sock, path, seq - 1, rows, a.device, records=True)
                g1 = step_bench.gathered(sock)
                # The synthetic step is timed before and after the fed one: one timing
                # alone moved the ratio by 0.1 on a noisy lease.
                before = step_bench.timed_steps(step, itertools.repeat(synthetic), a.steps)
                loader = ferry.Loader(records, batch_size=rows, shuffle=True, drop_last=True,
                                      device=a.device, address=sock)
                t = step_bench.timed_steps(step, step_bench.forever(loader, "data"), a.steps)
                loader.close()
                base = (before + step_bench.timed_steps(step, itertools.repeat(synthetic),
                                                        a.steps)) / 2
                g2 = step_bench.gathered(sock)
                print("%s, pair %d: input-bound records 1 MiB %.3fx of the peak (gathered %d "
                      "of %d); %.2f ms step %.3fx (gathered %d of %d)"
                      % (side, pair, rate / peak, g1[0], g1[1], base * 1e3, t / base,
                         g2[0] - g1[0], g2[1] - g1[1]))
                sys.stdout.flush()
            finally:
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    main()
