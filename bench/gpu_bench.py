#!/usr/bin/env python3
"""GPU-transport benchmarks, run on the GPU machine. Prints a table; never asserts.

  python3 bench/gpu_bench.py --ferryd PATH [--tokens-mb 512] [--images DIR]

Measured in one run, side by side (the machines are noisy: read the ratios):
  1. tokens: GB/s delivered into the trainer's GPU memory by ferry (zero-copy views, the
     trainer touching nothing) vs a pinned cudaMemcpyAsync of the same chunk size (the copy
     peak), and vs torch DataLoader(pin_memory=True) reading the same file; then the
     Loader's default (safe) mode, which clone()s each field of each batch;
  2. handoff: time the trainer spends getting a usable tensor when ferry is ahead of it
     (next() on a full queue), p50 / p99 over >= 10,000 batches;
  3. images (with --images): JPEG -> RandomResizedCrop(224) -> bf16 normalized CHW on the
     GPU, images/s;
  4. the token rows again with a C++ trainer (bench/gpu_consume_bench, found next to
     --ferryd), which shows what ferryd delivers without the Python trainer's per-batch cost,
     once through the shared-memory batch channel and once on the gRPC stream.
ferryd runs as a separate process on a private socket.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import ferry


def start_ferryd(binary, workdir, name="ferryd", config=None):
    """Starts `binary` on WORKDIR/NAME.sock (with `config`, a DaemonConfig in text form, if
    given) and waits until it answers; returns (process, socket path)."""
    sock = os.path.join(workdir, name + ".sock")
    log = open(os.path.join(workdir, name + ".log"), "w")
    args = [binary, "--listen", sock]
    if config is not None:
        conf = os.path.join(workdir, name + ".conf")
        with open(conf, "w") as f:
            f.write(config)
        args += ["--config", conf]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            ferry.Client(sock).close()
            return proc, sock
        except Exception:
            time.sleep(0.05)
    raise RuntimeError("ferryd did not start; see %s/%s.log" % (workdir, name))


def pinned_peak(chunk_bytes, device):
    reps = max(50, (512 << 20) // chunk_bytes)  # at least 512 MiB copied: ~10 ms
    src = torch.empty(chunk_bytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return chunk_bytes * reps / (start.elapsed_time(end) / 1e3) / 1e9


def cuda_objects(sock):
    """Sum over ranks of the CUDA objects ferryd's transports created (status counter)."""
    with ferry.Client(sock) as c:
        st = c.status()
    return sum(int(r.get("cudaObjectsCreated", r.get("cuda_objects_created", 0)))
               for j in st.get("jobs", []) for r in j.get("ranks", []))


def ferry_tokens(sock, path, seq_len, batch, device, epochs=2, records=False, prefetch=0,
                 stats=None, min_seconds=1.0, zero_copy=True):
    """GB/s of int64 tokens delivered over `epochs` epochs after a warm-up one, or as many
    more as take min_seconds (an epoch of the default 512 MiB file lasts ~12 ms at the
    pinned peak: too short to time alone). records=True reads the same file as raw int64
    records of seq_len + 1 (no conversion anywhere: one plain copy per batch) instead of
    uint16 tokens widened to int64 (on the GPU with a cuda device). prefetch: slots of the
    rank (batches in flight; 0 = the daemon's default). With a dict `stats`, adds "next":
    the share of the measured time the trainer spent inside the Loader's next() (waiting for
    ferry plus the Loader's own per-batch work). zero_copy=False: the Loader's default
    (safe) mode, which clone()s every field of every batch."""
    if records:
        dataset = ferry.Records(path, dtype="int64", shape=(seq_len + 1,))
    else:
        dataset = ferry.Tokens(path, seq_len=seq_len, dtype="uint16", output_dtype="int64")
    loader = ferry.Loader(dataset, batch_size=batch, shuffle=True, seed=0, drop_last=True,
                          device=device, address=sock, zero_copy=zero_copy, prefetch=prefetch)
    field = "data" if records else "tokens"
    nbytes = 0
    loader.set_epoch(0)
    for b in loader:  # warm-up epoch
        pass
    torch.cuda.synchronize()
    objects_after_warmup = cuda_objects(sock) if device != "cpu" else 0
    in_next = 0.0
    clock = time.perf_counter
    t0 = clock()
    epoch = 0
    while epoch < epochs or clock() - t0 < min_seconds:
        epoch += 1
        loader.set_epoch(epoch)
        it = iter(loader)
        while True:
            t = clock()
            b = next(it, None)
            in_next += clock() - t
            if b is None:
                break
            nbytes += b[field].numel() * b[field].element_size()
    torch.cuda.synchronize()
    seconds = clock() - t0
    if stats is not None:
        stats["next"] = in_next / seconds
    if device != "cpu":
        print("CUDA objects created by ferryd: %d after warm-up, %d after %d more epochs"
              % (objects_after_warmup, cuda_objects(sock), epoch))
    loader.close()
    return nbytes / seconds / 1e9


