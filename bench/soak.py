#!/usr/bin/env python3
"""Soak: one ferryd under trainers that join and die, for a long time. Prints what ferryd
holds every --every seconds (RSS and its anonymous part, file descriptors, threads, GPU
memory), then the growth after warm-up; never asserts (docs/benchmarks.md has the figures).

  python3 bench/soak.py --ferryd build/server/ferryd [--minutes 60] [--device cpu|cuda:0]
                        [--every 30] [--ranks 2] [--csv soak.csv]

ferryd serves one tokens job of --ranks ranks. Rank 0 is a long-lived trainer that keeps
consuming. Every other rank is a trainer process that attaches, takes a random number of
batches and then dies: half by SIGKILL (mid-batch, slots held), half by exiting (Loader
closed). A new one replaces it at once, so ferryd sees thousands of joins and deaths an
hour. With --device cuda:N the job uses the GPU transport (CUDA IPC, events), and the
samples include ferryd's device memory (nvidia-smi) and the /dev/shm entries CUDA leaves
(cuda.shm.*).

Growth is the least-squares slope of each series after the first 20% of the run
(warm-up), per hour and per trainer death.
"""

import argparse
import csv
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import ferry

TRAINER = r"""
import os, random, signal, sys, time
import ferry
address, path, rank, ranks, device, batches, how = sys.argv[1:8]
loader = ferry.Loader(ferry.Tokens(path, seq_len=2047, dtype="uint16"), batch_size=16,
                      shuffle=True, rank=int(rank), world_size=int(ranks), device=device,
                      address=address, job_name="soak", as_numpy=(device == "cpu"),
                      timeout=60)
epoch, taken = 0, 0
while True:
    loader.set_epoch(epoch)
    for batch in loader:
        taken += 1
        if batches != "forever" and taken >= int(batches):
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            loader.close()
            sys.exit(0)
    epoch += 1
"""


def start_ferryd(binary, workdir):
    sock = os.path.join(workdir, "ferryd.sock")
    log = open(os.path.join(workdir, "ferryd.log"), "w")
    proc = subprocess.Popen([binary, "--listen", sock], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            ferry.Client(sock).close()
            return proc, sock
        except ferry.FerryError:
            time.sleep(0.05)
    raise RuntimeError("ferryd did not start; see %s/ferryd.log" % workdir)


def memory_kib(pid):
    """VmRSS and its anonymous part (RssAnon: heap, stacks; what a leak grows). The rest is
    the mapped dataset's page cache (RssFile) and the shared slots (RssShmem)."""
    got = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon"):
                got[key] = int(line.split()[1])
    return got.get("VmRSS", -1), got.get("RssAnon", -1)


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def gpu_mib(pid):
    """ferryd's device memory as nvidia-smi reports it (-1 without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return -1
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1])
    return 0


def shm_entries():
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith("cuda.shm"))
    except FileNotFoundError:
        return []


def slope(xs, ys):
    if len(xs) < 3:
        return float("nan")
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ferryd", required=True)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--every", type=float, default=30, help="seconds between samples")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ranks", type=int, default=2, help="rank 0 lives; the others churn")
    ap.add_argument("--tokens-mb", type=int, default=256)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="ferry-soak-")
    path = os.path.join(work, "tokens.bin")
    rng = np.random.default_rng(0)
    rng.integers(0, 50000, args.tokens_mb << 19, dtype=np.uint16).tofile(path)
    daemon, sock = start_ferryd(args.ferryd, work)
    shm_before = set(shm_entries())
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")

    def trainer(rank, batches, how):
        return subprocess.Popen([sys.executable, "-c", TRAINER, sock, path, str(rank),
                                 str(args.ranks), args.device, str(batches), how],
                                env=env, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(work, "trainer%d.log" % rank), "ab"))

    keeper = trainer(0, "forever", "exit")
    churn = {}
    deaths = 0
    rows = []
    start = time.monotonic()
    end = start + args.minutes * 60
    next_sample = start
    columns = ("minutes", "rss_kib", "anon_kib", "fds", "threads", "gpu_mib", "deaths",
               "cuda_shm")
    print("%8s %10s %10s %6s %8s %8s %8s %8s" % columns, flush=True)
    try:
        while time.monotonic() < end:
            for rank in range(1, args.ranks):
                proc = churn.get(rank)
                if proc is None or proc.poll() is not None:
                    if proc is not None:
                        deaths += 1
                    churn[rank] = trainer(rank, random.randint(1, 200),
                                          random.choice(("kill", "exit")))
            if keeper.poll() is not None:
                raise RuntimeError("the long-lived trainer exited with %d; see %s"
                                   % (keeper.returncode, work))
            if daemon.poll() is not None:
                raise RuntimeError("ferryd exited with %d; see %s/ferryd.log"
                                   % (daemon.returncode, work))
            now = time.monotonic()
            if now >= next_sample:
                rss, anon = memory_kib(daemon.pid)
                row = dict(minutes=(now - start) / 60, rss_kib=rss, anon_kib=anon,
                           fds=fds(daemon.pid), threads=threads(daemon.pid),
                           gpu_mib=gpu_mib(daemon.pid) if args.device != "cpu" else 0,
                           deaths=deaths,
                           cuda_shm=len(set(shm_entries()) - shm_before))
                rows.append(row)
                print("%8.1f %10d %10d %6d %8d %8d %8d %8d" % tuple(row[k] for k in columns),
                      flush=True)
                next_sample += args.every
            time.sleep(0.05)
    finally:
        for proc in list(churn.values()) + [keeper]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    warm = [r for r in rows if r["minutes"] >= 0.2 * args.minutes]
    if len(warm) >= 3:
        t = [r["minutes"] / 60 for r in warm]
        d = [r["deaths"] for r in warm]
        print("\nafter warm-up (%d samples, %d trainer deaths):" % (len(warm),
                                                                    d[-1] - d[0]))
        for key in columns[1:]:
            if key == "deaths":
                continue
            per_hour = slope(t, [r[key] for r in warm])
            per_death = slope(d, [r[key] for r in warm]) if d[-1] > d[0] else float("nan")
            print("  %-9s first %8d last %8d  slope %+10.1f /h  %+8.3f /death"
                  % (key, warm[0][key], warm[-1][key], per_hour, per_death))
    print("ferryd's log and the trainers' logs: %s" % work)


if __name__ == "__main__":
    main()
