"""A seeded HTTP fuzzer for the gateway: every route, well-formed and hostile requests, over real sockets.

Why: the server must answer every request a client can send with a 2xx or a 4xx that names the problem, never a
5xx, and never leave a connection hanging; after any amount of garbage a well-formed request must still work.
Hand-written tests cover the refusals someone thought of; this generator covers the rest (wrong JSON types in
every field, missing and unknown fields, huge strings, deep nesting, invalid UTF-8, truncated and non-JSON bodies,
wrong media types, odd scenario names, record ids and query parameters, unknown routes, wrong methods, NaN
literals, references to unknown receipts or to other scenarios' receipts, harness trees with bad paths, recipe
names that would run code) and checks the answers.

- `generate(seed, n)` -> n `FuzzCase`s, the same list for the same seed (`random.Random(seed)`). Bodies are raw
  bytes; a body or path may hold placeholders (`@@R:<scenario>:<k>@@`, `@@P:<scenario>:<k>@@`) that `run`
  replaces with the k-th newest inference receipt (report id) the server handed out for that scenario, so
  reports and record lookups can name real records. Content-Length mismatches are not generated here.
- `run(base_url, cases, timeout=15)` sends each case over plain sockets (bytes and headers exactly as given,
  keep-alive reused and reopened every few requests so every worker takes traffic) and returns a `FuzzReport`:
  statuses, 5xx answers (label and body excerpt), held connections (no answer within `timeout`), connections
  closed or reset without an answer, and answers outside a case's `expect`ed statuses.
- `stalled_body(host, port, declared, sent, wait)` checks one thing apart: a request that declares a body and
  stops sending it; the server should answer 408 within its body read timeout.

Run it against a server of your own:

    .venv/bin/python -m reef_lab.testing.fuzz --url http://127.0.0.1:8900 --seed 0 -n 2000

tests/test_fuzz.py runs it against `scripts/serve.py --workers 2` relaying to the stub provider (a small count by
default; `-m slow` for 10,000 requests).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import select
import socket
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

SCENARIOS = ("fz-a", "fz-b", "fz-c")
RECEIPT_HEADER = "x-reef-agent-record-id"
BIG_BODY = 11 << 20  # over the 10 MB default body limit
MAX_EXCERPT = 300


@dataclass
class FuzzCase:
    method: str
    path: str  # the request target as sent (percent-encoded; may hold placeholders)
    headers: list[tuple[str, str | bytes]]
    body: bytes | None
    label: str  # "<route>/<mutation>[:detail]"
    expect: frozenset[int] | None = None  # the statuses this case must get (None: any non-5xx)
    chunked: bool = False  # send the body with Transfer-Encoding: chunked instead of Content-Length


@dataclass
class Outcome:
    index: int
    label: str
    method: str
    path: str
    status: int | None
    seconds: float
    excerpt: str
    problem: str | None = None  # "5xx", "held", "reset", "expect"


@dataclass
class FuzzReport:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def statuses(self) -> Counter:
        return Counter(o.status for o in self.outcomes)

    def _with(self, problem: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.problem == problem]

    @property
    def server_errors(self) -> list[Outcome]:
        return self._with("5xx")

    @property
    def held(self) -> list[Outcome]:
        return self._with("held")

    @property
    def resets(self) -> list[Outcome]:
        return self._with("reset")

    @property
    def unexpected(self) -> list[Outcome]:
        return self._with("expect")

    def by_label(self, prefix: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.label.startswith(prefix)]

    def summary(self, limit: int = 60) -> str:
        lines = [f"{len(self.outcomes)} requests; statuses: "
                 + ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items(), key=lambda kv: str(kv[0])))]
        slow = max(self.outcomes, key=lambda o: o.seconds, default=None)
        if slow is not None:
            lines.append(f"slowest: {slow.seconds:.2f} s  #{slow.index} {slow.label} {slow.method} {slow.path[:80]}")
        for name, items in (("5xx", self.server_errors), ("held connections", self.held),
                            ("closed/reset without an answer", self.resets),
                            ("unexpected status", self.unexpected)):
            if not items:
                continue
            distinct: dict[tuple, list[Outcome]] = {}
            for o in items:  # group by cause: label family, route, status and the message's shape
                key = (o.label.split(":", 1)[0], o.method, _route_of(o.path), o.status,
                       re.sub(r"rec_[0-9a-f]+|\d+", "#", o.excerpt)[:120])
                distinct.setdefault(key, []).append(o)
            lines.append(f"{name}: {len(items)} ({len(distinct)} distinct)")
            for (_, method, route, status, _), group in list(distinct.items())[:limit]:
                o = group[0]
                lines.append(f"  [{status}] x{len(group)} #{o.index} {o.label} {method} {route} "
                             f"({o.seconds:.2f} s): {o.excerpt[:MAX_EXCERPT]}")
        return "\n".join(lines)


def _route_of(path: str) -> str:
    p = path.split("?", 1)[0]
    if not p.startswith("/reef/scenarios/"):
        return p
    p = re.sub(r"^/reef/scenarios/[^/]+", "/reef/scenarios/{s}", p)
    return re.sub(r"/records/[^/]+$", "/records/{id}", p)


# ---- JSON text with raw parts -----------------------------------------------------------------------------------
class Raw(bytes):
    """JSON text put into a body as it is (NaN, 1e999, huge integers, deep nesting, bad escapes)."""


def dump(obj, ascii_only: bool = False) -> bytes:
    if isinstance(obj, Raw):
        return bytes(obj)
    if isinstance(obj, dict):
        return b"{" + b",".join(dump(str(k), ascii_only) + b":" + dump(v, ascii_only) for k, v in obj.items()) + b"}"
    if isinstance(obj, (list, tuple)):
        return b"[" + b",".join(dump(v, ascii_only) for v in obj) + b"]"
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def nest(depth: int, leaf: bytes = b"1", kind: str = "list") -> Raw:
    """`depth` levels of arrays (or objects) around `leaf`."""
    if kind == "list":
        return Raw(b"[" * depth + leaf + b"]" * depth)
    return Raw(b'{"a":' * depth + leaf + b"}" * depth)


_WORDS = ("alpha", "beta", "gamma", "reef", "coral", "tide", "kelp", "wave", "sand", "shell", "blue", "deep",
          "café", "naïve", "漢字", "🙂", "—", "x", "0", "42")


def text(rng: random.Random, lo: int = 1, hi: int = 8) -> str:
    """Plain words; never the stub provider's '!' markers (which fail on purpose)."""
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def odd_values(rng: random.Random) -> list:
    """Values of every JSON type, and some that are not quite JSON."""
    return [0, -1, 1.5, -0.0, 1e308, True, False, None, "", "x", text(rng), "\u0000", "é漢🙂", [], [1], [None],
            ["a", 2], {}, {"a": 1}, {"": None}, "x" * rng.choice((1000, 5000)),
            Raw(b"9223372036854775808"), Raw(b"-99999999999999999999999999"), Raw(b"1e999"), Raw(b"NaN"),
            Raw(b"Infinity"), Raw(b"-Infinity"), Raw(b'"\\ud800"'), Raw(b'"\\udfff x"'), Raw(b"01"),
            nest(rng.choice((3, 20, 50))), nest(rng.choice((3, 20)), kind="obj")]


