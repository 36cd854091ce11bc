"""ferry: batches from ferryd, the per-node data-prefetch daemon, for PyTorch training.

    import ferry
    loader = ferry.Loader(ferry.ImageFolder("/data/train"), batch_size=256,
                          transform=ferry.RandomResizedCrop(224, flip=True),
                          shuffle=True, seed=0, drop_last=True, rank=0, world_size=1)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:   # {"image": uint8[B,H,W,3], "label": int64[B], "index": int64[B]}
            ...

Pure Python over libferry.so's C ABI (ctypes): nothing is compiled per Python version.
"""

from ferry import transforms
from ferry.errors import FerryError
from ferry.crops import CenterCrop, RandomResizedCrop
from ferry.datasets import (Blend, ImageFolder, IndexedDataset, MegatronGPT, Npy, Records,
                            TokenShards, Tokens, WebDataset)
from ferry.loader import Loader

__version__ = "0.1.0"

__all__ = ["Blend", "CenterCrop", "Client", "FerryError", "ImageFolder", "IndexedDataset", "Loader",
           "MegatronGPT", "Npy", "RandomResizedCrop", "Records", "TokenShards", "Tokens",
           "WebDataset", "default_address", "transforms"]


def __getattr__(name):
    # The low-level client needs numpy and libferry; import it only when asked for.
    if name in ("Client", "default_address"):
        from ferry import client
        return getattr(client, name)
    raise AttributeError("module 'ferry' has no attribute %r" % name)
