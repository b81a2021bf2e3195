"""`dab serve` under a bounded concurrent load: queries answered one at a time against batched (issue 38).

Starts one real `dab serve` per ``--max-batch`` value (default 1, today's one at a time, and 16, the default) on
free loopback ports, over the same run and store, then loads them in turn, ``--rounds`` times in alternating
order so that both share the machine's other work alike: ``--clients`` threads (16) released together, each
sending ``--queries`` (40) mixed queries one after another on a kept-alive connection (the store's
captions and a few free phrasings, k cycling through 1, 5, 10, 20). Prints per candidate and round the
throughput (answered queries a second, from the release to the last answer), p50 and p99 latency, then mean ±
std over the rounds and the ratios to the first candidate (round by round), what each server's batcher did
(/healthz: queries a batch, the share of the time it was busy, how long a query waited for its batch to start),
and whether every query got the same hits from each server.

    make demo   # writes demo_out/ (the demo world, 100 test videos, and its dab T' = 8 run)
    python benchmarks/serve_load.py [--run demo_out/runs/dab] [--features demo_out/store.h5] [--index INDEX]
        [--batches 1,16] [--clients 16] [--queries 40] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np

from dab_pipeline.store import open_store

FREE_PHRASES = ("a large red circle", "two shapes on sand", "a small white ring on a navy background")
KS = (1, 5, 10, 20)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=Path("demo_out/runs/dab"))
    ap.add_argument("--features", type=Path, default=Path("demo_out/store.h5"))
    ap.add_argument("--index", type=Path, default=None)
    ap.add_argument("--batches", default="1,16", help="--max-batch of each server, comma-separated")
    ap.add_argument("--wait-ms", type=float, default=5.0, help="--batch-wait-ms of every server")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--queries", type=int, default=40, help="queries a client sends")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="the servers' --threads")
    ap.add_argument("--dtype", default="auto", help="the servers' --dtype")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take")
    return ap.parse_args(argv)


def workload(store: Path, clients: int, per_client: int) -> list[list[tuple[str, int]]]:
    """Each client's (query, k) list: the store's distinct captions (all splits: they are only query texts here)
    in a fixed shuffled order, every fifth query a free phrasing; k cycles through KS."""
    with open_store(store) as st:
        texts = sorted({str(t) for t in st.caption_text})
    if not texts:
        raise SystemExit(f"{store} has no captions to send")
    texts = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))]
    load = []
    for c in range(clients):
        qs = []
        for i in range(per_client):
            n = c * per_client + i
            text = FREE_PHRASES[n % len(FREE_PHRASES)] if n % 5 == 4 else texts[n % len(texts)]
            qs.append((text, KS[n % len(KS)]))
        load.append(qs)
    return load


class Server:
    """`dab serve` in a subprocess on a free loopback port (``--port 0``: the port it prints)."""

    def __init__(self, args: argparse.Namespace, max_batch: int, extra: tuple[str, ...] = ()) -> None:
        cmd = [sys.executable, "-m", "dab_pipeline.cli", "serve", "--run", str(args.run), *extra]
        cmd += ["--features", str(args.features), "--host", "127.0.0.1", "--port", "0", "--threads", str(args.threads)]
        cmd += ["--dtype", args.dtype, "--max-batch", str(max_batch), "--batch-wait-ms", str(args.wait_ms)]
        if args.index is not None:
            cmd += ["--index", str(args.index)]
        self.max_batch = max_batch
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self.port = self._port()
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()  # keep draining

    def _port(self) -> int:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if line.startswith("serving "):
                return int(line.split("http://127.0.0.1:")[1].split("/")[0])
        raise SystemExit(f"dab serve --max-batch {self.max_batch} did not start:\n{''.join(self.log)}")

    def get(self, path: str) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def stop(self) -> None:
        self.proc.terminate()  # SIGTERM: dab serve stops as on Ctrl-C (--ray: Serve and its Ray shut down)
        self.proc.wait(timeout=120)


def run_load(server: Server, load: list[list[tuple[str, int]]], timeout: float) -> dict:
    """Every client's queries against ``server``, the clients released together; latencies and answers."""
    n = len(load)
    start = threading.Barrier(n + 1)
    latency: list[list[float]] = [[] for _ in range(n)]
    answers: list[dict] = [{} for _ in range(n)]
    errors: list[str] = []
    ends = [0.0] * n

    def client(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        start.wait()
        for text, k in load[c]:
            t0 = time.perf_counter()
            try:
                conn.request("GET", f"/search?q={urllib.parse.quote_plus(text)}&k={k}")
                resp = conn.getresponse()
                body = json.loads(resp.read())
                if resp.status != 200:
                    raise OSError(f"{resp.status}: {body}")
                answers[c][(text, k)] = [(h["video_id"], h["cost"]) for h in body["hits"]]
            except (OSError, http.client.HTTPException, ValueError) as exc:
                errors.append(f"{text!r}: {exc}"[:200])
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
            latency[c].append(time.perf_counter() - t0)
        ends[c] = time.perf_counter()
        conn.close()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout=timeout * len(load[0]))
    if any(t.is_alive() for t in threads):
        raise SystemExit("a client hung")
    ms = 1000 * np.concatenate([np.asarray(x) for x in latency])
    answered = len(ms) - len(errors)
    return {
        "qps": answered / (max(ends) - t0),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "answered": answered,
        "errors": errors,
        "answers": {key: hits for part in answers for key, hits in part.items()},
    }


