"""TTT-Discover's settings: every choice of the paper (arXiv 2601.16175) as a field, the paper's value as default.

Why a LearnConfig: the recipe trains weights, so it shares what every weight recipe has (mode, selection, candidates,
`trainer` as a nested reef_lab TrainerConfig checked key by key) and a learner built on WeightRecipe can take it
as is. Where the paper gives no value the help text says so and where the default comes from (the authors' public
code, github.com/test-time-training/discover, or our own choice); recipes/tttd/README.md lists the sources.

The defaults are the paper's scale (gpt-oss-120b, 512 rollouts per step, 26k-token answers); the CPU-sized run is
recipes/tttd/examples/circle_packing_cpu.yaml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reef_lab.learning.recipe import LearnConfig
from reef_lab.schema import check_fields
from reef_lab.trainers.base import TrainerConfig

from recipes.tttd.sandbox import ISOLATIONS

# The built-in problems by name; `problem.name` may also be any `module:Class` deriving recipes.tttd.problems.Problem
PROBLEMS = {"circle_packing": "recipes.tttd.problems:CirclePacking",
            "circle_centres": "recipes.tttd.problems:CircleCentres"}


@dataclass
class ProblemConfig:
    name: str = field(default="circle_packing", metadata={
        "help": f"the discovery problem: one of {tuple(PROBLEMS)} (circle_packing: the reply is a program printing "
                "x y r per circle; circle_centres: the reply lists the centres and the radii follow by linear "
                "programming, recipes/tttd/problems.py), or a module:Class deriving recipes.tttd.problems.Problem"})
    n: int = field(default=6, metadata={"client_max": 1000,
        "help": "circles to pack (the paper: 26 and 32, after AlphaEvolve; 6 here so a 135M model on CPU can make "
                "progress, with a documented reference value)"})
    tolerance: float = field(default=1e-9, metadata={
        "help": "absolute slack of the containment and overlap checks (not given in the paper; 1e-9 accepts "
                "printed floats of touching circles and nothing a reward could profit from)"})
    # The sandbox's settings are the operator's (--recipe-config), never a client's: they bound what the server
    # spends on, and exposes to, code a model wrote.
    cpu_seconds: int = field(default=5, metadata={
        "help": "CPU seconds a candidate program may use (the authors' code allows 1000 s for heavy tasks; a "
                "circle list needs milliseconds)", "operator": True})
    wall_seconds: float = field(default=10.0, metadata={
        "help": "wall-clock seconds before the candidate is killed", "operator": True})
    memory_mb: int = field(default=256, metadata={
        "help": "address-space limit of a candidate, in MB", "operator": True})
    output_kb: int = field(default=16, metadata={"help": "most stdout a candidate may print, in KB", "operator": True})
    disk_mb: int = field(default=16, metadata={
        "help": "size in MB of each of a candidate's two writable folders, /tmp (its home and working directory) and "
                "/dev/shm; the rest of its filesystem is read-only, and a write past the size fails (ENOSPC: the "
                "candidate scores as invalid). With sandbox none only output_kb bounds a file", "operator": True})
    disk_inodes: int = field(default=4096, metadata={
        "help": "files and folders each of /tmp and /dev/shm may hold (a tmpfs's size does not bound them, and each "
                "pins kernel memory, about 1 KB); one more fails with ENOSPC and the candidate scores as invalid. "
                "Not bounded with sandbox none", "operator": True})
    sandbox: str = field(default="bwrap", metadata={
        "help": "how candidate programs are isolated: bwrap (bubblewrap: own user, pid, network and mount namespaces, "
                "read-only system, empty environment, no new processes; recipes/tttd/sandbox.py) or none (a plain "
                "child process with the server's user and view of the machine, logged at start; only for models you "
                "trust, where bubblewrap cannot run)", "operator": True})
    start_fill: float = field(default=0.5, metadata={
        "help": "the initial state (not in the paper, whose start is an empty program): circle_packing: circles on a "
                "grid at this fraction of the radius their cells allow (0.5: n = 6 scores 0.4998); circle_centres: the "
                "grid's centres shrunk towards the middle by this factor (0.3: n = 6 scores 0.3000)"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.name not in PROBLEMS and ":" not in self.name:
            raise ValueError(f"name must be one of {tuple(PROBLEMS)} or a module:Class path, got {self.name!r}")
        if self.n < 2:
            raise ValueError(f"n must be >= 2, got {self.n}")
        if not 0 < self.start_fill <= 1:
            raise ValueError(f"start_fill must be in (0, 1], got {self.start_fill}")
        if not 0 <= self.tolerance < 1e-3:
            raise ValueError(f"tolerance = {self.tolerance}: the checks' slack must be in [0, 1e-3) (a larger one "
                             "rewards overlapping circles); set tolerance to 1e-9, the default, or 0")
        for name, least in (("cpu_seconds", 1), ("output_kb", 1), ("memory_mb", 64)):
            if getattr(self, name) < least:
                why = " (the interpreter itself needs tens of MB)" if name == "memory_mb" else ""
                raise ValueError(f"{name} = {getattr(self, name)}: a candidate program cannot run with less than "
                                 f"{least}{why}; set {name} >= {least}")
        if not self.wall_seconds > 0:
            raise ValueError(f"wall_seconds = {self.wall_seconds}: a candidate needs some time to run; set "
                             "wall_seconds > 0")
        if self.disk_mb < 1:
            raise ValueError(f"disk_mb must be >= 1 (MB), got {self.disk_mb}")
        if self.disk_inodes < 16:
            raise ValueError(f"disk_inodes must be >= 16 (the folder itself and the candidate's source count), got "
                             f"{self.disk_inodes}")
        if self.sandbox not in ISOLATIONS:
            raise ValueError(f"sandbox must be one of {ISOLATIONS}, got {self.sandbox!r}")
        from recipes.tttd.problems import problem_class  # resolved now: a wrong module:Class fails at creation

        problem_class(self.name).check_config(self)


@dataclass
class TTTDConfig(LearnConfig):
    groups: int = field(default=8, metadata={"client_max": 16,
        "help": "G: parent states chosen by PUCT per step, one rollout group each (paper: 8 groups of 64 "
                "rollouts, 512 per step; the authors' public code runs the transposed 64 groups of 8)"})
    rollouts_per_group: int = field(default=64, metadata={"client_max": 64,
        "help": "R: continuations sampled from each parent (paper: 64); at least 3, since with 2 the KL target "
                "ln 2 is never reached"})
    steps: int = field(default=50, metadata={"client_max": 200,
        "help": "policy steps, one optimizer step per G x R grid (paper: 50)"})
    archive_size: int = field(default=1000, metadata={"client_max": 10_000,
        "help": "most states the archive keeps; the lowest rewards go first, never an initial state (not given in "
                "the paper; the authors' code: 1000)"})
    puct_c: float = field(default=1.0, metadata={"help": "PUCT exploration constant c (the authors' code: 1.0)"})
    puct_scale_by_range: bool = field(default=True, metadata={
        "help": "multiply the exploration bonus by max R - min R over the non-initial states, so c is unit-free "
                "(the authors' code does; the formula as the paper prints it has no such factor)"})
    children_per_expansion: int = field(default=2, metadata={"client_max": 16,
        "help": "best new valid children of one expansion that join the archive (paper: top 2)"})
    kl_target: float = field(default=math.log(2), metadata={
        "help": "per group, beta solves KL(q_beta || uniform) = this, in nats (paper: ln 2)"})
    beta_max: float = field(default=1e6, metadata={
        "help": "cap of the beta search when the target is unreachable (not in the paper; the authors' code: 1e6)"})
    kl_coef: float = field(default=0.1, metadata={
        "help": "lambda: token KL penalty towards the frozen base model (the authors' current code: 0.1; their "
                "earlier train.py: 0); needs LoRA (trainer.lora_rank > 0), whose base is the adapters switched off"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the rollouts (paper: 1.0)"})
    max_tokens: int = field(default=26000, metadata={"client_max": 32_768,
        "help": "max_tokens of a rollout (the authors' code: 26000 tokens of prompt and reasoning for gpt-oss-120b; "
                "a circle program for SmolLM2 needs about 200)"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling and of the initial states' order"})
    concurrency: int = field(default=32, metadata={"client_max": 32,
        "help": "rollouts in flight at once (not in the paper: an engine-throughput setting)"})
    policy_updates: bool = field(default=True, metadata={
        "help": "train the policy after each step (false: the base policy samples throughout, an ablation)"})
    reuse: bool = field(default=True, metadata={
        "help": "continue from archive states chosen by PUCT (false: every rollout starts from the initial "
                "solution; with policy_updates false this is best-of-N sampling from the base policy)"})
    problem: ProblemConfig = field(default_factory=ProblemConfig, metadata={
        "help": "the discovery problem (recipes.tttd.config.ProblemConfig fields)"})
    trainer: TrainerConfig = field(default_factory=lambda: {"lora_rank": 32, "lr": 4e-5}, metadata={
        "help": "reef_lab.trainers.base.TrainerConfig (paper: LoRA rank 32, learning rate 4e-5, Adam; the other "
                "optimiser settings are not given and keep reef_lab's defaults; its seed defaults to the run's)"})

    def __post_init__(self) -> None:
        if isinstance(self.trainer, dict):  # the trainer's seed is the run's unless the trainer names its own
            self.trainer = {"seed": self.seed, **self.trainer}
        super().__post_init__()
        if self.groups < 1 or self.steps < 1 or self.children_per_expansion < 1:
            raise ValueError("groups, steps and children_per_expansion must be at least 1")
        if self.rollouts_per_group < 3:
            raise ValueError(f"rollouts_per_group must be >= 3 (got {self.rollouts_per_group}): with 2 the KL target "
                             "is never reached and the better rollout's entropic weight grows without bound")
        if self.archive_size <= self.groups:
            raise ValueError(f"archive_size ({self.archive_size}) must exceed groups ({self.groups}): the archive "
                             "keeps one initial state per group")
        if not (0 < self.kl_target < math.log(self.rollouts_per_group)):
            raise ValueError(f"kl_target must lie in (0, ln(rollouts_per_group)) = (0, "
                             f"{math.log(self.rollouts_per_group):.4f}); the paper uses ln 2")
        if not (math.isfinite(self.puct_c) and self.puct_c >= 0 and math.isfinite(self.kl_coef)
                and self.kl_coef >= 0 and self.beta_max > 0):
            raise ValueError("puct_c and kl_coef must be finite and >= 0, beta_max > 0")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.temperature <= 0 or self.max_tokens < 1:
            raise ValueError("temperature must be > 0 and max_tokens >= 1")
        if self.kl_coef > 0 and not self.trainer.lora_rank:
            raise ValueError("kl_coef > 0 needs the frozen base, i.e. LoRA: set trainer.lora_rank > 0 "
                             "(e.g. 32, the paper's) or kl_coef: 0")

    @property
    def problem_config(self) -> ProblemConfig:
        return self.problem
