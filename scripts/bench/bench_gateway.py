"""Gateway overhead benchmark: reef_lab relaying to a stub provider vs calling the stub directly, same run.

    .venv/bin/python scripts/bench/bench_gateway.py            # results/gateway-bench.{md,png}, data/gateway-bench.json
    .venv/bin/python scripts/bench/bench_gateway.py --state temp [--reef-bin V/bin/reef]   # shared state:
                                                               # results/shared-state-bench.{md,png} (shared_state.py)

Starts the stub provider (`reef_lab.testing.stub_provider`, a plain WSGI app under granian) and the real
`scripts/serve.py --upstream-url <stub>` with a fresh data dir (for the instant stub also two variants beside it:
one asking for a short time slice (opt-in, server/tuning.py), and one with its data dir in memory to split the added latency into the
disk's flush and the rest), then measures with 16 concurrent clients:

1. latency: 16 keep-alive clients (threads of a separate process) at a paced total rate, alternating rounds
   direct and through reef_lab (each round starting one path later); p50/p90/p99 of both and the difference
   (the latency reef_lab adds, fsync of the record included); then the same with wrk as the client (16
   connections, exponential think time), whose own CPU use (a tenth of the Python clients') takes less from the
   two CPUs the server runs on;
2. throughput: `wrk -c16` saturating the stub directly, then through reef_lab (chat completions);
3. reports: `wrk -c16` posting reports that each reference two real receipts; afterwards the store must hold
   exactly as many reports as wrk counted 2xx answers.

Needs `wrk` (Debian: `apt-get install wrk`) for 2 and 3.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from reef_lab import procs
from reef_lab.testing.processes import start_server, start_stub
from scripts.common import ROOT, RunInfo, in_threads, pace, pyplot, quantile, spawn
from scripts.command_line import command_line, data_file

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there, how are you?"}]}


# ---- paced latency clients (run in a child process so their CPU use does not share the server's GIL) -----------
def _paced_clients(port: int, clients: int, rate: float, seconds: float) -> tuple[list[float], int]:
    body = json.dumps(CHAT).encode()
    headers = {"Content-Type": "application/json", "x-reef-scenario": "bench-latency"}
    lat, errors, lock = [], [0], threading.Lock()

    def run(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        for _ in pace(clients / rate, seconds, random.Random(i)):
            t0 = time.perf_counter()
            c.request("POST", "/v1/chat/completions", body, headers)
            r = c.getresponse()
            r.read()
            if r.status == 200:
                mine.append(time.perf_counter() - t0)
            else:
                errors[0] += 1
        with lock:
            lat.extend(mine)
    in_threads(run, clients)
    return lat, errors[0]


def paced(port: int, clients: int, rate: float, seconds: float) -> tuple[list[float], int]:
    """Latencies (s) of the answered requests and the count of failed ones, `clients` paced to `rate` in all."""
    process, queue = spawn(_paced_clients, port, clients, rate, seconds)
    out = queue.get()
    process.join()
    return out


def sequential(ports: dict[str, int], rounds: int = 4, n: int = 200) -> dict[str, list[float]]:
    """One client, one request at a time: the floor of each path's latency. Paths alternate in rounds of `n`
    requests (a noisy moment then hits both, not only the one measured during it); the first 20 of each round are
    warm-up."""
    body, lat = json.dumps(CHAT), {name: [] for name in ports}
    conns = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=10) for name, port in ports.items()}
    for _ in range(rounds):
        for name, c in conns.items():
            for i in range(n):
                t0 = time.perf_counter()
                c.request("POST", "/v1/chat/completions", body,
                          {"Content-Type": "application/json", "x-reef-scenario": "bench-sequential"})
                c.getresponse().read()
                if i >= 20:
                    lat[name].append(time.perf_counter() - t0)
    return lat


def fsync_probe(folder: Path, rate: float, n: int = 1000) -> dict:
    """The latency of what every receipt waits for: one ~1 KB pwrite plus fdatasync in a preallocated file on
    the data dir's disk, issued at the paced rate (one every 1/rate s) and back to back.

    Why in the bench: on these VMs a flush after an idle gap costs about twice a flush right after another, and
    that cost sits inside reef_lab's added latency at a paced rate; the probe shows it beside the result.
    """
    path = folder / "fsync-probe.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        os.pwrite(fd, bytes(n * 1024 + 4096), 0)
        os.fsync(fd)
        rec, out = b"x" * 1000, {}
        for name, gap in (("paced", 1 / rate), ("back_to_back", 0.0)):
            lat, nxt = [], time.perf_counter()
            for i in range(n):
                nxt += gap
                if (wait := nxt - time.perf_counter()) > 0:
                    time.sleep(wait)
                t0 = time.perf_counter()
                os.pwrite(fd, rec, i * 1024)
                os.fdatasync(fd)
                lat.append(time.perf_counter() - t0)
            out[name] = {"p50": round(ms(lat, 50), 3), "p90": round(ms(lat, 90), 3)}
        return out
    finally:
        os.close(fd)
        path.unlink()


def ms(xs: list[float], p: float) -> float:
    """The `p`th percentile (0 to 100) of latencies `xs` in seconds, in ms."""
    return quantile(xs, p / 100) * 1e3


# ---- wrk -------------------------------------------------------------------------------------------------------
WRK_CHAT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-reef-scenario"] = "bench-throughput"
""" % json.dumps(CHAT)

