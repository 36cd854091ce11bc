#!/usr/bin/env python3
"""LLM token delivery into GPU memory for every token dataset kind, at a given batch size in
delivered bytes (default 1 MiB of int64 tokens), side by side with the pinned copy peak of
the same chunk size measured in the same rounds. Prints a table; never asserts.

  python3 bench/gpu_llm_bench.py --ferryd PATH [--corpus-mb 512] [--batch-mib 1]

Kinds: tokens (one flat uint16 file, the baseline), token_shards (16 uint16 shards),
indexed (Megatron .bin/.idx of uint16 one-sequence documents of 200-2000 tokens; plain and
with position_ids + cu_seqlens), indexed int32, and a blend of token_shards + indexed +
tokens (weights 0.5 / 0.3 / 0.2). GB/s counts every delivered field's bytes; the ratio is to
the pinned cudaMemcpyAsync of one batch's tokens bytes (the target: >= 0.9).
ferryd runs as a separate process on a private socket; the trainer takes zero-copy views
and touches nothing, so what is measured is ferry's delivery.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import ferry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
from gpu_bench import pinned_peak, start_ferryd  # noqa: E402
import megatron_indexed  # noqa: E402


def deliver(sock, dataset, batch, device,
            min_seconds=float(os.environ.get("FERRY_BENCH_SECONDS", "1.5"))):
    """GB/s of all fields delivered (after a warm-up epoch), over whole epochs lasting at
    least min_seconds."""
    loader = ferry.Loader(dataset, batch_size=batch, shuffle=True, seed=0, drop_last=True,
                          device=device, address=sock, zero_copy=True)
    loader.set_epoch(0)
    for _ in loader:
        pass
    torch.cuda.synchronize()
    nbytes, epoch = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min_seconds:
        epoch += 1
        loader.set_epoch(epoch)
        for b in loader:
            nbytes += sum(v.numel() * v.element_size() for v in b.values())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if os.environ.get("FERRY_BENCH_STATUS"):
        job = loader.job_status()
        for r in job.get("ranks", []):
            print("  %s: limiting %s (%s), stall %.2f" % (
                dataset.__class__.__name__, r.get("limiting_stage"),
                r.get("limiting_stage_note", ""), float(r.get("stall_ratio", 0))))
    job_id = loader.job["id"]
    loader.close()
    # Frees its slab now: a job left idle keeps its slots until job_idle_timeout, and later
    # jobs of the run would get fewer slots from the host memory budget.
    with ferry.Client(sock) as client:
        client.delete_job(job_id)
    return nbytes / seconds / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ferryd", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--corpus-mb", type=int, default=512, help="MiB of uint16 tokens per kind")
    p.add_argument("--seq-len", type=int, default=2047)
    p.add_argument("--batch-mib", type=float, default=1.0,
                   help="MiB of int64 tokens per batch (batch = this / (seq_len + 1) / 8)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", help="run the kinds whose name contains this only")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="ferry-llm-bench-")
    rng = np.random.default_rng(0)
    n = a.corpus_mb * (1 << 20) // 2
    flat = rng.integers(0, 50257, size=n, dtype=np.uint16)
    flat.tofile(os.path.join(work, "flat.bin"))
    for i, part in enumerate(np.array_split(flat, 16)):
        part.tofile(os.path.join(work, "shard-%02d.bin" % i))
    lengths = []
    left = n
    while left > 0:
        lengths.append(min(left, int(rng.integers(200, 2001))))
        left -= lengths[-1]
    megatron_indexed.write_indexed_arrays(os.path.join(work, "docs"), flat, lengths)
    megatron_indexed.write_indexed_arrays(os.path.join(work, "docs32"),
                                          flat[:n // 2].astype(np.int32), [n // 2])
    s = a.seq_len
    tokens = ferry.Tokens(os.path.join(work, "flat.bin"), s)
    shards = ferry.TokenShards(os.path.join(work, "shard-{00..15}.bin"), s)
    indexed = ferry.IndexedDataset(os.path.join(work, "docs"), s)
    kinds = [
        ("tokens (flat file, baseline)", tokens),
        ("token_shards (16 shards)", shards),
        ("indexed uint16", indexed),
        ("indexed uint16 + position_ids + cu_seqlens",
         ferry.IndexedDataset(os.path.join(work, "docs"), s, position_ids=True,
                              cu_seqlens=True)),
        ("indexed int32", ferry.IndexedDataset(os.path.join(work, "docs32"), s)),
        ("blend: shards 0.5 + indexed 0.3 + tokens 0.2",
         ferry.Blend([shards, indexed, tokens], weights=[0.5, 0.3, 0.2])),
        ("blend: tokens alone (weight 1)", ferry.Blend([tokens], weights=[1])),
        ("blend: shards 0.5 + tokens 0.5", ferry.Blend([shards, tokens], weights=[1, 1])),
    ]
    if a.only:
        kinds = [k for k in kinds if a.only in k[0]]
    batch = max(1, int(a.batch_mib * (1 << 20)) // ((s + 1) * 8))
    chunk = batch * (s + 1) * 8
    proc, sock = start_ferryd(a.ferryd, work)
    try:
        runs = {}
        for _ in range(a.rounds):
            peak = pinned_peak(chunk, a.device)
            runs.setdefault("peak", []).append((peak, 1.0))
            for name, dataset in kinds:
                gbs = deliver(sock, dataset, batch, a.device)
                runs.setdefault(name, []).append((gbs, gbs / peak))
        print("batch %d x %d tokens (%.2f MiB of int64 tokens); %d rounds: median GB/s of all "
              "fields delivered, ratio to the same round's pinned peak (median, min-max)"
              % (batch, s + 1, chunk / 2**20, a.rounds))
        print("%-58s %8s %8s %13s" % ("", "GB/s", "vs peak", "(min-max)"))
        for name, vals in runs.items():
            label = ("pinned cudaMemcpyAsync, %.2f MiB chunks (peak)" % (chunk / 2**20)
                     if name == "peak" else "ferry %s" % name)
            ratios = [v[1] for v in vals]
            print("%-58s %8.2f %8.2f %6.2f-%-6.2f" % (
                label, statistics.median(v[0] for v in vals), statistics.median(ratios),
                min(ratios), max(ratios)))
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
