"""Soak test: the real server under a steady mixed load for minutes; memory, latency and errors as they go, then
reads by id before and after a restart.

    .venv/bin/python scripts/bench/soak.py   # 8 min warm-up + 10 measured; results/soak.{md,png}, data/soak.json
    .venv/bin/python scripts/bench/soak.py --warmup-minutes 1 --minutes 2 --out runs/soak     # a quick look

Starts the stub provider (`reef_lab.testing.stub_provider`) and `scripts/serve.py --upstream-url <stub>` (two worker
processes on a 2-CPU machine: a primary and a relay) with a fresh data dir. A separate load process runs `--clients`
keep-alive clients paced to `--rate` requests/s in all: each cycle is a chat completion (every fourth streamed)
and a report that references its receipt; every tenth cycle also reads a record back by id. Every 5 s the resident
memory of each worker process is sampled. The warm-up (`--warmup-minutes`) runs the same load before the measured
`--minutes`; it lasts past the first roll of a log into Parquet, which maps polars' and pyarrow's writer code and
their allocators' arenas into the process once (tens of MB). What it shows, per minute: each worker's memory, the
requests' p50/p99 and the errors. Afterwards: `--reads` records read by id one at a time (GET /reef/scenarios/{s}/records/{id})
before a restart and after it (the restart rolls every log into Parquet, so afterwards each read comes from a
segment through the on-disk index).

With retention (`--retain-max-bytes`, `--retain-max-age`, `--retain-max-records`, passed on to serve.py, and
`--roll-records` for segments small enough to see several): the records folder's size is sampled with memory, and
when the load ends the script reads /reef/status's eviction counts and every acknowledged record still stored, and
checks that none the policy keeps is missing: the newest `--retain-max-records` and those younger than
`--retain-max-age` (less a margin), in `retention` of soak.json and a section of soak.md.

    .venv/bin/python scripts/bench/soak.py --warmup-minutes 0 --minutes 2 --roll-records 1000 --retain-max-records 6000 \
        --retain-max-age 60s --out runs/soak-retention
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from reef_lab.records.retention import parse_bytes, parse_duration
from reef_lab.records.segments import collect_records
from reef_lab import procs
from reef_lab.testing import free_port
from reef_lab.testing.processes import start_child
from scripts.common import ROOT, in_threads, pace, pyplot, quantile, spawn
from scripts.command_line import command_line, data_file

SCENARIO = "soak"
HEADERS = {"Content-Type": "application/json", "x-reef-scenario": SCENARIO}


def workers_of(pid: int) -> list[int]:
    """The server's worker processes: what serve.py's process started (past the reef_lab.procs reapers)."""
    return sorted(procs.children(pid))


def records_size(data_dir: Path) -> dict:
    """Bytes of the records folder's segments and logs (what retention limits), and the largest segment."""
    segs, logs = [], []
    for p in (data_dir / "records").iterdir() if (data_dir / "records").exists() else ():
        try:
            size = p.stat().st_size
        except FileNotFoundError:  # rolled or evicted meanwhile
            continue
        if p.name.startswith("seg-") and p.name.endswith(".parquet"):
            segs.append(size)
        elif p.name.startswith("log-"):
            logs.append(size)
    return {"segments": sum(segs), "logs": sum(logs), "total": sum(segs) + sum(logs), "n_segments": len(segs),
            "largest_segment": max(segs, default=0), "largest_log": max(logs, default=0)}


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> dict | None:
    """Resident memory in MB: all of it, its anonymous part (heaps: what a leak grows) and its file-backed part
    (pages of mapped files, shared libraries' code among them: polars' Parquet writer first touched at the first
    roll adds tens of MB here, once)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:
        return None
    kb = {k: int(fields[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
    return {"rss": round(kb["VmRSS"] / 1024, 1), "anon": round(kb["RssAnon"] / 1024, 1),
            "file": round((kb["RssFile"] + kb["RssShmem"]) / 1024, 1)}


# ---- the load (a child process, so its CPU use does not share a GIL with the sampler) ------------------------
def _load(port: int, clients: int, rate: float, seconds: float, recent_reads: bool = False) -> tuple[list, list, list]:
    interval = clients * 2 / rate  # each cycle is two requests (a chat and its report), or three
    lock, events, receipts, acknowledged = threading.Lock(), [], [], []

    def call(c, method, path, body=None) -> tuple[int, bytes, dict]:
        c.request(method, path, None if body is None else json.dumps(body).encode(), HEADERS)
        r = c.getresponse()
        return r.status, r.read(), {k.lower(): v for k, v in r.getheaders()}

    def run(i: int) -> None:
        rng = random.Random(i)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine, got, reported = [], [], []
        for cycle in pace(interval, seconds, rng):
            stream = cycle % 4 == 0
            body = {"model": "m", "stream": stream,
                    "messages": [{"role": "user", "content": f"soak {i}-{cycle}: " + "words " * rng.randint(5, 60)}]}
            try:
                t0 = time.perf_counter()
                status, data, headers = call(c, "POST", "/v1/chat/completions", body)
                ok = status == 200
                rid = headers.get("x-reef-agent-record-id")
                if stream and ok:
                    tail = data.rsplit(b'"agent_record_id":"', 1)
                    rid = tail[1].split(b'"', 1)[0].decode() if len(tail) == 2 else None
                mine.append((t0, time.perf_counter() - t0, "chat", ok and rid is not None))
                if rid:
                    got.append(rid)
                    t0 = time.perf_counter()
                    status, data, _ = call(c, "POST", "/reef/report", {"score": rng.random(), "feedback": "fine",
                                                                      "references": [rid]})
                    mine.append((t0, time.perf_counter() - t0, "report", status == 200))
                    if status == 200:
                        reported.append(json.loads(data)["agent_record_id"])
                if cycle % 10 == 0 and got:
                    t0 = time.perf_counter()
                    pick = rng.choice(got[-20:] if recent_reads else got)  # older ones may be evicted
                    status, _, _ = call(c, "GET", f"/reef/scenarios/{SCENARIO}/records/{pick}")
                    mine.append((t0, time.perf_counter() - t0, "read", status == 200))
            except OSError as e:
                mine.append((time.perf_counter(), 0.0, f"error {type(e).__name__}", False))
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        with lock:
            events.extend(mine)
            receipts.extend(got)
            acknowledged.extend(got + reported)
    in_threads(run, clients)
    return events, receipts, acknowledged


def read_latencies(port: int, ids: list[str], rounds: int = 2) -> list[float]:
    """Each record read by id, one at a time on one keep-alive connection; the last round's times."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for _ in range(rounds):
        out = []
        for rid in ids:
            t0 = time.perf_counter()
            c.request("GET", f"/reef/scenarios/{SCENARIO}/records/{rid}", headers=HEADERS)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"reading {rid} answered {r.status}")
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the measured steady load")
    ap.add_argument("--rate", type=float, default=120.0, help="requests per second in all")
    ap.add_argument("--clients", type=int, default=8, help="concurrent keep-alive clients")
    ap.add_argument("--warmup-minutes", type=float, default=8.0,
                    help="minutes of the same load before the measured ones: past the first roll of the primary's "
                         "own log and of a relay's (about 3.5 and 6.5 min at 120 requests/s)")
    ap.add_argument("--reads", type=int, default=500, help="records read by id before and after the restart")
    ap.add_argument("--out", default=str(ROOT / "results"), help="folder for soak.md, soak.png; JSON in results/data/")
    ap.add_argument("--server-args", default="", help="extra scripts/serve.py flags, e.g. '--http-server granian'")
    ap.add_argument("--retain-max-bytes", help="serve.py's retention limit; checked afterwards (see above)")
    ap.add_argument("--retain-max-age", help="serve.py's retention limit; checked afterwards")
    ap.add_argument("--retain-max-records", type=int, help="serve.py's retention limit; checked afterwards")
    ap.add_argument("--roll-records", type=int, help="serve.py's records per log (segment size)")
    ap.add_argument("--recent-reads", action="store_true",
                    help="read back one of the client's 20 newest receipts instead of any (on with a retain limit)")
    ap.add_argument("--keep-work", action="store_true", help="keep the temporary data dir and logs")
    ap.add_argument("--retain-interval", type=float, default=5.0,
                    help="serve.py's seconds between retention rounds (with a retain limit)")
    args = ap.parse_args()
    retain = [f for k in ("retain_max_bytes", "retain_max_age", "retain_max_records", "roll_records")
              if getattr(args, k) is not None for f in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]
    limits = any(getattr(args, k) is not None for k in ("retain_max_bytes", "retain_max_age", "retain_max_records"))
    if limits:
        retain += ["--retain-interval", str(args.retain_interval)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="reef-soak-"))
    stub_port, port = free_port(), free_port()
    py = sys.executable
    stub = start_child([py, "-m", "reef_lab.testing.stub_provider", "--port", str(stub_port)], stub_port,
                       work / "stub.log", ready_path="/v1/models")
    serve_cmd = [py, "scripts/serve.py", "--port", str(port), "--data-dir", str(work / "data"), "--upstream-url",
                 f"http://127.0.0.1:{stub_port}", "--log-level", "warning", *retain, *args.server_args.split()]
    if retain:  # the eviction log lines are INFO
        serve_cmd[serve_cmd.index("--log-level") + 1] = "info"
    server = start_child(serve_cmd, port, work / "server.log", settle=1.0)
    try:
        pids = workers_of(server.pid)
        total = args.warmup_minutes + args.minutes
        print(f"[soak] server ready, workers {pids}; {args.warmup_minutes:g} + {args.minutes:g} min at {args.rate:g} "
              f"requests/s, {args.clients} clients", file=sys.stderr, flush=True)
        t0, cpu0 = time.time(), {p: cpu_s(p) for p in pids}
        load, q = spawn(_load, port, args.clients, args.rate, total * 60, args.recent_reads or limits)
        samples = []  # (seconds since start, {pid: rss MB})
        sizes = []  # (seconds since start, records_size)
        while load.is_alive() and time.time() - t0 < total * 60:  # not the load's wind-down
            samples.append((round(time.time() - t0, 1), {p: rss_mb(p) for p in pids}))
            sizes.append((samples[-1][0], records_size(work / "data")))
            if len(samples) % 12 == 0:
                print(f"[soak] {samples[-1][0] / 60:4.1f} min  MB (all/anon) " +
                      " ".join(f"{p}:{v['rss']}/{v['anon']}" for p, v in samples[-1][1].items() if v),
                      file=sys.stderr, flush=True)
            time.sleep(5)
        events, receipts, acknowledged = q.get()
        load.join()
        server_cpu = round(sum(cpu_s(p) - cpu0[p] for p in pids), 2)  # the workers', over the load
        retention = check_retention(args, port, work, acknowledged, sizes) if limits else None
        t_load = min(e[0] for e in events)
        print(f"[soak] load done: {len(events)} requests; reading {args.reads} records by id", file=sys.stderr,
              flush=True)
        if retention is None:
            ids = random.Random(0).sample(receipts, min(args.reads, len(receipts)))
        else:  # the newest receipts still stored: older ones may be evicted while they are read
            present = retention.pop("present")
            ids = [r for r in sorted(receipts) if r in present][-args.reads:]
        before = read_latencies(port, ids)
        server.stop(60)
        server = start_child(serve_cmd, port, work / "server.log")
        after = read_latencies(port, ids)
    finally:
        server.stop(60)
        stub.stop(60)
    if not args.keep_work:  # kept (with server.log) when the run failed
        shutil.rmtree(work, ignore_errors=True)
    report = summarize(args, samples, events, t_load, before, after, pids, command_line(program=""))
    report["retention"] = retention
    report["server_cpu_s"] = server_cpu
    data_file(out / "soak").write_text(json.dumps({**report, "samples": samples, "sizes": sizes}, indent=1))
    (out / "soak.md").write_text(render(report))
    plot(samples, report, out / "soak.png")
    print(render(report))


