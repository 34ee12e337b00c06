"""Discovery problems for TTT-Discover: a state's prompt, the initial state and an exact verifier with a continuous
reward; and circle packing, a CPU-sized member of the paper's family, in two representations.

Why: TTT-Discover needs a problem whose answers can be checked exactly and scored on a continuous scale, so that a
slightly better answer earns a slightly higher reward. The paper's circle packing (AlphaEvolve's n = 26 and 32)
asks for n circles in the unit square, inside it and pairwise disjoint, with the largest sum of radii. Here n is
small (default 6) so a 135M model on CPU can make progress.

The state shown to the model is the parent's solution: a short Python program whose list of (x, y, r) tuples prints
one circle per line, so a continuation only has to edit numbers. Verification extracts the reply's last ```python
block, runs it in the sandbox (recipes/tttd/sandbox.py: bubblewrap and limits), parses exactly n lines of
three finite numbers and checks the geometry with an absolute tolerance of 1e-9: x - r >= -tol, x + r <= 1 + tol
(same for y), r > 0, and |c_i - c_j| >= r_i + r_j - tol. A valid answer's reward is the sum of the radii; anything
else (no code block, a crash, a timeout, garbage output, an overlap or a leak) is invalid with reward 0 and the
reason kept.

`circle_centres` is the same instance in the representation AlphaEvolve's circle-packing programs use: the model
places only the centres and the verifier gives each circle the largest radius that keeps the packing valid (a linear
program: maximise sum r subject to r_i <= the wall distances, r_i + r_j <= |c_i - c_j|, solved by HiGHS, then
shrunk to strict feasibility and checked by the same geometry check with tolerance 0). Every reply that names n
centres inside the square is then a valid packing whose reward moves continuously with the centres, so a model that
can only copy a list and change a few numbers (SmolLM2-135M) still makes scored edits, better and worse; in the
program representation such edits almost always overlap (results/tttd-circle-packing.md). The optimum is the same
instance's (the best packing's centres give its radii back), so BEST_KNOWN applies to both.

`scipy_baseline(n, seconds, seed)` is the classical comparison: SLSQP from random starts until the wall-time budget
is spent, each result repaired to strict feasibility and checked by the same verifier with tolerance 0.
"""

from __future__ import annotations

import math
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from reef_lab.extras import need

from recipes.tttd.config import PROBLEMS, ProblemConfig
from recipes.tttd.sandbox import SandboxLimits, check_isolation, run_python

# Best sums of radii we know for n circles in the unit square. For n >= 5 we found no published table (Packomania
# lists equal circles; AlphaEvolve and TTT-Discover report n = 26 and 32), so these are our own: the best of
# scipy_baseline(n, seconds=40, seed=s) for seeds 0, 1, 2 on 2 shared CPUs, all three seeds agreeing to 1e-14
# (recipes/tttd/README.md has the command). Strong references, not proven optima. n = 2 is exact.
BEST_KNOWN = {
    2: (2 - math.sqrt(2), "exact: two circles on the diagonal, r1 + r2 <= sqrt(2) / (1 + sqrt(2))"),
    5: (1.1035533905921697, "scipy_baseline, 3 seeds x 40 s (equals (3 + sqrt(2)) / 4 to 1e-12)"),
    6: (1.2028389108708748, "scipy_baseline, 3 seeds x 40 s"),
    7: (1.3065463507553080, "scipy_baseline, 3 seeds x 40 s"),
    8: (1.4238139153164258, "scipy_baseline, 3 seeds x 40 s"),
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = re.compile(rf"\(\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)")
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


@dataclass(frozen=True)
class Verdict:
    reward: float  # the reward (the problem's invalid_reward when not valid)
    valid: bool
    kind: str  # "ok", or why not: format, timeout, memory, crash, output, garbage, infeasible
    reason: str  # "" when valid
    solution: str | None  # what a child state stores (the extracted program); None without a code block
    details: dict = field(default_factory=dict)


class Problem(ABC):
    """A discovery problem: states are solutions (text) with rewards; higher is better."""

    name: str
    invalid_reward: float = 0.0

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: ProblemConfig) -> Problem:
        """The problem a ProblemConfig describes (make_problem calls this on the class `cfg.name` names)."""

    @classmethod
    def check_config(cls, cfg: ProblemConfig) -> None:
        """Refuse settings this problem cannot use (ValueError naming the field); called when the config is
        built, before any model loads. By default anything goes."""

    @abstractmethod
    def initial_solution(self) -> str:
        """The starting state's solution (valid, so it has a reward)."""

    @abstractmethod
    def prompt(self, solution: str, reward: float) -> list[dict]:
        """Chat messages asking for an improvement of `solution` (which scored `reward`)."""

    @abstractmethod
    def verify(self, text: str) -> Verdict:
        """The reward of a model's reply; never raises for anything the reply contains."""

    def best_known(self) -> float | None:
        return None

    def reply_for(self, solution: str) -> str:
        """A model reply that states `solution` (the initial state is verified through the same parser)."""
        return f"```python\n{solution.strip()}\n```"

    def circles(self, solution: str) -> list[tuple[float, float, float]] | None:
        """The packing a stored solution stands for (what apps draw), or None if it is not one."""
        verdict = self.verify(self.reply_for(solution))
        return verdict.details.get("circles") if verdict.valid else None