def machine() -> str:
    """The CPU, its cores and the load average (other jobs on the machine share the cores)."""
    model = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def mean_std(xs: list[float], digits: int = 1) -> str:
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.{digits}f}"


# relative cost differences under which two answers count as the same up to ties: float32 arithmetic in another
# order (batch shapes, packing), and bf16's ~3 significant digits (--dtype auto on a CPU with native bf16)
TIES = (1e-4, 5e-3)


def compare_answers(ref: dict, other: dict) -> str:
    """How many queries got the same hits (ids, in order); how many differ only by ties within each of TIES (their
    ranked costs agree within it at every rank, so only videos of tied costs swapped places); the others listed."""
    same, ties, worst, other_diff = 0, [0] * len(TIES), 0.0, []
    for key, hits in ref.items():
        got = other.get(key, [])
        rel = max([abs(a - b) / max(abs(a), 1e-6) for (_, a), (_, b) in zip(hits, got)], default=0.0)
        worst = max(worst, rel)
        if [v for v, _ in got] == [v for v, _ in hits]:
            same += 1
            continue
        tie = next((i for i, t in enumerate(TIES) if len(got) == len(hits) and rel <= t), None)
        if tie is None:
            other_diff.append(f"{key[0]!r} k={key[1]}: {hits} against {got}")
        else:
            ties[tie] += 1
    out = f"{same}/{len(ref)} queries the same hits in the same order, " + ", ".join(
        f"{n} the same up to ties within {t:g} relative" for n, t in zip(ties, TIES)
    )
    out += f", {len(other_diff)} otherwise; largest relative cost difference at a rank {worst:.1e}"
    return out + "".join(f"\n    differs: {d}" for d in other_diff[:5])


def report(batches: list[int], results: dict[int, list[dict]]) -> None:
    base = batches[0]
    print("\nmean ± std over the rounds:")
    for b in batches:
        rs = results[b]
        n_q, n_b = sum(r["queries"] for r in rs), sum(r["batches"] for r in rs)
        print(
            f"  --max-batch {b:>3}: {mean_std([r['qps'] for r in rs])} queries/s, p50 {mean_std([r['p50'] for r in rs])}"
            f" ms, p99 {mean_std([r['p99'] for r in rs])} ms; {n_q / max(n_b, 1):.1f} queries a batch, worker busy "
            f"{mean_std([100 * r['busy'] for r in rs])} % of the time, a query waited {1000 * sum(r['waited'] for r in rs) / max(n_q, 1):.1f} ms "
            "for its batch to start"
        )
    for b in batches[1:]:
        pairs = [(x, y) for x, y in zip(results[b], results[base]) if x["qps"] > 0 and y["qps"] > 0]
        if not pairs:
            print(f"  --max-batch {b} against --max-batch {base}: no round where both answered")
            continue
        tput = [x["qps"] / y["qps"] for x, y in pairs]
        p50 = [x["p50"] / y["p50"] for x, y in pairs]
        p99 = [x["p99"] / y["p99"] for x, y in pairs]
        print(
            f"  --max-batch {b} against --max-batch {base}, round by round: throughput x{mean_std(tput, 2)}, "
            f"p50 x{mean_std(p50, 2)}, p99 x{mean_std(p99, 2)}"
        )
        same = compare_answers(results[base][0]["answers"], results[b][0]["answers"])
        print(f"  answers against --max-batch {base}: {same}")


def measured(server: Server, load: list[list[tuple[str, int]]], timeout: float) -> dict:
    """run_load with what the server's batcher did meanwhile (/healthz: batches, time busy, time queries waited)."""
    before = server.get("/healthz")["batching"]
    t0 = time.perf_counter()
    res = run_load(server, load, timeout)
    wall = time.perf_counter() - t0
    after = server.get("/healthz")["batching"]
    res["queries"], res["batches"] = after["queries"] - before["queries"], after["batches"] - before["batches"]
    res["busy"] = (after["busy_s"] - before["busy_s"]) / wall
    res["waited"] = after["waited_s"] - before["waited_s"]
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for p in (args.run, args.features):
        if not p.exists():
            raise SystemExit(f"{p} does not exist: run `make demo` (writes demo_out/) or pass --run and --features")
    batches = [int(b) for b in args.batches.split(",")]
    load = workload(args.features, args.clients, args.queries)
    print(
        f"{args.clients} clients x {args.queries} queries, loopback, servers --threads {args.threads} --dtype "
        f"{args.dtype} --batch-wait-ms {args.wait_ms:g}{' --index ' + str(args.index) if args.index else ''}; {machine()}"
    )
    servers: dict[int, Server] = {}
    try:
        for b in batches:
            servers[b] = Server(args, b)
            for text, k in load[0][:8]:  # warm-up: the split loaded, the engines built
                servers[b].get(f"/search?q={urllib.parse.quote_plus(text)}&k={k}")
        results: dict[int, list[dict]] = {b: [] for b in batches}
        for r in range(args.rounds):
            for b in batches if r % 2 == 0 else batches[::-1]:
                res = measured(servers[b], load, args.timeout)
                results[b].append(res)
                print(
                    f"round {r + 1} --max-batch {b:>3}: {res['answered']} answered, {res['qps']:.1f} queries/s, "
                    f"p50 {res['p50']:.0f} ms, p99 {res['p99']:.0f} ms"
                    + (f", errors: {res['errors'][:3]}" if res["errors"] else ""),
                    flush=True,
                )
        report(batches, results)
        print(f"  load average at the end: {os.getloadavg()[0]:.1f}")
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
