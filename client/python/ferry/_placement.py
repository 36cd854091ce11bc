"""Where a Loader runs: its rank and world size (from torchrun or torch.distributed when not
given), its GPU, and whether torch is there."""

import os
import sys
import warnings

from ferry.errors import FerryError


def _current_cuda_ordinal(device):
    """torch.cuda.current_device(), for device='cuda' with no index (as torch reads it)."""
    try:
        import torch  # noqa: F401 (whether it imports)
    except ImportError:
        raise FerryError("FAILED_PRECONDITION", "device=%r yields torch CUDA tensors: install "
                         "PyTorch with CUDA, or use device='cpu'" % (device,)) from None
    if not torch.cuda.is_available():
        raise FerryError("FAILED_PRECONDITION", "device=%r: torch.cuda.is_available() is False "
                         "in this process (no GPU visible, or a CPU-only PyTorch); use "
                         "device='cpu'" % (device,))
    return torch.cuda.current_device()


def _parse_device(device):
    """'cpu' -> None; 'cuda:N' -> N (the trainer's ordinal); 'cuda' -> the current CUDA
    device, as in torch. torch.device objects are read the same way. TypeError/ValueError
    otherwise."""
    if type(device).__name__ == "device" and type(device).__module__ == "torch":
        kind, index = device.type, device.index
        if kind == "cpu":
            return None
        if kind == "cuda":
            return _current_cuda_ordinal(device) if index is None else int(index)
        raise ValueError("device must be 'cpu' or 'cuda[:N]', got %r" % (device,))
    if not isinstance(device, str):
        raise TypeError("device must be a str ('cpu', 'cuda' or 'cuda:N') or a torch.device, "
                        "got %r" % (device,))
    if device == "cpu":
        return None
    if device == "cuda":
        return _current_cuda_ordinal(device)
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError("device must be 'cpu' or 'cuda[:N]', got %r" % device)


def _launcher_rank():
    """(rank, world_size, where) of this process as the launcher set it up:
    torch.distributed's when it is initialized, else $RANK / $WORLD_SIZE (torchrun, SLURM
    wrappers and most launchers set both); None when neither says."""
    dist = sys.modules.get("torch.distributed")  # a process group implies torch is imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world), "$RANK/$WORLD_SIZE"
        except ValueError:
            raise ValueError("$RANK=%r and $WORLD_SIZE=%r must be integers (set by the "
                             "launcher); pass rank= and world_size= to ferry.Loader"
                             % (rank, world)) from None
    return None


def _resolve_rank(rank, world_size):
    """rank and world_size as given, else the launcher's (_launcher_rank), else 0 and 1. A
    value given that contradicts the launcher's is a ValueError naming both."""
    launcher = _launcher_rank()
    if launcher is None:
        return (0 if rank is None else rank), (1 if world_size is None else world_size)
    launcher_rank, launcher_world, where = launcher
    for name, given, theirs in (("rank", rank, launcher_rank),
                                ("world_size", world_size, launcher_world)):
        if given is not None and not isinstance(given, bool) and given != theirs:
            raise ValueError("%s=%r contradicts %s, which says rank %d of %d: leave rank= and "
                             "world_size= out to take the launcher's, or pass its values"
                             % (name, given, where, launcher_rank, launcher_world))
    return (launcher_rank if rank is None else rank,
            launcher_world if world_size is None else world_size)


def _warn_if_not_local_rank_device(device, cuda_ordinal):
    """Under torchrun ($LOCAL_RANK set), device='cuda' means the current device; one that is
    not LOCAL_RANK's usually means torch.cuda.set_device was not called, and every rank of
    the node would then train on GPU 0."""
    local = os.environ.get("LOCAL_RANK")
    if cuda_ordinal is None or local is None or not local.isdigit():
        return
    named = isinstance(device, str) and device.startswith("cuda:") or (
        type(device).__name__ == "device" and getattr(device, "index", None) is not None)
    if named or cuda_ordinal == int(local):
        return
    warnings.warn("ferry.Loader: device=%r is cuda:%d, the current CUDA device, but "
                  "$LOCAL_RANK is %s: call torch.cuda.set_device(local_rank) before making "
                  "the Loader (or pass device=\"cuda:%s\"), or every rank of this node uses "
                  "GPU %d" % (device, cuda_ordinal, local, local, cuda_ordinal),
                  RuntimeWarning, stacklevel=3)


def _torch_cuda_device(ordinal):
    """torch.device('cuda', ordinal) after checking torch can use it."""
    try:
        import torch  # noqa: F401 (whether it imports)
    except ImportError:
        raise FerryError("FAILED_PRECONDITION", "device='cuda:%d' yields torch CUDA tensors: "
                         "install PyTorch with CUDA, or use device='cpu'" % ordinal) from None
    if not torch.cuda.is_available():
        raise FerryError("FAILED_PRECONDITION", "device='cuda:%d': torch.cuda.is_available() "
                         "is False in this process (no GPU visible, or a CPU-only PyTorch); "
                         "use device='cpu'" % ordinal)
    if ordinal >= torch.cuda.device_count():
        raise FerryError("INVALID_ARGUMENT", "device='cuda:%d': this process sees %d CUDA "
                         "device(s) (CUDA_VISIBLE_DEVICES=%s)"
                         % (ordinal, torch.cuda.device_count(),
                            os.environ.get("CUDA_VISIBLE_DEVICES", "unset")))
    return torch.device("cuda", ordinal)


def _torch_available():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False