# ---- well-formed bodies -------------------------------------------------------------------------------------------
def _msgs(rng):
    out = [{"role": "user", "content": text(rng)}]
    if rng.random() < 0.3:
        out = [{"role": "user", "content": text(rng)}, {"role": "assistant", "content": text(rng)}] + out
    return out


def chat_body(rng, stream=False):
    b = {"model": "m", "messages": _msgs(rng)}
    if rng.random() < 0.3:
        b["messages"].insert(0, {"role": "system", "content": text(rng)})
    if rng.random() < 0.3:
        b["max_tokens"] = rng.randint(1, 64)
    if rng.random() < 0.2:
        b["temperature"] = rng.random()
    if stream:
        b["stream"] = True
    return b


def responses_body(rng, stream=False):
    b = {"model": "m", "input": text(rng) if rng.random() < 0.6 else [{"role": "user", "content": text(rng)}]}
    if rng.random() < 0.3:
        b["instructions"] = text(rng)
    if stream:
        b["stream"] = True
    return b


def messages_body(rng, stream=False):
    b = {"model": "m", "max_tokens": rng.randint(1, 64), "messages": _msgs(rng)}
    if rng.random() < 0.3:
        b["system"] = text(rng) if rng.random() < 0.5 else [{"type": "text", "text": text(rng)}]
    if stream:
        b["stream"] = True
    return b


def report_body(rng, scen, i):
    b: dict = {"score": round(rng.uniform(-1, 1), 3)}
    if rng.random() < 0.7:
        b["references"] = [f"@@R:{scen}:{k}@@" for k in range(rng.choice((1, 1, 2)))]
    if rng.random() < 0.4:
        b["feedback"] = text(rng) if rng.random() < 0.5 else {"note": text(rng), "ok": True}
    if rng.random() < 0.3:
        b["metadata"] = {"run": i, "who": text(rng, 1, 2)}
    if rng.random() < 0.2:
        b["agent_record_id"] = f"fz-rep-{i}"
    return b


def record_item(rng, scen, i):
    item: dict = {"scenario": scen, "kind": "inference", "dialect": "openai.chat",
                  "request": {"model": "m", "messages": _msgs(rng)},
                  "response": {"choices": [{"message": {"role": "assistant", "content": text(rng)}}]}}
    if rng.random() < 0.5:
        item["id"] = f"fz-imp-{i}-{rng.randrange(1000)}"
    if rng.random() < 0.3:
        item["tags"] = {"src": "fuzz"}
    if rng.random() < 0.3:
        item["created_at"] = 1.7e9 + rng.random() * 1e7
    return item


# ---- the generator ------------------------------------------------------------------------------------------------
JSON_CT = ("Content-Type", "application/json")
INFERENCE = {"chat": ("/v1/chat/completions", chat_body), "responses": ("/v1/responses", responses_body),
             "messages": ("/v1/messages", messages_body)}
# route patterns and the methods they take (for wrong-method cases)
METHODS = {"/v1/chat/completions": {"POST"}, "/v1/responses": {"POST"}, "/v1/messages": {"POST"},
           "/v1/messages/count_tokens": {"POST"}, "/v1/models": {"GET"}, "/reef/report": {"POST"},
           "/reef/scenarios": {"GET", "POST"}, "/reef/scenarios/fz-a": {"GET", "DELETE"},
           "/reef/scenarios/fz-a/records": {"GET"}, "/reef/records/batch": {"POST"}, "/reef/status": {"GET"},
           "/reef/train": {"POST"}, "/reef/scenarios/fz-a/releases": {"GET"},
           "/reef/scenarios/fz-a/rollback": {"POST"}, "/reef/scenarios/fz-a/promote": {"POST"},
           "/reef/harness": {"GET"}, "/reef/scenarios/fz-a/harness": {"POST"}}
BAD_MEDIA = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml",
             "json", "application/jsonx", "text/json", None)
GOOD_MEDIA = ("application/json; charset=utf-8", "APPLICATION/JSON", "application/vnd.api+json", "application/json ")
ODD_NAMES = ("", "-a", ".a", "_a", "a b", "a/b", "..", ".", "café", "漢字", "a" * 129, "a" * 128, "a\tb", "A.b_c-1",
             "%2F", "a%00b", "fz-a;b", "null", "0", " fz-a")
ODD_IDS = ("rec_nope", "..", "...", "rec_" + "0" * 300, "%2e%2e%2fscenarios.json", "%00", "%ff", "caf%C3%A9",
           "a%2Fb", "rec_%0A", "@@R:fz-b:0@@", "@@P:fz-a:0@@", "x" * 2000, "-1", "0")
EDGE_NUMBERS = [("token_ids", b"9223372036854775808"), ("prompt_token_ids", b"18446744073709551615"),
                ("created_at", b"1e308"), ("token_ids", b"9223372036854775807"), ("logprobs", b"-1e308"),
                ("score", b"5e-324"), ("token_ids", b"18446744073709551616"), ("created_at", b"253402300800"),
                ("prompt_token_ids", b"4294967296"), ("score", b"-0.0"), ("logprobs", b"1e-400")]
BAD_HARNESS_PATHS = ("a" * 300, "a\u0000b", "..", "../x.md", "/abs.md", "a/../b.md", "./a.md", "a//b.md", "a\\b.md",
                     "", "README.md", "reef_checkpoint.json", "/".join("d" * 9) + ".md", "\t.md", "a\nb.md",
                     "é" * 101, "x" * 201 + "/y.md", "skills/" + "s" * 250 + ".md", "\u202e.md", "con\u0000")


