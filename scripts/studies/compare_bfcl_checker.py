"""Differential check of reef_lab's BFCL AST checker (reef_lab/tasks/bfcl.py) against BFCL's own.

BFCL's `ast_checker.py` is loaded from the installed `bfcl-eval` wheel with its package imports stubbed (the
language enum, and a model config whose function names use underscores for dots; no model SDK is imported). Both
checkers judge the same calls on every item of the single-turn Python categories: the first possible answer as
given, and mutations of it (each optional parameter left out, a wrong value, a number sent as a string, an unknown
parameter, a required one missing, parallel calls reversed, one call dropped). Prints the agreement per category;
exits 1 on any disagreement, listing the first ones.

    .venv/bin/python scripts/studies/compare_bfcl_checker.py [--categories simple_python multiple ...]
"""

from __future__ import annotations

import argparse
import copy
import enum
import importlib.util
import sys
import types
from pathlib import Path


from reef_lab.tasks.bfcl import CATEGORIES, ast_check, data_folder, load_category, tool_name  # noqa: E402


def bfcl_checker():
    """BFCL's ast_checker module, its imports stubbed."""
    class Language(enum.Enum):
        PYTHON = "python"
        JAVA = "java"
        JAVASCRIPT = "javascript"

    path = data_folder().parent / "eval_checker" / "ast_eval" / "ast_checker.py"  # found before the stubs go in
    stubs = {
        "bfcl_eval": types.ModuleType("bfcl_eval"),
        "bfcl_eval.constants": types.ModuleType("bfcl_eval.constants"),
        "bfcl_eval.constants.enums": types.SimpleNamespace(Language=Language),
        "bfcl_eval.constants.model_config": types.SimpleNamespace(
            MODEL_CONFIG_MAPPING={"stub/model": types.SimpleNamespace(underscore_to_dot=True)}),
        "bfcl_eval.constants.type_mappings": types.SimpleNamespace(JAVA_TYPE_CONVERSION={}, JS_TYPE_CONVERSION={}),
        "bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter": types.SimpleNamespace(
            java_type_converter=None),
        "bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter": types.SimpleNamespace(
            js_type_converter=None),
    }
    sys.modules.update(stubs)
    spec = importlib.util.spec_from_file_location("bfcl_ast_checker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, Language.PYTHON


def first_answer(answer: dict, drop_optional: bool) -> dict:
    (name, params), = answer.items()
    args = {p: vs[0] for p, vs in params.items() if vs and vs[0] != "" and not (drop_optional and "" in vs)}
    return {tool_name(name): args}


def variants(item: dict):
    truth = item["possible_answer"]
    yield "as given", [first_answer(a, False) for a in truth]
    yield "optional left out", [first_answer(a, True) for a in truth]
    calls = [first_answer(a, False) for a in truth]
    (name, args), = calls[0].items()
    if args:
        p = next(iter(args))
        v = args[p]
        wrong = copy.deepcopy(calls)
        wrong[0][name][p] = (v + 7) if isinstance(v, (int, float)) and not isinstance(v, bool) else "zzz-wrong"
        yield "wrong value", wrong
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            as_str = copy.deepcopy(calls)
            as_str[0][name][p] = str(v)
            yield "number as string", as_str
        missing = copy.deepcopy(calls)
        del missing[0][name][p]
        yield "first parameter missing", missing
    extra = copy.deepcopy(calls)
    extra[0][name]["not_a_parameter"] = 1
    yield "unknown parameter", extra
    if len(calls) > 1:
        yield "reversed", list(reversed(calls))
        yield "one dropped", calls[:-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--categories", nargs="*", default=list(CATEGORIES))
    args = ap.parse_args()
    folder = data_folder()
    checker, python = bfcl_checker()
    disagreements, total = [], 0
    for category in args.categories:
        agree = n = 0
        for item in load_category(category, folder):
            for label, calls in variants(item):
                theirs = checker.ast_checker(item["functions"], calls, item["possible_answer"], python, category,
                                             "stub_model")["valid"]
                ours = ast_check(item["functions"], calls, item["possible_answer"], category) is None
                n += 1
                agree += theirs == ours
                if theirs != ours:
                    disagreements.append((item["id"], label, theirs, ours, calls))
        total += n
        print(f"{category:24s} {agree}/{n} verdicts agree")
    print(f"all: {total - len(disagreements)}/{total} agree")
    for d in disagreements[:10]:
        print("DISAGREE", d)
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
