"""The job spec a Loader sends (ferry.v1.JobSpec as a dict), and the refusal of DataLoader
arguments that ferry takes in another form."""

import math
import numbers

from ferry._checks import _check_bool, _check_int, _job_limit


_IMAGE_DTYPES = {"uint8": "UINT8", "float32": "FLOAT32", "float16": "FLOAT16",
                 "bfloat16": "BFLOAT16"}


def _check_channels(name, value):
    if value is None:
        return None
    if (not isinstance(value, (tuple, list)) or len(value) != 3 or
            not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)):
        raise TypeError("%s must be 3 numbers (R, G, B), got %r" % (name, value))
    out = [float(v) for v in value]
    if not all(math.isfinite(v) for v in out):
        raise ValueError("%s must be finite, got %r" % (name, value))
    return out


def _image_output(dataset, cuda_ordinal, image_dtype, mean, std):
    """The JobSpec's image_output dict (None for plain uint8), after checking the arguments."""
    if not isinstance(image_dtype, str) or image_dtype not in _IMAGE_DTYPES:
        raise ValueError("image_dtype must be one of %s, got %r"
                         % (sorted(_IMAGE_DTYPES), image_dtype))
    mean = _check_channels("mean", mean)
    std = _check_channels("std", std)
    if std is not None and not all(v > 0 for v in std):
        raise ValueError("std must be > 0 per channel, got %r" % (std,))
    if image_dtype == "uint8":
        if mean is not None or std is not None:
            raise ValueError("mean/std apply to normalized images: pass image_dtype='float32', "
                             "'float16' or 'bfloat16' with them")
        return None
    if not getattr(dataset, "_IMAGES", False):
        raise ValueError("image_dtype=%r applies to image datasets only" % image_dtype)
    if cuda_ordinal is None:
        raise ValueError("image_dtype=%r needs device='cuda:N': ferryd normalizes on the "
                         "GPU; on the CPU convert the uint8 batch yourself" % image_dtype)
    out = {"dtype": _IMAGE_DTYPES[image_dtype]}
    if mean is not None:
        out["mean"] = mean
    if std is not None:
        out["std"] = std
    return out


def _job_spec(dataset, batch_size, transform, shuffle, seed, drop_last, world_size, prefetch,
              image_output, device="cpu"):
    """The ferry.v1.JobSpec (JSON dict) of checked Loader arguments."""
    spec = {
        "dataset": dataset._spec(),
        "batch_size": batch_size,
        "shuffle": _check_bool("shuffle", shuffle),
        "seed": str(seed),
        "drop_last": _check_bool("drop_last", drop_last),
        "world_size": world_size,
        "device": device,
        "prefetch_depth": _check_int("prefetch", prefetch, 0, _job_limit("prefetch_depth")),
    }
    if transform is not None and getattr(dataset, "_IMAGES", False):
        spec["transform"] = transform._spec()
    if image_output is not None:
        spec["image_output"] = image_output
    return spec


# torch DataLoader arguments that ferry.Loader does not take, with what does their job here.
_DATALOADER_ONLY = {
    "num_workers": "ferryd's worker threads decode for every rank of the machine: set "
                   "workers_per_node in ferryd.conf (or ferryd --workers N)",
    "pin_memory": "batches are already in pinned memory; device=\"cuda\" delivers them on "
                  "the GPU",
    "pin_memory_device": "use device=\"cuda:N\"",
    "prefetch_factor": "use prefetch=N (batches in flight for this rank)",
    "persistent_workers": "ferryd's workers persist across epochs; leave it out",
    "sampler": "the sampler runs in ferryd: use shuffle=, seed=, rank= and world_size=",
    "batch_sampler": "use batch_size= and drop_last=",
    "collate_fn": "batches arrive collated, as a dict of tensors",
    "worker_init_fn": "ferryd's workers run no Python; transforms go in transform=",
    "multiprocessing_context": "ferryd's workers are threads of the daemon; leave it out",
    "generator": "use seed= (every random draw follows from seed, epoch and sample)",
    "in_order": "batches always arrive in the sampler's order; leave it out",
    "snapshot_every_n_steps": "state_dict() may be called after any batch",
}


def _refuse_dataloader_arguments(kwargs):
    for name in kwargs:
        if name in _DATALOADER_ONLY:
            raise TypeError("Loader() takes no %s= (a torch DataLoader argument): %s"
                            % (name, _DATALOADER_ONLY[name]))
    if kwargs:
        raise TypeError("Loader() got an unexpected keyword argument %r"
                        % (sorted(kwargs)[0],))