class _Gen:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.created: list[str] = []  # scenario names this run creates with POST /reef/scenarios
        self.i = 0

    # helpers
    def scen(self) -> str:
        r = self.rng.random()
        if r < 0.85 or not self.created:
            return self.rng.choice(SCENARIOS)
        return self.rng.choice(self.created)

    def headers(self, scen: str | None, ct: str | None = "application/json", extra=()) -> list:
        h: list = []
        if ct is not None:
            h.append(("Content-Type", ct))
        if scen is not None:
            h.append(("x-reef-scenario", scen))
        if self.rng.random() < 0.15:
            h.append((f"x-reef-tag-{self.rng.choice(('user', 'run', 'a_b', 'X-Up'))}", text(self.rng, 1, 2)))
        h.extend(extra)
        return h

    def case(self, method, path, headers, body, label, expect=None, chunked=False) -> FuzzCase:
        if isinstance(body, (dict, list, Raw)) or body is not None and not isinstance(body, bytes):
            body = dump(body, ascii_only=self.rng.random() < 0.3)
        return FuzzCase(method, path, headers, body, label, frozenset(expect) if expect else None, chunked)

    def valid_any(self) -> FuzzCase:
        rng, i = self.rng, self.i
        s = self.scen()
        k = rng.random()
        if k < 0.45:
            name = rng.choice(list(INFERENCE))
            path, make = INFERENCE[name]
            stream = rng.random() < 0.3
            label = f"{name}/valid-stream" if stream else f"{name}/valid"
            return self.case("POST", path, self.headers(s), make(rng, stream), label)
        if k < 0.6:
            return self.case("POST", "/reef/report", self.headers(s), report_body(rng, s, i), "report/valid")
        choices = [
            lambda: self.case("POST", "/v1/messages/count_tokens", self.headers(None),
                              {"model": "m", "messages": _msgs(rng)}, "count_tokens/valid"),
            lambda: self.case("GET", "/v1/models", self.headers(None, None), None, "models/valid"),
            lambda: self.case("GET", "/reef/scenarios", self.headers(None, None), None, "scenarios/list"),
            lambda: self.create_scenario(),
            lambda: self.case("GET", f"/reef/scenarios/{s}", self.headers(None, None), None, "scenario/get"),
            lambda: self.case("GET", f"/reef/scenarios/{s}/records?" + urllib.parse.urlencode(
                {"kind": rng.choice(("inference", "report", "train")), "limit": rng.randint(1, 1000)}),
                self.headers(None, None), None, "records/list"),
            lambda: self.case("GET", f"/reef/scenarios/{s}/records?limit=2&after=@@R:{s}:3@@",
                              self.headers(None, None), None, "records/list-after"),
            lambda: self.case("GET", f"/reef/scenarios/{s}/records/@@R:{s}:0@@", self.headers(None, None), None,
                              "record/get"),
            lambda: self.case("POST", "/reef/records/batch", self.headers(s),
                              {"records": [record_item(rng, s, i) for _ in range(rng.randint(1, 5))]}, "batch/valid"),
            lambda: self.case("GET", "/reef/status", self.headers(None, None), None, "status/valid"),
            lambda: self.case("GET", "/healthz", [], None, "healthz/valid", {200}),
            lambda: self.case("POST", "/reef/train", self.headers(None), {"scenario": s}, "train/valid"),
            lambda: self.case("GET", f"/reef/scenarios/{s}/releases", self.headers(None, None), None, "releases/get"),
            lambda: self.case("POST", f"/reef/scenarios/{s}/rollback", self.headers(None),
                              {"release_id": rng.choice(("base", "v1", f"{s}:v1", "v2"))}, "rollback/valid"),
            lambda: self.case("POST", f"/reef/scenarios/{s}/promote", self.headers(None), {"candidate": "c1"},
                              "promote/valid"),
            lambda: self.case("GET", "/reef/harness" + rng.choice(("", "?release_id=v1")), self.headers(s, None),
                              None, "harness/get"),
            lambda: self.case("POST", f"/reef/scenarios/{s}/harness", self.headers(None),
                              {"files": {"system_prompt.md": text(rng), "rules.md": text(rng),
                                         f"skills/{rng.choice(('a', 'b'))}.md": text(rng)}}, "harness/publish"),
        ]
        if rng.random() < 0.05 and self.created:
            victim = self.created.pop(rng.randrange(len(self.created)))
            return self.case("DELETE", f"/reef/scenarios/{victim}", self.headers(None, None), None, "scenario/delete")
        if rng.random() < 0.01:
            return self.case("DELETE", f"/reef/scenarios/{rng.choice(SCENARIOS[1:])}", self.headers(None, None), None,
                             "scenario/delete-busy")
        return rng.choice(choices)()

    def create_scenario(self) -> FuzzCase:
        name = f"fzs-{self.i}"
        self.created.append(name)
        body: dict = {"name": name}
        if self.rng.random() < 0.5:
            body["recipe"] = self.rng.choice(("basic", "basic", "gepa", "sft", "grpo"))
        if self.rng.random() < 0.2:
            body["config"] = {"require_score": self.rng.random() < 0.5}
        return self.case("POST", "/reef/scenarios", self.headers(None), body, "scenarios/create")

    def popen(self) -> FuzzCase:
        spec = self.rng.choice(("subprocess:Popen", "subprocess:Popen", "os:system", "builtins:eval",
                                "recipes.basic:Recipe", "../recipes/basic", "recipes.basic.recipe:BasicRecipe",
                                "subprocess", "pickle:loads"))
        body: dict = {"name": f"fzx-{self.i}", "recipe": spec}
        if self.rng.random() < 0.6:
            body["config"] = {"args": ["touch", f"/tmp/reef-fuzz-pwned-{self.i}"]}
        return self.case("POST", "/reef/scenarios", self.headers(None), body, f"scenarios/recipe-code:{spec}", {400})

    # a valid request of a JSON-bodied POST route, as (path, headers-scenario, body object, route name)
    def post_template(self):
        rng, s, i = self.rng, self.scen(), self.i
        name = rng.choice(("chat", "chat", "responses", "messages", "count_tokens", "report", "report", "scenarios",
                           "batch", "train", "rollback", "promote", "harness"))
        if name in INFERENCE:
            path, make = INFERENCE[name]
            return name, path, s, make(rng, rng.random() < 0.3)
        return {
            "count_tokens": lambda: ("count_tokens", "/v1/messages/count_tokens", None,
                                     {"model": "m", "messages": _msgs(rng)}),
            "report": lambda: ("report", "/reef/report", s, report_body(rng, s, i) | {"score": 0.5}),
            "scenarios": lambda: ("scenarios", "/reef/scenarios", None, {"name": f"fzm-{i}", "recipe": "basic",
                                                                         "config": {}}),
            "batch": lambda: ("batch", "/reef/records/batch", s, {"records": [record_item(rng, s, i)]}),
            "train": lambda: ("train", "/reef/train", None, {"scenario": s}),
            "rollback": lambda: ("rollback", f"/reef/scenarios/{s}/rollback", None, {"release_id": "base"}),
            "promote": lambda: ("promote", f"/reef/scenarios/{s}/promote", None, {"candidate": "c1"}),
            "harness": lambda: ("harness", f"/reef/scenarios/{s}/harness", None,
                                {"files": {"system_prompt.md": text(rng)}}),
        }[name]()

    def mutate_field(self) -> FuzzCase:
        """Wrong type, missing, or nested deep, at any field of a valid body (nested ones included)."""
        rng = self.rng
        name, path, s, body = self.post_template()
        spots = list(_spots(body))
        spot = rng.choice(spots)
        how = rng.choice(("type", "type", "type", "missing", "deep", "huge"))
        value: object
        if how == "type":
            value = rng.choice(odd_values(rng))
        elif how == "deep":
            depth = rng.choice((50, 62, 65, 100, 255, 1000))
            value = nest(depth, kind=rng.choice(("list", "obj")))
        else:
            value = "y" * rng.choice((20_000, 100_000, 190_000)) if how == "huge" else _MISSING
        body = _set(body, spot, value)
        expect = None
        if how == "deep" and depth + 1 > 64:
            expect = {400}  # deeper than the server's 64 levels whatever field it sits in
        elif isinstance(value, Raw) and bytes(value) in (b"NaN", b"Infinity", b"-Infinity"):
            expect = {400}  # not JSON
        shown = "/".join(map(str, spot))
        return self.case("POST", path, self.headers(s), body, f"{name}/{how}:{shown}", expect)

    def unknown_field(self) -> FuzzCase:
        name, path, s, body = self.post_template()
        body = dict(body)
        body[self.rng.choice(("zzz", "__proto__", "", "Score", "références", "x" * 300))] = \
            self.rng.choice(odd_values(self.rng))
        strict = name in ("report", "scenarios")  # the routes that refuse unknown fields
        return self.case("POST", path, self.headers(s), body, f"{name}/unknown-field", {400} if strict else None)

    def bad_bytes(self) -> FuzzCase:
        """Bodies that are not JSON: truncated, invalid UTF-8, random bytes, other formats, empty."""
        rng = self.rng
        name, path, s, body = self.post_template()
        raw = dump(body)
        how = rng.choice(("truncated", "truncated", "utf8", "utf8", "garbage", "form", "xml", "empty-object-ish",
                          "trailing", "bom", "two-docs", "empty"))
        if how == "truncated":
            raw = raw[: rng.randrange(1, len(raw))]
        elif how == "utf8":
            pos = raw.rfind(b'"', 0, len(raw) - 2)
            bad = rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf", b"\x80abc"))
            raw = raw[:pos] + bad + raw[pos:] if pos > 0 else bad + raw
        elif how == "garbage":
            raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 400)))
        elif how == "form":
            raw = b"model=m&messages=hi&score=1"
        elif how == "xml":
            raw = b"<?xml version='1.0'?><messages><m>hi</m></messages>"
        elif how == "empty-object-ish":
            raw = rng.choice((b"{", b"}", b"[", b"{]", b'{"a"}', b"{'a': 1}", b"{a:1}", b"nul", b"tru", b'"'))
        elif how == "trailing":
            raw = raw + rng.choice((b",", b"}", b" x", b"\x00"))
        elif how == "bom":
            raw = b"\xef\xbb\xbf" + raw
        elif how == "two-docs":
            raw = raw + b"\n" + raw
        else:
            raw = b""
        expect = {400} if raw else None  # an empty body: 400 from most routes, 202/409 for train
        return self.case("POST", path, self.headers(s), raw, f"{name}/not-json:{how}", expect,
                         chunked=rng.random() < 0.1 and bool(raw))

    def media_type(self) -> FuzzCase:
        rng = self.rng
        name, path, s, body = self.post_template()
        if rng.random() < 0.7:
            ct = rng.choice(BAD_MEDIA)
            return self.case("POST", path, self.headers(s, ct), body, f"{name}/media:{ct}", {415})
        ct = rng.choice(GOOD_MEDIA)
        return self.case("POST", path, self.headers(s, ct), body, f"{name}/media-ok:{ct.strip()}")

    def scenario_name(self) -> FuzzCase:
        rng = self.rng
        odd = rng.choice(ODD_NAMES)
        where = rng.choice(("header", "header", "path", "create", "train-body", "import"))
        if where == "header":
            name = rng.choice(list(INFERENCE) + ["report"])
            path, body = ("/reef/report", {"score": 1}) if name == "report" else \
                (INFERENCE[name][0], INFERENCE[name][1](rng))
            hv: str | bytes = odd.encode("utf-8") if rng.random() < 0.7 else odd.encode("latin-1", "replace")
            ok = bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", odd.strip(" \t")))
            return self.case("POST", path, self.headers(None, extra=[("x-reef-scenario", hv)]), body,
                             f"{name}/odd-scenario-header", None if ok else {400})
        if where == "path":
            seg = urllib.parse.quote(odd, safe=rng.choice(("", "/", "%")))
            tail = rng.choice(("", "/records", "/records?limit=1", "/releases", "/records/rec_x"))
            method = rng.choice(("GET", "GET", "DELETE"))
            if not seg:
                return self.case(method, f"/reef/scenarios/{tail.lstrip('/')}", self.headers(None, None), None,
                                 "scenario/empty-segment")
            return self.case(method if not tail else "GET", f"/reef/scenarios/{seg}{tail}",
                             self.headers(None, None), None, "scenario/odd-name-path")
        if where == "create":
            ok = bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", odd))
            return self.case("POST", "/reef/scenarios", self.headers(None), {"name": odd},
                             "scenarios/create-odd-name", None if ok else {400, 409} if odd in SCENARIOS else {400})
        if where == "train-body":
            return self.case("POST", "/reef/train", self.headers(None), {"scenario": odd}, "train/odd-name")
        return self.case("POST", "/reef/records/batch", self.headers(None),
                         {"records": [record_item(rng, "x", self.i) | {"scenario": odd}]}, "batch/odd-scenario")

    def record_and_query(self) -> FuzzCase:
        rng, s = self.rng, self.scen()
        if rng.random() < 0.4:
            rid = rng.choice(ODD_IDS)
            return self.case("GET", f"/reef/scenarios/{s}/records/{rid}", self.headers(None, None), None,
                             "record/odd-id")
        q = rng.choice(("limit=-1", "limit=0", "limit=1001", "limit=abc", "limit=", "limit=1e3", "limit=%20",
                        "limit=99999999999999999999999999", "limit=1&limit=2", "kind=bogus", "kind=",
                        "kind=inference&kind=report", "after=rec_nope", "after=", "after=%00", "after=..%2F",
                        "after=@@P:" + s + ":0@@", "after=@@R:fz-b:0@@", "release_id=v1", "%zz=1", "a=%ff",
                        "limit=%D9%A3", "limit=+5", "limit=-0", "limit=0x10", "limit=1_000", "x" * 3000 + "=1"))
        expect = {400} if q in ("limit=-1", "limit=0", "limit=1001", "limit=abc", "limit=", "limit=1e3",
                                "kind=bogus", "limit=0x10", "limit=99999999999999999999999999") else None
        expect = expect and expect | {404}  # 404 first when the scenario was deleted meanwhile
        return self.case("GET", f"/reef/scenarios/{s}/records?{q}", self.headers(None, None), None,
                         f"records/query:{q[:40]}", expect)

    def report_mutation(self) -> FuzzCase:
        rng, s = self.rng, self.scen()
        body: dict = {"score": 0.5, "references": [f"@@R:{s}:0@@"]}
        how = rng.choice(("score", "score", "refs", "refs", "refs", "feedback", "metadata", "id", "none",
                          "repeat-id"))
        expect: set | None = {400}
        if how == "score":
            v = rng.choice((Raw(b"NaN"), Raw(b"Infinity"), Raw(b"-Infinity"), Raw(b"1e999"), "1", "0.5", True,
                            False, [1], {"v": 1}, "", Raw(b"-1e309")))
            body["score"] = v
            label = f"score={bytes(v).decode() if isinstance(v, Raw) else json.dumps(v)}"
        elif how == "refs":
            v = rng.choice(([f"@@R:{rng.choice(SCENARIOS)}:0@@", "rec_nope"], ["@@R:fz-b:0@@"], ["rec_nope"],
                            [f"@@R:{s}:0@@", f"@@R:{s}:0@@"], [f"@@P:{s}:0@@"], "rec_x", [1], [None], {"a": 1},
                            [f"@@R:{s}:{k}@@" for k in range(rng.choice((50, 500)))], [""], ["x" * 5000]))
            body["references"] = v
            label = "refs"
            if v == ["@@R:fz-b:0@@"] and s == "fz-b" or len(v) in (50, 500):
                expect = None  # may be a valid list of this scenario's receipts
        elif how == "feedback":
            body["feedback"] = rng.choice((1, [1], True, nest(80, b'"x"', "obj"), nest(40, b'"x"', "obj")))
            label = "feedback"
            expect = None if isinstance(body["feedback"], Raw) and len(body["feedback"]) < 400 else {400}
        elif how == "metadata":
            body["metadata"] = rng.choice((1, "m", [1], True, nest(30, kind="obj"), nest(70, kind="obj")))
            label = "metadata"
            expect = None if isinstance(body["metadata"], Raw) and len(body["metadata"]) < 200 else {400}
        elif how == "id":
            body["agent_record_id"] = rng.choice(("", "a b", "x" * 129, 5, ["x"], "../x", "é", "rec_\u0000"))
            body["id"] = rng.choice((body["agent_record_id"], "other"))
            label = "id"
        elif how == "repeat-id":
            body = {"agent_record_id": f"fz-rep-fixed-{rng.randrange(3)}", "score": rng.choice((0.1, 0.2))}
            label, expect = "repeat-id", {200, 409}
        else:
            body = rng.choice(({}, {"references": []}, {"metadata": {}}, [], "x", 1, JNULL))
            label = "no-score-no-feedback"
        return self.case("POST", "/reef/report", self.headers(s), body, f"report/{how}:{label}", expect)

    def inference_mutation(self) -> FuzzCase:
        rng, s = self.rng, self.scen()
        name = rng.choice(list(INFERENCE))
        path, make = INFERENCE[name]
        body = make(rng, rng.random() < 0.3)
        how = rng.choice(("messages", "messages", "content", "role", "stream", "model", "top-level"))
        if how == "messages":
            key = "input" if name == "responses" else "messages"
            body[key] = rng.choice(("hi", 5, {}, None, True, [1, 2], [None], [[]], [{"role": "user"}],
                                    [{"content": "x"}], [], [{"role": "user", "content": None}]))
        elif how == "content":
            key = "input" if name == "responses" else "messages"
            body[key] = [{"role": "user", "content": rng.choice((5, [1], [None], [{"type": "text"}], {"a": 1},
                                                                  [{"type": "text", "text": 5}], True))}]
        elif how == "role":
            body["messages" if name != "responses" else "input"] = [
                {"role": rng.choice((5, None, "", "robot", ["user"], "system")), "content": "x"}]
        elif how == "stream":
            body["stream"] = rng.choice(("yes", 1, [], {}, None, "false", 0))
        elif how == "model":
            body["model"] = rng.choice((5, None, [], {"a": 1}, "", "x" * 10000, nest(50), True))
        else:
            extra = rng.choice(("system", "instructions", "max_tokens", "temperature", "tools", "n", "stop"))
            body[extra] = rng.choice(odd_values(rng))
        return self.case("POST", path, self.headers(s), body, f"{name}/bad-{how}")

    def harness_mutation(self) -> FuzzCase:
        rng, s = self.rng, self.scen()
        how = rng.random()
        if how < 0.6:
            p = rng.choice(BAD_HARNESS_PATHS)
            files = {p: "x"}
            if rng.random() < 0.5:
                files = {"system_prompt.md": "ok", **files}
            label = "bad-path"
        elif how < 0.75:
            files = rng.choice(({"a": "x", "a/b": "y"}, {"skills": "x", "skills/a.md": "y"},
                                {"a/b/c": "x", "a/b": "y"}, {"a/b": "y", "a": "x"}))
            label = "file-beside-folder"
        else:
            files = rng.choice(({"x.md": 1}, {"x.md": None}, {"x.md": ["a"]}, {"x.md": "a\u0000b"},
                                {"x.md": Raw(b'"\\ud800"')}, {}, [], "x", None, 5,
                                {f"f{k}.md": "x" for k in range(201)}))
            label = "bad-content"
        body = {"files": files} if rng.random() < 0.9 else JNULL if files is None else files
        return self.case("POST", f"/reef/scenarios/{s}/harness", self.headers(None), body, f"harness/{label}", {400})

    def batch_mutation(self) -> FuzzCase:
        rng, s, i = self.rng, self.scen(), self.i
        item = record_item(rng, s, i)
        how = rng.choice(("kind", "kind", "ids", "tokens", "logprobs", "created_at", "tags", "refs", "shape", "id",
                          "timing", "score", "dup"))
        expect: set | None = {400}
        if how == "kind":
            item["kind"] = rng.choice(("bogus", 5, None, ["inference"], nest(50), nest(70), nest(255), nest(1000),
                                       {"a": 1}, ""))
            if item["kind"] is None:
                expect = None
        elif how == "ids":
            item["id"] = rng.choice(("", "a b", "x" * 129, 5, ["x"], "../../x", "é", True))
        elif how == "tokens":
            item["token_ids"] = rng.choice(([-1], ["a"], [1.5], [True], 5, [[1]], [2 ** 40, Raw(b"1e3")]))
        elif how == "logprobs":
            item["token_ids"] = [1, 2]
            item["logprobs"] = rng.choice(([0.1], [Raw(b"NaN"), 0.1], ["a", "b"], [True, False], [0.1, 0.2, 0.3], 5))
        elif how == "created_at":
            item["created_at"] = rng.choice((-1, 0, "now", True, Raw(b"1e999"), 1e300, 1e12, 253402300800, 1e20))
            if item["created_at"] in (1e300, 1e12, 253402300800, 1e20):
                expect = None  # positive and finite: taken (and must not break listing or storage)
        elif how == "tags":
            item["tags"] = rng.choice(({"a": 1}, ["a"], "a", {"a": None}, {"a": {"b": "c"}}))
        elif how == "refs":
            item["references"] = rng.choice((["rec_nope"], ["@@R:fz-b:0@@"], "x", [5]))
            item["scenario"] = "fz-a"
        elif how == "shape":
            body = rng.choice(({}, {"records": []}, {"records": {}}, {"records": "x"}, {"records": [1]},
                               {"records": [None]}, [], {"records": [{}] * 10001}, {"records": [[]]}))
            expect = None if body == {"records": [{}] * 10001} else {400}
            return self.case("POST", "/reef/records/batch", self.headers(s), body, "batch/shape", expect)
        elif how == "id":
            item["id"] = "fz-imp-fixed"
            item["request"] = {"n": rng.randrange(3)}  # same id, other content: 409 after the first
            expect = {200, 201, 409}
        elif how == "timing":
            item["timing"] = rng.choice(([1], "x", 5))
        elif how == "score":
            item["score"] = rng.choice(("1", True, Raw(b"NaN"), Raw(b"Infinity"), [1]))
        else:
            item["id"] = f"fz-dup-{i}"
            body = {"records": [item, {**item, "request": {"other": True}}]}
            return self.case("POST", "/reef/records/batch", self.headers(s), body, "batch/dup-in-batch")
        return self.case("POST", "/reef/records/batch", self.headers(s), {"records": [item]}, f"batch/{how}", expect)

    def misc(self) -> FuzzCase:
        rng, s = self.rng, self.scen()
        k = rng.randrange(14)
        if k == 0:
            return self.case("POST", "/reef/train", self.headers(None),
                             rng.choice(({"scenario": 1}, {"scenario": [s]}, {"scenario": None}, {"scenario": {}},
                                         {"scenario": True})), "train/scenario-type", {400})
        if k == 1:
            return self.case("POST", "/reef/train", self.headers(None), rng.choice(([], "x", 5, JNULL, [s])),
                             "train/body-not-object", {400})
        if k == 2:
            return self.case("POST", "/v1/messages/count_tokens", self.headers(None),
                             rng.choice(([], [{"model": "m"}], "x", 5, JNULL, True)), "count_tokens/not-object", {400})
        if k == 3:
            return self.case("POST", "/v1/messages/count_tokens", self.headers(None),
                             {"model": rng.choice(("m", 5)), "messages": rng.choice(("hi", 5, None, [1], {}))},
                             "count_tokens/bad-messages")
        if k == 4:
            return self.case("POST", f"/reef/scenarios/{s}/rollback", self.headers(None),
                             rng.choice(({"release_id": 5}, {"release_id": None}, {}, [], {"release_id": ["v1"]},
                                         {"release_id": "../../etc"}, {"release_id": "v999"},
                                         {"release_id": "fz-b:v1"}, {"release_id": "x" * 5000},
                                         {"release_id": ":"}, {"release_id": ""})), "rollback/bad")
        if k == 5:
            return self.case("POST", f"/reef/scenarios/{s}/promote", self.headers(None),
                             rng.choice(({"candidate": 1}, {"candidate": "../c1"}, {"candidate": "c999"}, {}, [],
                                         {"candidate": None}, {"candidate": "c0"}, {"candidate": ""})), "promote/bad")
        if k == 6:
            q = rng.choice(("", "?release_id=v999", "?release_id=..%2F..", "?release_id=", "?release_id=base",
                            "?release_id=%00", "?release_id=fz-b:v1"))
            hv = rng.choice((s, None, "", "a/b", "é"))
            return self.case("GET", "/reef/harness" + q, self.headers(hv, None), None, "harness/get-odd")
        if k == 7:  # unknown routes
            p = rng.choice(("/v2/chat/completions", "/v1", "/v1/", "/reef", "/reef/", "/reef/scenarios/a/b/c/d",
                            "/v1/chat/completions/", "//v1/models", "/v1/models/x", "/%ff", "/reef/records",
                            "/reef/records/batch/x", "/" + "a" * 4000, "/v1/chat%2Fcompletions", "/reef/report/x",
                            "/reef/scenarios/fz-a/records/x/y", "/healthz/", "/.env", "/reef/%2e%2e/status"))
            method = rng.choice(("GET", "POST"))
            # %2F decodes to a real route; '//' is merged into one slash
            expect = None if "%2F" in p or p.startswith("//") else {404, 405}
            return self.case(method, p, self.headers(s, None), None, "unknown-route", expect)
        if k == 8:  # wrong methods
            route = rng.choice(list(METHODS))
            wrong = sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - METHODS[route])
            method = rng.choice(wrong)
            return self.case(method, route, self.headers(s, None), None, f"wrong-method:{method}", {405})
        if k == 9:  # HEAD / OPTIONS / odd methods
            route = rng.choice(list(METHODS) + ["/healthz"])
            method = rng.choice(("HEAD", "OPTIONS", "TRACE", "PROPFIND", "FOO"))
            return self.case(method, route, self.headers(s, None), None, f"odd-method:{method}")
        if k == 10:  # browser-ish headers (auth is off): cross-site pages are refused
            h = rng.choice(([("Sec-Fetch-Site", "cross-site")], [("Origin", "null")],
                            [("Origin", "http://evil.example")], [("Sec-Fetch-Site", "same-origin")],
                            [("Authorization", "Bearer x" * rng.choice((1, 500)))], [("x-api-key", "\xe9")]))
            name = rng.choice(list(INFERENCE))
            cross = h[0][0] == "Origin" or h[0][1] == "cross-site"
            return self.case("POST", INFERENCE[name][0], self.headers(s, extra=h), INFERENCE[name][1](rng),
                             f"{name}/browser:{h[0][0]}", {403} if cross else None)
        if k == 11:  # many or large tag headers, odd header bytes
            extra = rng.choice(([(f"x-reef-tag-t{j}", "v") for j in range(rng.choice((20, 90)))],
                                [("x-reef-tag-big", "v" * rng.choice((1000, 6000)))],
                                [("x-reef-tag-bytes", "é漢".encode())], [("x-reef-tag-", "empty-name")],
                                [("x-reef-tag-a", "")], [("anthropic-version", "\xff\xfe")],
                                [("anthropic-beta", "x" * 2000)], [("x-reef-scenario", s), ("x-reef-scenario", "fz-b")],
                                [("Content-Type", "text/plain")]))
            name = rng.choice(list(INFERENCE))
            return self.case("POST", INFERENCE[name][0], self.headers(s, extra=extra), INFERENCE[name][1](rng),
                             f"{name}/headers")
        if k == 12:  # GET with a body; DELETE with a body
            method, p = rng.choice((("GET", "/reef/status"), ("GET", "/v1/models"), ("GET", f"/reef/scenarios/{s}"),
                                    ("GET", "/healthz"), ("DELETE", "/reef/scenarios/fzq-nope")))
            return self.case(method, p, self.headers(s), rng.choice(({"a": 1}, b"garbage", b"")), "body-on-get")
        return self.case("POST", "/reef/scenarios", self.headers(None),
                         rng.choice(({"name": s}, {"name": 5}, {}, [], {"name": "ok1", "config": 5},
                                     {"name": f"fzc-{self.i}", "config": {"nope": 1}},
                                     {"name": f"fzc-{self.i}", "recipe": "basic", "config": {"require_score": "yes"}},
                                     {"name": f"fzc-{self.i}", "recipe": 5}, {"name": f"fzc-{self.i}", "recipe": ""},
                                     {"name": f"fzc-{self.i}", "recipe": "gepa", "config": nest(60, kind="obj")},
                                     {"name": f"fzc-{self.i}", "extra": 1})), "scenarios/create-bad")

    def edge_numbers(self, k: int | None = None) -> FuzzCase:
        """An imported record with numbers at the edges of what the store's columns hold (int64, float64)."""
        rng, s, i = self.rng, self.scen(), self.i
        key, value = EDGE_NUMBERS[k % len(EDGE_NUMBERS)] if k is not None else rng.choice(EDGE_NUMBERS)
        item = record_item(rng, s, i)
        if key == "logprobs":
            item["token_ids"] = [1]
        item[key] = [Raw(value)] if key in ("token_ids", "prompt_token_ids", "logprobs") else Raw(value)
        return self.case("POST", "/reef/records/batch", self.headers(s), {"records": [item]},
                         f"batch/edge-number:{key}={value.decode()}")

    def big_body(self) -> FuzzCase:
        rng, s = self.rng, self.scen()
        name, path, _, body = self.post_template()
        if path == "/reef/records/batch":
            path, name = "/v1/chat/completions", "chat"
        pad = BIG_BODY - 200
        body = {"model": "m", "messages": [{"role": "user", "content": "z" * pad}]} if rng.random() < 0.5 else \
            {"pad": "z" * pad}
        return self.case("POST", path, self.headers(s), body, f"{name}/over-10MB", {413},
                         chunked=rng.random() < 0.3)

    def one(self) -> FuzzCase:
        r = self.rng.random()
        for weight, make in ((0.30, self.valid_any), (0.10, self.mutate_field), (0.04, self.unknown_field),
                             (0.08, self.bad_bytes), (0.05, self.media_type), (0.07, self.scenario_name),
                             (0.06, self.record_and_query), (0.09, self.report_mutation),
                             (0.07, self.inference_mutation), (0.04, self.harness_mutation),
                             (0.05, self.batch_mutation), (0.02, self.edge_numbers), (0.12, self.misc)):
            if r < weight:
                return make()
            r -= weight
        return self.misc()


