#!/usr/bin/env python3
"""The whole node: one ferryd feeding every GPU of the box against torch's DataLoader per
rank, side by side in one run under torchrun. Prints a table; never asserts.

  python3 bench/node_bench.py --ferryd PATH --data DIR [--gpus N] [--batches 150]
      [--train-steps 50] [--rounds 2] [--compare-priority] [--json OUT.json]
      [--ferry-config NAME=CONFIG ...] [--ferryd-other NAME=PATH ...]

DIR is written by bench/make_bench_dataset.py (imagefolder/: ImageNet-like JPEGs of about
105 KiB). One process per GPU (torchrun --standalone --nproc_per_node N), batch 256 per
GPU, decode -> RandomResizedCrop(224) -> flip -> normalized bf16 CHW in GPU memory:

  - ferry: one ferryd (a private socket, its default config: one worker per CPU at
    worker_nice 10, gpu_decode "auto"); every rank's ferry.Loader(device="cuda") with rank
    and world size from torch.distributed, so the ranks share one job, its sampler and its
    workers, and each GPU's JPEG engines decode its own rank's share.
  - DataLoader: per rank, torchvision decode_image + transforms.v2 RandomResizedCrop(224) +
    RandomHorizontalFlip in CPUs/N - 1 worker processes, DistributedSampler (set_epoch
    each epoch), pin_memory, persistent workers, prefetch_factor 4; normalized to bf16 on
    the GPU by the trainer (the same work as ferry's kernel). bench/anchors.py's loaders.

Measured, each phase a torchrun of its own so no loader lingers into the next:
  1. Loaders alone: every rank takes `--batches` batches after `--warmup` (300: gpu_decode
     "auto" searches for its share over the first few seconds of steps that wait), between two
     barriers. Node images/s (all ranks' images over the wall time between the barriers),
     the slowest and fastest rank's images/s, and node CPU-seconds per 1000 images from
     /proc/stat (every process of the machine: ferryd, trainers, DataLoader workers).
     ferry's per-GPU JPEG counts (ferryctl status: images each GPU's decoder took) over
     the phase show whether every GPU's engines work. Each --ferry-config NAME=CONFIG
     adds a ferry row whose ferryd runs with that DaemonConfig (text form, e.g.
     "gpu_decode: 'gpu'"), measured in the same rounds; each --ferryd-other NAME=PATH
     a row whose ferryd is another build (an A/B of two builds on one lease).
  2. DDP ResNet-50 (torchvision, bf16 autocast, channels_last, SGD): mean step time over
     `--train-steps` steps after 15 warm-up steps, with synthetic batches already on the
     GPU, fed by ferry, fed by ferry with uint8 images that the trainer normalizes in its
     own stream (no kernel of ferryd's on its GPU), fed by the DataLoader; ratios to
     synthetic. --compare-priority
     adds ferry with its workers under SCHED_IDLE (worker_sched_idle) and at nice 0
     (worker_nice 0: as any thread), to show what the trainers lose when the workers
     compete with them for the cores. For ferry, rank 0 reads every rank's stall and the
     share of time its main thread waited for a CPU (ferryctl status) at the end.
Each of the two runs `--rounds` times (the orders alternate); figures are medians with
(min-max).

Targets (reported only, never asserted): on 4 GPUs, ResNet-50 step <= 1.03x synthetic and
loaders alone >= 3x the DataLoader's images/s; on one GPU with 16 CPUs, >= 6x.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCH = 256
_TICK = os.sysconf("SC_CLK_TCK")


def node_cpu_seconds():
    """Busy CPU-seconds of the whole machine so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal
    return busy / _TICK


# ---------------------------------------------------------------- one rank (under torchrun)

