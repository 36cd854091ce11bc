"""One rank of test_multi_gpu: imports torch, then for each round waits for the round's go
file, iterates epoch 0 of a ferry.Loader on cuda:<rank> against that round's ferryd, and
writes what it got. Run as `python3 multi_gpu_worker.py '<json config>'`.

Config keys: rank, world_size, root, batch_size, crop, rounds: [{"address", "go", "out"}],
and optionally job_name. Each round's out (written atomically): {"index": [...], "device":
...} or {"error": {"code", "message"}}. The go file lets the test start every rank's Loader
at the same instant, with torch already imported and CUDA initialized. Batches arrive as
normalized bfloat16 on the rank's GPU (ferryd's decode, copy and normalize kernels all run
there), and each is used by a matrix product on the current stream, as a training step
would while ferryd fills the next slots.
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


def main():
    config = json.loads(sys.argv[1])
    rank = config["rank"]
    device = "cuda:%d" % rank
    torch.cuda.set_device(rank)
    weight = torch.randn(1024, 1024, device=device)  # CUDA initialized before the start signal
    for number, round_ in enumerate(config["rounds"]):
        deadline = time.monotonic() + 300
        while not os.path.exists(round_["go"]):
            if time.monotonic() > deadline:
                sys.exit("round %d: no go file within 300 s" % number)
            time.sleep(0.001)
        result = {}
        try:
            loader = ferry.Loader(
                ferry.ImageFolder(config["root"]), batch_size=config["batch_size"],
                transform=ferry.RandomResizedCrop(config["crop"], flip=True), shuffle=True,
                seed=number, rank=rank, world_size=config["world_size"], device=device,
                image_dtype="bfloat16", address=round_["address"],
                job_name=config.get("job_name"), timeout=60)
            loader.set_epoch(0)
            index = []
            for batch in loader:
                image = batch["image"]
                result["device"] = str(image.device)
                step = image.float().reshape(image.shape[0], -1)[:, :1024] @ weight
                index += batch["index"].cpu().tolist()
                float(step.sum())
            loader.close()
            result["index"] = index
        except ferry.FerryError as e:
            result = {"error": {"code": e.code, "message": e.message}}
        ferry_it.write_json_atomically(round_["out"], result)


if __name__ == "__main__":
    main()