WRK_REPORT = """
local ids = {}
for line in io.lines("%s") do ids[#ids + 1] = line end
math.randomseed(os.time())
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-reef-scenario"] = "bench-reports"
request = function()
  local a = math.random(#ids)
  local b = a %% #ids + 1
  local body = '{"score": ' .. (math.random(0, 100) / 100) .. ', "feedback": "ok", "references": ["' ..
               ids[a] .. '", "' .. ids[b] .. '"]}'
  return wrk.format(nil, nil, nil, body)
end
"""


WRK_PACED = WRK_CHAT.replace("bench-throughput", "bench-latency") + """
local think_ms = %f
math.randomseed(os.time())
function delay()  -- exponential think time before each request: Poisson arrivals on each connection
  return -math.log(1 - math.random()) * think_ms
end
function done(summary, latency, requests)
  io.write(string.format("PACED %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
                         latency:percentile(50), latency:percentile(90), latency:percentile(99),
                         summary.errors.status + summary.errors.connect + summary.errors.read +
                         summary.errors.write + summary.errors.timeout))
end
"""


def paced_wrk(port: int, clients: int, rate: float, seconds: int) -> dict:
    """The latency phase with wrk (C) as the client: `clients` connections, each waiting an exponential think
    time (mean clients/rate s) before each request, so the total rate is `rate` less the latency's share.

    Why beside the Python clients: those spend about as much CPU per request as the stub, on the same two CPUs
    as the server they measure; wrk spends a tenth of that, so its numbers show the server with less of the
    client in them. Both are reported.
    """
    out = run_wrk(f"http://127.0.0.1:{port}/v1/chat/completions", WRK_PACED % (clients / rate * 1000), seconds,
                  clients)
    n, dur, p50, p90, p99, errors = map(int, re.search(r"PACED (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)",
                                                        out).groups())
    return {"n": n, "rps": round(n / dur * 1e6, 1), "p50": p50 / 1e3, "p90": p90 / 1e3, "p99": p99 / 1e3,
            "errors": errors}


def need_wrk() -> None:
    """Stop, saying how to install it, where wrk (the throughput phases' client) is missing."""
    if not shutil.which("wrk"):
        sys.exit("wrk is needed for the throughput phases: apt-get install wrk")


