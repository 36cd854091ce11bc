"""One trainer rank for the GPU tests: iterates a ferry.Loader (device "cpu" or "cuda:N")
and records what it got. Run as `python3 gpu_worker.py '<json config>'`.

Config keys:
  address, root, rank, world_size, batch_size, seed, epochs (count), crop (default 32),
  device ("cpu" or "cuda:0"), image_dtype, mean, std, zero_copy, job_name, compose ("vit":
  a ferry.transforms.Compose instead of RandomResizedCrop + flip), full_decode.
  out: JSON written (atomically) at a pause and at the end:
    {"len": ..., "state": loader.state_dict(), "done": bool,
     "epochs": {"<e>": [{"index": [...], "label": [...], "pixel_sum": [...] (uint8 only),
                         "image_shape": [...], "image_dtype": "...", "device": "..."}]},
     "train": {"losses": [...], "params_changed": bool} (train only),
     "error": {"code", "message"} when a FerryError ended the run}
  save_images: a path: torch.save of {"<e>:<batch>": image tensor on the CPU}.
  resume: a state_dict to load first. pause_after: after this many batches of the first
    epoch, write `out`, create `ready_file`, then wait for `go_file` (or, without one, sleep
    holding the batch until killed).
  train: steps of SGD on a small conv net over float images (needs a float image_dtype).
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

import torch  # noqa: E402

import ferry  # noqa: E402
import ferry_it  # noqa: E402


def record(batch):
    image = batch["image"]
    entry = {"index": batch["index"].cpu().tolist(), "label": batch["label"].cpu().tolist(),
             "image_shape": list(image.shape), "image_dtype": str(image.dtype),
             "device": str(image.device)}
    if image.dtype == torch.uint8:
        entry["pixel_sum"] = image.reshape(image.shape[0], -1).sum(1, dtype=torch.int64).cpu().tolist()
    return entry


def transform(config):
    """RandomResizedCrop + flip, or with "compose": "vit" the ViT recipe of ferry.transforms
    (ending in Normalize, and RandomErasing with p=1 so that every image has a box)."""
    crop = config.get("crop", 32)
    if config.get("compose") != "vit":
        return ferry.RandomResizedCrop(crop, flip=True,
                                       full_decode=config.get("full_decode", False))
    from ferry import transforms as T
    return T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                      T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.2),
                      T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
                      T.RandomErasing(1.0)])


def main():
    config = json.loads(sys.argv[1])
    if "reattach_seconds" in config:  # how long the Loader waits for a restarted ferryd
        os.environ["FERRY_REATTACH_SECONDS"] = str(config["reattach_seconds"])
    out = {"epochs": {}, "done": False}
    saved = {}
    loader = ferry.Loader(
        ferry.ImageFolder(config["root"]), batch_size=config["batch_size"],
        transform=transform(config),
        shuffle=True, seed=config.get("seed", 0), rank=config.get("rank", 0),
        world_size=config.get("world_size", 1), device=config.get("device", "cpu"),
        address=config["address"], job_name=config.get("job_name"),
        zero_copy=config.get("zero_copy", False), timeout=60,
        image_dtype=config.get("image_dtype", "uint8"), mean=config.get("mean"),
        std=config.get("std"))
    out["len"] = len(loader)
    if config.get("resume"):
        loader.load_state_dict(config["resume"])
    model = opt = None
    if config.get("train"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 6)
        ).to(config["device"])
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        out["train"] = {"losses": []}
    taken = 0
    try:
        first_epoch = config["resume"]["epoch"] if config.get("resume") else 0
        for epoch in range(first_epoch, first_epoch + config.get("epochs", 1)):
            if not config.get("resume") or epoch != first_epoch:
                loader.set_epoch(epoch)
            records = out["epochs"].setdefault(str(epoch), [])
            # A resumed epoch goes on at the state's batch (same world and batch size).
            first = (loader.state_dict()["batches_done"]
                     if config.get("resume") and epoch == first_epoch else 0)
            for index, batch in enumerate(loader, first):
                records.append(record(batch))
                if config.get("save_images"):
                    saved["%d:%d" % (epoch, index)] = batch["image"].cpu()
                if model is not None and len(out["train"]["losses"]) < config["train"]:
                    loss = torch.nn.functional.cross_entropy(
                        model(batch["image"].float()), batch["label"])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    out["train"]["losses"].append(loss.item())
                taken += 1
                if taken == config.get("pause_after"):
                    out["state"] = loader.state_dict()
                    ferry_it.write_json_atomically(config["out"], out)
                    open(config["ready_file"], "w").close()
                    if not config.get("go_file"):
                        while True:
                            time.sleep(1)
                    while not os.path.exists(config["go_file"]):
                        time.sleep(0.02)
        out["done"] = True
    except ferry.FerryError as e:
        out["error"] = {"code": e.code, "message": e.message}
    if model is not None:
        out["train"]["params_changed"] = any(
            not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    out["state"] = loader.state_dict()
    if config.get("save_images"):
        torch.save(saved, config["save_images"])
    loader.close()
    ferry_it.write_json_atomically(config["out"], out)


if __name__ == "__main__":
    main()
