"""BFCL v4 function-calling items as a held-out tool task, scored by BFCL's AST match of the calls.

The Berkeley Function Calling Leaderboard (https://github.com/ShishirPatil/gorilla, Apache-2.0) ships its items in
the `bfcl-eval` wheel (installed `--no-deps` by scripts/setup.sh: its own dependencies are model SDKs reef_lab does
not need). This module reads `bfcl_eval/data/BFCL_v4_<category>.json` and `possible_answer/BFCL_v4_<category>.json`
by path (json lines, joined by id) and never imports bfcl_eval. Only the single-turn Python categories, whose
answers are checked by AST: `simple_python`, `multiple`, `parallel`, `parallel_multiple` and their `live_` forms.

`ast_check` follows BFCL's checker (bfcl_eval/eval_checker/ast_eval/ast_checker.py, version 2026.3.23) for Python:
the number of calls; per call the function name, required parameters present, no parameter the function or the
answer does not know, the type of each value (an int is accepted for a float; a value of the answer's own type is
taken as a variable), the value among the possible answers (strings compared without case, spaces and `,./-_*^`;
lists, dicts and lists of dicts element by element), and a parameter the model left out only when its possible
answers include "" (optional). `parallel` categories match calls to answers in any order; `multiple` checks the one
expected function. Function names with dots are called with underscores (OpenAI function names allow no dots), as
BFCL does for OpenAI-style models.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from reef_lab.schema import check_fields
from reef_lab.tasks.tools import EpisodeScore, ToolTask, call_arguments

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
              "live_parallel", "live_parallel_multiple")
DEFAULT_CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple"]
PYTHON_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
                "dict": dict, "any": str}
SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def data_folder() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("BFCL's data is not installed: bash scripts/setup.sh (or pip install --no-deps "
                                "bfcl-eval==2026.3.23)")
    return Path(spec.submodule_search_locations[0]) / "data"


def _json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_category(category: str, folder: Path | None = None) -> list[dict]:
    """A category's items: {id, category, messages, functions (BFCL's docs), tools (OpenAI schemas),
    possible_answer (BFCL's ground truth)}, in file order."""
    if category not in CATEGORIES:
        raise ValueError(f"BFCL category {category!r} is not one of the single-turn Python ones {CATEGORIES}")
    folder = folder or data_folder()
    answers = {r["id"]: r["ground_truth"] for r in _json_lines(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
    items = []
    for row in _json_lines(folder / f"BFCL_v4_{category}.json"):
        if row["id"] not in answers:
            raise ValueError(f"BFCL item {row['id']} has no possible answer in {folder / 'possible_answer'}")
        turns = row["question"]
        if len(turns) != 1:
            raise ValueError(f"BFCL item {row['id']} has {len(turns)} turns; the single-turn categories have one")
        items.append({"id": row["id"], "category": category, "messages": list(turns[0]),
                      "functions": row["function"], "tools": [openai_tool(f) for f in row["function"]],
                      "possible_answer": answers[row["id"]]})
    return items


def tool_name(name: str) -> str:
    return name.replace(".", "_")


def openai_tool(function: dict) -> dict:
    """A BFCL function doc as an OpenAI function tool (BFCL's types mapped to JSON schema's)."""
    return {"type": "function", "function": {"name": tool_name(function["name"]),
                                             "description": function.get("description", ""),
                                             "parameters": _schema(function.get("parameters") or {})}}


def _schema(node: dict) -> dict:
    out = {}
    for k, v in node.items():
        if k == "type":
            mapped = SCHEMA_TYPES.get(v, v)
            if mapped is not None:
                out["type"] = mapped
        elif k == "properties":
            out[k] = {name: _schema(p) for name, p in v.items()}
        elif k == "items" and isinstance(v, dict):
            out[k] = _schema(v)
        elif k != "optional":
            out[k] = v
    return out


# ---- BFCL's AST checker (Python) -------------------------------------------------------------------------------------
def standardize(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _std_all(values: list) -> list:
    return [standardize(v) if isinstance(v, str) else v for v in values]


def _answer_type(possible: list):
    return next((type(a) for a in possible if a != ""), None)


def _type_error(param: str, value, possible: list, expected: str, nested: str | None) -> tuple[str | None, bool]:
    """(error or None, whether the value is taken as a variable), as BFCL's type_checker: a value of the answers'
    own type passes as a variable (then only exact membership counts), also after a failed nested check."""
    want = PYTHON_TYPES[expected]
    answer_type = _answer_type(possible)
    is_variable = answer_type is not None and answer_type != want
    error = f"type of {param!r}: expected {expected}, got {type(value).__name__} {value!r}"[:200]
    if type(value) is want:
        if nested is None:
            return None, is_variable
        for answer in possible:
            if not isinstance(answer, list) or all(_type_error(param, v, answer, nested, None)[0] is None
                                                   for v in value):
                return None, is_variable
        error = f"nested type of {param!r}: expected {expected} of {nested}, got {value!r}"[:200]
    if answer_type is not None and type(value) is answer_type:
        return None, True
    return error, is_variable


def _dict_ok(value: dict, possible: list) -> bool:
    for answer in possible:
        if answer == "":
            continue
        if all(k in answer and (standardize(v) if isinstance(v, str) else v) in _std_all(answer[k])
               for k, v in value.items()) and all(k in value or "" in vs for k, vs in answer.items()):
            return True
    return False


def _list_dict_ok(value: list, possible: list) -> bool:
    return any(len(value) == len(answer) and all(_dict_ok(v, [a]) for v, a in zip(value, answer))
               for answer in possible)


def check_one(function: dict, call: dict, answer: dict) -> str | None:
    """Why one call ({name: {param: value}}) does not match one possible answer ({name: {param: [values]}}) of
    `function`, or None when it does."""
    (expected_name, possible), = answer.items()
    name = tool_name(function["name"])
    if tool_name(expected_name) not in call or name not in call:
        return f"expected a call of {name!r}, got {sorted(call)}"
    args = call[name]
    props = function["parameters"]["properties"]
    for p in function["parameters"].get("required") or []:
        if p not in args:
            return f"{name}: missing required parameter {p!r}"
    for p, value in args.items():
        if p not in props or p not in possible:
            return f"{name}: unexpected parameter {p!r}"
        expected = props[p]["type"]
        nested = props[p]["items"]["type"] if expected in ("array", "tuple") else None
        if expected == "float" and type(value) is int:
            value = float(value)
        error, is_variable = _type_error(p, value, possible[p], expected, nested)
        if error:
            return f"{name}: {error}"
        want = PYTHON_TYPES[expected]
        if is_variable:
            ok = value in possible[p]
        elif want is dict:
            ok = _dict_ok(value, possible[p])
        elif want is list and nested == "dict":
            ok = _list_dict_ok(value, possible[p])
        elif want is str:
            ok = standardize(value) in _std_all(possible[p])
        elif want is list:
            ok = _std_all(list(value)) in [_std_all(a) if isinstance(a, list) else [] for a in possible[p]]
        else:
            ok = value in possible[p]
        if not ok:
            return f"{name}: {p}={value!r} is not one of {possible[p]}"[:300]
    for p, values in possible.items():
        if p not in args and "" not in values:
            return f"{name}: parameter {p!r} left out but not optional"
    return None


def ast_check(functions: list[dict], calls: list[dict], possible_answer: list[dict], category: str) -> str | None:
    """BFCL's AST verdict on a reply's calls ([{name: {param: value}}]): None when they match, else why not."""
    by_name = {tool_name(f["name"]): f for f in functions}
    if len(calls) != len(possible_answer):
        return f"expected {len(possible_answer)} call(s), got {len(calls)}"
    if "parallel" in category:
        free = list(range(len(calls)))
        for answer in possible_answer:
            function = by_name[tool_name(next(iter(answer)))]
            match = next((i for i in free if check_one(function, calls[i], answer) is None), None)
            if match is None:
                return f"no call matches the expected {next(iter(answer))} call"
            free.remove(match)
        return None
    answer = possible_answer[0]
    return check_one(by_name[tool_name(next(iter(answer)))], calls[0], answer)


@dataclass
class BfclOptions:
    categories: list[str] | None = field(default=None, metadata={
        "help": f"BFCL v4 categories to draw items from, of {CATEGORIES}; default {DEFAULT_CATEGORIES}"})

    def __post_init__(self) -> None:
        check_fields(self)
        for c in self.categories or []:
            if c not in CATEGORIES:
                raise ValueError(f"categories {self.categories}: {c!r} is not one of the single-turn Python BFCL "
                                 f"categories {CATEGORIES}; pick among them")


class BfclTask(ToolTask):
    """BFCL v4 single-turn items: one reply, scored 1 when its tool calls pass the AST check. Options:
    `categories` (default simple_python, multiple, parallel, parallel_multiple)."""

    max_turns = 1
    options_class = BfclOptions

    def __init__(self, config):
        super().__init__(config)
        unknown = set(config.options) - {"categories"}
        if unknown:
            raise ValueError(f"bfcl task options are 'categories' only, got {sorted(unknown)}")
        self.categories = list(BfclOptions(**config.options).categories or DEFAULT_CATEGORIES)
        self._items: list[dict] | None = None

    def all_items(self) -> list[dict]:
        if self._items is None:
            self._items = [it for c in self.categories for it in load_category(c)]
        return self._items

    def items(self, n: int, seed: int) -> list[dict]:
        pool = self.all_items()
        order = list(range(len(pool)))
        random.Random(seed).shuffle(order)
        return [pool[i] for i in order[:n]]

    def score_episode(self, item: dict, transcript: list[dict]) -> EpisodeScore:
        reply = next((m for m in transcript if m.get("role") == "assistant"), None)
        calls, bad = [], []
        for call in (reply or {}).get("tool_calls") or []:
            name, args, error = call_arguments(call)
            (bad.append(error) if error else calls.append({name: args}))
        if reply is not None:
            bad += ["a <tool_call> the parser could not read"] * (reply.get("content") or "").count("<tool_call>")
        why = "; ".join(bad) if bad else ast_check(item["functions"], calls, item["possible_answer"],
                                                  item["category"])
        ok = why is None
        return EpisodeScore(1.0 if ok else 0.0, ok, len(calls), len(bad),
                            "Correct: the calls match BFCL's possible answers." if ok else f"Incorrect: {why}",
                            {"calls": calls})
