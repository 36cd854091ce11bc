"""Shared helpers for ferry's integration tests: a ferryd of the test's own on a temporary
socket, a JPEG imagefolder generator, a `ferryctl --json` wrapper and a rank-worker launcher.

Environment (set by tests/integration/CMakeLists.txt):
  FERRY_DAEMON   the ferryd binary
  FERRYCTL       the ferryctl binary
  PYTHONPATH     <build>/python, where the `ferry` package and its libferry.so live

    with FerryDaemon(config='drain_timeout_seconds: 2') as daemon:
        root = make_image_folder(os.path.join(daemon.dir, "images"), {"cat": 4, "dog": 4})
        status = ferryctl(daemon.address, "status")
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rank_worker.py")

# Solid, well separated colours, one per class: a crop of any size keeps its class's mean
# colour, so an image row can be matched to its label (JPEG shifts colours by a few units).
CLASS_COLORS = [(220, 30, 30), (30, 200, 40), (40, 50, 220), (230, 220, 40), (200, 40, 210),
                (40, 210, 210)]


def ferryd_binary():
    path = os.environ.get("FERRY_DAEMON", "")
    if not os.access(path, os.X_OK):
        raise RuntimeError("FERRY_DAEMON must name the ferryd binary (got %r); run these "
                           "tests through ctest" % path)
    return path


def ferryctl_binary():
    path = os.environ.get("FERRYCTL", "")
    if not os.access(path, os.X_OK):
        raise RuntimeError("FERRYCTL must name the ferryctl binary (got %r); run these tests "
                           "through ctest" % path)
    return path


def short_tempdir(prefix):
    """A fresh directory with a short path: Unix socket paths are limited to 107 bytes."""
    base = tempfile.gettempdir()
    if len(base) > 40:
        base = "/tmp"
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def tail(path, limit=3000):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError as e:
        return "(cannot read %s: %s)" % (path, e)


def run_ferryctl(address, *args, timeout=30):
    """Runs ferryctl --address ADDRESS ARGS; returns the CompletedProcess."""
    return subprocess.run([ferryctl_binary(), "--address", address] + list(args),
                          capture_output=True, text=True, timeout=timeout)


def ferryctl(address, *args):
    """`ferryctl --address ADDRESS --json ARGS`, decoded. Raises AssertionError with ferryctl's
    stderr when it fails."""
    proc = run_ferryctl(address, "--json", *args)
    if proc.returncode != 0:
        raise AssertionError("ferryctl %s failed (exit %d): %s"
                             % (" ".join(args), proc.returncode, proc.stderr.strip()))
    return json.loads(proc.stdout)


# Every ferryd of the tests (the on-demand ones the package starts too) reports a cycle in
# the order its mutexes are taken (absl's deadlock detection, off in a daemon by default);
# FerryDaemon.stop() shows the report.
os.environ.setdefault("FERRY_MUTEX_DEADLOCK_DETECTION", "report")


def report_lock_cycles(log_path):
    """Prints to stderr the lock-order cycles absl reported in a ferryd log, if any."""
    try:
        with open(log_path, errors="replace") as f:
            log = f.read()
    except OSError:
        return
    at = log.find("Potential Mutex deadlock")
    if at >= 0:
        sys.stderr.write("ferryd reported a cycle in its lock order (%s):\n%s\n"
                         % (log_path, log[max(0, at - 200):at + 4000]))


class FerryDaemon:
    """A ferryd of the test's own: `ferryd --listen <dir>/ferryd.sock [--config
    <dir>/ferryd.conf]` in a fresh temporary directory, ready once `ferryctl status` answers.
    stop() (or leaving the `with` block) sends SIGTERM and waits; the directory is removed.

    config: DaemonConfig text format, a function of the directory returning it, or None for
    no config file (built-in defaults).
    """

    def __init__(self, config=None, dir_mode=0o700, start_timeout=30, preexec_fn=None):
        self.dir = short_tempdir("ferry-it-")
        os.chmod(self.dir, dir_mode)
        self.address = os.path.join(self.dir, "ferryd.sock")
        self.session_address = os.path.join(self.dir, "ferryd.session.sock")
        self.log_path = os.path.join(self.dir, "ferryd.log")
        self.config_path = None
        argv = [ferryd_binary(), "--listen", self.address]
        if callable(config):
            config = config(self.dir)
        if config is not None:
            self.config_path = os.path.join(self.dir, "ferryd.conf")
            with open(self.config_path, "w") as f:
                f.write(config)
            argv += ["--config", self.config_path]
        self._argv = argv
        self._preexec_fn = preexec_fn  # run in the child before ferryd (setrlimit, ...)
        self._start(start_timeout)

    def _start(self, timeout):
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, start_new_session=True,
                                            preexec_fn=self._preexec_fn)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def restart(self, sig=signal.SIGKILL, start_timeout=30):
        """Kills ferryd with `sig`, waits for it, and starts a new one on the same socket
        (same directory, same config): a daemon restart as a trainer sees it."""
        self.process.send_signal(sig)
        self.process.wait(30)
        self._start(start_timeout)

    @property
    def pid(self):
        return self.process.pid

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            code = self.process.poll()
            if code is not None:
                raise AssertionError("ferryd exited with code %d before answering; log:\n%s"
                                     % (code, tail(self.log_path)))
            if os.path.exists(self.address):
                proc = run_ferryctl(self.address, "--json", "status")
                if proc.returncode == 0:
                    return
                last = proc.stderr.strip()
            if time.monotonic() > deadline:
                raise AssertionError("ferryd did not answer on %s within %d s (%s); log:\n%s"
                                     % (self.address, timeout, last, tail(self.log_path)))
            time.sleep(0.05)

    def log(self):
        return tail(self.log_path)

    def terminate(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout=20):
        """SIGTERM, wait (SIGKILL after `timeout`), remove the directory; returns the exit
        code. A ferryd that a signal had killed before (a crash) has its log's tail printed
        to stderr first, so that the crash is diagnosable from the test's output."""
        died = self.process.poll()
        if died is not None and died < 0:
            sys.stderr.write("ferryd %d was killed by signal %d; its log:\n%s\n"
                             % (self.process.pid, -died, tail(self.log_path)))
        report_lock_cycles(self.log_path)
        if died is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def tokens_loader(daemon, tokens, seq_len, batch_size, name="t.bin"):
    """A ferry.Loader (numpy batches, 30 s timeout) over a new file `name` in daemon.dir of
    `tokens` uint16 ids 0, 1, 2, ... (mod 50000)."""
    import numpy as np
    import ferry
    path = os.path.join(daemon.dir, name)
    (np.arange(tokens) % 50000).astype(np.uint16).tofile(path)
    return ferry.Loader(ferry.Tokens(path, seq_len=seq_len), batch_size=batch_size,
                        as_numpy=True, address=daemon.address, timeout=30)


def jpeg_bytes(color, size=(48, 40), variant=0):
    """A small JPEG: a solid `color` with a faint per-`variant` stripe, so every file differs
    while its mean colour stays its class's."""
    import io
    from PIL import Image, ImageDraw
    image = Image.new("RGB", size, color)
    draw = ImageDraw.Draw(image)
    shade = tuple(max(0, min(255, c + (variant % 7) * 3 - 9)) for c in color)
    y = variant % size[1]
    draw.line([(0, y), (size[0] - 1, y)], fill=shade)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_image_folder(root, counts, extension=".jpg"):
    """root/<class>/<i><extension> JPEGs, class c in CLASS_COLORS[c's sorted position].
    counts: {class name: number of images}. File names are not zero-padded ("10.jpg" sorts
    before "2.jpg"), and each class directory also holds a non-JPEG file that must be
    ignored. Returns root."""
    classes = sorted(counts)
    for name in reversed(list(counts)):  # creation order differs from sorted order
        c = classes.index(name)
        d = os.path.join(root, name)
        os.makedirs(d)
        with open(os.path.join(d, "README.txt"), "w") as f:
            f.write("not an image\n")
        for i in reversed(range(counts[name])):
            with open(os.path.join(d, "%d%s" % (i, extension)), "wb") as f:
                f.write(jpeg_bytes(CLASS_COLORS[c], variant=i))
    return root


def make_photo_folder(root, per_class, classes=2, seed=0):
    """root/<c>/<i>.jpg: 480x360 JPEGs of smooth colour with grain (about 40-60 KiB, as
    costly to decode per pixel as photos), enough for nvJPEG and the resize to work."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:360, 0:480]
    for c in range(classes):
        os.makedirs(os.path.join(root, "c%d" % c))
        for i in range(per_class):
            base = np.stack([(x * (1 + c) + i * 7) % 256, (y * 2 + i * 13) % 256,
                             (x + y + c * 50) % 256], axis=-1).astype(np.int16)
            pixels = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="JPEG", quality=90)
            with open(os.path.join(root, "c%d" % c, "%d.jpg" % i), "wb") as f:
                f.write(out.getvalue())
    return root


def expected_samples(root):
    """[(path, label)] in ferryd's sample order: class directories sorted, then the .jpg /
    .jpeg / .png files of each sorted by name; label = the class directory's sorted
    position."""
    out = []
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for label, c in enumerate(classes):
        names = sorted(n for n in os.listdir(os.path.join(root, c))
                       if os.path.splitext(n)[1].lower() in (".jpg", ".jpeg", ".png"))
        out.extend((os.path.join(root, c, n), label) for n in names)
    return out


def nearest_class(mean_rgb):
    """Index of the CLASS_COLORS entry closest to an image's mean colour."""
    return min(range(len(CLASS_COLORS)),
               key=lambda c: sum((a - b) ** 2 for a, b in zip(CLASS_COLORS[c], mean_rgb)))


def worker_env():
    env = dict(os.environ)
    env.pop("FERRY_ADDRESS", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def start_worker(config, log_path, preexec_fn=None):
    """Starts rank_worker.py with `config` (a dict, see rank_worker.py); its output goes to
    log_path."""
    log = open(log_path, "wb")
    try:
        return subprocess.Popen([sys.executable, WORKER, json.dumps(config)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=worker_env(), preexec_fn=preexec_fn)
    finally:
        log.close()


def wait_for_file(path, timeout, processes=(), what="file"):
    """Waits until `path` exists; fails early if any of `processes` exited."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        for p in processes:
            if p.poll() is not None:
                raise AssertionError("process %s exited with %s before writing %s"
                                     % (p.args, p.returncode, path))
        if time.monotonic() > deadline:
            raise AssertionError("no %s at %s within %g s" % (what, path, timeout))
        time.sleep(0.05)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json_atomically(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def expect_batch_channel():
    """Whether this test's trainers take batches through the shared-memory batch channel
    (the default) or on the gRPC stream (FERRY_BATCH_CHANNEL=grpc: the *_grpc variants of
    the tests in CMakeLists.txt)."""
    return os.environ.get("FERRY_BATCH_CHANNEL", "shm") not in ("grpc", "0")


def rank_status(job_status, rank):
    """The RankStatus of `rank` in a `ferryctl --json job` answer, or None."""
    for r in job_status.get("ranks", []):
        if int(r.get("rank", 0)) == rank:
            return r
    return None


def poll(predicate, timeout, interval=0.1):
    """Calls predicate() until it returns a true value or `timeout` passes; returns the last
    value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