def extract_code(text: str) -> str | None:
    """The last fenced code block (```python, ```py or bare ```), or None."""
    blocks = [b.strip() for b in _CODE_BLOCK.findall(text)]
    blocks = [b for b in blocks if b]
    return blocks[-1] if blocks else None


def check_circles(circles: list[tuple[float, float, float]], n: int, tol: float, allow_zero: bool = False) -> str:
    """"" when n circles lie in the unit square, pairwise disjoint (within tol); else the first violation. Radius 0
    (a centre on the wall) counts only with `allow_zero`."""
    if len(circles) != n:
        return f"expected {n} circles, got {len(circles)}"
    for i, (x, y, r) in enumerate(circles):
        if not all(math.isfinite(v) for v in (x, y, r)):
            return f"circle {i} has a non-finite value"
        if r < 0 or (r == 0 and not allow_zero):
            return f"circle {i} has radius {r!r} {'< 0' if allow_zero else '<= 0'}"
        if x - r < -tol or x + r > 1 + tol or y - r < -tol or y + r > 1 + tol:
            return f"circle {i} ({x!r}, {y!r}, r={r!r}) leaves the unit square"
    for i in range(n):
        xi, yi, ri = circles[i]
        for j in range(i + 1, n):
            xj, yj, rj = circles[j]
            gap = math.hypot(xi - xj, yi - yj) - (ri + rj)
            if gap < -tol:
                return f"circles {i} and {j} overlap by {-gap:.3g}"
    return ""


def parse_circles(stdout: str) -> tuple[list[tuple[float, float, float]] | None, str]:
    """(circles, "") from lines of three numbers, or (None, why it is garbage)."""
    circles = []
    for k, line in enumerate(stdout.splitlines()):
        if not line.strip():
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 3:
            return None, f"line {k + 1} does not hold three numbers: {line[:80]!r}"
        try:
            x, y, r = (float(p) for p in parts)
        except ValueError:
            return None, f"line {k + 1} is not numeric: {line[:80]!r}"
        circles.append((x, y, r))
    return circles, ""


def program_for(circles: list[tuple[float, float, float]], digits: int = 6) -> str:
    """The solution text of a packing: a short program that prints its circles."""
    rows = "\n".join(f"    ({x:.{digits}f}, {y:.{digits}f}, {r:.{digits}f})," for x, y, r in circles)
    return ("# circles (x, y, r) in the unit square; the score is the sum of r\n"
            f"circles = [\n{rows}\n]\n"
            "for x, y, r in circles:\n"
            "    print(x, y, r)\n")