_MISSING = object()
JNULL = Raw(b"null")  # a body that is JSON null (a None body means no body at all)


def _spots(obj, prefix=()):
    """Every path to a value in a JSON-like object (keys and list indices)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _spots(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _spots(v, prefix + (i,))


def _set(obj, spot, value):
    """A copy of `obj` with the value at `spot` replaced (or removed when `value` is _MISSING)."""
    if not spot:
        return value
    head, rest = spot[0], spot[1:]
    if isinstance(obj, dict):
        out = dict(obj)
        if not rest and value is _MISSING:
            out.pop(head, None)
        else:
            out[head] = _set(obj[head], rest, value)
        return out
    out = list(obj)
    if not rest and value is _MISSING:
        del out[head]
    else:
        out[head] = _set(obj[head], rest, value)
    return out


def generate(seed: int, n: int) -> list[FuzzCase]:
    """n requests, the same for the same seed: first a few well-formed ones (so scenarios and receipts exist and a
    code-running recipe is tried), then a mix of well-formed and hostile ones; every 311th an 11 MB body, and every
    97th a code-naming recipe and a record with edge numbers (in turn), so short runs hold them too."""
    g = _Gen(seed)
    out: list[FuzzCase] = []
    for i in range(n):
        g.i = i
        if i < 9:  # each scenario gets receipts and a report before the mix starts
            s = SCENARIOS[i % 3]
            if i < 6:
                name = ("chat", "messages", "responses")[i % 3]
                c = g.case("POST", INFERENCE[name][0], g.headers(s), INFERENCE[name][1](g.rng), f"{name}/valid", {200})
            else:
                c = g.case("POST", "/reef/report", g.headers(s), {"score": 1, "references": [f"@@R:{s}:0@@"]},
                           "report/valid", {200})
        elif i == 9:
            c = g.case("POST", "/reef/scenarios", g.headers(None),
                       {"name": f"fzx-{i}", "recipe": "subprocess:Popen",
                        "config": {"args": ["touch", "/tmp/reef-fuzz-pwned"]}},
                       "scenarios/recipe-code:subprocess:Popen", {400})
        elif i % 311 == 150:
            c = g.big_body()
        elif i % 97 == 40:
            c = g.popen()
        elif i % 97 == 70:
            c = g.edge_numbers(i // 97)
        else:
            c = g.one()
        out.append(c)
    return out


# ---- the sender ---------------------------------------------------------------------------------------------------
_PLACEHOLDER = re.compile(rb"@@([RP]):([A-Za-z0-9._-]+):(\d+)@@")
_STREAM_RECEIPT = re.compile(rb'"agent_record_id"\s*:\s*"(rec_[0-9a-f]+)"')


class _Ids:
    def __init__(self):
        self.receipts: dict[str, list[str]] = {}
        self.reports: dict[str, list[str]] = {}

    def fill(self, data: bytes) -> bytes:
        def sub(m):
            pool = (self.receipts if m.group(1) == b"R" else self.reports).get(m.group(2).decode(), [])
            k = int(m.group(3))
            return (pool[-1 - k] if k < len(pool) else f"rec_missing{k}").encode()
        return _PLACEHOLDER.sub(sub, data)


class _Closed(Exception):
    pass


class _Client:
    """One keep-alive HTTP/1.1 connection over a plain socket: the request goes out exactly as built."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self.used = 0

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def _connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.used = 0

    def request(self, method: str, target: bytes, headers: list[tuple[str, bytes]], body: bytes | None,
                chunked: bool) -> tuple[int, dict, bytes, bool]:
        """(status, headers, body, answered early) or raises socket.timeout / _Closed."""
        if self.sock is None:
            self._connect()
        self.used += 1
        names = {k.lower() for k, _ in headers}
        lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: " + f"{self.host}:{self.port}".encode()]
        lines += [k.encode() + b": " + v for k, v in headers]
        if body is not None and "content-length" not in names:
            lines.append(b"Transfer-Encoding: chunked" if chunked else b"Content-Length: " + str(len(body)).encode())
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        if body is not None and chunked:
            step = 1 << 16
            body = b"".join(b"%x\r\n" % len(body[j:j + step]) + body[j:j + step] + b"\r\n"
                            for j in range(0, len(body), step)) + b"0\r\n\r\n"
        early = self._send(head + (body or b""))
        resp = http.client.HTTPResponse(self.sock, method=method)
        try:
            resp.begin()
            data = resp.read()
        except (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError,
                BrokenPipeError) as e:
            raise _Closed(f"{type(e).__name__}: {e}") from None
        except http.client.HTTPException as e:
            raise _Closed(f"unreadable answer: {type(e).__name__}: {e}") from None
        if resp.will_close or early:
            self.close()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, early

    def _send(self, data: bytes) -> bool:
        """Send it all, or stop when the server answers first (a refusal before the body was read): True then."""
        sock = self.sock
        view, sent = memoryview(data), 0
        if len(data) <= 1 << 16:
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError) as e:
                raise _Closed(f"send failed: {e}") from None
            return False
        deadline = time.monotonic() + self.timeout
        while sent < len(data):
            readable, writable, _ = select.select([sock], [sock], [], max(0.0, deadline - time.monotonic()))
            if readable:
                return True
            if not writable:
                raise socket.timeout("the server took no more of the body")
            try:
                sent += sock.send(view[sent:sent + (1 << 18)])
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                return True  # it may still have answered: read what is there
            deadline = time.monotonic() + self.timeout
        return False


