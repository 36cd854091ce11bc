"""The metrics endpoint: scraped during a run through ferry.Loader, its families
are there and its counters equal what `ferryctl status --json` says for the same rank; a
Unix-socket endpoint; and a non-loopback metrics_listen without metrics_allow_non_loopback
keeps ferryd from starting, with a message naming the setting."""

import http.client
import json
import os
import re
import socket
import subprocess
import unittest
import urllib.request

import ferry_it

# Families the exporter always declares (server/metrics/prometheus_text.cc) and a dashboard
# or alert may rely on.
FAMILIES = {
    "ferry_build_info": "gauge",
    "ferry_uptime_seconds": "gauge",
    "ferry_cpu_seconds_total": "counter",
    "ferry_workers": "gauge",
    "ferry_workers_busy_ratio": "gauge",
    "ferry_memory_in_use_bytes": "gauge",
    "ferry_memory_budget_bytes": "gauge",
    "ferry_consumers": "gauge",
    "ferry_jobs": "gauge",
    "ferry_gpu_h2d_bytes_total": "counter",
    "ferry_job_info": "gauge",
    "ferry_job_samples_decoded_total": "counter",
    "ferry_job_read_bytes_total": "counter",
    "ferry_job_bad_samples_total": "counter",
    "ferry_rank_batches_delivered_total": "counter",
    "ferry_rank_samples_delivered_total": "counter",
    "ferry_rank_queue_depth": "gauge",
    "ferry_rank_stall_ratio": "gauge",
    "ferry_rank_limiting_stage": "gauge",
    "ferry_rank_handoff_latency_seconds": "histogram",
    "ferry_rank_copy_latency_seconds": "histogram",
}

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """Prometheus text format -> ({family: type}, [(name, {label: value}, float)])."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if m is None:
                raise AssertionError("not a sample line: %r" % line)
            labels = dict(LABEL.findall(m.group(2) or ""))
            samples.append((m.group(1), labels, float(m.group(3))))
    return types, samples


def value(samples, name, **labels):
    found = [v for n, l, v in samples
             if n == name and all(l.get(k) == str(w) for k, w in labels.items())]
    if len(found) != 1:
        raise AssertionError("%d samples of %s%s" % (len(found), name, labels))
    return found[0]


def delivered(status):
    """What may still move between two status answers: each rank's delivered counters."""
    return sorted((job["job"]["id"], int(r.get("rank", 0)), int(r.get("batches_delivered", 0)),
                   int(r.get("samples_delivered", 0)))
                  for job in status.get("jobs", []) for r in job.get("ranks", [])), \
        int(status["daemon"].get("consumers", 0))


def metrics_port(daemon):
    """The port ferryd chose for metrics_listen "127.0.0.1:0", from its log line."""
    def find():
        m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", daemon.log())
        return int(m.group(1)) if m else None
    port = ferry_it.poll(find, 10)
    if not port:
        raise AssertionError("no metrics line in ferryd's log:\n" + daemon.log())
    return port


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as response:
        assert response.status == 200, response.status
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4"), \
            response.headers["Content-Type"]
        return response.read().decode()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


