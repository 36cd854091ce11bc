"""Resume states of a ferry.Loader that hold on any world size and batch size.

An epoch's order is a function of the job's seed and the epoch, never of the world size, so
a run's progress through an epoch is the set of positions of that order its ranks consumed
(libferry's ferry_epoch_consumed computes it). A state records that set; a run resumed on M
ranks with batch size B' has what is left dealt to its ranks as a fresh epoch is
(docs/data.md, "Resuming on another number of GPUs"). A run resumed with the world size,
batch size and drop_last it was saved with continues the same deal at the same batch, so
its batches (padding included) are those of an uninterrupted run, and a single rank that
restarts alone rejoins the others."""

import hashlib
import json
import numbers

from ferry import _lib

FORMAT = 2

# What fixes an epoch's order; a state is refused when one of them differs.
_ORDER_KEYS = ("dataset", "seed", "shuffle")


def order_of(spec):
    """The parts of a JobSpec dict that fix the epoch's order."""
    return {"dataset": spec["dataset"], "seed": str(spec["seed"]),
            "shuffle": bool(spec["shuffle"])}


def _checksum(state):
    body = {k: v for k, v in state.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make(epoch, info, base, batches_done, epoch_batches, spec, quarantined):
    """The state of a run whose ranks each took `batches_done` of the `epoch_batches` batches
    of `epoch`, which they were dealt after the positions `base` (info: the run's
    Consumer.epoch_info())."""
    if epoch_batches > 0 and batches_done >= epoch_batches:
        epoch, base, batches_done = epoch + 1, [], 0  # the epoch is over
    run = dict(info, consumed=[list(r) for r in base])
    consumed = _lib.epoch_consumed(run, batches_done) if base or batches_done else []
    state = {
        "format": FORMAT,
        "epoch": epoch,
        "positions": int(info["positions"]),
        "consumed": consumed,
        "world_size": int(info["world_size"]),
        "batch_size": int(info["batch_size"]),
        "drop_last": bool(info["drop_last"]),
        "resumed_from": [list(r) for r in base],
        "batches_done": batches_done,
        "order": order_of(spec),
        "quarantined": list(quarantined),
    }
    state["checksum"] = _checksum(state)
    return state


class Plan:
    """Where a run resumes: the epoch, the positions its deal leaves out, its first batch."""

    def __init__(self, epoch, base, first_batch):
        self.epoch, self.base, self.first_batch = epoch, base, first_batch


def _ranges(name, value, positions):
    if not isinstance(value, (list, tuple)):
        raise TypeError("%s must be a list of [begin, end] ranges, got %r" % (name, value))
    out, end = [], 0
    for r in value:
        if (not isinstance(r, (list, tuple)) or len(r) != 2 or
                not all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                        for x in r)):
            raise TypeError("%s must hold [begin, end] pairs of ints, got %r" % (name, r))
        begin, stop = int(r[0]), int(r[1])
        if begin < end or begin >= stop or stop > positions:
            raise ValueError("%s must be sorted, disjoint, non-empty ranges inside the epoch's "
                             "%d positions; got %r" % (name, positions, value))
        out.append([begin, stop])
        end = stop
    return out


def read(state, info, spec):
    """The Plan of a state in this module's format for a run with the given epoch_info and
    JobSpec dict. ValueError naming what differs when the state is of another dataset, seed
    or shuffle, was edited, or is of a newer format."""
    fmt = state.get("format")
    if fmt != FORMAT:
        raise ValueError("state['format'] is %r; this ferry reads format %d (and the older "
                         "{epoch, batches_done} form): a state from a newer ferry needs that "
                         "ferry" % (fmt, FORMAT))
    if state.get("checksum") != _checksum(state):
        raise ValueError("the state's checksum does not match its contents: it was edited or "
                         "damaged after state_dict() made it; load the state as it was saved")
    mine = order_of(spec)
    theirs = state.get("order", {})
    for key in _ORDER_KEYS:
        if theirs.get(key) != mine[key]:
            raise ValueError("the state is of another epoch order: its %s is %s, this Loader's "
                             "is %s. Resume with the %s the state was saved with"
                             % (key, json.dumps(theirs.get(key), sort_keys=True),
                                json.dumps(mine[key], sort_keys=True), key))
    positions = int(info["positions"])
    if state.get("positions") != positions:
        raise ValueError("the state was saved with %r positions per epoch, this Loader's "
                         "dataset has %d: the dataset changed (files added or removed) since "
                         "the state was saved" % (state.get("positions"), positions))
    epoch = state["epoch"]
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or epoch < 0:
        raise ValueError("state['epoch'] must be an int >= 0, got %r" % (epoch,))
    consumed = _ranges("state['consumed']", state["consumed"], positions)
    base = _ranges("state['resumed_from']", state["resumed_from"], positions)
    done = state["batches_done"]
    if isinstance(done, bool) or not isinstance(done, numbers.Integral) or done < 0:
        raise ValueError("state['batches_done'] must be an int >= 0, got %r" % (done,))
    deal = {}
    for key in ("world_size", "batch_size"):
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError("state['%s'] must be an int >= 1, got %r" % (key, value))
        deal[key] = int(value)
    # Where the run starts is libferry's (ferry_resume_plan): the next epoch after one
    # consumed whole, the same deal at its batch for a run dealt alike, else the rest dealt.
    epoch, dealt_after, first = _lib.resume_plan(
        dict(deal, epoch=epoch, positions=positions, consumed=consumed,
             drop_last=bool(state.get("drop_last")), resumed_from=base, batches_done=int(done)),
        info)
    return Plan(epoch, dealt_after, first)
