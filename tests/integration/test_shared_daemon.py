"""One daemon per user and machine without a service: 8 trainer processes started at the same
instant with no ferryd running end up sharing exactly one on-demand ferryd; SIGKILL of the
process that started it does not stop it; once every process is gone it exits by itself and
nothing is left in /tmp or /dev/shm. XDG_RUNTIME_DIR is unset, as in most containers, so the
daemon's directory is /tmp/ferry-<uid>."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import numpy as np

import ferry_it

RANKS = 8
IDLE = 3  # FERRY_DAEMON_IDLE_SECONDS
SAMPLES = 8 * 64

# One trainer rank: waits for `go`, creates its Loader (starting or joining the daemon),
# reads two batches, reports, waits for `proceed`, reads the rest of its epoch.
RANK = textwrap.dedent("""
    import json, os, sys, time
    import ferry
    cfg = json.loads(sys.argv[1])
    while not os.path.exists(cfg["go"]):
        time.sleep(0.001)
    loader = ferry.Loader(ferry.Records(cfg["records"], "int64"), batch_size=4,
                          rank=cfg["rank"], world_size=cfg["world"], shuffle=True, seed=9,
                          job_name="shared", as_numpy=True, timeout=60)
    it = iter(loader)
    seen = [int(v) for _ in range(2) for v in next(it)["data"]]
    with open(cfg["out"] + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "daemon": loader._daemon.pid,
                   "started": loader._daemon.started}, f)
    os.rename(cfg["out"] + ".tmp", cfg["out"])
    while not os.path.exists(cfg["proceed"]):
        time.sleep(0.01)
    seen += [int(v) for b in it for v in b["data"]]
    loader.close()
    with open(cfg["out"] + ".done", "w") as f:
        json.dump(seen, f)
""")


def daemons_on(address):
    """Pids of ferryd processes listening on `address` (by their command line)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % entry) as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if not zombie and address.encode() in argv and any(a.endswith(b"ferryd") for a in argv):
            pids.append(int(entry))
    return pids


def ferry_entries(directory):
    try:
        return {name for name in os.listdir(directory) if "ferry" in name}
    except OSError:
        return set()


class SharedDaemonTest(unittest.TestCase):
    def test_eight_processes_share_one_daemon_that_leaves_nothing_behind(self):
        runtime = "/tmp/ferry-%d" % os.geteuid()
        address = os.path.join(runtime, "ferryd.sock")
        if os.path.exists(runtime):
            self.skipTest("%s exists (this user's on-demand ferryd may be running): the test "
                          "needs it absent" % runtime)
        shm_before = ferry_entries("/dev/shm")
        work = tempfile.mkdtemp(prefix="ferry-shared-")
        self.addCleanup(subprocess.run, ["rm", "-rf", work])
        records = os.path.join(work, "records.bin")
        np.arange(SAMPLES, dtype=np.int64).tofile(records)
        env = ferry_it.worker_env()
        env.pop("XDG_RUNTIME_DIR", None)
        env.update(XDG_CACHE_HOME=os.path.join(work, "cache"),
                   FERRY_DAEMON_IDLE_SECONDS=str(IDLE), FERRY_DAEMON=ferry_it.ferryd_binary())
        go, proceed = os.path.join(work, "go"), os.path.join(work, "proceed")
        procs, outs = [], []
        for rank in range(RANKS):
            out = os.path.join(work, "rank%d.json" % rank)
            cfg = dict(go=go, proceed=proceed, records=records, rank=rank, world=RANKS, out=out)
            log = open(out + ".log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-c", RANK, json.dumps(cfg)],
                                          stdout=log, stderr=log, env=env))
            log.close()
            outs.append(out)
        self.addCleanup(lambda: [p.kill() for p in procs if p.poll() is None])
        time.sleep(1.0)  # every interpreter is up and polling for `go`
        open(go, "w").close()
        for rank, out in enumerate(outs):
            ferry_it.wait_for_file(out, 90, [procs[rank]], "rank %d's report" % rank)
        reports = [ferry_it.read_json(out) for out in outs]

        # Exactly one ferryd, started by exactly one of the processes, used by all.
        self.assertEqual(len({r["daemon"] for r in reports}), 1, reports)
        self.assertEqual(sum(r["started"] for r in reports), 1, reports)
        self.assertEqual(daemons_on(address), [reports[0]["daemon"]])
        daemon = reports[0]["daemon"]

        # SIGKILL the process that started it, slots held; the others go on.
        starter = next(rank for rank, r in enumerate(reports) if r["started"])
        procs[starter].kill()
        procs[starter].wait()
        open(proceed, "w").close()
        for rank, proc in enumerate(procs):
            if rank == starter:
                continue
            self.assertEqual(proc.wait(90), 0, ferry_it.tail(outs[rank] + ".log"))
            seen = ferry_it.read_json(outs[rank] + ".done")
            self.assertEqual(len(seen), SAMPLES // RANKS)
        self.assertEqual(daemons_on(address), [daemon], "the daemon died with its starter")

        # Nobody left: it exits after the grace period and takes its directory with it.
        gone = ferry_it.poll(lambda: not daemons_on(address), IDLE + 20)
        self.assertTrue(gone, "the on-demand ferryd did not exit")
        removed = ferry_it.poll(lambda: not os.path.exists(runtime), 5)
        self.assertTrue(removed, "left behind: %s" % ferry_entries(runtime))
        self.assertEqual(ferry_entries("/dev/shm") - shm_before, set())
        log = os.path.join(work, "cache", "ferry")
        self.assertTrue(os.listdir(log), "no log in $XDG_CACHE_HOME/ferry")


if __name__ == "__main__":
    unittest.main()
