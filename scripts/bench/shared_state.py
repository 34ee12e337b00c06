"""`bench_gateway.py --state postgresql://...` (or `--state temp`: a throwaway PostgreSQL started here): what shared
state costs, side by side in one run (issue 52).

Servers, each in front of the same instant stub provider, each with a fresh data dir:
- `reef_lab, data dir`: the embedded default (records group-committed to the data dir's log, fdatasync);
- `reef_lab, PostgreSQL`: `--state <url>` (records group-committed to PostgreSQL, its WAL flushed at commit);
- `reef_lab, PostgreSQL, 2 gateways`: two `--service gateway --workers 1` processes on that database (the same
  number of worker processes as one gateway's default two), the load split over both ports;
- `Reef 0.1.3, PostgreSQL`: Reef with its own PostgreSQL record store, when `--reef-bin` names its `reef` command
  (a venv of its own, Python 3.12+: `python3.12 -m venv runs/reef-venv && runs/reef-venv/bin/pip install
  'reef-infra[postgres]==0.1.3'`, then `--reef-bin runs/reef-venv/bin/reef`; it needs git-lfs on PATH:
  `apt-get install git-lfs`).

Measured: paced latency with wrk as the client (16 connections, exponential think times, `--rate` requests/s in
total), rounds alternating, each round starting one server later; then throughput (wrk, 16 connections). Writes
results/shared-state-bench.md, its JSON under results/data/ and a plot.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
from pathlib import Path

from reef_lab.testing import free_port
from reef_lab.testing.processes import Child, start_child, start_server, start_stub
from scripts.common import RunInfo, pyplot
from scripts.command_line import command_line, data_file

DIRECT, DEFAULT, PG, PG2, REEF = ("direct", "reef_lab, data dir", "reef_lab, PostgreSQL",
                                  "reef_lab, PostgreSQL, 2 gateways", "Reef 0.1.3, PostgreSQL")


def start_reef(reef_bin: str, stub_url: str, db_url: str, folder: Path) -> Child:
    """Reef 0.1.3's server (`reef serve`) in front of the stub with its PostgreSQL record store
    (`--storage.record-backend postgres`: reef/storage/postgres.py PostgresRecordStore, which commits each record
    before the answer, reef/service/request_service.py infer_with_data), its local state in `folder/.reef`.
    Reef needs Python 3.12+ and git-lfs on PATH."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [os.path.abspath(reef_bin), "serve", "--inference.upstream-url", stub_url, "--inference.upstream-model", "stub-model",
           "--reef.host", "127.0.0.1", "--reef.port", str(port), "--storage.record-backend", "postgres",
           "--storage.record-database-url", db_url]
    env = {"HOME": str(folder), "PATH": os.environ.get("PATH", "")}  # its git config stays in the run's folder
    return start_child(cmd, port, folder / "reef.log", env=env, timeout=180, ready_path="/healthz", cwd=folder)


def _split(ports: list[int], fn, *args) -> list[dict]:
    """`fn(port, *args)` on every port at once (a load balancer's even split); their results."""
    out: list[dict | None] = [None] * len(ports)

    def run(i: int) -> None:
        out[i] = fn(ports[i], *args)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ports))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out  # type: ignore[return-value]


