#!/usr/bin/python3
"""A stand-in trainer that reads an imagefolder through ferryd and reports throughput.

It does what a training loop does with its input and nothing else: asks ferry.Loader for
shuffled, randomly cropped 224x224 batches, epoch after epoch, and touches every batch
(mean pixel value, label histogram, a check that no sample repeats within an epoch) so
that each byte really crosses into this process.

  PYTHONPATH=build/python /usr/bin/python3 examples/train_demo.py build/demo/imagenet \
      --address build/demo/ferryd.sock --epochs 3 --batch-size 64

With --ferryctl PATH it runs `ferryctl job <id>` after the second epoch (the first when
there is one), while the Loader is still attached, so that the job's live figures (rates, stall, limiting stage, corrupt
samples quarantined) show. With --baseline-workers N (N > 0) it then does the same epochs
with torch's DataLoader and N workers (examples/dataloader_baseline.py; PIL and a process
pool without torch) and prints both side by side, counting every process's CPU time.

The summary scripts/demo.sh prints:
  ferry demo: <N> images in <T> s = <X> images/s
"""

import argparse
import os
import resource
import subprocess
import sys
import time

import numpy as np

import ferry


def as_numpy(x):
    """Batches hold torch tensors (or numpy arrays); read them as numpy without copying."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # torch.Tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root", help="imagefolder root: root/<class>/<image>.jpg")
    p.add_argument("--address", default=None,
                   help="ferryd's Unix socket (default: the client's default socket)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="crop size (default 224)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help='"cpu" (host transport) or "cuda:N"')
    p.add_argument("--zero-copy", action="store_true",
                   help="read batches in place in ferryd's shared memory instead of copies")
    p.add_argument("--ferryctl", default=None,
                   help="ferryctl binary: show `ferryctl job` after the second epoch")
    p.add_argument("--baseline-workers", type=int, default=0,
                   help="also run torch's DataLoader with this many workers (0: no baseline)")
    args = p.parse_args()

    address = os.path.abspath(args.address) if args.address else None
    loader = ferry.Loader(ferry.ImageFolder(os.path.abspath(args.root)),
                          batch_size=args.batch_size,
                          transform=ferry.RandomResizedCrop(args.size, flip=True),
                          shuffle=True, seed=args.seed, drop_last=True,
                          rank=0, world_size=1, device=args.device, address=address,
                          zero_copy=args.zero_copy)

    client = ferry.Client(address)
    ferryd_cpu_start = float(client.status()["daemon"].get("cpu_seconds", 0))
    own_cpu_start = own_cpu_seconds()
    total_images = 0
    total_seconds = 0.0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        start = time.monotonic()
        images = 0
        batches = 0
        pixel_sum = 0.0
        label_counts = {}
        seen = set()
        repeats = 0
        for batch in loader:
            image = as_numpy(batch["image"])
            label = as_numpy(batch["label"])
            index = as_numpy(batch["index"])
            if image.dtype != np.uint8 or image.shape[1:] != (args.size, args.size, 3):
                sys.exit("unexpected image batch %s %s; expected uint8 [B, %d, %d, 3]" %
                         (image.dtype, image.shape, args.size, args.size))
            n = image.shape[0]
            if label.shape != (n,) or index.shape != (n,):
                sys.exit("label/index shapes %s/%s do not match %d images" %
                         (label.shape, index.shape, n))
            # The "training step": read every pixel, count labels.
            pixel_sum += float(image.mean(dtype=np.float32)) * n
            for value, count in zip(*np.unique(label, return_counts=True)):
                label_counts[int(value)] = label_counts.get(int(value), 0) + int(count)
            # A corrupt sample arrives as its substitute (whose index it carries), so an
            # index may repeat once per quarantined sample, and no more.
            repeats += sum(1 for i in index.tolist() if i in seen)
            seen.update(index.tolist())
            images += n
            batches += 1
        seconds = time.monotonic() - start
        quarantined = len(loader.job_status().get("quarantined_indices", []))
        if repeats > quarantined:
            sys.exit("epoch %d: %d samples delivered twice, more than the %d substitutes for "
                     "quarantined samples" % (epoch, repeats, quarantined))
        total_images += images
        total_seconds += seconds
        counts = sorted(label_counts.values())
        print("epoch %d: %d batches, %d images in %.2f s = %.0f images/s; mean pixel %.1f; "
              "%d classes, %d-%d images per class; %d corrupt files quarantined" %
              (epoch, batches, images, seconds, images / max(seconds, 1e-9),
               pixel_sum / max(images, 1), len(label_counts),
               counts[0] if counts else 0, counts[-1] if counts else 0, quarantined),
              flush=True)
        if epoch == min(1, args.epochs - 1) and args.ferryctl:
            print("== ferryctl job %s (the trainer is attached)" % loader.job["id"], flush=True)
            subprocess.run([args.ferryctl, "--address", address or "", "job", loader.job["id"]],
                           check=False)

    ferry_cpu = (float(client.status()["daemon"].get("cpu_seconds", 0)) - ferryd_cpu_start +
                 own_cpu_seconds() - own_cpu_start)
    client.close()
    loader.close()
    if total_images == 0:
        sys.exit("ferry demo: no batches were delivered (dataset smaller than one batch?)")
    print("ferry demo: %d images in %.2f s = %.0f images/s" %
          (total_images, total_seconds, total_images / total_seconds), flush=True)
    if args.baseline_workers > 0:
        import dataloader_baseline
        print("== baseline: the same %d epochs without ferry" % args.epochs, flush=True)
        base = dataloader_baseline.run(args.root, args.epochs, args.batch_size, args.size,
                                       args.baseline_workers, args.seed)
        if base["images"] == 0:
            sys.exit("baseline: no batches were delivered")
        ferry_rate = total_images / total_seconds
        base_rate = base["images"] / base["seconds"]
        ferry_cpu_k = 1000 * ferry_cpu / total_images
        base_cpu_k = 1000 * base["cpu_seconds"] / base["images"]
        print("%-9s %8.0f images/s  %6.2f CPU-s per 1000 images  (ferryd + this process)"
              % ("ferry", ferry_rate, ferry_cpu_k))
        print("%-9s %8.0f images/s  %6.2f CPU-s per 1000 images  (%s%s)"
              % ("baseline", base_rate, base_cpu_k, base["what"],
                 "; %d corrupt files read as black images each epoch"
                 % (base["corrupt"] // args.epochs) if base["corrupt"] else ""))
        print("ferry vs baseline: %.2fx the images/s, %.2fx the CPU per image"
              % (ferry_rate / base_rate, ferry_cpu_k / base_cpu_k), flush=True)


def own_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
