"""GPU transport end to end: a ferryd of the test's own serving device "cuda:0" to trainer
processes (gpu_worker.py) that use ferry.Loader(device="cuda:0"). Skipped, with the reason,
without PyTorch with CUDA or without a libferry built with CUDA.

  (a) cuda uint8 batches equal cpu batches of the same spec (index, label, pixel sums),
      2 epochs; tokens widened on the GPU; records gathered from the page cache, and
      copied by workers where the pinned budget or the config rules the gather out; two
      jobs over one file pin it once;
  (b) float32 / bfloat16 normalization on the GPU vs a torch reference from the cpu batch;
  (c) two ranks on one GPU;
  (d) kill -9 of a GPU trainer mid-epoch, then reattach and finish the epoch;
  (e) ferryd SIGKILLed under a live GPU trainer: a FerryError, no hang;
  (f) a few SGD steps of a small conv net on ferry batches.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))

import ferry_it  # noqa: E402
import gpu_skip  # noqa: E402

WORKER = os.path.join(HERE, "gpu_worker.py")
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


SKIP = gpu_skip.announce(gpu_skip.skip_reason())


def start(config, log_path):
    log = open(log_path, "wb")
    try:
        return subprocess.Popen([sys.executable, WORKER, json.dumps(config)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=ferry_it.worker_env())
    finally:
        log.close()


@unittest.skipIf(SKIP is not None, SKIP or "")
class GpuTransportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The workers decode every JPEG here, so that GPU jobs' pixels equal CPU jobs' exactly;
        # test_b and test_b2 run ferryds whose GPU decodes.
        cls.daemon = ferry_it.FerryDaemon(config='gpu_decode: "cpu"\ndrain_timeout_seconds: 2\n')
        cls.root = ferry_it.make_image_folder(os.path.join(cls.daemon.dir, "images"),
                                              {"a": 9, "b": 8, "c": 7})

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def run_worker(self, name, timeout=180, **config):
        out = os.path.join(self.daemon.dir, name + ".json")
        log = os.path.join(self.daemon.dir, name + ".log")
        base = dict(address=self.daemon.address, root=self.root, batch_size=5, seed=11,
                    epochs=2, out=out)
        base.update(config)
        proc = start(base, log)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("%s did not finish within %d s; log:\n%s"
                                 % (name, timeout, ferry_it.tail(log)))
        self.assertEqual(code, 0, "%s failed; log:\n%s\nferryd:\n%s"
                         % (name, ferry_it.tail(log), self.daemon.log()))
        result = ferry_it.read_json(out)
        self.assertNotIn("error", result, ferry_it.tail(log))
        return result

    @staticmethod
    def strip(epochs, keys=("index", "label", "pixel_sum")):
        return {e: [{k: b[k] for k in keys} for b in batches] for e, batches in epochs.items()}

    def test_a_cuda_uint8_matches_cpu(self):
        cpu = self.run_worker("a_cpu", device="cpu")
        gpu = self.run_worker("a_gpu", device="cuda:0")
        self.assertTrue(gpu["done"])
        self.assertEqual(set(gpu["epochs"]), {"0", "1"})
        for batches in gpu["epochs"].values():
            for b in batches:
                self.assertEqual(b["device"], "cuda:0")
                self.assertEqual(b["image_dtype"], "torch.uint8")
        self.assertEqual(self.strip(gpu["epochs"]), self.strip(cpu["epochs"]))
        zero_copy = self.run_worker("a_gpu_zc", device="cuda:0", zero_copy=True)
        self.assertEqual(self.strip(zero_copy["epochs"]), self.strip(cpu["epochs"]))

    def test_a_tokens_widened_on_the_gpu_match_cpu(self):
        # GPU token jobs carry raw uint16/uint32 over PCIe and widen on the device.
        import numpy as np
        import torch
        import ferry
        d = self.daemon.dir
        rng = np.random.default_rng(3)
        files = {"uint16": rng.integers(0, 2**16, 4099, dtype=np.uint16),
                 "uint32": rng.integers(0, 2**32, 4099, dtype=np.uint32)}
        cases = [("uint16", "int64"), ("uint16", "int32"), ("uint32", "int64"),
                 ("uint32", "int32")]  # the last stays widened on the host (range check)
        for dtype, out in cases:
            path = os.path.join(d, "tokens.%s" % dtype)
            files[dtype].tofile(path)
            batches = {}
            for device in ("cpu", "cuda:0"):
                loader = ferry.Loader(ferry.Tokens(path, seq_len=63, dtype=dtype,
                                                   output_dtype=out),
                                      batch_size=7, shuffle=True, seed=2, device=device,
                                      address=self.daemon.address, timeout=60)
                loader.set_epoch(1)
                if dtype == "uint32" and out == "int32":
                    # Every window holds ids past 2**31: more bad samples than good, so the
                    # job stops on either side, naming the token.
                    with self.assertRaises(ferry.FerryError) as cm:
                        for _ in loader:
                            pass
                    self.assertEqual(cm.exception.code, "DATA_LOSS")
                    self.assertIn("does not fit dataset.tokens.output_dtype INT32",
                                  cm.exception.message)
                    batches[device] = []
                else:
                    batches[device] = [(b["tokens"].cpu(), b["index"].cpu()) for b in loader]
                loader.close()
            self.assertEqual(len(batches["cpu"]), len(batches["cuda:0"]))
            for (ct, ci), (gt, gi) in zip(batches["cpu"], batches["cuda:0"]):
                self.assertEqual(gt.dtype, getattr(torch, out), (dtype, out))
                self.assertTrue(torch.equal(ct, gt), (dtype, out))
                self.assertTrue(torch.equal(ci, gi))
        # widen_tokens_on_host: the workers widen, the copy engine moves int64 (4x the bytes
        # of the raw uint16 rows: no kernel of ferryd's), and the batches are the same. A
        # batch of 16 rows fills one 4 KiB host slot raw, three widened (status counts the
        # slots' bytes per batch copied), and the job's host rows are int64, not uint16.
        path = os.path.join(d, "tokens.uint16")
        with ferry_it.FerryDaemon(config="widen_tokens_on_host: true\n") as other:
            loader = ferry.Loader(ferry.Tokens(path, seq_len=63, dtype="uint16"),
                                  batch_size=16, shuffle=True, seed=2, device="cuda:0",
                                  address=other.address, timeout=60)
            loader.set_epoch(1)
            widened = [(b["tokens"].cpu(), b["index"].cpu()) for b in loader]
            status = ferry_it.ferryctl(other.address, "status")
            loader.close()
        [job] = status.get("jobs", [])
        [rank] = job.get("ranks", [])
        self.assertEqual(job["job"]["fields"][0]["dtype"], "INT64", job["job"])
        loader = ferry.Loader(ferry.Tokens(path, seq_len=63, dtype="uint16"), batch_size=16,
                              shuffle=True, seed=2, device="cpu", address=self.daemon.address,
                              timeout=60)
        loader.set_epoch(1)
        cpu = [(b["tokens"], b["index"]) for b in loader]
        loader.close()
        self.assertEqual(len(cpu), len(widened))
        for (ct, ci), (gt, gi) in zip(cpu, widened):
            self.assertEqual(gt.dtype, torch.int64)
            self.assertTrue(torch.equal(ct, gt))
            self.assertTrue(torch.equal(ci, gi))
        self.assertGreaterEqual(int(rank["bytes_to_device"]) // int(rank["batches_copied"]),
                                16 * 64 * 8, rank)
        # The same asked for by the job alone (ferry.Tokens(widen_on_host=True)), on the
        # test's own ferryd, which widens on the GPU otherwise.
        loader = ferry.Loader(ferry.Tokens(path, seq_len=63, dtype="uint16",
                                           widen_on_host=True),
                              batch_size=16, shuffle=True, seed=2, device="cuda:0",
                              address=self.daemon.address, timeout=60)
        loader.set_epoch(1)
        per_job = [(b["tokens"].cpu(), b["index"].cpu()) for b in loader]
        status = ferry_it.ferryctl(self.daemon.address, "status")
        loader.close()
        self.assertEqual(len(cpu), len(per_job))
        for (ct, ci), (gt, gi) in zip(cpu, per_job):
            self.assertTrue(torch.equal(ct, gt))
            self.assertTrue(torch.equal(ci, gi))
        [job] = [j for j in status.get("jobs", [])
                 if j["job"]["spec"]["dataset"].get("tokens", {}).get("widen_on_host")]
        self.assertEqual(job["job"]["fields"][0]["dtype"], "INT64", job["job"])
        # Status per GPU: NUMA node, worker CPUs, bytes moved, pinned bytes released with
        # the jobs' rings... (ranks stay attached to their jobs until deleted).
        status = ferry_it.ferryctl(self.daemon.address, "status")
        [gpu] = [g for g in status["daemon"]["gpus"] if int(g["ordinal"]) == 0]
        self.assertGreater(int(gpu["bytes_to_device"]), 0, gpu)
        self.assertTrue(gpu["local_cpus"], gpu)
        self.assertGreaterEqual(int(gpu["ranks"]), 1, gpu)
        self.assertGreater(int(gpu["pinned_memory_in_use_bytes"]), 0, gpu)
        table = ferry_it.run_ferryctl(self.daemon.address, "status").stdout
        self.assertIn("WORKER CPUS", table)

    def test_a_llm_kinds_widened_on_the_gpu_match_cpu(self):
        # token_shards (to int64 and int32), indexed uint16 / int32 (sign-extended by the
        # kernel) with position_ids + cu_seqlens, and a blend: raw ids cross PCIe, the job's
        # host rows are the file's dtype, and every field equals the cpu transport's.
        import numpy as np
        import torch
        import ferry
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "testing"))
        import megatron_indexed
        d = self.daemon.dir
        rng = np.random.default_rng(9)
        for i in range(3):
            rng.integers(0, 2**16, 700 + 50 * i, dtype=np.uint16).tofile(
                os.path.join(d, "shard-%d.bin" % i))
        flat = rng.integers(0, 2**16, 3000, dtype=np.uint16)
        lengths = [300, 1000, 1200, 500]
        megatron_indexed.write_indexed_arrays(os.path.join(d, "docs"), flat, lengths)
        wide = rng.integers(0, 2**31 - 1, 3000, dtype=np.int32)
        megatron_indexed.write_indexed_arrays(os.path.join(d, "docs32"), wide, lengths)
        shards = os.path.join(d, "shard-{0..2}.bin")
        cases = [
            ("token_shards int64", ferry.TokenShards(shards, 31), "UINT16"),
            ("token_shards int32", ferry.TokenShards(shards, 31, output_dtype="int32"),
             "UINT16"),
            ("indexed uint16", ferry.IndexedDataset(os.path.join(d, "docs"), 31,
                                                    position_ids=True, cu_seqlens=True),
             "UINT16"),
            ("indexed int32", ferry.IndexedDataset(os.path.join(d, "docs32"), 31,
                                                   position_ids=True), "INT32"),
            ("blend", ferry.Blend([ferry.TokenShards(shards, 31),
                                   ferry.IndexedDataset(os.path.join(d, "docs"), 31)],
                                  weights=[2, 1]), "UINT16"),
        ]
        for name, dataset, host_dtype in cases:
            batches = {}
            for device in ("cpu", "cuda:0"):
                loader = ferry.Loader(dataset, batch_size=6, shuffle=True, seed=3,
                                      device=device, address=self.daemon.address, timeout=60)
                loader.set_epoch(2)
                batches[device] = [{k: v.cpu() for k, v in b.items()} for b in loader]
                if device != "cpu":
                    status = ferry_it.ferryctl(self.daemon.address, "status")
                    [job] = [j for j in status["jobs"] if j["job"]["id"] == loader.job["id"]]
                    self.assertEqual(job["job"]["fields"][0]["dtype"], host_dtype, name)
                loader.close()
            self.assertEqual(len(batches["cpu"]), len(batches["cuda:0"]), name)
            for cb, gb in zip(batches["cpu"], batches["cuda:0"]):
                self.assertEqual(set(cb), set(gb), name)
                for k in cb:
                    self.assertEqual(cb[k].dtype, gb[k].dtype, (name, k))
                    self.assertTrue(torch.equal(cb[k], gb[k]), (name, k))

    def test_a_megatron_gpt_on_the_gpu_is_megatrons(self):
        # Megatron-Core's blend of 3 (testing/megatron_core/references/g1_blend3) delivered to
        # cuda:0: every field, the bool attention_mask included, equals Megatron's rows.
        import numpy as np
        import torch
        import ferry
        refs = os.path.join(os.path.dirname(os.path.dirname(HERE)), "testing", "megatron_core",
                            "references")
        with np.load(os.path.join(refs, "g1_blend3.npz")) as npz:
            ref = {k.split("/")[1]: npz[k] for k in npz.files
                   if k.startswith("train/") and k.count("/") == 1}
        dataset = ferry.MegatronGPT([os.path.join(refs, "corpora", "blend_src%d" % d)
                                     for d in range(3)], 8, eod_token=2, pad_token=1,
                                    weights=[0.7, 0.2, 0.1], split="90,10,0", num_samples=40,
                                    create_attention_mask=True, cu_seqlens=True)
        loader = ferry.Loader(dataset, batch_size=4, drop_last=True, device="cuda:0",
                              address=self.daemon.address, timeout=60)
        count = 0
        for batch in loader:
            rows = batch["index"].cpu().numpy()
            self.assertEqual(list(rows), list(range(count, count + 4)))
            for field in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask"):
                self.assertEqual(batch[field].device.type, "cuda", field)
                got = batch[field].cpu().numpy()
                self.assertEqual(got.dtype, ref[field].dtype, field)
                np.testing.assert_array_equal(got, ref[field][rows], field)
            self.assertEqual(batch["attention_mask"].dtype, torch.bool)
            count += 4
        loader.close()
        self.assertEqual(count, len(ref["tokens"]) // 4 * 4)

    def records_on(self, address, path, device, step_seconds=0, **dataset):
        """Two shuffled epochs of `path` as int64 records of 33 values on `device`: per batch
        (data, index) on the CPU, and the copy path status reports for the job's rank. With
        step_seconds, the trainer spends that long on each batch, so ferry runs ahead."""
        import ferry
        loader = ferry.Loader(ferry.Records(path, dtype="int64", shape=(33,), **dataset),
                              batch_size=7, shuffle=True, seed=4, device=device,
                              address=address, timeout=60)
        batches = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for b in loader:
                batches.append((b["data"].cpu(), b["index"].cpu()))
                time.sleep(step_seconds)
        status = ferry_it.ferryctl(address, "status")
        loader.close()
        ranks = [r for j in status.get("jobs", [])
                 if j["job"]["spec"]["dataset"].get("records", {}).get("path") == path
                 # the Loader names the GPU by its PCI bus id: "cuda:0000:..."
                 and j["job"]["spec"].get("device", "cpu").startswith(device[:4])
                 for r in j.get("ranks", [])]
        return batches, ranks

    def test_a_records_gathered_from_the_page_cache_match_cpu(self):
        # Records jobs on the GPU read their rows with a kernel straight from the file's
        # pinned page cache (PAGE_CACHE_GATHER); the data must equal the cpu transport's, for
        # records aligned to 16 bytes and for records after an 8-byte header. A ferryd whose
        # pinned budget cannot hold the file, or that turns the gather off, copies the rows
        # on its workers (SLOT_COPY) and says why.
        import numpy as np
        import torch
        d = self.daemon.dir
        rng = np.random.default_rng(5)
        values = rng.integers(-2**62, 2**62, (1999, 33), dtype=np.int64)
        plain = os.path.join(d, "records.i64")
        values.tofile(plain)
        with_header = os.path.join(d, "records-header.i64")
        with open(with_header, "wb") as f:
            f.write(b"HEADER!!")
            f.write(values.tobytes())
        for path, extra in ((plain, {}), (with_header, {"header_bytes": 8})):
            cpu, _ = self.records_on(self.daemon.address, path, "cpu", **extra)
            gpu, ranks = self.records_on(self.daemon.address, path, "cuda:0", **extra)
            self.assertEqual(len(cpu), 2 * (1999 // 7 + 1))
            self.assertEqual(len(cpu), len(gpu))
            for (cd, ci), (gd, gi) in zip(cpu, gpu):
                self.assertTrue(torch.equal(ci, gi))
                self.assertTrue(torch.equal(cd, gd), path)
                self.assertTrue(torch.equal(gd, torch.from_numpy(values[gi.numpy()])))
            self.assertTrue(ranks, "no rank of the cuda records job in status")
            for r in ranks:
                self.assertEqual(r.get("copy_path"), "PAGE_CACHE_GATHER", r)
                self.assertGreaterEqual(int(r["pinned_dataset_bytes"]), values.nbytes, r)
        # Batches in order and intact however many streams their kernels take in turn
        # (the default is 4): one, and 16 of one block each, which finish out of order.
        cpu, _ = self.records_on(self.daemon.address, plain, "cpu")
        # An attach that does not wait for the registration: batches made before it is done
        # are copied by the workers, the later ones gathered.
        for config in ("gather_streams: 1\n", "gather_streams: 16\ngather_thread_blocks: 1\n",
                       "gather_registration_wait_ms: -1\ngather_every_batch: true\n"):
            with ferry_it.FerryDaemon(config=config) as other:
                gpu, ranks = self.records_on(other.address, plain, "cuda:0")
                self.assertEqual(len(cpu), len(gpu), config)
                for (cd, ci), (gd, gi) in zip(cpu, gpu):
                    self.assertTrue(torch.equal(ci, gi), config)
                    self.assertTrue(torch.equal(cd, gd), config)
                for r in ranks:
                    self.assertEqual(r.get("copy_path"), "PAGE_CACHE_GATHER", (config, r))
                    self.assertGreater(int(r.get("batches_gathered", 0)), 0, (config, r))
        # Which batches are gathered: by default those made while the trainer waits for
        # them (at least the first ones, made before it held any slot); while it computes
        # (2 ms a batch here) workers copy the rows instead. With gather_every_batch,
        # every batch is gathered. The data are the same either way.
        for config in ("", "gather_every_batch: true\n"):
            for step in (0, 0.002):
                with ferry_it.FerryDaemon(config=config) as other:  # a job of its own
                    gpu, ranks = self.records_on(other.address, plain, "cuda:0",
                                                 step_seconds=step)
                    self.assertEqual(len(cpu), len(gpu), config)
                    for (cd, ci), (gd, gi) in zip(cpu, gpu):
                        self.assertTrue(torch.equal(ci, gi), config)
                        self.assertTrue(torch.equal(cd, gd), config)
                    [r] = ranks
                    copied = int(r.get("batches_copied", 0))
                    gathered = int(r.get("batches_gathered", 0))
                    self.assertGreaterEqual(copied, len(gpu), r)
                    self.assertGreater(gathered, 0, (config, step, r))
                    print("gathered %d of %d batches (%s, %.3f s steps)"
                          % (gathered, copied, config.strip() or "default", step))
                    if config:
                        self.assertEqual(gathered, copied, r)
                    elif step > 0:
                        self.assertLess(gathered, copied // 2, r)
        big = os.path.join(d, "records-big.i64")
        np.zeros((4096, 33), dtype=np.int64).tofile(big)  # 1.08 MB: over a 1 MiB budget
        for config, plain_path, note in (
                ("pinned_memory_budget_bytes: 1048576\n", "PAGE_CACHE_GATHER",
                 "pinned memory budget"),
                ("disable_page_cache_gather: true\n", "SLOT_COPY", "disable_page_cache_gather")):
            with ferry_it.FerryDaemon(config=config) as other:
                gpu, ranks = self.records_on(other.address, plain, "cuda:0")
                self.assertEqual(len(gpu), 2 * (1999 // 7 + 1))
                for gd, gi in gpu:
                    self.assertTrue(torch.equal(gd, torch.from_numpy(values[gi.numpy()])))
                self.assertTrue(ranks)
                for r in ranks:
                    self.assertEqual(r.get("copy_path"), plain_path, (config, r))
                gpu, ranks = self.records_on(other.address, big, "cuda:0")
                self.assertEqual(len(gpu), 2 * (4096 // 7 + 1))
                for gd, _ in gpu:
                    self.assertEqual(int(gd.abs().sum()), 0)
                self.assertTrue(ranks)
                for r in ranks:
                    self.assertEqual(r.get("copy_path"), "SLOT_COPY", (config, r))
                    self.assertIn(note, r.get("copy_path_note", ""), (config, r))

    def test_a_two_jobs_over_one_file_pin_it_once(self):
        # Two jobs (seeds 4 and 5) over one records file, live at once, share its mapping
        # and so one registration of its page cache: under a pinned budget that holds the
        # file once (and the jobs' slabs) but not twice, both gather, and the daemon's
        # pinned bytes count the file once. Each still gets its own, right, batches.
        import ferry
        import numpy as np
        import torch
        path = os.path.join(self.daemon.dir, "records-shared.i64")
        values = np.random.default_rng(6).integers(-2**62, 2**62, (1999, 33), dtype=np.int64)
        values.tofile(path)  # 527,736 bytes
        with ferry_it.FerryDaemon(config="pinned_memory_budget_bytes: 1048576\n") as other:
            loaders = [ferry.Loader(ferry.Records(path, dtype="int64", shape=(33,)),
                                    batch_size=7, shuffle=True, seed=seed, device="cuda:0",
                                    address=other.address, timeout=60) for seed in (4, 5)]
            iterators = [iter(loader) for loader in loaders]
            firsts = []
            for it in iterators:
                b = next(it)
                firsts.append(b["index"].cpu())
                self.assertTrue(torch.equal(b["data"].cpu(),
                                            torch.from_numpy(values[b["index"].cpu().numpy()])))
            self.assertFalse(torch.equal(firsts[0], firsts[1]), "two seeds, one order")
            status = ferry_it.ferryctl(other.address, "status")
            ranks = [r for j in status.get("jobs", []) for r in j.get("ranks", [])]
            self.assertEqual(len(ranks), 2, status)
            for r in ranks:
                self.assertEqual(r.get("copy_path"), "PAGE_CACHE_GATHER", r)
            # The daemon's pinned bytes: the jobs' slabs and the registered file.
            in_use = int(status["daemon"]["pinned_memory_in_use_bytes"])
            print("two jobs over one %d-byte file: %d pinned bytes in use"
                  % (values.nbytes, in_use))
            self.assertGreaterEqual(in_use, values.nbytes, status["daemon"])
            self.assertLess(in_use, 2 * values.nbytes, status["daemon"])
            for loader in loaders:
                loader.close()

    def test_a_records_gathered_from_a_file_cut_short(self):
        # The owner truncates a records file that a GPU rank gathers from its pinned page
        # cache (every batch gathered, so workers write only indices): that job stops with
        # an error naming the file, and ferryd, its GPU and another job on it go on.
        import ferry
        import numpy as np
        import torch
        d = self.daemon.dir
        values = np.random.default_rng(8).integers(-2**62, 2**62, (8191, 33), dtype=np.int64)
        victim, other_path = os.path.join(d, "cut.i64"), os.path.join(d, "kept.i64")
        values.tofile(victim)  # 2.1 MB
        values.tofile(other_path)
        with ferry_it.FerryDaemon(config="gather_every_batch: true\n") as other:
            def records(path, seed):
                return ferry.Loader(ferry.Records(path, dtype="int64", shape=(33,)),
                                    batch_size=7, shuffle=True, seed=seed, device="cuda:0",
                                    address=other.address, timeout=60, prefetch=2)
            cut, kept = records(victim, 4), records(other_path, 5)
            it = iter(cut)
            for _ in range(3):
                next(it)
            status = ferry_it.ferryctl(other.address, "status")
            [rank] = [r for j in status["jobs"] if j["job"]["id"] == cut.job["id"]
                      for r in j.get("ranks", [])]
            self.assertEqual(rank.get("copy_path"), "PAGE_CACHE_GATHER", rank)
            os.truncate(victim, 4096)  # 15 records are left
            with self.assertRaises(ferry.FerryError) as cm:
                for _ in it:
                    pass
            self.assertIn("cut.i64", cm.exception.message)
            self.assertIn("shrank while the job read it", cm.exception.message)
            cut.close()
            self.assertIsNone(other.process.poll(), "ferryd died; log:\n%s" % other.log())
            n = 0
            for b in kept:
                self.assertTrue(torch.equal(b["data"].cpu(),
                                            torch.from_numpy(values[b["index"].cpu().numpy()])))
                n += 1
            self.assertEqual(n, len(kept))
            kept.close()
            self.assertNotIn("CUDA_ERROR", other.log())

    def test_a_gpu_batches_kept_past_a_delete(self):
        # A raw GPU consumer keeps every batch and its job is deleted: its stream ends
        # drain_timeout_seconds later and ferryd frees the rank's device slots, while the
        # consumer's IPC mappings keep the batches it holds readable and right.
        import ferry
        import numpy as np
        import torch
        from ferry import _lib
        from ferry.client import Client
        path = os.path.join(self.daemon.dir, "records-kept.i64")
        values = np.arange(64 * 33, dtype=np.int64).reshape(64, 33)
        values.tofile(path)
        with ferry_it.FerryDaemon(config="drain_timeout_seconds: 1\n") as other:
            client = Client(other.address)
            job = client.create_job({"dataset": ferry.Records(path, dtype="int64",
                                                              shape=(33,))._spec(),
                                     "batch_size": 8, "device": "cuda", "prefetch_depth": 2},
                                    name="kept")
            consumer = client.attach(job["id"], 0, "cuda:" + _lib.cuda_pci_bus_id(0))
            consumer.start_epoch(0)
            held = [consumer.next(30000) for _ in range(2)]
            stream = torch.cuda.current_stream()
            tensors = []
            for b in held:
                b.wait(stream.cuda_stream)
                tensors.append(b.cuda_tensors())
            before = int(ferry_it.ferryctl(other.address, "status")["daemon"]["gpus"][0]
                         ["device_memory_in_use_bytes"])
            self.assertGreater(before, 0)
            proc = ferry_it.run_ferryctl(other.address, "delete", job["id"])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with self.assertRaises(ferry.FerryError) as cm:
                consumer.next(20000)
            self.assertEqual(cm.exception.code, "ABORTED", cm.exception.message)
            freed = ferry_it.poll(lambda: int(ferry_it.ferryctl(other.address, "status")
                                              ["daemon"]["gpus"][0]
                                              .get("device_memory_in_use_bytes", 0)) == 0, 10)
            self.assertTrue(freed, "ferryd kept the deleted rank's device slots")
            # ferryd allocates again where it may: the held batches still read right.
            again = client.create_job({"dataset": ferry.Records(path, dtype="int64",
                                                                shape=(33,))._spec(),
                                       "batch_size": 8, "device": "cuda", "seed": "9"},
                                      name="after")
            other_consumer = client.attach(again["id"], 0, "cuda:" + _lib.cuda_pci_bus_id(0))
            other_consumer.start_epoch(0)
            self.assertIsNotNone(other_consumer.next(30000))
            for i, t in enumerate(tensors):
                self.assertTrue(torch.equal(t["data"].cpu(),
                                            torch.from_numpy(values[8 * i:8 * i + 8])), i)
            tensors.clear()
            held.clear()
            other_consumer.close()
            consumer.close()
            client.close()
            self.assertIsNone(other.process.poll(), "ferryd died; log:\n%s" % other.log())
            self.assertIn("still holds 2 batch(es)", other.log())
            self.assertNotIn("CUDA_ERROR", other.log())

    def test_b_normalize(self):
        import torch
        d = self.daemon.dir
        self.run_worker("b_cpu", device="cpu", epochs=1, save_images=os.path.join(d, "b_cpu.pt"))
        self.run_worker("b_f32", device="cuda:0", epochs=1, image_dtype="float32", mean=MEAN,
                        std=STD, save_images=os.path.join(d, "b_f32.pt"))
        self.run_worker("b_bf16", device="cuda:0", epochs=1, image_dtype="bfloat16",
                        save_images=os.path.join(d, "b_bf16.pt"))  # ferryd's default mean/std
        cpu = torch.load(os.path.join(d, "b_cpu.pt"))
        f32 = torch.load(os.path.join(d, "b_f32.pt"))
        bf16 = torch.load(os.path.join(d, "b_bf16.pt"))
        self.assertEqual(set(cpu), set(f32))
        mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        std = torch.tensor(STD).view(1, 3, 1, 1)
        for key, u8 in cpu.items():
            ref = (u8.permute(0, 3, 1, 2).float() / 255 - mean) / std  # HWC -> CHW
            self.assertEqual(f32[key].dtype, torch.float32)
            self.assertEqual(f32[key].shape, ref.shape)
            self.assertLess((f32[key] - ref).abs().max().item(), 1e-5, key)
            self.assertEqual(bf16[key].dtype, torch.bfloat16)
            err = (bf16[key].float() - ref).abs()
            self.assertTrue(bool((err <= ref.abs() * 2 ** -8 + 1e-3).all()),
                            "%s: max bf16 error %g" % (key, err.max().item()))

    def test_b_composed_transform_gpu_and_cpu_paths_agree(self):
        # The ViT recipe: on a GPU job ColorJitter, RandomGrayscale, Normalize and
        # RandomErasing run fused on the GPU with the parameters the workers drew; on a CPU
        # job the workers run them on uint8. Same draws, so the batches agree up to the CPU
        # path's uint8 rounding (docs/data.md), and the erased boxes coincide exactly.
        import torch
        d = self.daemon.dir
        self.run_worker("bc_cpu", device="cpu", epochs=2, compose="vit",
                        save_images=os.path.join(d, "bc_cpu.pt"))
        self.run_worker("bc_f32", device="cuda:0", epochs=2, compose="vit",
                        save_images=os.path.join(d, "bc_f32.pt"))
        self.run_worker("bc_bf16", device="cuda:0", epochs=1, compose="vit",
                        image_dtype="bfloat16", save_images=os.path.join(d, "bc_bf16.pt"))
        cpu = torch.load(os.path.join(d, "bc_cpu.pt"))
        f32 = torch.load(os.path.join(d, "bc_f32.pt"))
        bf16 = torch.load(os.path.join(d, "bc_bf16.pt"))
        self.assertEqual(set(cpu), set(f32))
        level = 1 / (255 * torch.tensor(STD).view(1, 3, 1, 1))  # one uint8 step, normalized
        worst, total, count = 0.0, 0.0, 0
        for key, ref in cpu.items():
            self.assertEqual(ref.dtype, torch.float32)
            self.assertEqual(f32[key].dtype, torch.float32)
            self.assertEqual(f32[key].shape, ref.shape)
            levels = (f32[key] - ref).abs() / level
            worst = max(worst, levels.max().item())
            total += levels.sum().item()
            count += levels.numel()
            # RandomErasing(p=1) writes 0 in the same box on both paths.
            # (On the CPU path only erasing makes an exact 0: no uint8 level normalizes to 0.)
            erased = ref == 0
            self.assertTrue(bool(erased.any()), key)
            self.assertTrue(bool((f32[key][erased] == 0).all()), key)
            if key in bf16:
                err = (bf16[key].float() - f32[key]).abs()
                self.assertTrue(bool((err <= f32[key].abs() * 2 ** -8 + 1e-6).all()), key)
        print("compose CPU vs GPU path: mean %.3f, max %.2f uint8 levels"
              % (total / count, worst), flush=True)
        self.assertLess(total / count, 2.5)  # as compose_paths_test, which explains it
        self.assertLessEqual(worst, 8.0)

    def image_difference(self, reference_path, other_path):
        """(mean, max) absolute uint8 difference between two save_images files."""
        import torch
        reference, other = torch.load(reference_path), torch.load(other_path)
        self.assertEqual(set(reference), set(other))
        worst, total, count = 0, 0.0, 0
        for key, ref in reference.items():
            diff = (other[key].int() - ref.int()).abs()
            worst = max(worst, diff.max().item())
            total += diff.sum().item()
            count += diff.numel()
        return total / count, worst

    def test_b_jpeg_decode_on_the_gpu_matches_the_cpus(self):
        # A ferryd whose GPU decodes every JPEG it can (gpu_decode "gpu"), against the CPU
        # decode of this class's ferryd: the same crops and flips (the workers draw them),
        # full-resolution decodes on both sides (full_decode), so the pixels differ only by
        # nvJPEG's IDCT and upsampling against libjpeg-turbo's. Photo-sized files (40-60
        # KiB), each many times the crop's 3 KiB row: they travel to the GPU in the JPEG
        # row of their own, so none is too_large.
        d = self.daemon.dir
        root = ferry_it.make_photo_folder(os.path.join(d, "bg_photos"), per_class=10)
        decoding = ferry_it.FerryDaemon(config='gpu_decode: "gpu"\ndrain_timeout_seconds: 2\n')
        try:
            self.run_worker("bg_cpu", device="cpu", epochs=2, full_decode=True, root=root,
                            save_images=os.path.join(d, "bg_cpu.pt"))
            gpu = self.run_worker("bg_gpu", device="cuda:0", epochs=2, full_decode=True,
                                  root=root, address=decoding.address, job_name="gpu-decode",
                                  save_images=os.path.join(d, "bg_gpu.pt"))
            import ferry
            with ferry.Client(decoding.address) as client:
                jobs = [j for j in client.status().get("jobs", [])]
            status = [j.get("gpu_decode", {}) for j in jobs]
        finally:
            decoding.stop()
        self.assertTrue(gpu["done"])
        mean, worst = self.image_difference(os.path.join(d, "bg_cpu.pt"),
                                            os.path.join(d, "bg_gpu.pt"))
        print("GPU vs CPU JPEG decode: mean %.4f, max %d levels; status %s"
              % (mean, worst, status), flush=True)
        self.assertLessEqual(worst, 8)
        self.assertLess(mean, 0.5)
        self.assertTrue(any(int(s.get("gpu_images", 0)) > 0 for s in status), status)
        self.assertEqual([int(s.get("cpu_images", 0)) for s in status], [0], status)

    def test_b2_auto_leaves_a_trainer_it_keeps_ahead_of_on_the_workers(self):
        # The defaults: gpu_decode "auto" and reduced-scale CPU decode. This trainer steps
        # faster than nothing but ferry's workers decode these small JPEGs faster still, so
        # it seldom waits: "auto" keeps (nearly) every file on the workers, whose decode the
        # batches match within docs/data.md's tolerance whichever side decoded. (An
        # input-bound trainer that gets the GPU: gpu_decode_split_test and
        # bench/gpu_decode_bench.py's ResNet-18 rows.)
        d = self.daemon.dir
        auto = ferry_it.FerryDaemon(config="drain_timeout_seconds: 2\n")
        try:
            self.run_worker("b2_cpu", device="cpu", epochs=8,
                            save_images=os.path.join(d, "b2_cpu.pt"))
            gpu = self.run_worker("b2_gpu", device="cuda:0", epochs=8, address=auto.address,
                                  job_name="auto-decode", save_images=os.path.join(d, "b2_gpu.pt"))
            import ferry
            with ferry.Client(auto.address) as client:
                daemon_status = client.status()
                status = [j.get("gpu_decode", {}) for j in daemon_status.get("jobs", [])]
                gpus = daemon_status.get("daemon", {}).get("gpus", [])
        finally:
            auto.stop()
        self.assertTrue(gpu["done"])
        mean, worst = self.image_difference(os.path.join(d, "b2_cpu.pt"),
                                            os.path.join(d, "b2_gpu.pt"))
        print("auto vs CPU decode: mean %.4f, max %d levels; status %s; GPU totals %s"
              % (mean, worst, status, gpus), flush=True)
        self.assertLess(mean, 1.0)
        self.assertLessEqual(worst, 16)
        self.assertEqual([s.get("mode") for s in status], ["auto"], status)
        on_gpu, on_cpu = int(status[0].get("gpu_images", 0)), int(status[0].get("cpu_images", 0))
        self.assertLessEqual(on_gpu, 0.1 * (on_gpu + on_cpu), status)
        self.assertLessEqual(status[0].get("demand", 0), 0.5, status)
        # The GPU's own totals (ferryctl status) count the images of its batches: at most
        # those the workers routed (some may sit in batches prefetched, never copied).
        self.assertLessEqual(int(gpus[0].get("jpeg_gpu_images", 0)), on_gpu, gpus)
        self.assertGreater(int(gpus[0].get("jpeg_cpu_images", 0)), 0, gpus)

    def test_c_two_ranks_on_one_gpu(self):
        logs, procs, outs = [], [], []
        for rank in range(2):
            outs.append(os.path.join(self.daemon.dir, "c%d.json" % rank))
            logs.append(os.path.join(self.daemon.dir, "c%d.log" % rank))
            procs.append(start(dict(address=self.daemon.address, root=self.root, batch_size=3,
                                    seed=5, epochs=2, rank=rank, world_size=2,
                                    device="cuda:0", job_name="two-ranks", out=outs[rank]),
                               logs[rank]))
        for p, log in zip(procs, logs):
            self.assertEqual(p.wait(180), 0, ferry_it.tail(log))
        results = [ferry_it.read_json(o) for o in outs]
        cpu = [self.run_worker("c_cpu%d" % r, device="cpu", batch_size=3, seed=5, rank=r,
                               world_size=2, job_name="two-ranks-cpu") for r in range(2)]
        for rank in range(2):
            self.assertTrue(results[rank]["done"])
            self.assertEqual(self.strip(results[rank]["epochs"]), self.strip(cpu[rank]["epochs"]))
        for e in ("0", "1"):
            seen = [i for r in results for b in r["epochs"][e] for i in b["index"]]
            self.assertEqual(set(seen), set(range(24)))

    def test_d_kill_gpu_trainer_and_resume(self):
        d = self.daemon.dir
        out, ready = os.path.join(d, "d.json"), os.path.join(d, "d.ready")
        log = os.path.join(d, "d.log")
        proc = start(dict(address=self.daemon.address, root=self.root, batch_size=4, seed=2,
                          epochs=1, device="cuda:0", zero_copy=True, job_name="kill",
                          pause_after=2, ready_file=ready, out=out), log)
        ferry_it.wait_for_file(ready, 120, [proc])
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        first = ferry_it.read_json(out)
        state = first["state"]
        self.assertEqual({k: state[k] for k in ("epoch", "batches_done", "quarantined")},
                         {"epoch": 0, "batches_done": 2, "quarantined": []})
        # ferryd frees the rank once it sees the stream of the dead process end.
        detached = ferry_it.poll(lambda: not any(
            r.get("attached") for j in ferry_it.ferryctl(self.daemon.address, "status")
            .get("jobs", []) for r in j.get("ranks", [])), 20)
        self.assertTrue(detached, "rank still attached 20 s after its trainer was killed")
        rest = self.run_worker("d_resume", device="cuda:0", batch_size=4, seed=2, epochs=1,
                               job_name="kill", resume=state)
        cpu = self.run_worker("d_cpu", device="cpu", batch_size=4, seed=2, epochs=1,
                              job_name="kill-cpu")
        got = first["epochs"]["0"] + rest["epochs"]["0"]
        self.assertEqual(self.strip({"0": got}), self.strip(cpu["epochs"]))

    @staticmethod
    def paused_gpu_trainer(daemon, name, **cfg):
        """A GPU trainer on `daemon` over 12 images that takes cfg["pause_after"] batches of
        epoch 0 and waits for its go file; returns (process, out file, go file, log)."""
        root = ferry_it.make_image_folder(os.path.join(daemon.dir, "images"), {"a": 6, "b": 6})
        out, ready, go, log = (os.path.join(daemon.dir, name + suffix)
                               for suffix in (".json", ".ready", ".go", ".log"))
        proc = start(dict(address=daemon.address, root=root, batch_size=2, seed=1, epochs=1,
                          device="cuda:0", ready_file=ready, go_file=go, out=out, **cfg), log)
        ferry_it.wait_for_file(ready, 120, [proc])
        return proc, out, go, log

    def test_e_ferryd_sigkill_under_gpu_trainer(self):
        daemon = ferry_it.FerryDaemon()
        try:
            # ferryd is gone for good: the Loader does not wait for it to come back.
            proc, out, go, log = self.paused_gpu_trainer(daemon, "e", pause_after=1,
                                                         reattach_seconds=0)
            daemon.process.send_signal(signal.SIGKILL)
            daemon.process.wait(10)
            start_time = time.monotonic()
            open(go, "w").close()
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise AssertionError("the GPU trainer hung after ferryd died; log:\n"
                                     + ferry_it.tail(log))
            self.assertEqual(code, 0, ferry_it.tail(log))
            self.assertLess(time.monotonic() - start_time, 30)
            result = ferry_it.read_json(out)
            self.assertIn("error", result, ferry_it.tail(log))
            self.assertIn(result["error"]["code"], ("UNAVAILABLE", "CANCELLED", "INTERNAL"))
        finally:
            daemon.stop()

    def test_e2_gpu_trainer_goes_on_after_ferryd_restarts(self):
        # A GPU trainer that lives through a ferryd restart attaches again by itself (new
        # device slots, new events) and delivers the rest of its epoch.
        daemon = ferry_it.FerryDaemon()
        try:
            proc, out, go, log = self.paused_gpu_trainer(daemon, "e2", pause_after=2)
            daemon.restart(signal.SIGKILL)
            open(go, "w").close()
            self.assertEqual(proc.wait(120), 0, ferry_it.tail(log))
            result = ferry_it.read_json(out)
            self.assertTrue(result["done"], result.get("error"))
            indices = sorted(i for entry in result["epochs"]["0"] for i in entry["index"])
            self.assertEqual(indices, list(range(12)), ferry_it.tail(log))
            self.assertIn("taking job '", ferry_it.tail(log))
        finally:
            daemon.stop()

    def test_f_train_a_few_steps(self):
        result = self.run_worker("f_train", device="cuda:0", epochs=1, image_dtype="float32",
                                 train=4)
        import math
        losses = result["train"]["losses"]
        self.assertEqual(len(losses), 4)
        self.assertTrue(all(math.isfinite(x) for x in losses), losses)
        self.assertTrue(result["train"]["params_changed"])


if __name__ == "__main__":
    unittest.main()
