#!/usr/bin/python3
"""A stand-in trainer that reads an imagefolder through ferryd and reports throughput.

It does what a training loop does with its input and nothing else: asks ferry.Loader for
shuffled, randomly cropped 224x224 batches, epoch after epoch, and touches every batch
(mean pixel value, label histogram, a check that no sample repeats within an epoch) so
that each byte really crosses into this process.

  PYTHONPATH=build/python /usr/bin/python3 examples/train_demo.py build/demo/imagenet \
      --address build/demo/ferryd.sock --epochs 3 --batch-size 64

The last line is the summary scripts/demo.sh prints:
  ferry demo: <N> images in <T> s = <X> images/s
"""

import argparse
import os
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
    args = p.parse_args()

    address = os.path.abspath(args.address) if args.address else None
    loader = ferry.Loader(ferry.ImageFolder(os.path.abspath(args.root)),
                          batch_size=args.batch_size,
                          transform=ferry.RandomResizedCrop(args.size, flip=True),
                          shuffle=True, seed=args.seed, drop_last=True,
                          rank=0, world_size=1, device=args.device, address=address,
                          zero_copy=args.zero_copy)

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
            repeated = seen.intersection(index.tolist())
            if repeated:
                sys.exit("epoch %d: sample(s) %s delivered twice" % (epoch, sorted(repeated)[:5]))
            seen.update(index.tolist())
            images += n
            batches += 1
        seconds = time.monotonic() - start
        total_images += images
        total_seconds += seconds
        counts = sorted(label_counts.values())
        print("epoch %d: %d batches, %d images in %.2f s = %.0f images/s; mean pixel %.1f; "
              "%d classes, %d-%d images per class" %
              (epoch, batches, images, seconds, images / max(seconds, 1e-9),
               pixel_sum / max(images, 1), len(label_counts),
               counts[0] if counts else 0, counts[-1] if counts else 0), flush=True)

    loader.close()
    if total_images == 0:
        sys.exit("ferry demo: no batches were delivered (dataset smaller than one batch?)")
    print("ferry demo: %d images in %.2f s = %.0f images/s" %
          (total_images, total_seconds, total_images / total_seconds), flush=True)


if __name__ == "__main__":
    main()