def run_wrk(url: str, script: str, seconds: int, conns: int = 16) -> str:
    """wrk's output for `script` (Lua) against `url`."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        return procs.run(["wrk", "-t2", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", f.name, url],
                         capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def wrk(url: str, script: str, seconds: int, conns: int = 16) -> dict:
    out = run_wrk(url, script, seconds, conns)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errs = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "requests": total, "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": errs.group(1) if errs else None}


def _mean_runs(runs: list[dict]) -> dict:
    return {"rps": sum(r["rps"] for r in runs) / len(runs), "runs_rps": [r["rps"] for r in runs],
            "requests": sum(r["requests"] for r in runs), "non_2xx": sum(r["non_2xx"] for r in runs)}


def make_receipts(port: int, n: int) -> list[str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    out = []
    for _ in range(n):
        c.request("POST", "/v1/chat/completions", json.dumps(CHAT),
                  {"Content-Type": "application/json", "x-reef-scenario": "bench-reports"})
        r = c.getresponse()
        r.read()
        out.append(r.getheader("x-reef-agent-record-id"))
    return out


def status(port: int) -> dict:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/reef/scenarios/bench-reports")
    return json.loads(c.getresponse().read())


def rotated(paths: dict, r: int) -> list[tuple]:
    """The (name, port) pairs of `paths` in round `r`'s order: each round starts one path later.

    Why: on this VM a phase right after a saturating or quiet one measures differently; with a fixed order one
    path would always run in the same spot and carry that bias into the comparison.
    """
    items = list(paths.items())
    k = r % len(items)
    return items[k:] + items[:k]


def latency_by_rate(paths: dict[str, int], args) -> dict:
    """Paced p50 (wrk as the client) of every path at each rate of `--sweep`, paths alternating within a round,
    `--rounds` rounds of `--sweep-seconds`; returns {rate: {path: median p50 ms, "added": {path: ms}}}.

    Why: on this VM the added latency depends on how busy the machine is (a quiet disk and quiet CPUs answer
    slower), so one rate alone can flatter or wrong the server.
    """
    out = {}
    for rate in args.sweep:
        p50s = {name: [] for name in paths}
        for r in range(args.rounds):
            for name, port in rotated(paths, r):
                print(f"[bench] sweep: {rate:g} requests/s, round {r + 1}/{args.rounds}, {name}", flush=True)
                p50s[name].append(paced_wrk(port, 16, rate, args.sweep_seconds)["p50"])
        med = {name: round(statistics.median(xs), 3) for name, xs in p50s.items()}
        out[f"{rate:g}"] = med | {"added": {n: round(v - med["direct"], 3) for n, v in med.items() if n != "direct"}}
    return out


# Variants of reef_lab measured beside the default in the instant-stub part (same run, rounds alternating).
VARIANTS = {
    "reef_lab, short time slice": {"args": ["--sched-slice-us", "100"], "throughput": True},
    "reef_lab, data dir in memory": {"args": [], "memory": True},  # /dev/shm: no device flush (not durable)
}


def measure(delay_ms: float, args, with_reports: bool, variants: dict | None = None) -> tuple[dict, dict]:
    """One stub (answering after `delay_ms`) and reef_lab in front of it (plus `variants`, each a server of its
    own); returns (result, raw latencies)."""
    stub = start_stub(delay_ms)
    stub_port = stub.port
    servers = {}  # name -> (port, data dir, process)
    for name, v in {"reef_lab": {"args": []}, **(variants or {})}.items():
        if v.get("memory") and not Path("/dev/shm").is_dir():
            print(f"[bench] no /dev/shm here: skipping {name!r}", flush=True)
            continue
        data_dir = tempfile.mkdtemp(prefix="reef-bench-", dir="/dev/shm" if v.get("memory") else None)
        proc = start_server("--upstream-url", f"http://127.0.0.1:{stub_port}", "--log-level", "warning", *v["args"],
                            data_dir=data_dir, log=Path(data_dir + "-serve.log"))
        servers[name] = (proc.port, data_dir, proc)
    reef_port, data_dir, _ = servers["reef_lab"]
    tag = f"provider {delay_ms:g} ms"
    try:
        print(f"[bench] {tag}: warming up", flush=True)
        paths = {"direct": stub_port, **{name: port for name, (port, _, _) in servers.items()}}
        for port in paths.values():
            paced(port, 16, args.rate, 2)
        lat = {name: [] for name in paths}
        errors = {name: 0 for name in paths}
        wrk_rounds = {name: [] for name in paths}
        for r in range(args.rounds):
            for name, port in rotated(paths, r):
                print(f"[bench] {tag}: latency round {r + 1}/{args.rounds}, {name}", flush=True)
                xs, err = paced(port, 16, args.rate, args.seconds)
                lat[name] += xs
                errors[name] += err
            for name, port in rotated(paths, r):
                print(f"[bench] {tag}: latency round {r + 1}/{args.rounds}, {name}, wrk as the client", flush=True)
                wrk_rounds[name].append(paced_wrk(port, 16, args.rate, args.seconds))
        latency = {name: {f"p{p}": round(ms(xs, p), 3) for p in (50, 90, 99)} | {"n": len(xs),
                                                                               "errors": errors[name]}
                   for name, xs in lat.items()}
        added_by = {name: {k: round(latency[name][k] - latency["direct"][k], 3) for k in ("p50", "p90", "p99")}
                    for name in paths if name != "direct"}
        latency_wrk = {name: {"p50": round(statistics.median(x["p50"] for x in xs), 3),
                              "p90": round(statistics.median(x["p90"] for x in xs), 3),
                              "round_p50": [x["p50"] for x in xs], "n": sum(x["n"] for x in xs),
                              "rps": round(statistics.mean(x["rps"] for x in xs), 1),
                              "errors": sum(x["errors"] for x in xs)} for name, xs in wrk_rounds.items()}
        added_wrk = {name: {k: round(latency_wrk[name][k] - latency_wrk["direct"][k], 3) for k in ("p50", "p90")}
                     for name in paths if name != "direct"}
        sweep = latency_by_rate(paths, args) if args.sweep and delay_ms == 0 else None
        print(f"[bench] {tag}: fdatasync probe", flush=True)
        fsync_ms = fsync_probe(Path(data_dir), args.rate)
        print(f"[bench] {tag}: one client, sequential", flush=True)
        one = {name: round(ms(xs, 50), 3)
               for name, xs in sequential({"direct": stub_port, "reef_lab": reef_port}).items()}
        thr_paths = {"direct": stub_port, "reef_lab": reef_port,
                     **{name: servers[name][0] for name, v in (variants or {}).items()
                        if v.get("throughput") and name in servers}}
        runs = {name: [] for name in thr_paths}
        for r in range(args.rounds):
            for name, port in rotated(thr_paths, r):
                print(f"[bench] {tag}: throughput round {r + 1}/{args.rounds}, {name}", flush=True)
                runs[name].append(wrk(f"http://127.0.0.1:{port}/v1/chat/completions", WRK_CHAT, args.seconds))
        thr = {name: _mean_runs(x) for name, x in runs.items()}
        result = {"provider_delay_ms": delay_ms, "latency_ms": latency, "added_latency_ms": added_by["reef_lab"],
                  "added_latency_ms_by_server": added_by, "latency_wrk_client_ms": latency_wrk,
                  "added_latency_wrk_client_ms": added_wrk, "fdatasync_ms": fsync_ms,
                  "one_client_p50_ms": one | {"added": round(one["reef_lab"] - one["direct"], 3)},
                  "throughput": {**thr, "ratio": round(thr["reef_lab"]["rps"] / thr["direct"]["rps"], 4)}}
        if sweep:
            result["latency_by_rate"] = sweep
        if with_reports:
            print("[bench] reports: making 2000 receipts", flush=True)
            ids = make_receipts(reef_port, 2000)
            ids_file = Path(data_dir) / "receipts.txt"
            ids_file.write_text("\n".join(ids) + "\n")
            before = status(reef_port)["records"]["report"]
            print("[bench] reports: wrk", flush=True)
            reports = wrk(f"http://127.0.0.1:{reef_port}/reef/report", WRK_REPORT % ids_file, args.seconds)
            result["reports"] = {**reports, "stored": status(reef_port)["records"]["report"] - before}
    finally:
        started = [p for _, _, p in servers.values()] + [stub]
        for child in started:  # all at once: each one's shutdown overlaps the others'
            child.proc.terminate()
        for child in started:
            child.stop(60)
    from reef_lab.records.store import scan_records
    import polars as pl
    failed = scan_records(data_dir).filter(pl.col("status") != "ok").select("error").collect()["error"].to_list()
    log_tail = [line for line in Path(data_dir + "-serve.log").read_text(errors="replace").splitlines()
                if "ERROR" in line or "Traceback" in line][:5]
    result["failures"] = {"error_records": len(failed), "first_errors": failed[:3], "server_log_errors": log_tail}
    for _, d, _ in servers.values():
        shutil.rmtree(d, ignore_errors=True)
        Path(d + "-serve.log").unlink()
    return result, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=10, help="length of each measured phase")
    ap.add_argument("--rate", type=float, default=400, help="total paced request rate of the latency phase")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating direct/proxied rounds of the latency and throughput phases")
    ap.add_argument("--provider-ms", type=float, default=20.0,
                    help="delay of the second, provider-like stub (the first answers at once)")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip the servers measured beside reef_lab (default time slice; data dir in memory)")
    ap.add_argument("--sweep", type=lambda v: [float(x) for x in v.split(",")], default=None,
                    help="also measure the instant stub's paced latency at each of these total rates (e.g. "
                         "100,200,400,800), wrk as the client; about 45 s per rate with the defaults")
    ap.add_argument("--sweep-seconds", type=int, default=5, help="length of each round of --sweep")
    ap.add_argument("--out", default=None, help="results path prefix (default results/gateway-bench, or with "
                                                 "--state results/shared-state-bench)")
    ap.add_argument("--state", default=None,
                    help="measure shared state instead (scripts/bench/shared_state.py): reef_lab on this PostgreSQL "
                         "(postgresql://..., or 'temp' for a throwaway one started here) against the data dir, 1 vs "
                         "2 gateways, and Reef with its PostgreSQL store (--reef-bin)")
    ap.add_argument("--reef-bin", default=None,
                    help="with --state: Reef 0.1.3's `reef` command (reef-infra[postgres]==0.1.3 in a Python 3.12 "
                         "venv; git-lfs on PATH), to measure Reef with its PostgreSQL store beside reef_lab")
    args = ap.parse_args()
    need_wrk()
    if args.state:
        from scripts.bench import shared_state

        args.out = args.out or str(ROOT / "results" / "shared-state-bench")
        shared_state.main(args, sys.modules[__name__])
        return
    args.out = args.out or str(ROOT / "results" / "gateway-bench")
    run = RunInfo()
    zero, zero_lat = measure(0.0, args, with_reports=True, variants=None if args.no_variants else VARIANTS)
    slow, slow_lat = measure(args.provider_ms, args, with_reports=False)
    result = {
        **run.fields(), "clients": 16, "paced_rate_per_s": args.rate, "seconds_per_phase": args.seconds,
        "instant_stub": zero, "provider_stub": slow,
        "command": command_line(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    data_file(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(render(result))
    plot(result, zero_lat, slow_lat, args.out + ".png")
    print(render(result))


def plot(r: dict, zero_lat: dict, slow_lat: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, lat, title in ((axes[0], zero_lat, "instant stub"),
                           (axes[1], slow_lat, f"stub answering in {r['provider_stub']['provider_delay_ms']:g} ms")):
        for name, xs in lat.items():
            xs = sorted(x * 1e3 for x in xs)
            ax.plot(xs, [i / len(xs) for i in range(len(xs))], label=name)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"latency at {r['paced_rate_per_s']:.0f} req/s, 16 clients: {title}")
        ax.grid(alpha=0.3)
        ax.legend()
    t0, t1 = r["instant_stub"]["throughput"], r["provider_stub"]["throughput"]
    names = ["instant\ndirect", "instant\nreef_lab", "provider\ndirect", "provider\nreef_lab", "reports\nreef_lab"]
    vals = [t0["direct"]["rps"], t0["reef_lab"]["rps"], t1["direct"]["rps"], t1["reef_lab"]["rps"],
            r["instant_stub"]["reports"]["rps"]]
    axes[2].bar(names, vals, color=["#888", "#2a7", "#888", "#2a7", "#27a"])
    axes[2].set_ylabel("requests/s (wrk, 16 connections)")
    axes[2].set_title("throughput")
    for i, v in enumerate(vals):
        axes[2].text(i, v, f"{v:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


_NOTES = {
    "reef_lab, short time slice": "the same reef_lab with `--sched-slice-us 100` (opt-in): its threads ask for a "
                                  "100 us slice while the machine is less than 85% busy (server/tuning.py "
                                  "SliceGovernor)",
    "reef_lab, data dir in memory": "the same reef_lab with its data dir in /dev/shm: no device flush, so not "
                                    "durable; shown only to split the added latency into disk and the rest",
}


def _section(x: dict, title: str) -> str:
    lat, t = x["latency_ms"], x["throughput"]
    others = [n for n in lat if n not in ("direct", "reef_lab")]
    rows = "".join(f"\n| {name} | {lat[name]['p50']:.3f} | {lat[name]['p90']:.3f} | {lat[name]['p99']:.3f} | "
                     f"{x['added_latency_ms_by_server'][name]['p50']:.3f} |" for name in others)
    lw = x["latency_wrk_client_ms"]
    wrk_rows = ""
    for name, v in lw.items():
        added = "" if name == "direct" else f"{x['added_latency_wrk_client_ms'][name]['p50']:.3f}"
        rounds = ", ".join(f"{p:.3f}" for p in v["round_p50"])
        wrk_rows += (f"\n| {'direct to stub' if name == 'direct' else name} | {v['p50']:.3f} ({rounds}) | "
                     f"{v['p90']:.3f} | {f'**{added}**' if name == 'reef_lab' else added} |")
    notes = "\n" + "".join(f"\n- *{name}*: {_NOTES.get(name, '')}" for name in others)
    thr_rows = "".join(f"\n| {name} | {t[name]['rps']:.0f} ({', '.join(f'{v:.0f}' for v in t[name]['runs_rps'])}) | "
                       f"{t[name]['non_2xx']} |" for name in t if name not in ("direct", "reef_lab", "ratio"))
    return f"""## {title}