def measure_shared(args, bench) -> dict:
    """One run of every server; `bench` is scripts/bench/bench_gateway.py (its wrk helpers)."""
    pg = None
    url = args.state
    if url == "temp":
        from reef_lab.testing.postgres import Postgres

        pg = Postgres().start()
        url = pg.url
    run = RunInfo()
    stub = start_stub(0.0)
    stub_url = f"http://127.0.0.1:{stub.port}"
    folders, children = [], [stub]

    def serve(*flags: str) -> Child:
        folder = tempfile.mkdtemp(prefix="reef-bench-")
        folders.append(folder)
        child = start_server("--upstream-url", stub_url, "--log-level", "warning", *flags, data_dir=folder,
                             log=Path(folder + "-serve.log"))
        children.append(child)
        return child

    try:
        servers: dict[str, list[int]] = {DIRECT: [stub.port], DEFAULT: [serve().port],
                                         PG: [serve("--state", url).port]}
        servers[PG2] = [serve("--state", url, "--service", "gateway", "--workers", "1").port for _ in range(2)]
        if args.reef_bin:
            folder = tempfile.mkdtemp(prefix="reef-bench-reef-")
            folders.append(folder)
            reef = start_reef(args.reef_bin, stub_url, url, Path(folder))
            children.append(reef)
            servers[REEF] = [reef.port]
        print(f"[bench] warming up {', '.join(servers)}", flush=True)
        for ports in servers.values():
            _split(ports, bench.paced_wrk, 16 // len(ports), args.rate / len(ports), 2)
        rounds: dict[str, list[dict]] = {name: [] for name in servers}
        for r in range(args.rounds):
            for name, ports in bench.rotated(servers, r):
                print(f"[bench] latency round {r + 1}/{args.rounds}: {name}", flush=True)
                parts = _split(ports, bench.paced_wrk, 16 // len(ports), args.rate / len(ports), args.seconds)
                n = sum(p["n"] for p in parts)
                rounds[name].append({k: sum(p[k] * p["n"] for p in parts) / max(n, 1) for k in ("p50", "p90")}
                                    | {"n": n, "errors": sum(p["errors"] for p in parts)})
        latency = {name: {"p50": round(statistics.median(x["p50"] for x in xs), 3),
                          "p90": round(statistics.median(x["p90"] for x in xs), 3),
                          "round_p50": [round(x["p50"], 3) for x in xs], "n": sum(x["n"] for x in xs),
                          "errors": sum(x["errors"] for x in xs)} for name, xs in rounds.items()}
        thr: dict[str, list[float]] = {name: [] for name in servers}
        errors: dict[str, int] = {name: 0 for name in servers}
        for r in range(args.rounds):
            for name, ports in bench.rotated(servers, r):
                print(f"[bench] throughput round {r + 1}/{args.rounds}: {name}", flush=True)
                parts = _split(ports, lambda p: bench.wrk(f"http://127.0.0.1:{p}/v1/chat/completions",
                                                          bench.WRK_CHAT, args.seconds, 16 // len(ports)))
                thr[name].append(sum(p["rps"] for p in parts))
                errors[name] += sum(p["non_2xx"] for p in parts)
        print("[bench] one client, one request at a time", flush=True)
        one = {name: round(bench.ms(xs, 50), 3) for name, xs in
               bench.sequential({name: ports[0] for name, ports in servers.items()}).items()}
        direct = latency[DIRECT]
        result = {
            **run.fields(), "command": command_line(), "state": "a throwaway PostgreSQL 15 on loopback"
            if pg is not None else "the given PostgreSQL", "rate": args.rate, "seconds": args.seconds,
            "rounds": args.rounds, "latency_ms": latency,
            "added_p50_ms": {n: round(v["p50"] - direct["p50"], 3) for n, v in latency.items() if n != DIRECT},
            "throughput_rps": {n: round(statistics.mean(v), 1) for n, v in thr.items()},
            "throughput_runs": thr, "non_2xx": errors, "one_client_p50_ms": one,
        }
        result["pg_over_default_p50_ms"] = round(latency[PG]["p50"] - latency[DEFAULT]["p50"], 3)
        return result
    finally:
        for c in children:
            c.proc.terminate()
        for c in children:
            c.stop(60)
        if pg is not None:
            pg.close()
        import shutil
        for f in folders:
            shutil.rmtree(f, ignore_errors=True)


def write(result: dict, out: str) -> str:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    import json

    data_file(out).write_text(json.dumps(result, indent=2) + "\n")
    page = render(result)
    Path(out + ".md").write_text(page)
    plot(result, out + ".png")
    return page


def render(r: dict) -> str:
    lat, thr, added = r["latency_ms"], r["throughput_rps"], r["added_p50_ms"]
    one = r["one_client_p50_ms"]
    rows = "\n".join(f"| {n} | {one[n]:.3f} | {'' if n == DIRECT else f'{one[n] - one[DIRECT]:.3f}'} | "
                     f"{v['p50']:.3f} | {v['p90']:.3f} | {'' if n == DIRECT else f'{added[n]:.3f}'} | "
                     f"{thr[n]:.0f} | {'' if n == DIRECT else f'{thr[n] / thr[DIRECT]:.3f}'} | "
                     f"{v['errors'] + r['non_2xx'][n]} |" for n, v in lat.items())
    name = Path(r.get("out", "shared-state-bench")).name
    return f"""# Shared state: reef_lab on PostgreSQL against the data dir and Reef, side by side

Command: `{r['command'].strip()}`, started {r['started']} ({r['machine']['cpus']} CPUs, {r['machine'].get('cpu', '')};
the host took {100 * r['cpu_steal_share']:.1f}% of the CPU time as steal). Database: {r['state']}. Every server
relays to the same instant stub provider on loopback (`reef_lab.testing.stub_provider`), each with a fresh data dir;
wrk, the stub, PostgreSQL and the servers share these CPUs. Latency: wrk with 16 connections paced at
{r['rate']:.0f} requests/s in total (exponential think times), {r['rounds']} rounds of {r['seconds']} s, servers
alternating and each round starting one later (p50/p90: the median of the rounds). Throughput: wrk, 16 connections,
{r['rounds']} rounds. Two gateways: two `--service gateway --workers 1` processes (the same two worker processes as
one gateway's default), the load split evenly over both. One client: one request at a time, 4 rounds of 180
(the floor of each server's latency; a server that cannot keep up with the paced rate queues, and its paced p50 is
mostly that queue).

![latency and throughput]({name}.png)

| server | one client p50 ms | added | paced p50 ms | paced p90 ms | added p50 | requests/s | of direct | errors |
|---|---|---|---|---|---|---|---|---|
{rows}

PostgreSQL over the data dir, p50: **{r['pg_over_default_p50_ms']:+.3f} ms** paced (goal: at most +1 ms),
{one[PG] - one[DEFAULT]:+.3f} ms for one client alone; throughput {thr[PG] / thr[DEFAULT]:.2f}x the data dir's.{_vs_reef(r)}
Two gateways on these two CPUs: {thr[PG2] / thr[PG]:.2f}x one gateway's throughput (the same CPUs do the work; what
a second gateway adds is another machine's CPUs, not measured here). Errors: wrk's count of non-2xx answers and
socket errors over the whole run.

Rounds' p50: {"; ".join(f"{n}: {', '.join(f'{x:.3f}' for x in v['round_p50'])}" for n, v in lat.items())}.
"""


def _vs_reef(r: dict) -> str:
    if REEF not in r["latency_ms"]:
        return ""
    one, thr = r["one_client_p50_ms"], r["throughput_rps"]
    return (f"\nAgainst Reef 0.1.3 on the same database: **{thr[PG] / thr[REEF]:.0f}x its throughput** "
            f"({thr[PG]:.0f} against {thr[REEF]:.0f} requests/s), one client's added latency "
            f"{one[PG] - one[DIRECT]:.3f} ms against {one[REEF] - one[DIRECT]:.3f} ms; at the paced rate Reef "
            "cannot keep up and queues.")


def plot(r: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    names = list(r["latency_ms"])
    short = [n.replace("reef_lab, ", "").replace(", PostgreSQL", "\n+PG").replace("PostgreSQL", "PG") for n in names]
    axes[0].bar(short, [r["latency_ms"][n]["p50"] for n in names], color="#2a7")
    axes[0].set_yscale("log")  # Reef's queue is two orders above the rest
    axes[0].set_ylabel("p50 latency (ms, log)")
    axes[0].set_title(f"paced at {r['rate']:.0f} req/s, 16 connections")
    axes[1].bar(short, [r["throughput_rps"][n] for n in names], color="#27a")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("requests/s (wrk, 16 connections, log)")
    axes[1].set_title("throughput")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(args, bench) -> None:
    result = measure_shared(args, bench)
    result["out"] = args.out
    print(write(result, args.out))