class CirclePacking(Problem):
    invalid_reward = 0.0

    def __init__(self, n: int = 6, tolerance: float = 1e-9, limits: SandboxLimits | None = None,
                 start_fill: float = 0.5):
        if n < 2:
            raise ValueError(f"circle packing needs n >= 2 circles, got {n}")
        if not 0 <= tolerance < 1e-3:
            raise ValueError(f"tolerance must be in [0, 1e-3), got {tolerance}")
        if not 0 < start_fill <= 1:
            raise ValueError(f"start_fill must be in (0, 1], got {start_fill}")
        self.n, self.tolerance, self.start_fill = n, tolerance, start_fill
        self.limits = limits or SandboxLimits(cpu_seconds=5, wall_seconds=10.0, memory_mb=256, output_bytes=16 * 1024)
        check_isolation(self.limits)  # a machine that cannot sandbox candidates fails here, naming the fix
        self.name = f"circle_packing_{n}"

    @classmethod
    def from_config(cls, cfg: ProblemConfig) -> CirclePacking:
        limits = SandboxLimits(cpu_seconds=cfg.cpu_seconds, wall_seconds=cfg.wall_seconds, memory_mb=cfg.memory_mb,
                        output_bytes=cfg.output_kb * 1024, isolation=cfg.sandbox, disk_mb=cfg.disk_mb,
                        disk_inodes=cfg.disk_inodes)
        return cls(cfg.n, cfg.tolerance, limits, cfg.start_fill)

    def initial_solution(self) -> str:
        """A k x k grid (k = ceil(sqrt(n))), circles at `start_fill` of the radius their cells allow: valid, with
        room."""
        k = math.ceil(math.sqrt(self.n))
        r = round(self.start_fill * 0.5 / k, 4)
        cells = [((i % k + 0.5) / k, (i // k + 0.5) / k) for i in range(self.n)]
        return program_for([(x, y, r) for x, y in cells], digits=4)

    def prompt(self, solution: str, reward: float) -> list[dict]:
        text = (f"Pack {self.n} circles into the unit square [0,1] x [0,1]: every circle must lie inside the square "
                "and no two circles may overlap. Make the sum of the radii as large as possible.\n\n"
                f"This program scores {reward:.6f}:\n```python\n{solution.strip()}\n```\n\n"
                "Write an improved version: change the numbers so the circles are bigger but still fit. Reply with "
                "the whole program in one ```python block.")
        return [{"role": "user", "content": text}]

    def verify(self, text: str) -> Verdict:
        code = extract_code(text)
        if code is None:
            return Verdict(self.invalid_reward, False, "format", "no ```python code block in the reply", None)
        run = run_python(code, self.limits)
        details = {"seconds": round(run.seconds, 3)}
        if not run.ok:
            return Verdict(self.invalid_reward, False, run.kind, run.detail, code, details)
        circles, why = parse_circles(run.stdout)
        if circles is None:
            return Verdict(self.invalid_reward, False, "garbage", why, code, details)
        why = check_circles(circles, self.n, self.tolerance)
        if why:
            return Verdict(self.invalid_reward, False, "infeasible", why, code, details)
        return Verdict(sum(r for _, _, r in circles), True, "ok", "", code, {**details, "circles": circles})

    def best_known(self) -> float | None:
        return BEST_KNOWN[self.n][0] if self.n in BEST_KNOWN else None


def solve_radii(centres: list[tuple[float, float]]) -> list[float]:
    """The radii with the largest sum for fixed centres in the unit square: a linear program (HiGHS)."""
    import numpy as np
    need("tttd")
    from scipy.optimize import linprog

    n = len(centres)
    iu, ju = np.triu_indices(n, 1)
    pts = np.asarray(centres, dtype=float)
    a_ub = np.zeros((len(iu), n))
    a_ub[np.arange(len(iu)), iu] = 1.0
    a_ub[np.arange(len(iu)), ju] = 1.0
    b_ub = np.hypot(*(pts[iu] - pts[ju]).T)
    bounds = [(0.0, max(0.0, min(x, 1 - x, y, 1 - y))) for x, y in centres]
    res = linprog(-np.ones(n), A_ub=a_ub if n > 1 else None, b_ub=b_ub if n > 1 else None, bounds=bounds,
                  method="highs")
    if res.status != 0:  # cannot happen for centres in the square (r = 0 is feasible); say so if it does
        raise RuntimeError(f"the radius LP failed: {res.message}")
    return [max(0.0, float(r)) for r in res.x]


def centres_text(centres: list[tuple[float, float]], digits: int = 4) -> str:
    """The solution text of a set of centres: the list a reply states."""
    rows = "\n".join(f"    ({x:.{digits}f}, {y:.{digits}f})," for x, y in centres)
    return f"centres = [\n{rows}\n]"


class CircleCentres(Problem):
    """Circle packing where the model places the centres and the radii follow by linear programming (module doc).

    A reply's last ```python block must hold at least n pairs `(x, y)`; the first n are the centres, rounded to
    `digits` decimals (the precision the state shows, so a stored solution scores exactly what it scored).
    """

    invalid_reward = 0.0
    digits = 4

    def __init__(self, n: int = 6, start_fill: float = 0.3):
        if n < 2:
            raise ValueError(f"circle packing needs n >= 2 circles, got {n}")
        if not 0 < start_fill <= 1:
            raise ValueError(f"start_fill must be in (0, 1], got {start_fill}")
        self.n, self.start_fill = n, start_fill
        self.name = f"circle_centres_{n}"

    @classmethod
    def from_config(cls, cfg: ProblemConfig) -> CircleCentres:
        return cls(cfg.n, cfg.start_fill)

    def initial_solution(self) -> str:
        """A k x k grid of cell centres (k = ceil(sqrt(n))) shrunk towards the square's centre by `start_fill`:
        crowded, so the circles are small (n = 6, 0.3: sum 0.3000) and moving centres apart pays."""
        k = math.ceil(math.sqrt(self.n))
        cells = [((i % k + 0.5) / k, (i // k + 0.5) / k) for i in range(self.n)]
        return centres_text([(0.5 + self.start_fill * (x - 0.5), 0.5 + self.start_fill * (y - 0.5))
                             for x, y in cells], self.digits)

    def prompt(self, solution: str, reward: float) -> list[dict]:
        text = (f"Place {self.n} circles in the unit square [0,1] x [0,1]. You choose the centres; each circle then "
                "gets the largest radius that keeps it inside the square and clear of the other circles, and the "
                f"score is the sum of the radii.\n\nThese centres score {reward:.4f}:\n```python\n"
                f"{solution.strip()}\n```\n\nWrite an improved version: move the centres apart so the circles can "
                "grow. Reply with the whole list in one ```python block.")
        return [{"role": "user", "content": text}]

    def verify(self, text: str) -> Verdict:
        code = extract_code(text)
        if code is None:
            return Verdict(self.invalid_reward, False, "format", "no ```python code block in the reply", None)
        pairs = _PAIR.findall(code)
        if len(pairs) < self.n:
            return Verdict(self.invalid_reward, False, "garbage",
                           f"the code block holds {len(pairs)} (x, y) pairs, {self.n} needed", code)
        centres = [(round(float(x), self.digits), round(float(y), self.digits)) for x, y in pairs[:self.n]]
        solution = centres_text(centres, self.digits)
        for i, (x, y) in enumerate(centres):
            if not (math.isfinite(x) and math.isfinite(y) and 0 <= x <= 1 and 0 <= y <= 1):
                return Verdict(self.invalid_reward, False, "infeasible",
                               f"centre {i} ({x!r}, {y!r}) lies outside the unit square", solution)
        circles = repair([(x, y, r) for (x, y), r in zip(centres, solve_radii(centres), strict=True)])
        why = check_circles(circles, self.n, 0.0, allow_zero=True)
        if why:  # repair makes this unreachable; a verifier still checks what it scores
            return Verdict(self.invalid_reward, False, "infeasible", why, solution)
        return Verdict(sum(r for _, _, r in circles), True, "ok", "", solution, {"circles": circles})

    def best_known(self) -> float | None:
        return BEST_KNOWN[self.n][0] if self.n in BEST_KNOWN else None


def make_problem(config: ProblemConfig | dict) -> Problem:
    """The problem a config names: a built-in name (config.PROBLEMS) or a `module:Class` deriving Problem."""
    cfg = config if isinstance(config, ProblemConfig) else ProblemConfig(**config)
    return problem_class(cfg.name).from_config(cfg)


def problem_class(name: str) -> type[Problem]:
    from reef_lab.plugins import load_class

    return load_class(name, Problem, "problem.name", names=PROBLEMS)


@dataclass(frozen=True)
class BaselineResult:
    best: float  # the best valid sum of radii (0.0 if no start finished)
    circles: list[tuple[float, float, float]]
    starts: int  # SLSQP runs completed
    seconds: float


def repair(circles: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """Shrink radii until the packing is strictly valid (an optimiser's answer may overlap by 1e-10)."""
    out = [[x, y, max(min(r, x, 1 - x, y, 1 - y), 0.0)] for x, y, r in circles]
    for i in range(len(out)):
        for j in range(i + 1, len(out)):
            d = math.hypot(out[i][0] - out[j][0], out[i][1] - out[j][1])
            s = out[i][2] + out[j][2]
            if s > d:
                out[i][2] *= d / s
                out[j][2] *= d / s
    return [(x, y, r * (1 - 1e-12)) for x, y, r in out]


def scipy_baseline(n: int, seconds: float, seed: int = 0) -> BaselineResult:
    """SLSQP multistart on the same instance within a wall-time budget (starts are not begun after it runs out)."""
    import numpy as np
    need("tttd")
    from scipy.optimize import minimize

    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    iu, ju = np.triu_indices(n, 1)
    pairs = len(iu)

    def objective(z):
        return -z[2 * n:].sum()

    def objective_grad(z):
        g = np.zeros(3 * n)
        g[2 * n:] = -1.0
        return g

    def cons(z):
        x, y, r = z[:n], z[n:2 * n], z[2 * n:]
        walls = np.concatenate([x - r, 1 - x - r, y - r, 1 - y - r])
        sep = (x[iu] - x[ju]) ** 2 + (y[iu] - y[ju]) ** 2 - (r[iu] + r[ju]) ** 2
        return np.concatenate([walls, sep])

    def cons_jac(z):
        x, y, r = z[:n], z[n:2 * n], z[2 * n:]
        jac = np.zeros((4 * n + pairs, 3 * n))
        idx = np.arange(n)
        jac[idx, idx], jac[idx, 2 * n + idx] = 1, -1
        jac[n + idx, idx], jac[n + idx, 2 * n + idx] = -1, -1
        jac[2 * n + idx, n + idx], jac[2 * n + idx, 2 * n + idx] = 1, -1
        jac[3 * n + idx, n + idx], jac[3 * n + idx, 2 * n + idx] = -1, -1
        rows = 4 * n + np.arange(pairs)
        dx, dy, sr = x[iu] - x[ju], y[iu] - y[ju], r[iu] + r[ju]
        jac[rows, iu], jac[rows, ju] = 2 * dx, -2 * dx
        jac[rows, n + iu], jac[rows, n + ju] = 2 * dy, -2 * dy
        jac[rows, 2 * n + iu], jac[rows, 2 * n + ju] = -2 * sr, -2 * sr
        return jac

    best, best_circles, starts = 0.0, [], 0
    bounds = [(0.0, 1.0)] * (2 * n) + [(0.0, 0.5)] * n
    while time.perf_counter() - started < seconds:
        z0 = np.concatenate([rng.uniform(0.05, 0.95, 2 * n), rng.uniform(0.0, 0.05, n)])
        res = minimize(objective, z0, jac=objective_grad, method="SLSQP", bounds=bounds,
                       constraints=[{"type": "ineq", "fun": cons, "jac": cons_jac}],
                       options={"maxiter": 500, "ftol": 1e-12})
        starts += 1
        z = res.x
        circles = repair([(float(z[i]), float(z[n + i]), float(z[2 * n + i])) for i in range(n)])
        if check_circles(circles, n, 0.0) == "":
            total = sum(r for _, _, r in circles)
            if total > best:
                best, best_circles = total, circles
    return BaselineResult(best, best_circles, starts, time.perf_counter() - started)