def _header_bytes(v: str | bytes) -> bytes:
    return v if isinstance(v, bytes) else v.encode("latin-1", "replace")


def run(base_url: str, cases: list[FuzzCase], timeout: float = 15.0, fresh_every: int = 4,
        progress=None) -> FuzzReport:
    """Send every case in order; see the module docstring for what the report holds."""
    u = urllib.parse.urlsplit(base_url)
    client = _Client(u.hostname or "127.0.0.1", u.port or 80, timeout)
    ids, report = _Ids(), FuzzReport()
    for idx, case in enumerate(cases):
        if client.used >= fresh_every:
            client.close()  # a new connection may land on another worker
        target = ids.fill(case.path.encode("utf-8"))
        body = ids.fill(case.body) if case.body is not None and b"@@" in case.body else case.body
        headers = [(k, ids.fill(_header_bytes(v))) for k, v in case.headers]
        t0 = time.monotonic()
        status, excerpt, problem = None, "", None
        for attempt in (0, 1):
            reused = client.sock is not None and client.used > 0
            try:
                status, rh, data, _ = client.request(case.method, target, headers, body, case.chunked)
                excerpt = data[:MAX_EXCERPT].decode("utf-8", "replace")
                break
            except (socket.timeout, TimeoutError):
                client.close()
                problem, excerpt = "held", f"no answer within {timeout:g} s"
                break
            except (_Closed, ConnectionRefusedError, ConnectionResetError, BrokenPipeError) as e:
                client.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: as clients do, once more anew
                problem, excerpt = "reset", str(e)
                break
        seconds = time.monotonic() - t0
        if status is not None:
            if status >= 500:
                problem = "5xx"
            elif case.expect is not None and status not in case.expect:
                problem = "expect"
                excerpt = f"expected {sorted(case.expect)}: " + excerpt
            scen = next((v for k, v in case.headers if k.lower() == "x-reef-scenario"), None)
            scen = scen.decode("latin-1") if isinstance(scen, bytes) else scen
            if status == 200 and scen:
                rid = rh.get(RECEIPT_HEADER)
                if rid is None and data:
                    found = _STREAM_RECEIPT.findall(data[-4096:])
                    rid = found[-1].decode() if found else None
                if rid is not None:
                    pool = ids.reports if case.path.startswith("/reef/report") else ids.receipts
                    pool.setdefault(scen, []).append(rid)
                    del pool[scen][:-600]
        report.outcomes.append(Outcome(idx, case.label, case.method, target.decode("utf-8", "replace")[:300],
                                       status, seconds, excerpt, problem))
        if progress is not None:
            progress(idx, report.outcomes[-1])
    client.close()
    return report