Latency at a paced rate ({lat['direct']['n']} direct, {lat['reef_lab']['n']} proxied requests, \
{sum(v['errors'] for v in lat.values())} errors):

| ms | p50 | p90 | p99 | added p50 |
|---|---|---|---|---|
| direct to stub | {lat['direct']['p50']:.3f} | {lat['direct']['p90']:.3f} | {lat['direct']['p99']:.3f} | |
| through reef_lab | {lat['reef_lab']['p50']:.3f} | {lat['reef_lab']['p90']:.3f} | {lat['reef_lab']['p99']:.3f} | |
| **added by reef_lab** | **{x['added_latency_ms']['p50']:.3f}** | {x['added_latency_ms']['p90']:.3f} | \
{x['added_latency_ms']['p99']:.3f} | **{x['added_latency_ms']['p50']:.3f}** |{rows}{notes if others else ""}

The same paced latency with wrk (C) as the client instead of the Python clients (16 connections, each waiting an \
exponential think time of mean 16/rate before each request; the median of the rounds' p50 and p90, each round's \
p50 in brackets; {sum(v['n'] for v in lw.values())} requests, {sum(v['errors'] for v in lw.values())} errors):

| ms | p50 (rounds) | p90 | added p50 |
|---|---|---|---|{wrk_rows}