def rank_main(a):
    import torch
    import torch.distributed as dist
    import torchvision

    import anchors  # the loaders, their batches, the ResNet-50 step

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = "cuda:%d" % local_rank
    dist.init_process_group("nccl", device_id=torch.device(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    anchors.BATCH = BATCH
    root = os.path.join(a.data, "imagefolder")
    feed = a.phase.split(":")[1]
    # A job of its own per phase: a job kept from the loaders-alone phase would start the
    # training with its ranks' GPU decode demand at 1 (they waited there).
    job_name = "node-bench-" + a.phase.replace(":", "-")

    if feed == "ferry":
        loader = anchors.make_ferry(a.address, root, device, job_name=job_name)
        batches = anchors.ferry_batches(loader, device)
    elif feed == "ferry-uint8":
        # uint8 HWC to the GPU; the trainer normalizes it to bf16 in its own stream, so no
        # kernel of ferryd's runs on the trainer's GPU.
        import ferry
        loader = ferry.Loader(ferry.ImageFolder(root), batch_size=BATCH,
                              transform=ferry.RandomResizedCrop(224, flip=True), shuffle=True,
                              seed=0, drop_last=True, device=device, address=a.address,
                              image_dtype="uint8", job_name=job_name, prefetch=8)
        batches = anchors.ferry_batches(loader, device)
    elif feed == "dataloader":
        cpus = len(os.sched_getaffinity(0))
        workers = max(1, cpus // world - 1)
        dataset = anchors.JpegFolder(root)
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                      shuffle=True, drop_last=True)
        dl = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                         drop_last=True, num_workers=workers, pin_memory=True,
                                         persistent_workers=True, prefetch_factor=4)

        def epochs():
            mean = anchors.MEAN.to(device).view(1, 3, 1, 1)
            std = anchors.STD.to(device).view(1, 3, 1, 1)
            epoch = 0
            while True:
                sampler.set_epoch(epoch)
                for image, label in dl:
                    x = image.to(device, non_blocking=True).float().sub_(mean).div_(std)
                    yield x.to(torch.bfloat16), label.to(device, non_blocking=True)
                epoch += 1
        batches = epochs()
    else:
        batches = anchors.synthetic(device, 1000)

    result = {"rank": rank, "world": world}
    if a.phase.startswith("loader"):
        for _ in range(a.warmup):
            next(batches)
        torch.cuda.synchronize()
        dist.barrier()
        cpu0 = node_cpu_seconds()
        t0 = time.perf_counter()
        for _ in range(a.batches):
            next(batches)
        torch.cuda.synchronize()
        result["rank_seconds"] = time.perf_counter() - t0
        dist.barrier()
        result["wall_seconds"] = time.perf_counter() - t0
        result["node_cpu_seconds"] = node_cpu_seconds() - cpu0
        result["images"] = a.batches * BATCH
    else:
        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet50(num_classes=1000).to(device).to(
            memory_format=torch.channels_last)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        anchors.train_steps(batches, 15, model, optimizer, device)
        dist.barrier()
        cpu0 = node_cpu_seconds()
        t0 = time.perf_counter()
        anchors.train_steps(batches, a.train_steps, model, optimizer, device)
        if feed.startswith("ferry") and rank == 0 and a.ferryctl:
            result["ranks"] = rank_figures(a.ferryctl, a.address)
        dist.barrier()
        result["step_seconds"] = (time.perf_counter() - t0) / a.train_steps
        result["node_cpu_seconds"] = node_cpu_seconds() - cpu0
    with open(os.path.join(a.out, "%s.rank%d.json" % (a.phase.replace(":", "_"), rank)),
              "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    os._exit(0)  # the loaders' threads and workers end with the process


# ---------------------------------------------------------------- the driver

def run_phase(a, phase, address, out):
    for f in os.listdir(out):
        if f.startswith(phase.replace(":", "_") + "."):
            os.unlink(os.path.join(out, f))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(a.gpus), os.path.abspath(__file__), "--rank-phase", phase,
           "--address", address, "--data", a.data, "--out", out,
           "--batches", str(a.batches), "--warmup", str(a.warmup),
           "--train-steps", str(a.train_steps), "--ferryctl", a.ferryctl]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("phase %s failed (exit %d):\n%s" % (phase, proc.returncode,
                                                               proc.stderr[-4000:]))
    ranks = []
    for r in range(a.gpus):
        with open(os.path.join(out, "%s.rank%d.json" % (phase.replace(":", "_"), r))) as f:
            ranks.append(json.load(f))
    return ranks


def ferry_status(ferryctl, address):
    out = subprocess.run([ferryctl, "--address", address, "--json", "status"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def rank_figures(ferryctl, address):
    """Per rank of the (one) job: stall ratio, CPU wait ratio, limiting stage."""
    jobs = ferry_status(ferryctl, address).get("jobs", [])
    return [{"rank": int(r.get("rank", 0)), "stall": float(r.get("stall_ratio", 0)),
             "cpu_wait": float(r.get("consumer_cpu_wait_ratio", 0)),
             "limit": r.get("limiting_stage", "")}
            for j in jobs for r in j.get("ranks", []) if r.get("attached")]


def gpu_decode_figures(ferryctl, address):
    jobs = ferry_status(ferryctl, address).get("jobs", [])
    return [j.get("gpu_decode", {}) for j in jobs]


def gpu_jpeg_counts(ferryctl, address):
    """Per GPU ordinal: images its JPEG decoder decoded so far."""
    out = subprocess.run([ferryctl, "--address", address, "--json", "status"],
                         capture_output=True, text=True, check=True).stdout
    return {int(g.get("ordinal", 0)): int(g.get("jpeg_gpu_images", 0))
            for g in json.loads(out).get("daemon", {}).get("gpus", [])}


def med(values):
    return "%s (%s-%s)" % tuple(_fmt(v) for v in (statistics.median(values), min(values),
                                                  max(values)))


def _fmt(v):
    return "%.0f" % v if v >= 100 else "%.2f" % v


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ferryd")
    p.add_argument("--ferryctl", default=os.environ.get("FERRYCTL", ""))
    p.add_argument("--data", required=True)
    p.add_argument("--gpus", type=int, default=0, help="default: every GPU")
    p.add_argument("--batches", type=int, default=150, help="per rank, loaders alone")
    p.add_argument("--warmup", type=int, default=300, help="per rank, loaders alone")
    p.add_argument("--train-steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--compare-priority", action="store_true")
    p.add_argument("--skip-train", action="store_true", help="loaders alone only")
    p.add_argument("--ferry-config", action="append", default=[], metavar="NAME=CONFIG",
                   help="loaders alone: also ferry with this DaemonConfig text (repeatable)")
    p.add_argument("--ferryd-other", action="append", default=[], metavar="NAME=PATH",
                   help="loaders alone: also ferry with this ferryd binary (repeatable)")
    p.add_argument("--json")
    # Internal: one rank of a phase, under torchrun.
    p.add_argument("--rank-phase")
    p.add_argument("--address")
    p.add_argument("--out")
    a = p.parse_args()
    if a.rank_phase:
        a.phase = a.rank_phase
        return rank_main(a)

    import torch
    import gpu_bench  # ferryd start

    a.gpus = a.gpus or torch.cuda.device_count()
    cpus = len(os.sched_getaffinity(0))
    root = os.path.join(a.data, "imagefolder")
    n_images = sum(len(f) for _, _, f in os.walk(root))
    print("node_bench: %d GPUs (%s), %d CPUs, %d JPEGs, batch %d per GPU, %d rounds"
          % (a.gpus, torch.cuda.get_device_name(0), cpus, n_images, BATCH, a.rounds),
          flush=True)
    for d, _, files in os.walk(root):  # the page cache warm for every side
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                fh.read()
    work = tempfile.mkdtemp(prefix="ferry-node-")
    results = {"gpus": a.gpus, "cpus": cpus, "images": n_images}
    daemons = {}

    def daemon(config, binary=None):
        """A ferryd (`binary`, default --ferryd) with `config` (None: the defaults), started
        on first use."""
        key = (binary or a.ferryd, config)
        if key not in daemons:
            daemons[key] = gpu_bench.start_ferryd(key[0], work, "ferryd%d" % len(daemons),
                                                  config)
        return daemons[key][1]

    try:
        # 1. Loaders alone.
        configs = {"ferry": None}
        binaries = {}
        for item in a.ferry_config:
            name, _, text = item.partition("=")
            configs["ferry, " + name] = text.replace("\\n", "\n") + "\n"
        for item in a.ferryd_other:
            name, _, path = item.partition("=")
            configs["ferry, " + name] = None
            binaries["ferry, " + name] = path
        names = list(configs) + ["DataLoader"]
        rates = {name: [] for name in names}
        spread = {name: [] for name in names}
        cpu = {name: [] for name in names}
        decoded = []
        for r in range(a.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                address = daemon(configs.get(name), binaries.get(name))
                is_ferry = name in configs
                before = gpu_jpeg_counts(a.ferryctl, address) if is_ferry else None
                ranks = run_phase(a, "loader:" + ("ferry" if is_ferry else "dataloader"),
                                  address, work)
                if before is not None:
                    after = gpu_jpeg_counts(a.ferryctl, address)
                    decoded.append({g: after[g] - before.get(g, 0) for g in after})
                    split = gpu_decode_figures(a.ferryctl, address)
                    print("  %s's GPU decode split: %s" % (name, json.dumps(split)), flush=True)
                images = sum(x["images"] for x in ranks)
                wall = max(x["wall_seconds"] for x in ranks)
                rates[name].append(images / wall)
                per_rank = [x["images"] / x["rank_seconds"] for x in ranks]
                spread[name].append((min(per_rank), max(per_rank)))
                cpu[name].append(1000 * ranks[0]["node_cpu_seconds"] / images)
                print("  loaders round %d, %s: %.0f images/s (ranks %.0f-%.0f), %.2f CPU-s/1000"
                      % (r, name, rates[name][-1], *spread[name][-1], cpu[name][-1]),
                      flush=True)
        results["loaders"] = {"images_per_second": rates, "rank_spread": spread,
                              "cpu_seconds_per_1000": cpu, "ferry_gpu_jpeg_images": decoded}

        # 2. DDP ResNet-50.
        steps = {}
        feeds = [] if a.skip_train else [("synthetic", "train:synthetic", None), ("ferry", "train:ferry", None),
                 ("ferry, uint8 normalized by the trainer", "train:ferry-uint8", None),
                 ("DataLoader", "train:dataloader", None)]
        if a.compare_priority and feeds:
            feeds.append(("ferry, workers SCHED_IDLE", "train:ferry",
                          "worker_sched_idle: true\n"))
            feeds.append(("ferry, workers nice 0", "train:ferry", "worker_nice: 0\n"))
        steps = {name: [] for name, _, _ in feeds}
        for r in range(a.rounds if feeds else 0):
            for name, phase, config in (feeds if r % 2 == 0 else feeds[::-1]):
                ranks = run_phase(a, phase, daemon(config), work)
                steps[name].append(statistics.median(x["step_seconds"] for x in ranks))
                if "ranks" in ranks[0]:
                    print("    %s: %s" % (name, ", ".join(
                        "rank %d stall %.0f%% cpu wait %.0f%% %s"
                        % (x["rank"], 100 * x["stall"], 100 * x["cpu_wait"], x["limit"])
                        for x in ranks[0]["ranks"])), flush=True)
            print("  train round %d: " % r + ", ".join(
                "%s %.1f ms" % (k, 1e3 * v[-1]) for k, v in steps.items()), flush=True)
        results["resnet50_step_seconds"] = steps
    finally:
        for proc, _ in daemons.values():
            proc.terminate()
            proc.wait()

    print()
    print("| %d GPUs, %d CPUs | images/s (node) | slowest-fastest rank | CPU-s / 1000 images |"
          % (a.gpus, cpus))
    print("| --- | --- | --- | --- |")
    for name in names:
        lo = [s[0] for s in spread[name]]
        hi = [s[1] for s in spread[name]]
        print("| %s | %s | %.0f-%.0f | %s |" % (name, med(rates[name]), statistics.median(lo),
                                                statistics.median(hi), med(cpu[name])))
    for name in configs:
        ratio = statistics.median(rates[name]) / statistics.median(rates["DataLoader"])
        cpu_ratio = statistics.median(cpu[name]) / statistics.median(cpu["DataLoader"])
        print("%s / DataLoader: %.2fx the images/s, %.2fx the CPU per image"
              % (name, ratio, cpu_ratio))
    if decoded:
        last = decoded[-1]
        print("ferry, images each GPU's JPEG decoder took in its last round: " + ", ".join(
            "GPU %d %d" % (g, n) for g, n in sorted(last.items())))
    if steps:
        print()
        print("| DDP ResNet-50 | step ms | vs synthetic |")
        print("| --- | --- | --- |")
    syn = statistics.median(steps["synthetic"]) if steps else 1
    for name, values in steps.items():
        print("| %s | %s | %.3fx |" % (name, med([1e3 * v for v in values]),
                                       statistics.median(values) / syn))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
