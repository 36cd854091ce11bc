#!/usr/bin/python3
"""The demo's baseline: the same work as examples/train_demo.py (shuffled JPEGs, each
decoded, RandomResizedCrop to size x size with a random horizontal flip, batched as uint8
HWC) done the way a competent PyTorch user does it without ferry:

  - with torch and torchvision: torch.utils.data.DataLoader over a torchvision-style
    image folder, PIL decode + torchvision.transforms.RandomResizedCrop /
    RandomHorizontalFlip, `workers` worker processes kept across epochs
    (persistent_workers), prefetch_factor 4;
  - otherwise: PIL in a multiprocessing.Pool of `workers` processes, numpy batches.

A file that does not decode becomes a black image (DataLoader itself would stop the run
at the first one), counted in the result.

CPU time counts every process: this one and its workers (the workers are joined, so
their time is in RUSAGE_CHILDREN, before the result is read).

  PYTHONPATH=build/python /usr/bin/python3 examples/dataloader_baseline.py build/demo/x \
      --epochs 3 --batch-size 64
"""

import argparse
import os
import random
import resource
import sys
import time

import numpy as np

EXTENSIONS = (".jpg", ".jpeg", ".png")


def list_samples(root):
    """[(path, label)] in ImageFolder's order: classes sorted, files sorted."""
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    samples = []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for f in sorted(os.listdir(folder)):
            if f.lower().endswith(EXTENSIONS):
                samples.append((os.path.join(folder, f), label))
    return samples


def random_resized_crop(image, size, rng):
    """torchvision's RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) with
    bilinear resampling, then a horizontal flip with probability 1/2, on a PIL image."""
    from PIL import Image
    width, height = image.size
    area = width * height
    box = (0, 0, width, height)
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        w = int(round(np.sqrt(target * ratio)))
        h = int(round(np.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            x = rng.randint(0, width - w)
            y = rng.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    out = image.resize((size, size), Image.BILINEAR, box=box)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return out


def load_pil(path, size, seed):
    """One sample for the PIL pool: (uint8 HWC array, decoded?)."""
    from PIL import Image
    try:
        with Image.open(path) as image:
            crop = random_resized_crop(image.convert("RGB"), size, random.Random(seed))
        return np.asarray(crop, dtype=np.uint8), True
    except Exception:  # a corrupt file: a black image, as the torch path does
        return np.zeros((size, size, 3), np.uint8), False


class _SafeFolder:
    """A map-style dataset over list_samples with torchvision's transforms; a file that
    does not decode gives a black image and label -1."""

    def __init__(self, samples, size):
        from torchvision import transforms
        self.samples = samples
        self.size = size
        self.transform = transforms.Compose([transforms.RandomResizedCrop(size),
                                             transforms.RandomHorizontalFlip(),
                                             transforms.PILToTensor()])

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        import torch
        from PIL import Image
        path, label = self.samples[i]
        try:
            with Image.open(path) as image:
                chw = self.transform(image.convert("RGB"))
            return chw.permute(1, 2, 0).contiguous(), label
        except Exception:
            return torch.zeros((self.size, self.size, 3), dtype=torch.uint8), -1


def cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(root, epochs, batch_size, size=224, workers=4, seed=0):
    """Returns {"what", "images", "seconds", "cpu_seconds", "corrupt"}: images delivered
    over `epochs` epochs (drop_last), wall seconds of the epochs, CPU seconds of every
    process (set-up included: starting workers is part of the cost)."""
    samples = list_samples(root)
    cpu_start = cpu_seconds()
    images = corrupt = 0
    seconds = 0.0
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None:
        what = ("torch DataLoader, %d workers (persistent, prefetch_factor 4), PIL decode + "
                "torchvision RandomResizedCrop(%d) + flip" % (workers, size))
        torch.manual_seed(seed)
        loader = torch.utils.data.DataLoader(
            _SafeFolder(samples, size), batch_size=batch_size, shuffle=True, drop_last=True,
            num_workers=workers, persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None)
        for _ in range(epochs):
            start = time.monotonic()
            for image, label in loader:
                images += image.shape[0]
                corrupt += int((label < 0).sum())
                float(image.float().mean())  # the "training step" reads every pixel
            seconds += time.monotonic() - start
        del loader  # joins the workers, so that their CPU time is counted
    else:
        import multiprocessing
        what = ("PIL decode + RandomResizedCrop(%d) + flip in a pool of %d processes "
                "(torch/torchvision not installed)" % (size, workers))
        rng = random.Random(seed)
        with multiprocessing.Pool(workers) as pool:
            for epoch in range(epochs):
                start = time.monotonic()
                order = list(range(len(samples)))
                rng.shuffle(order)
                for b in range(len(order) // batch_size):
                    batch = order[b * batch_size:(b + 1) * batch_size]
                    rows = pool.starmap(load_pil, [(samples[i][0], size, seed * 7919 + epoch
                                                    * 104729 + i) for i in batch])
                    image = np.stack([r[0] for r in rows])
                    corrupt += sum(1 for r in rows if not r[1])
                    images += image.shape[0]
                    float(image.mean(dtype=np.float32))
                seconds += time.monotonic() - start
    return {"what": what, "images": images, "seconds": seconds,
            "cpu_seconds": cpu_seconds() - cpu_start, "corrupt": corrupt}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("root")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    r = run(args.root, args.epochs, args.batch_size, args.size, args.workers)
    if r["images"] == 0:
        sys.exit("baseline: no batches (dataset smaller than one batch?)")
    print("baseline (%s): %d images in %.2f s = %.0f images/s, %.1f CPU-s per 1000 images"
          % (r["what"], r["images"], r["seconds"], r["images"] / r["seconds"],
             1000 * r["cpu_seconds"] / r["images"]))


if __name__ == "__main__":
    main()