Part of that is the disk: the record's fdatasync, probed in the same run on the data dir's disk (one ~1 KB
pwrite + fdatasync, scripts/bench/bench_gateway.py `fsync_probe`), takes p50 **{x['fdatasync_ms']['paced']['p50']:.3f} ms** \
when issued at the paced rate and {x['fdatasync_ms']['back_to_back']['p50']:.3f} ms back to back.

One client, one request at a time (the floor): p50 {x['one_client_p50_ms']['direct']:.3f} ms direct, \
{x['one_client_p50_ms']['reef_lab']:.3f} ms through reef_lab, **{x['one_client_p50_ms']['added']:.3f} ms added**.

Throughput, 16 connections saturating (wrk; mean of alternating rounds, each round's value in brackets):

| | requests/s | non-2xx |
|---|---|---|
| direct to stub | {t['direct']['rps']:.0f} ({', '.join(f"{v:.0f}" for v in t['direct']['runs_rps'])}) | \
{t['direct']['non_2xx']} |
| through reef_lab | {t['reef_lab']['rps']:.0f} ({', '.join(f"{v:.0f}" for v in t['reef_lab']['runs_rps'])}) | \
{t['reef_lab']['non_2xx']} |{thr_rows}
| **ratio** (reef_lab / direct) | **{t['ratio']:.3f}** | |

Ratio within each round (reef_lab's run against the stub's run of the same round): \
{', '.join(f"{a / b:.3f}" for a, b in zip(t['reef_lab']['runs_rps'], t['direct']['runs_rps']))}.

{_sweep(x.get('latency_by_rate'))}Failed inferences recorded by reef_lab in this part: {x['failures']['error_records']}\
{(' (' + '; '.join(x['failures']['first_errors']) + ')') if x['failures']['first_errors'] else ''}; \
errors in its log: {len(x['failures']['server_log_errors'])}.
"""


def _sweep(sw: dict | None) -> str:
    if not sw:
        return ""
    names = [n for n in next(iter(sw.values())) if n != "added"]
    head = " | ".join(["requests/s", *[f"{n} p50" for n in names], *[f"added, {n}" for n in names if n != "direct"]])
    rows = "".join("\n| " + " | ".join([rate, *[f"{v[n]:.3f}" for n in names],
                                         *[f"{v['added'][n]:.3f}" for n in names if n != "direct"]]) + " |"
                   for rate, v in sw.items())
    return f"""Paced latency by total rate (wrk as the client; median of the rounds' p50, ms; `--sweep`):

| {head} |
|{'---|' * (len(names) * 2)}{rows}

"""


def render(r: dict) -> str:
    rep = r["instant_stub"]["reports"]
    cpu = f", {r['machine']['cpu']}" if r['machine'].get('cpu') else ""
    return f"""# Gateway overhead: reef_lab relaying to a stub provider vs the stub directly

Command: `{r['command'].strip()}`, started {r.get('started', '?')} ({r['machine']['cpus']} CPUs{cpu}, Python \
{r['machine']['python']}; the host took {100 * r.get('cpu_steal_share', 0):.1f}% of the CPU time as steal); load \
generator, stub and server share these CPUs. Stub: `reef_lab.testing.stub_provider` (a plain WSGI app under granian) on
loopback; reef_lab: `scripts/serve.py --upstream-url <stub>` with a fresh data dir
({min(r['machine']['cpus'], 8)} worker processes, the default with a provider: a primary and relays, see
server/workers.py), every record fsynced before its receipt. 16 concurrent
clients; latency phases pace them at {r['paced_rate_per_s']:.0f} requests/s in total, {r['seconds_per_phase']} s per
round, direct and proxied rounds alternating, each round starting one path later (this machine is noisy: compare
the rows of one run, not numbers across runs).

![latency and throughput](gateway-bench.png)

{_section(r['instant_stub'], 'Instant stub (answers in about 0.1 ms: the hardest case for the ratio)')}
{_section(r['provider_stub'], f"Provider-like stub (answers after {r['provider_stub']['provider_delay_ms']:g} ms)")}
## Reports with two references each (wrk, 16 connections)

**{rep['rps']:.0f} reports/s**; {rep['requests']} answered by the end of the run, {rep['non_2xx']} non-2xx;
{rep['stored']} report records were in the store afterwards (requests still in flight when wrk stopped are stored
too, so this can exceed the answered count).

Reef 0.1.3 on this machine, for comparison (from the issue): adds 4.4 ms p50, keeps 6% of direct throughput,
takes 254 reports/s.
"""


if __name__ == "__main__":
    main()
