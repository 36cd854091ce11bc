"""One trainer rank for the integration tests: iterates a ferry.Loader over an ImageFolder and
records what it got. Run as `python3 rank_worker.py '<json config>'`.

Config keys:
  address, root, rank, world_size, batch_size, seed, epochs (list of epoch numbers, or a
    count n for epochs 0..n-1): the run.
  crop (default 32), job_name, zero_copy (default False), prefetch (default 4),
    drop_last (default False).
  out: JSON file written (atomically) at a pause and at the end:
    {"len": batches per epoch, "job_id": ..., "state": loader.state_dict(), "done": bool,
     "epochs": {"<epoch>": {"index": [[...] per batch], "label": [[...]],
                            "color_class": [[class whose colour the image row has]],
                            "image_shape": [[...] per batch], "image_dtype": "...",
                            "digest": [[sha1 prefix of each row's pixels]]}},
     "error": {"code": ..., "message": ...} when a FerryError ended the run}
  resume: a state_dict to load before the first epoch (exact mid-epoch resume).
  pause_after: after this many batches of the first epoch, write `out`, create `ready_file`
    and then wait for `go_file` to exist, or, without go_file, sleep until killed (holding
    the current batch when zero_copy is set).
  reattach_seconds: how long the Loader waits for a restarted ferryd (FERRY_REATTACH_SECONDS;
    the Loader's default when absent).
  dataset: instead of an ImageFolder at `root`, a ferry dataset given as a Python expression
    over the module `ferry` (e.g. "ferry.Blend([...], weights=[...])"); then "digest" covers
    every field of a row but "index", and "label" / "color_class" / "image_*" stay empty.
"""

import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ferry  # noqa: E402
import ferry_it  # noqa: E402


def pause(save, cfg):
    """Saves the result so far, says so through ready_file, then waits for go_file (or,
    without one, for the test to kill this process)."""
    save()
    open(cfg["ready_file"], "w").close()
    if cfg.get("go_file"):
        while not os.path.exists(cfg["go_file"]):
            time.sleep(0.05)
    else:
        time.sleep(600)  # until the test kills this process


def main():
    cfg = json.loads(sys.argv[1])
    if "reattach_seconds" in cfg:
        os.environ["FERRY_REATTACH_SECONDS"] = str(cfg["reattach_seconds"])
    images = "dataset" not in cfg
    dataset = ferry.ImageFolder(cfg["root"]) if images else eval(cfg["dataset"], {"ferry": ferry})
    loader = ferry.Loader(dataset, batch_size=cfg["batch_size"],
                          transform=(ferry.RandomResizedCrop(cfg.get("crop", 32), flip=True)
                                     if images else None),
                          shuffle=True, seed=cfg["seed"], drop_last=cfg.get("drop_last", False),
                          rank=cfg["rank"],
                          world_size=cfg["world_size"], address=cfg["address"],
                          prefetch=cfg.get("prefetch", 4), job_name=cfg.get("job_name"),
                          zero_copy=cfg.get("zero_copy", False), timeout=60)
    result = {"len": len(loader), "job_id": loader.job["id"], "epochs": {}, "done": False}

    def save():
        result["state"] = loader.state_dict()
        ferry_it.write_json_atomically(cfg["out"], result)

    if cfg.get("resume"):
        loader.load_state_dict(cfg["resume"])
    pause_after = cfg.get("pause_after")
    try:
        epochs = cfg["epochs"]
        for n, epoch in enumerate(range(epochs) if isinstance(epochs, int) else epochs):
            if n > 0 or not cfg.get("resume"):
                loader.set_epoch(epoch)
            rec = {"index": [], "label": [], "color_class": [], "image_shape": [],
                   "image_dtype": None, "digest": []}
            result["epochs"][str(epoch)] = rec
            for b, batch in enumerate(loader):
                if not images:
                    rec["index"].append([int(i) for i in batch["index"]])
                    rows = [batch[k].contiguous().numpy() for k in sorted(batch) if k != "index"]
                    rec["digest"].append([
                        hashlib.sha1(b"".join(f[r].tobytes() for f in rows)).hexdigest()[:16]
                        for r in range(len(batch["index"]))])
                    if n == 0 and pause_after is not None and b + 1 == pause_after:
                        pause(save, cfg)
                    continue
                image = batch["image"]
                rec["index"].append([int(i) for i in batch["index"]])
                rec["label"].append([int(i) for i in batch["label"]])
                rec["image_shape"].append(list(image.shape))
                rec["image_dtype"] = str(image.dtype)
                means = image.double().mean(dim=(1, 2)).tolist()
                rec["color_class"].append([ferry_it.nearest_class(m) for m in means])
                pixels = image.contiguous().numpy()
                rec["digest"].append([hashlib.sha1(row.tobytes()).hexdigest()[:16]
                                      for row in pixels])
                if n == 0 and pause_after is not None and b + 1 == pause_after:
                    pause(save, cfg)
    except ferry.FerryError as e:
        result["error"] = {"code": e.code, "message": e.message}
        save()
        return 0
    result["done"] = True
    save()
    loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