def stalled_body(host: str, port: int, declared: int = 100, sent: int = 5, wait: float = 60.0,
                 path: str = "/v1/chat/completions", scenario: str = "fz-stall") -> tuple[int | None, float]:
    """Declare a `declared`-byte JSON body, send only `sent` bytes of it, and wait up to `wait` seconds for the
    server's answer. Returns (status, or None when none came or the server closed without one; seconds waited)."""
    body = (b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * declared)[:sent]
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"x-reef-scenario: {scenario}\r\nContent-Length: {declared}\r\n\r\n").encode()
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=wait) as sock:
        sock.sendall(head + body)
        buf = b""
        deadline = t0 + wait
        while b"\r\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, time.monotonic() - t0
            sock.settimeout(left)
            try:
                chunk = sock.recv(4096)
            except (socket.timeout, TimeoutError):
                return None, time.monotonic() - t0
            except ConnectionResetError:
                return None, time.monotonic() - t0
            if not chunk:
                return None, time.monotonic() - t0
            buf += chunk
    m = re.match(rb"HTTP/1\.[01] (\d{3})", buf)
    return (int(m.group(1)) if m else None), time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8900")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=15.0)
    a = ap.parse_args(argv)
    rep = run(a.url, generate(a.seed, a.n), timeout=a.timeout)
    print(rep.summary())
    return 1 if rep.server_errors or rep.held or rep.resets or rep.unexpected else 0


if __name__ == "__main__":
    raise SystemExit(main())