def dataloader_tokens(path, seq_len, batch, device, workers):
    data = np.memmap(path, dtype=np.uint16, mode="r")

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return (len(data) - 1) // seq_len

        def __getitem__(self, i):
            return torch.from_numpy(data[i * seq_len:i * seq_len + seq_len + 1].astype(np.int64))

    dl = torch.utils.data.DataLoader(Windows(), batch_size=batch, shuffle=True, drop_last=True,
                                     num_workers=workers, pin_memory=True,
                                     persistent_workers=workers > 0)
    nbytes = 0
    for x in dl:  # warm-up
        x.to(device, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for x in dl:
        y = x.to(device, non_blocking=True)
        nbytes += y.numel() * y.element_size()
    torch.cuda.synchronize()
    return nbytes / (time.perf_counter() - t0) / 1e9


def handoff(sock, path, device, batches, step_us=0):
    """next() latency with small batches. step_us > 0 simulates a training step between
    batches (a busy wait), so ferry refills its ring and is ahead of the trainer, which is
    the situation the handoff target is about; step_us = 0 measures the back-to-back rate."""
    loader = ferry.Loader(ferry.Tokens(path, seq_len=127, dtype="uint16"), batch_size=8,
                          shuffle=False, drop_last=True, device=device, address=sock,
                          zero_copy=True, prefetch=16)
    times = []
    epoch = 0
    while len(times) < batches:
        loader.set_epoch(epoch)
        it = iter(loader)
        time.sleep(0.05)  # let the ring fill
        while len(times) < batches:
            t0 = time.perf_counter_ns()
            try:
                b = next(it)
            except StopIteration:
                break
            times.append(time.perf_counter_ns() - t0)
            del b
            if step_us:
                end = time.perf_counter_ns() + step_us * 1000
                while time.perf_counter_ns() < end:
                    pass
        epoch += 1
    loader.close()
    times.sort()
    return times[len(times) // 2] / 1e3, times[int(len(times) * 0.99)] / 1e3, len(times)


def handoff_parts(sock, path, device, batches=3000, step_us=1000):
    """Where a handoff's time goes with ferry ahead (a simulated step of step_us between
    batches), timed piece by piece through the calls the Loader makes."""
    loader = ferry.Loader(ferry.Tokens(path, seq_len=127, dtype="uint16"), batch_size=8,
                          drop_last=True, device=device, address=sock, zero_copy=True,
                          prefetch=16)
    consumer = loader._consumer
    parts = {"next": [], "current_stream": [], "wait": [], "views": [], "release": []}
    epoch = 0
    n = 0
    while n < batches:
        consumer.start_epoch(100 + epoch, 0)
        time.sleep(0.05)
        while n < batches:
            t = [time.perf_counter_ns()]
            b = consumer.next(1000)
            t.append(time.perf_counter_ns())
            if b is None:
                break
            s = loader._current_stream()
            t.append(time.perf_counter_ns())
            b.wait(s)
            t.append(time.perf_counter_ns())
            loader._cuda_views(b)
            t.append(time.perf_counter_ns())
            b.release(s)
            t.append(time.perf_counter_ns())
            for i, k in enumerate(parts):
                parts[k].append(t[i + 1] - t[i])
            n += 1
            end = time.perf_counter_ns() + step_us * 1000
            while time.perf_counter_ns() < end:
                pass
        epoch += 1
    loader.close()
    return {k: sorted(v)[len(v) // 2] / 1e3 for k, v in parts.items()}


def images(sock, root, device, batch, epochs=2):
    loader = ferry.Loader(ferry.ImageFolder(root), batch_size=batch,
                          transform=ferry.RandomResizedCrop(224, flip=True), shuffle=True,
                          drop_last=True, device=device, address=sock, zero_copy=True,
                          image_dtype="bfloat16")
    loader.set_epoch(0)
    for b in loader:
        pass
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        for b in loader:
            n += b["image"].shape[0]
    torch.cuda.synchronize()
    loader.close()
    return n / (time.perf_counter() - t0)


def thread_cpu(pid):
    """{tid: (thread name, CPU seconds so far)} of process `pid`, from /proc."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    task_dir = "/proc/%d/task" % pid
    for tid in os.listdir(task_dir):
        try:
            with open(os.path.join(task_dir, tid, "stat")) as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)  # utime + stime
    return out


def print_thread_cpu(what, before, after, seconds):
    """CPU used per thread name between two thread_cpu snapshots, in cores, busiest first:
    a thread near 1.0 core is a serial bottleneck."""
    groups = {}
    for tid, (name, cpu) in after.items():
        used = cpu - before.get(tid, (name, 0.0))[1]
        total, busiest, count = groups.get(name, (0.0, 0.0, 0))
        groups[name] = (total + used, max(busiest, used), count + 1)
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    print("%s, CPU in cores over %.1f s (threads; busiest thread): %s" % (
        what, seconds, "; ".join("%s %.2f (%d; %.2f)" % (name, total / seconds, count,
                                                          busiest / seconds)
                                 for name, (total, busiest, count) in rows[:8]
                                 if total > 0.01 * seconds)))


def print_copy_counters(sock):
    """Per rank of every job: where a batch's time goes in ferryd (status counters)."""
    with ferry.Client(sock) as c:
        jobs = c.status().get("jobs", [])
    for j in jobs:
        for r in j.get("ranks", []):
            n = int(r.get("batches_copied", 0))
            if n:
                releases = int(r.get("releases", 0))
                watched = releases - int(r.get("releases_complete", 0))
                spec = j["job"]["spec"]
                filled = max(1, int(r.get("batches_filled", 0)))
                delivered = max(1, int(r.get("batches_delivered", 0)))
                us = lambda key, count: 1e6 * float(r.get(key, 0)) / count
                print("job %s (%s, batch %s, %s slots): %d batches copied; per batch, us: "
                      "fill %.1f, wait for a device slot %.1f, enqueue %.1f, enqueue-to-ready "
                      "%.1f, held by the trainer %.1f, device slot idle %.1f; %d of %d "
                      "releases needed a released signal (%.1f us each)"
                      % (j["job"]["id"], next(iter(spec["dataset"])), spec.get("batch_size"),
                         r.get("slots", "?"), n, us("fill_seconds", filled),
                         us("copy_wait_seconds", n), us("copy_enqueue_seconds", n),
                         us("copy_ready_seconds", n), us("lease_seconds", delivered),
                         us("device_slot_idle_seconds", n), watched, releases,
                         us("release_signal_seconds", max(1, watched))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ferryd", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--tokens-mb", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=2047)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--token-batches", default="64,256",
                   help="token batch sizes (rows of seq_len+1 int64) to measure")
    p.add_argument("--handoff-batches", type=int, default=10000)
    p.add_argument("--step-us", type=int, default=1000,
                   help="simulated training step between batches for the handoff figure")
    p.add_argument("--images", help="imagefolder for the JPEG pipeline")
    p.add_argument("--only-tokens", action="store_true", help="the token rows only")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the token rows")
    p.add_argument("--prefetch", default="0,8",
                   help="comma-separated prefetch depths (slots per rank) for the token rows; "
                   "0 = the daemon's default")
    p.add_argument("--skip-dataloader", action="store_true",
                   help="leave out the DataLoader token row (slow)")
    a = p.parse_args()
    workdir = tempfile.mkdtemp(prefix="ferry-gpu-bench-")
    path = os.path.join(workdir, "tokens.u16")
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, size=a.tokens_mb * (1 << 20) // 2, dtype=np.uint16).tofile(path)
    proc, sock = start_ferryd(a.ferryd, workdir)
    try:
        rows = []
        workers = max(1, (os.cpu_count() or 2) - 1)
        prefetch = [int(v) for v in a.prefetch.split(",")]
        for i, batch in enumerate(int(b) for b in a.token_batches.split(",")):
            chunk = batch * (a.seq_len + 1) * 8
            # Rounds alternate the peak copy and ferry's variants; each figure is the median
            # over the rounds, each ratio the median of the per-round ratios.
            runs = {}
            for _ in range(a.rounds):
                peak = pinned_peak(chunk, a.device)
                runs.setdefault("peak", []).append((peak, 1.0, 0.0))
                # Zero-copy at each prefetch depth, then the Loader's default (safe) mode.
                variants = [(depth, True) for depth in prefetch]
                if a.device != "cpu":
                    variants.append((0, False))
                for depth, zero_copy in variants:
                    for records in (False, True):
                        st = {}
                        gbs = ferry_tokens(sock, path, a.seq_len, batch, a.device,
                                           records=records, prefetch=depth, stats=st,
                                           zero_copy=zero_copy)
                        runs.setdefault((records, depth, zero_copy), []).append(
                            (gbs, gbs / peak, st["next"]))
            med = lambda xs: statistics.median(xs)
            for key, vals in runs.items():
                if key == "peak":
                    name = "pinned cudaMemcpyAsync, %.1f MiB chunks (peak)" % (chunk / 2**20)
                else:
                    name = ("ferry %s -> GPU (batch %d, %s)"
                            % ("raw int64 records" if key[0] else "tokens u16->int64", batch,
                               "prefetch %s" % (key[1] or "default") if key[2] else
                               "safe mode, prefetch default"))
                rows.append((name, med([v[0] for v in vals]), med([v[1] for v in vals]),
                             min(v[1] for v in vals), max(v[1] for v in vals),
                             med([v[2] for v in vals])))
            if i == 0 and not a.skip_dataloader:
                dl_gbs = dataloader_tokens(path, a.seq_len, batch, a.device, workers)
                rows.append(("DataLoader(%d workers, pin_memory) -> GPU" % workers, dl_gbs,
                             dl_gbs / peak, dl_gbs / peak, dl_gbs / peak, float("nan")))
        host_gbs = ferry_tokens(sock, path, a.seq_len, a.batch, "cpu")  # vs the last peak
        rows.append(("ferry tokens -> host memory (cpu transport), for scale", host_gbs,
                     host_gbs / peak, host_gbs / peak, host_gbs / peak, float("nan")))
        print("%d round(s); GB/s of int64 delivered (median), ratio to the same round's pinned "
              "peak (median, min-max), share of the trainer's time inside the Loader's next()"
              % a.rounds)
        print("%-72s %8s %8s %13s %6s" % ("python trainer (ferry.Loader, zero-copy unless "
                                           "said)", "GB/s", "vs peak", "(min-max)", "next"))
        for name, v, r, lo, hi, wait in rows:
            print("%-72s %8.2f %8.2f %6.2f-%-6.2f %6.2f" % (name, v, r, lo, hi, wait))
        consume_bench = os.path.join(os.path.dirname(a.ferryd), "gpu_consume_bench")
        if os.path.exists(consume_bench):
            sys.stdout.flush()
            cuda_index = str(torch.device(a.device).index or 0)
            # Batches through the shared-memory batch channel (the default), then on the gRPC
            # stream (the data plane before it) for comparison.
            for plane in ("shm", "grpc"):
                print("C++ trainer, batches %s:" % ("through the shared-memory batch channel"
                                                    if plane == "shm" else
                                                    "on the gRPC stream (FERRY_BATCH_CHANNEL=grpc)"))
                sys.stdout.flush()
                subprocess.run([consume_bench, "--address", sock, "--path", path, "--seq-len",
                                str(a.seq_len), "--batches", a.token_batches, "--prefetch",
                                a.prefetch, "--rounds", str(a.rounds), "--device", cuda_index],
                               env=dict(os.environ, FERRY_BATCH_CHANNEL=plane))
            # Where the CPU goes per thread, for the first batch size at the default depth.
            for kind in ("tokens", "records"):
                # Records have 4x fewer batches per epoch (int64 rows): as many epochs more.
                epochs = "80" if kind == "tokens" else "320"
                trainer = subprocess.Popen(
                    [consume_bench, "--address", sock, "--path", path, "--seq-len",
                     str(a.seq_len), "--batches", a.token_batches.split(",")[0], "--prefetch",
                     "0", "--rounds", "1", "--epochs", epochs, "--kinds", kind, "--device",
                     cuda_index], stdout=subprocess.DEVNULL)
                time.sleep(1.5)  # past the job's creation and warm-up
                before = (time.perf_counter(), thread_cpu(proc.pid), thread_cpu(trainer.pid))
                time.sleep(1.5)
                after = None
                try:
                    if trainer.poll() is None:
                        after = (time.perf_counter(), thread_cpu(proc.pid),
                                 thread_cpu(trainer.pid))
                except OSError:  # it ended while being read
                    pass
                trainer.wait()
                if after is None:
                    print("(the %s profile run ended early: no thread CPU figures)" % kind)
                    continue
                seconds = after[0] - before[0]
                print_thread_cpu("ferryd, C++ trainer on %s" % kind, before[1], after[1], seconds)
                print_thread_cpu("  the C++ trainer", before[2], after[2], seconds)
        else:
            print("(no %s: the C++ trainer rows are left out)" % consume_bench)
        if a.only_tokens:
            print_copy_counters(sock)
            return
        for step in (a.step_us, 0):
            what = ("trainer step %d us, ferry ahead" % step if step else
                    "back to back, bounded by ferry's per-batch rate")
            p50, p99, n = handoff(sock, path, a.device, a.handoff_batches, step)
            print("handoff %s, %d batches: p50 %.1f us, p99 %.1f us" % (what, n, p50, p99))
            p50, p99, n = handoff(sock, path, "cpu", a.handoff_batches // 4, step)
            print("  same on the cpu transport, %d batches: p50 %.1f us, p99 %.1f us"
                  % (n, p50, p99))
        print_copy_counters(sock)
        print("handoff parts, p50 us: " + ", ".join(
            "%s %.1f" % kv for kv in handoff_parts(sock, path, a.device).items()))
        if a.images:
            print("JPEG -> RandomResizedCrop(224) -> bf16 on GPU: %.0f images/s"
                  % images(sock, a.images, a.device, a.batch))
        status = subprocess.run([os.path.join(os.path.dirname(a.ferryd), "ferryctl"),
                                 "--address", sock, "status"], capture_output=True, text=True)
        print(status.stdout)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