class MetricsTest(unittest.TestCase):
    def test_scrape_during_a_run_matches_status(self):
        daemon = ferry_it.FerryDaemon(config='metrics_listen: "127.0.0.1:0"\n')
        self.addCleanup(daemon.stop)
        port = metrics_port(daemon)
        root = ferry_it.make_image_folder(os.path.join(daemon.dir, "images"),
                                          {"cat": 20, "dog": 20})
        ready = os.path.join(daemon.dir, "ready")
        go = os.path.join(daemon.dir, "go")
        out = os.path.join(daemon.dir, "rank0.json")
        worker = ferry_it.start_worker(
            dict(address=daemon.address, root=root, rank=0, world_size=1, batch_size=4,
                 seed=1, epochs=2, out=out, job_name="metrics-it", pause_after=3,
                 ready_file=ready, go_file=go), out + ".log")
        self.addCleanup(lambda: worker.poll() is None and worker.kill())
        ferry_it.wait_for_file(ready, 60, [worker], "paused trainer")

        # Mid-run: the trainer holds its place; ferryd may still be delivering into free
        # slots, so compare a scrape taken between two equal status answers.
        def consistent():
            before = ferry_it.ferryctl(daemon.address, "status")
            types, samples = parse(scrape(port))
            after = ferry_it.ferryctl(daemon.address, "status")
            if delivered(before) != delivered(after):
                return None
            return after, types, samples
        found = ferry_it.poll(lambda: self._matches(*consistent() or (None, None, None)), 30)
        self.assertTrue(found, "no scrape agreed with status between two equal answers")
        status, types, samples = found
        for name, kind in FAMILIES.items():
            self.assertEqual(types.get(name), kind, name)
        job = status["jobs"][0]
        rank = ferry_it.rank_status(job, 0)
        self.assertGreaterEqual(int(rank["batches_delivered"]), 3)
        self.assertEqual(value(samples, "ferry_jobs"), 1)
        self.assertEqual(value(samples, "ferry_rank_attached", job_id=job["job"]["id"], rank=0), 1)
        self.assertEqual(value(samples, "ferry_job_info", job_id=job["job"]["id"],
                               job_name="metrics-it", device="cpu"), 1)
        stages = [v for n, l, v in samples
                  if n == "ferry_rank_limiting_stage" and l.get("rank") == "0"]
        self.assertEqual(sorted(stages), [0, 0, 0, 0, 0, 0, 1])  # one of the seven stages
        # A histogram's +Inf bucket and _count agree.
        labels = dict(job_id=job["job"]["id"], rank=0)
        self.assertEqual(
            value(samples, "ferry_rank_handoff_latency_seconds_bucket", le="+Inf", **labels),
            value(samples, "ferry_rank_handoff_latency_seconds_count", **labels))

        open(go, "w").close()
        self.assertEqual(worker.wait(120), 0, ferry_it.tail(out + ".log"))
        self.assertTrue(ferry_it.read_json(out)["done"])
        # After the run: the counters are final and still equal.
        found = ferry_it.poll(lambda: self._matches(*consistent() or (None, None, None)), 30)
        self.assertTrue(found)
        status, _, samples = found
        rank = ferry_it.rank_status(status["jobs"][0], 0)
        per_epoch = ferry_it.read_json(out)["len"]
        self.assertEqual(int(rank["batches_delivered"]), 2 * per_epoch)
        self.assertEqual(value(samples, "ferry_rank_samples_delivered_total",
                               job_id=status["jobs"][0]["job"]["id"], rank=0), 80)

    def _matches(self, status, types, samples):
        """(status, types, samples) when every rank's delivered counters in the scrape equal
        the status's, else None."""
        if status is None:
            return None
        for job in status.get("jobs", []):
            for rank in job.get("ranks", []):
                labels = dict(job_id=job["job"]["id"], job_name=job["job"]["name"],
                              rank=int(rank.get("rank", 0)))
                if (value(samples, "ferry_rank_batches_delivered_total", **labels)
                        != int(rank.get("batches_delivered", 0))
                        or value(samples, "ferry_rank_samples_delivered_total", **labels)
                        != int(rank.get("samples_delivered", 0))):
                    return None
        if value(samples, "ferry_consumers") != int(status["daemon"].get("consumers", 0)):
            return None
        return status, types, samples

    def test_unix_socket_endpoint(self):
        daemon = ferry_it.FerryDaemon(
            config=lambda d: 'metrics_listen: "unix:%s/metrics.sock"\n' % d)
        self.addCleanup(daemon.stop)
        path = os.path.join(daemon.dir, "metrics.sock")
        self.assertTrue(ferry_it.poll(lambda: os.path.exists(path), 10), daemon.log())
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)  # unix_socket_mode
        connection = UnixHTTPConnection(path)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        self.assertEqual(response.status, 200)
        types, samples = parse(response.read().decode())
        connection.close()
        self.assertEqual(types.get("ferry_build_info"), "gauge")
        self.assertEqual(len([s for s in samples if s[0] == "ferry_build_info"]), 1)
        self.assertEqual(daemon.stop(), 0)
        self.assertFalse(os.path.exists(path), "metrics socket left behind")

    def test_non_loopback_address_is_refused_unless_allowed(self):
        d = ferry_it.short_tempdir("ferry-it-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        config = os.path.join(d, "ferryd.conf")
        with open(config, "w") as f:
            f.write('metrics_listen: "0.0.0.0:9464"\n')
        proc = subprocess.run([ferry_it.ferryd_binary(), "--listen", os.path.join(d, "s.sock"),
                               "--config", config], capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("metrics_listen '0.0.0.0:9464' is not a loopback address", proc.stderr)
        self.assertIn("metrics_allow_non_loopback: true", proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "s.sock")))

    def test_dashboard_and_scrape_config_name_what_ferryd_exports(self):
        """deploy/grafana/ferry-dashboard.json loads, and every metric its queries name is one
        a ferryd scrape declares (a histogram's _bucket, _sum and _count included);
        deploy/prometheus/ferry-scrape.yml scrapes the documented address."""
        deploy = os.path.join(ferry_it.HERE, "..", "..", "deploy")
        with open(os.path.join(deploy, "grafana", "ferry-dashboard.json")) as f:
            dashboard = json.load(f)
        daemon = ferry_it.FerryDaemon(config='metrics_listen: "127.0.0.1:0"\n')
        self.addCleanup(daemon.stop)
        types, _ = parse(scrape(metrics_port(daemon)))
        exported = set(types)
        for name, kind in types.items():
            if kind == "histogram":
                exported |= {name + "_bucket", name + "_sum", name + "_count"}
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
        self.assertGreaterEqual(len(dashboard["panels"]), 8)
        named = set()
        for expr in exprs:
            names = set(re.findall(r"\b(ferry_[a-zA-Z0-9_]+)", expr))
            self.assertTrue(names, "a query naming no ferry metric: %s" % expr)
            self.assertLessEqual(names, exported, expr)
            named |= names
        for wanted in ("ferry_rank_stall_ratio", "ferry_rank_limiting_stage",
                       "ferry_rank_samples_delivered_total", "ferry_workers_busy_ratio",
                       "ferry_rank_handoff_latency_seconds_bucket",
                       "ferry_rank_copy_latency_seconds_bucket", "ferry_memory_in_use_bytes",
                       "ferry_memory_budget_bytes", "ferry_gpu_h2d_bytes_total"):
            self.assertIn(wanted, named)
        with open(os.path.join(deploy, "prometheus", "ferry-scrape.yml")) as f:
            scrape_config = f.read()
        self.assertIn('targets: ["127.0.0.1:9464"]', scrape_config)
        self.assertIn("metrics_path: /metrics", scrape_config)

    def test_log_level_flag(self):
        proc = subprocess.run([ferry_it.ferryd_binary(), "--log-level", "loud"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--log-level: log level 'loud' is not one of debug, info, warning, error",
                      proc.stderr)


if __name__ == "__main__":
    unittest.main()
