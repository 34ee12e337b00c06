"""Fairness under long prompts on the embedded engine: p95 latency of short requests (max_tokens 8, 8 concurrent
clients) while agents' 6,000-token prompts are being processed, against the same clients with no long prompts,
side by side in one run (issue 30; goal: at most 2x).

Arms, interleaved in rounds so a busy machine's load falls on all of them alike:
  base     short clients only
  chunked  short clients + long-prompt clients, chunked prefill (the default: --prefill-chunk 512, share 0.5)
  whole    short clients + long-prompt clients, whole-prompt prefill (--prefill-chunk 0, the behaviour before)
Everything goes through HTTP: the gateway behind reef_lab's own server (server/httpd.py, as scripts/serve.py runs
it) in this process, SmolLM2-135M-Instruct on CPU, one engine per prefill setting on the same weights. Between
phases the engine is left to drain, so a prompt started in one phase never lands in the next one's numbers.

    .venv/bin/python scripts/bench/bench_long_prompts.py   # results/agents-fairness.{md,png}, data/*.json
    .venv/bin/python scripts/bench/bench_long_prompts.py --phase-s 60 --rounds 1 --arms base,chunked
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from reef_lab.engines.embedded import EmbeddedEngine, default_cache_dir, load_model
from reef_lab.gateway.gateway import Gateway
from scripts.common import ROOT, pyplot
from scripts.command_line import command_line, data_file, repo_path
from server.app import create_app
from server.httpd import Server, listen

ARMS = {"base": None, "chunked": 512, "whole": 0}  # arm -> prefill_chunk of its engine (base uses chunked's)


def log_prompt(tokenizer, tokens: int, seed: int) -> str:
    """About `tokens` tokens of a build log an agent might paste, different for each `seed`."""
    lines = [f"[{seed}:{i}] step {(i * 7 + seed) % 29} of target //pkg{i % 17}:lib finished "
             f"{'ok' if (i + seed) % 9 else 'with 2 warnings'} in {(i * 13 + seed) % 97} ms" for i in range(tokens // 8)]
    ids = tokenizer.encode("\n".join(lines), add_special_tokens=False)[: tokens - 40]
    return tokenizer.decode(ids) + "\n\nWhich step failed first?"


def post(port: int, body: dict, scenario: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json", "x-reef-scenario": scenario})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


class Phase:
    """One arm for `seconds`: short clients in a loop, and long-prompt clients when `long_clients`."""

    def __init__(self, arm: str, port: int, engine: EmbeddedEngine, prompts: list[str], args):
        self.arm, self.port, self.engine, self.prompts, self.args = arm, port, engine, prompts, args
        self.stop = threading.Event()
        self.short: list[dict] = []  # {start, seconds, overlapped}
        self.long: list[dict] = []  # {start, first_token_s, done, seconds} of the long requests prefilled
        self.long_in_flight = 0
        self.lock = threading.Lock()
        self.samples: list[dict] = []

    def short_client(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            body = {"model": "m", "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Client {i}, question {n}: what is {n} plus {i}?"}]}
            with self.lock:
                overlapped = self.long_in_flight > 0  # a long prompt is with the engine as this one arrives
            started = time.perf_counter()
            status, _ = post(self.port, body, "short")
            seconds = time.perf_counter() - started
            if status == 200:  # one that ends after the phase counts too: it started within it
                self.short.append({"start": started, "seconds": seconds, "overlapped": overlapped})
            n += 1

    def long_client(self, i: int) -> None:
        """Streams a long prompt's answer, again and again; at the phase's end it hangs up (the engine drops the
        prompt after its chunk in progress, or, prefilled whole, after the pass)."""
        n = 0
        while not self.stop.is_set():
            body = {"model": "m", "max_tokens": 8, "temperature": 0, "stream": True,
                    "messages": [{"role": "user", "content": self.prompts[(i * 7 + n) % len(self.prompts)]}]}
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
            with self.lock:
                self.long_in_flight += 1
            started = time.perf_counter()
            hang_up = threading.Thread(target=self._hang_up_at_stop, args=(c,), daemon=True)
            try:
                c.request("POST", "/v1/chat/completions", json.dumps(body),
                          {"Content-Type": "application/json", "x-reef-scenario": "long"})
                hang_up.start()
                r = c.getresponse()
                first_token, done = None, False
                while line := r.readline():
                    if first_token is None and b'"delta":{"content"' in line:
                        first_token = time.perf_counter() - started  # the prompt is prefilled
                    done = done or line.startswith(b"data: [DONE]")
            except (OSError, http.client.HTTPException):
                done = False
            finally:
                with self.lock:
                    self.long_in_flight -= 1
                c.close()
            if first_token is not None:
                self.long.append({"start": started, "first_token_s": first_token, "done": done,
                                  "seconds": time.perf_counter() - started})
            n += 1

    def _hang_up_at_stop(self, c: http.client.HTTPConnection) -> None:
        self.stop.wait()
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass

    def run(self) -> dict:
        longs = [threading.Thread(target=self.long_client, args=(i,), daemon=True)
                 for i in range(self.args.long_clients if self.arm != "base" else 0)]
        for t in longs:
            t.start()
        if longs:  # the shorts start once the long prompts are with the engine
            while self.long_in_flight < len(longs):
                time.sleep(0.05)
            time.sleep(1.0)
        shorts = [threading.Thread(target=self.short_client, args=(i,), daemon=True)
                  for i in range(self.args.short_clients)]
        self.chunk_tokens = self.engine.info()["prefill_chunk_tokens"]
        started = time.perf_counter()
        for t in shorts:
            t.start()
        while time.perf_counter() - started < self.args.phase_s:
            info = self.engine.info()
            self.samples.append({**{k: info[k] for k in ("active_rows", "prefilling_rows", "queue_depth")},
                                 "long_in_flight": self.long_in_flight})
            time.sleep(1.0)
        self.chunk_tokens = self.engine.info()["prefill_chunk_tokens"] - self.chunk_tokens
        self.stop.set()
        for t in shorts:
            t.join()
        ended = time.perf_counter()
        for t in longs:  # a long request in progress finishes (the engine drains before the next phase)
            t.join()
        return self.summary(started, ended)

    def summary(self, started: float, ended: float) -> dict:
        counted = [s["seconds"] for s in self.short if s["overlapped"] or self.arm == "base"]
        long_done = self.long
        return {"arm": self.arm, "seconds": round(ended - started, 1), "short_requests": len(self.short),
                "short_counted": len(counted), "short_latencies_s": [round(x, 4) for x in counted],
                "p50_s": quantile(counted, 0.5), "p95_s": quantile(counted, 0.95),
                "max_s": round(max(counted), 3) if counted else None,
                "long_requests_done": len(long_done),
                "long_first_token_s": [round(r["first_token_s"], 1) for r in long_done],
                "chunked_prefill_tokens_per_s": round(self.chunk_tokens / self.args.phase_s, 1),
                "long_in_flight_share": round(sum(1 for s in self.samples if s["long_in_flight"]) /
                                              max(1, len(self.samples)), 3),
                "prefilling_share": round(sum(1 for s in self.samples if s["prefilling_rows"]) /
                                          max(1, len(self.samples)), 3)}


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 4)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1], 4)


def drain(engine: EmbeddedEngine, timeout: float = 1800) -> float:
    started = time.perf_counter()
    while True:
        info = engine.info()
        if not info["active_rows"] and not info["queue_depth"]:
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"the engine did not drain in {timeout} s: {info}")
        time.sleep(0.2)


def serve(engine: EmbeddedEngine, data_dir: Path) -> tuple[Server, int, Gateway]:
    gateway = Gateway(data_dir, engine)
    sock = listen("127.0.0.1", 0)
    server = Server(create_app(gateway), sock)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, sock.getsockname()[1], gateway


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="base,chunked,whole", help="comma-separated: base, chunked, whole")
    parser.add_argument("--rounds", type=int, default=2, help="times each arm runs, interleaved")
    parser.add_argument("--phase-s", type=float, default=75.0, help="seconds the short clients run per phase")
    parser.add_argument("--short-clients", type=int, default=8, help="clients sending max_tokens 8 in a loop")
    parser.add_argument("--long-clients", type=int, default=1, help="clients sending long prompts in a loop")
    parser.add_argument("--long-tokens", type=int, default=6000, help="tokens of each long prompt")
    parser.add_argument("--prefill-share", type=float, default=0.5, help="the chunked arm's --prefill-share")
    parser.add_argument("--model-path", default=None, help="HF folder or .gguf; default: the embedded SmolLM2")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "agents-fairness",
                        help="writes OUT.json, OUT.png and OUT.md")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(ARMS):
        parser.error(f"unknown arms {sorted(unknown)}; known: {sorted(ARMS)}")

    model, tokenizer, name = load_model(args.model_path, default_cache_dir())
    prompts = [log_prompt(tokenizer, args.long_tokens, seed) for seed in range(4)]
    engines = {"chunked": EmbeddedEngine(model, tokenizer, name, prefill_chunk=512,
                                         prefill_share=args.prefill_share),
               "whole": EmbeddedEngine(model, tokenizer, name, prefill_chunk=0)}
    prompt_tokens = engines["chunked"].count_tokens([{"role": "user", "content": prompts[0]}])
    tmp = Path(tempfile.mkdtemp(prefix="bench-long-prompts-"))
    servers = {k: serve(e, tmp / k) for k, e in engines.items()}
    began = time.perf_counter()
    phases = []
    try:
        for key, (server, port, _) in servers.items():  # warm-up, not measured: first calls pay lazy set-up
            warm = [threading.Thread(target=post, args=(port, {"model": "m", "max_tokens": 8, "messages": [
                {"role": "user", "content": f"warm-up {i}"}]}, "w")) for i in range(args.short_clients)]
            warm.append(threading.Thread(target=post, args=(port, {"model": "m", "max_tokens": 2, "messages": [
                {"role": "user", "content": prompts[0][: len(prompts[0]) // 8]}]}, "w")))
            for t in warm:
                t.start()
            for t in warm:
                t.join()
        for r in range(args.rounds):
            for arm in arms:
                key = "chunked" if arm == "base" else arm
                server, port, _ = servers[key]
                post(port, {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}, "w")
                phase = Phase(arm, port, engines[key], prompts, args).run()
                phase["round"], phase["drain_s"] = r, round(drain(engines[key]), 1)
                phases.append(phase)
                print(f"round {r} {arm:8s} p50 {phase['p50_s']} s  p95 {phase['p95_s']} s  "
                      f"({phase['short_counted']} short requests; {phase['long_requests_done']} long done; "
                      f"drained in {phase['drain_s']} s)", flush=True)
    finally:
        for server, _, gateway in servers.values():
            server.stop(grace=5)
            gateway.close(close_engine=False)
        for engine in engines.values():
            engine.close()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, arms, phases, name, prompt_tokens, time.perf_counter() - began, os.cpu_count())


def report(args, arms, phases, model_name: str, prompt_tokens: int, wall_s: float, cpus: int | None) -> None:
    by_arm = {a: [p for p in phases if p["arm"] == a] for a in arms}
    pooled = {a: quantile([x for p in ps for x in p["short_latencies_s"]], 0.95) for a, ps in by_arm.items()}
    p50 = {a: quantile([x for p in ps for x in p["short_latencies_s"]], 0.5) for a, ps in by_arm.items()}
    ratios = {}  # per round: arm p95 / base p95 of the same round, then the pooled ratio
    if "base" in by_arm:
        for a in arms:
            if a != "base":
                per_round = [round(p["p95_s"] / b["p95_s"], 2) for p, b in zip(by_arm[a], by_arm["base"])
                             if p["p95_s"] and b["p95_s"]]
                ratios[a] = {"per_round": per_round,
                             "pooled": round(pooled[a] / pooled["base"], 2) if pooled[a] and pooled["base"] else None}
    result = {"command": command_line(), "written": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "cpus": cpus, "load_avg_at_end": os.getloadavg(), "wall_s": round(wall_s, 1),
              "model": f"{model_name} (fp32, CPU)", "long_prompt_tokens": prompt_tokens,
              "settings": vars(args) | {"out": repo_path(args.out)}, "p95_s": pooled, "p50_s": p50,
              "ratio_to_base": ratios, "phases": phases}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    data_file(args.out).write_text(json.dumps(result, indent=1))
    plot(args.out.with_suffix(".png"), arms, by_arm)
    args.out.with_suffix(".md").write_text(markdown(result, arms, by_arm))
    print(json.dumps({k: result[k] for k in ("p95_s", "p50_s", "ratio_to_base", "wall_s")}, indent=1))


def markdown(result: dict, arms, by_arm) -> str:
    s = result["settings"]
    lines = [
        "# Short requests beside agents' long prompts on the embedded engine", "",
        f"Command: `{result['command']}`, written {result['written']} on {result['cpus']} CPUs (load average at the "
        f"end {', '.join(f'{x:.1f}' for x in result['load_avg_at_end'])}), {result['wall_s'] / 60:.0f} min. "
        f"{result['model']}; {s['short_clients']} clients send chat requests with max_tokens 8 in a loop; in the "
        f"long arms {s['long_clients']} client(s) stream {result['long_prompt_tokens']}-token prompts (max_tokens 8) "
        f"in a loop. Arms interleave in {s['rounds']} rounds of {s['phase_s']:.0f} s phases; a short request counts "
        "when a long prompt was with the engine as it arrived (every one in `base`).", "",
        f"![latency]({Path(s['out']).name}.png)", "",
        "| arm | prefill | short requests | p50 s | p95 s | max s | p95 / base p95 (pooled; per round) | long prompts "
        "prefilled (s to the first token) |", "|---|---|---|---|---|---|---|---|"]
    prefill = {"base": "no long prompts", "chunked": f"chunks of <= 512, share {s['prefill_share']}",
               "whole": "whole prompt in one pass (before)"}
    for a in arms:
        lat = [x for p in by_arm[a] for x in p["short_latencies_s"]]
        ratio = result["ratio_to_base"].get(a)
        shown = f"**{ratio['pooled']}**; {', '.join(map(str, ratio['per_round']))}" if ratio else "1"
        longs = [x for p in by_arm[a] for x in p["long_first_token_s"]]
        lines.append(f"| {a} | {prefill[a]} | {len(lat)} | {result['p50_s'][a]} | {result['p95_s'][a]} | "
                     f"{max(lat) if lat else '-'} | {shown} | {len(longs)} ({', '.join(f'{x:.0f}' for x in longs)}) |")
    lines += ["", "Per phase, in the order run:", "", "| round | arm | short requests | p50 s | p95 s | long prompts "
              "prefilled | chunked prefill tokens/s | share of samples with a long prompt in flight / being prefilled "
              "in chunks | drained in s |", "|---|---|---|---|---|---|---|---|---|"]
    for p in result["phases"]:
        lines.append(f"| {p['round']} | {p['arm']} | {p['short_counted']} | {p['p50_s']} | {p['p95_s']} | "
                     f"{p['long_requests_done']} | {p['chunked_prefill_tokens_per_s']} | {p['long_in_flight_share']} / "
                     f"{p['prefilling_share']} | {p['drain_s']} |")
    return "\n".join(lines) + "\n"


def plot(path: Path, arms, by_arm) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for a in arms:
        xs = sorted(x for p in by_arm[a] for x in p["short_latencies_s"])
        if xs:
            right.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=a)
        left.scatter([a] * len(by_arm[a]), [p["p95_s"] for p in by_arm[a]], s=40)
    left.set_ylabel("p95 latency of a max_tokens=8 request (s)")
    left.set_title("p95 per phase")
    left.set_yscale("log")
    right.set_xscale("log")
    right.set_xlabel("latency (s)")
    right.set_ylabel("share of requests")
    right.set_title("short requests' latency (all phases)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