def check_retention(args, port: int, work: Path, acknowledged: list[str], sizes: list) -> dict:
    """After the load: wait for a retention round that started after it, then compare what is stored with what the
    policy keeps, and the eviction counts with the files and the server's log."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def status() -> dict:
        c.request("GET", "/reef/status")
        return json.loads(c.getresponse().read())["retention"]
    t_end = time.time()
    deadline = t_end + 180
    while (status()["last_round"] or {}).get("at", 0) < t_end + 1 and time.time() < deadline:
        time.sleep(1)  # a round after every roll, and at least every --retain-interval seconds
    now = time.time()
    present = set(collect_records(work / "data", lambda lf: lf.select("id"))["id"].to_list())
    final, st = records_size(work / "data"), status()
    acked = sorted(acknowledged)  # server ids sort by the time they were made
    keep = set(acked)
    if args.retain_max_records is not None:
        keep &= set(acked[-args.retain_max_records:])
    if args.retain_max_age is not None:  # a margin for the time the check itself takes
        cutoff = (now - parse_duration(args.retain_max_age) + 10) * 1000
        keep &= {r for r in acked if int(r[4:16], 16) >= cutoff}
    lines = sum(line.count(b"retention: segment ") for line in (work / "server.log").read_bytes().splitlines())
    cap = parse_bytes(args.retain_max_bytes) if args.retain_max_bytes else None
    slack = [(t, s["total"] - cap, s["largest_segment"]) for t, s in sizes] if cap else []
    return {"present": present, "acknowledged": len(acked), "stored": len(present & set(acked)),
            "must_keep": len(keep),
            "missing": sorted(keep - present)[:20], "n_missing": len(keep - present),
            "evicted": st["evicted"], "by_scenario": st["by_scenario"], "rounds": st["rounds"],
            "retention_cpu_s": st["cpu_s"],
            "log_lines": lines, "final_size": final, "cap_bytes": cap,
            "max_total_bytes": max((s["total"] for _, s in sizes), default=0),
            "max_segment_bytes": max((s["largest_segment"] for _, s in sizes), default=0),
            "max_log_bytes": max((s["largest_log"] for _, s in sizes), default=0),
            "max_over_cap_bytes": max((x for _, x, _ in slack), default=None)}


def memory_table(samples, pids, warm: float) -> dict:
    """Per worker and part (anon, rss): where it stood at start, after warm-up and at the end, its range after
    warm-up and the slope of a line fitted to that range."""
    rss = {}
    for p in pids:
        for part in ("anon", "rss"):
            after_warm = [(t, s[p][part]) for t, s in samples if t >= warm and s.get(p)]
            if not after_warm:
                continue
            ts, vs = [t for t, _ in after_warm], [v for _, v in after_warm]
            slope = statistics.linear_regression(ts, vs).slope * 60 if len(ts) > 2 else float("nan")
            rss[f"{p} {part}"] = {
                "start_mb": next(s[p][part] for _, s in samples if s.get(p)), "at_warmup_mb": vs[0],
                "end_mb": vs[-1], "min_after_warmup_mb": min(vs), "max_after_warmup_mb": max(vs),
                "spread_after_warmup_mb": round(max(vs) - min(vs), 1), "slope_mb_per_min": round(slope, 3)}
    return rss


def summarize(args, samples, events, t_load, before, after, pids, command) -> dict:
    minutes = []
    for m in range(int(args.warmup_minutes + args.minutes + 0.999)):
        lat = [e[1] for e in events if m * 60 <= e[0] - t_load < (m + 1) * 60 and e[3]]
        errs = [e for e in events if m * 60 <= e[0] - t_load < (m + 1) * 60 and not e[3]]
        minutes.append({"minute": m + 1, "warmup": m < args.warmup_minutes, "requests": len(lat) + len(errs),
                        "errors": len(errs),
                        "p50_ms": round(quantile(lat, 0.5) * 1e3, 2),
                        "p99_ms": round(quantile(lat, 0.99) * 1e3, 2)})
    rss = memory_table(samples, pids, args.warmup_minutes * 60)
    by_kind = {}
    for kind in ("chat", "report", "read"):
        lat = [e[1] for e in events if e[2] == kind and e[3]]
        by_kind[kind] = {"n": len(lat), "p50_ms": round(quantile(lat, 0.5) * 1e3, 2),
                         "p99_ms": round(quantile(lat, 0.99) * 1e3, 2)}
    errors = [e for e in events if not e[3]]
    measured = [m for m in minutes if not m["warmup"]]
    return {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command,
            "minutes": args.minutes, "rate": args.rate, "clients": args.clients,
            "warmup_minutes": args.warmup_minutes, "requests": len(events), "errors": len(errors),
            "error_kinds": sorted({e[2] for e in errors}), "by_kind": by_kind, "by_minute": minutes, "rss": rss,
            "measured_p99_ms": [min(m["p99_ms"] for m in measured), max(m["p99_ms"] for m in measured)]
            if measured else None,
            "reads": {"n": len(before), "before_p50_ms": round(quantile(before, 0.5) * 1e3, 3),
                      "before_p99_ms": round(quantile(before, 0.99) * 1e3, 3),
                      "after_p50_ms": round(quantile(after, 0.5) * 1e3, 3),
                      "after_p99_ms": round(quantile(after, 0.99) * 1e3, 3),
                      "ratio_p50": round(quantile(after, 0.5) / quantile(before, 0.5), 3)}}


def render(r: dict) -> str:
    lines = [f"# Soak: {r['minutes']:g} minutes at {r['rate']:g} requests/s after {r['warmup_minutes']:g} of warm-up "
             f"({r['started']})", "",
             f"Command: `.venv/bin/python {r['command'].strip()}` (plot: soak.png). A cycle is a chat completion "
             "(every fourth streamed) and a report on its receipt; every tenth cycle also reads a record by id.", "",
             f"- requests: {r['requests']:,}, errors: {r['errors']} {r['error_kinds'] or ''}",
             *(f"- {k}: n={v['n']:,}, p50 {v['p50_ms']} ms, p99 {v['p99_ms']} ms" for k, v in r["by_kind"].items()),
             "", f"## Resident memory per worker (warm-up: first {r['warmup_minutes']:g} min)", "",
             "`anon`: the process's own heap pages (what a leak grows); `rss`: all resident pages, including those "
             "of mapped files and shared libraries (polars' and pyarrow's code, touched once by the first roll).", "",
             "| worker, part | at start | after warm-up | at the end | min-max after warm-up | spread | slope |",
             "|---|---|---|---|---|---|---|"]
    for p, v in r["rss"].items():
        lines.append(f"| {p} | {v['start_mb']} MB | {v['at_warmup_mb']} MB | {v['end_mb']} MB | "
                     f"{v['min_after_warmup_mb']}-{v['max_after_warmup_mb']} MB | {v['spread_after_warmup_mb']} MB | "
                     f"{v['slope_mb_per_min']:+.3f} MB/min |")
    lines += ["", "## Latency and errors per minute", "",
              f"p99 over the measured minutes: {r['measured_p99_ms'][0]}-{r['measured_p99_ms'][1]} ms.", "",
              "| minute | requests | errors | p50 | p99 |", "|---|---|---|---|---|"]
    lines += [f"| {m['minute']}{' (warm-up)' if m['warmup'] else ''} | {m['requests']:,} | {m['errors']} | "
              f"{m['p50_ms']} ms | {m['p99_ms']} ms |" for m in r["by_minute"]]
    rd = r["reads"]
    lines += ["", "## Reads by id before and after a restart", "",
              f"{rd['n']} records read one at a time (GET /reef/scenarios/soak/records/{{id}}, one keep-alive client):",
              f"before the restart p50 {rd['before_p50_ms']} ms (p99 {rd['before_p99_ms']}), after it p50 "
              f"{rd['after_p50_ms']} ms (p99 {rd['after_p99_ms']}): **{rd['ratio_p50']}x**.", ""]
    ret = r.get("retention")
    if ret:
        ev = ret["evicted"]
        lines += ["## Retention", "",
                  f"{ret['acknowledged']:,} records acknowledged, {ret['stored']:,} still stored; the policy keeps "
                  f"{ret['must_keep']:,} of them: **{ret['n_missing']} missing**.",
                  f"Evicted (/reef/status): {ev['segments']} segments deleted, {ev['rewritten']} rewritten, "
                  f"{ev['records']:,} records, {ev['bytes']:,} bytes in {ret['rounds']} rounds, which took "
                  f"{ret['retention_cpu_s']} CPU seconds of the workers' {r['server_cpu_s']}; the server logged "
                  f"{ret['log_lines']} eviction lines.",
                  f"Records folder (segments + logs) at most {ret['max_total_bytes']:,} bytes in the samples, "
                  f"{ret['final_size']['total']:,} at the end; largest segment {ret['max_segment_bytes']:,} bytes"
                  + (f"; at most {ret['max_over_cap_bytes']:,} bytes over the {ret['cap_bytes']:,}-byte limit."
                     if ret["cap_bytes"] else "."), ""]
    return "\n".join(lines)


def plot(samples, r, path: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key in r["rss"]:
        p, part = key.split()
        pts = [(t / 60, s[int(p)][part]) for t, s in samples if s.get(int(p))]
        a.plot([x for x, _ in pts], [y for _, y in pts], label=f"worker {p} {part}",
               ls="-" if part == "anon" else ":")
    a.axvline(r["warmup_minutes"], color="grey", ls=":", label="end of warm-up")
    a.set(xlabel="minutes", ylabel="resident memory, MB", title="memory per worker")
    a.legend()
    ms = r["by_minute"]
    b.plot([m["minute"] for m in ms], [m["p99_ms"] for m in ms], marker="o", label="p99")
    b.plot([m["minute"] for m in ms], [m["p50_ms"] for m in ms], marker="o", label="p50")
    b.set(xlabel="minute", ylabel="ms", title=f"latency ({r['errors']} errors)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
