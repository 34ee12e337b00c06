"""TTT-Discover's loop on a gateway scenario: select parents by PUCT, sample continuations through the gateway,
verify, report, train one step, serve the new policy; repeat.

Why through the gateway: every rollout is an inference of the scenario (recorded with its token ids and the
engine's logprobs, the reward reported on it), so a run is inspectable like any traffic, works the same live (a
server's scenario with recipe `tttd`) and as an experiment (scripts/run_experiment.py), and on any generating engine
that hosts releases (embedded, vLLM, SGLang). The policy after each step is loaded into the engine as a transient
release `<scenario>:step<N>` (two folders used in turn, so the one serving is never overwritten) and routed to the
scenario, so the next step samples on-policy; only the run's final policy is published as a release, with the best
solution beside it (best_solution.py, best.json), which also goes to W&B as an artifact.

State lives in the run folder: archive.json (the PUCT archive), state.json (steps done, the policy's folder),
metrics.jsonl (one row per step). A stopped run resumes at its next step from the last policy (the LoRA adapter;
the optimizer's moments start afresh).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

from reef_lab.engines.base import Generator, ReleaseHost
from reef_lab.files import write_atomic, write_json
from reef_lab.learning.recipe import LearnContext
from reef_lab.trainers.samples import Sample
from reef_lab.trainers import make_trainer
from reef_lab.trainers.base import Loss
from reef_lab.wire.text import chat_message

from .archive import Archive, State
from .config import TTTDConfig
from .entropic import group_advantages
from .problems import Problem, make_problem

log = logging.getLogger("recipes.tttd")


class Discovery:
    """One TTT-Discover run of the context's scenario, its state in `folder`."""

    def __init__(self, ctx: LearnContext, config: TTTDConfig, folder: str | Path):
        self.ctx, self.scenario, self.cfg, self.releaser = ctx, ctx.scenario, config, ctx.releaser
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tracker = ctx.tracker
        self.problem: Problem = make_problem(config.problem_config)
        engine = ctx.engine
        if not isinstance(engine, Generator):
            raise ValueError("TTT-Discover samples its own rollouts: serve with a generating engine (embedded, vllm, "
                             "sglang), not a relay")
        if config.policy_updates and not isinstance(engine, ReleaseHost):
            raise ValueError("TTT-Discover trains the policy: the engine must host releases (embedded, vllm, sglang)")
        self.engine = engine
        self._archive_path, self._state_path = self.folder / "archive.json", self.folder / "state.json"
        self.metrics_path = self.folder / "metrics.jsonl"
        self.state = orjson.loads(self._state_path.read_bytes()) if self._state_path.is_file() else {
            "step": 0, "policy": None, "policy_folder": None, "released": None}
        if self._archive_path.is_file():
            self.archive = Archive.from_dict(orjson.loads(self._archive_path.read_bytes()))
        else:
            self.archive = Archive(config.puct_c, config.archive_size, config.children_per_expansion,
                                   config.puct_scale_by_range)
            start = self.problem.initial_solution()
            verdict = self.problem.verify(self.problem.reply_for(start))
            if not verdict.valid:
                raise ValueError(f"the problem's initial solution is invalid: {verdict.reason}")
            for _ in range(config.groups):  # one initial state per group, as the authors' code does
                self.archive.add_initial(start, verdict.reward, {"kind": "initial"})
            self._save()
        self._trainer = None
        self.phase = "idle"
        self.last_row: dict | None = None
        if self.state["policy"] and config.policy_updates:  # resumed: serve the last policy again
            self.releaser.serve_policy(self.scenario, self.state["policy"], self.state["policy_folder"])

    # ---- the loop -------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state["step"] >= self.cfg.steps

    def run(self, stop: threading.Event | None = None, progress: bool = False) -> dict:
        """Steps until `cfg.steps` (or `stop`); then the final release. Returns the summary."""
        from tqdm import tqdm

        bar = tqdm(total=self.cfg.steps, initial=self.state["step"], desc=f"{self.scenario} TTT-Discover",
                   disable=not progress, dynamic_ncols=True)
        bar.set_postfix(best=f"{self.archive.best().reward:.4f}")
        while not self.done and not (stop is not None and stop.is_set()):
            row = self.step()
            bar.update(1)
            bar.set_postfix(best=f"{row['best_reward']:.4f}", step_mean=f"{row['mean_reward']:.3f}",
                            valid=f"{row['valid_fraction']:.2f}")
        bar.close()
        if self.done and self.state["released"] is None:
            self.finish()
        return self.summary()

    def step(self) -> dict:
        t, cfg = self.state["step"], self.cfg
        started = time.perf_counter()
        self.phase = "sampling"
        initial = [s for s in self.archive.states.values() if s.initial]
        parents = self.archive.select(cfg.groups) if cfg.reuse else [initial[g % len(initial)]
                                                                      for g in range(cfg.groups)]
        jobs = [(g, parent, k) for g, parent in enumerate(parents) for k in range(cfg.rollouts_per_group)]
        with ThreadPoolExecutor(min(cfg.concurrency, len(jobs))) as pool:
            outs = list(pool.map(lambda job: self._rollout(t, *job), jobs))
        sampled = time.perf_counter()

        self.phase = "training"
        samples, betas, dropped, kinds = [], [], 0, {}
        for g, parent in enumerate(parents):
            group = [o for o in outs if o["group"] == g]
            for o in group:
                kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
            if cfg.reuse:
                self.archive.expand(parent.id, [(o["solution"] or "", o["reward"] if o["valid"] else None)
                                                for o in group], step=t,
                                    infos=[{"record": o["record_id"], "kind": o["kind"]} for o in group])
            rewards = [o["reward"] for o in group]
            adv = group_advantages(rewards, cfg.kl_target, cfg.beta_max)
            if adv is None:
                dropped += 1
                betas.append(None)
                continue
            advantages, beta = adv
            betas.append(beta)
            for o, a in zip(group, advantages, strict=True):
                if o["sample"] is not None:
                    o["sample"].advantages = [a] * len(o["sample"].completion_ids)
                    samples.append(o["sample"])
        if not cfg.reuse:  # best-of-N keeps only the best solution found, as a child of the start
            best = max((o for o in outs if o["valid"]), key=lambda o: o["reward"], default=None)
            if best is not None and best["reward"] > self.archive.best().reward:
                self.archive.expand(initial[0].id, [(best["solution"], best["reward"])], step=t,
                                    infos=[{"record": best["record_id"], "kind": "ok"}])
        stats = {}
        if cfg.policy_updates and samples:
            stats = self.trainer.step(samples, Loss("is", kl_coef=cfg.kl_coef))
        trained = time.perf_counter()
        swap_s = None
        if cfg.policy_updates and samples:
            self.phase = "serving"
            swap_s = self._serve_policy(t + 1)
        rewards = [o["reward"] for o in outs]
        best = self.archive.best()
        row = {"event": "tttd_step", "step": t + 1, "time": time.time(), "best_reward": best.reward,
               "best_state": best.id, "step_best": max(rewards), "mean_reward": sum(rewards) / len(rewards),
               "valid_fraction": sum(o["valid"] for o in outs) / len(outs), "kinds": kinds,
               # valid replies that restate their parent, and new ones that beat it (the discoveries)
               "copies": sum(o["copy"] for o in outs), "better": sum(o["better"] for o in outs),
               "parents": [p.id for p in parents], "parent_rewards": [p.reward for p in parents],
               "betas": betas, "groups_dropped": dropped, "samples": len(samples),
               "tokens": sum(o["tokens"] for o in outs), "release": self.engine.release_for(self.scenario),
               "rollout_s": round(sampled - started, 2), "train_s": round(trained - sampled, 2),
               "swap_s": swap_s, "archive_size": len(self.archive),
               **{k: v for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}
        if self.problem.best_known() is not None:
            row["best_known"] = self.problem.best_known()
        self.state["step"] = t + 1
        self._save()
        with open(self.metrics_path, "ab") as f:
            f.write(orjson.dumps(row) + b"\n")
        if self.tracker is not None:
            self.tracker.log(row)
        self.last_row, self.phase = row, "idle"
        log.info("%s step %d: best %.4f, mean %.3f, valid %.2f", self.scenario, t + 1, row["best_reward"],
                 row["mean_reward"], row["valid_fraction"])
        return row

    def _rollout(self, t: int, g: int, parent: State, k: int) -> dict:
        cfg = self.cfg
        body = {"model": self.engine.model_name, "messages": self.problem.prompt(parent.solution, parent.reward),
                "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                "seed": (cfg.seed * 1_000_003 + t) * 65_537 + g * cfg.rollouts_per_group + k}
        out = {"group": g, "parent": parent.id, "record_id": None, "reward": self.problem.invalid_reward,
               "valid": False, "kind": "error", "solution": None, "sample": None, "tokens": 0, "copy": False,
               "better": False}
        try:  # the stored record comes back: its token ids and logprobs are the sample's
            rec = self.ctx.infer(body, {"group": f"s{t}g{g}", "tttd_step": str(t), "parent": parent.id})
            rid = rec["id"]
            text = chat_message(rec).get("content") or ""
        except Exception as e:  # noqa: BLE001 - a failed rollout scores as invalid and is not trained on
            log.warning("rollout %d/%d of step %d failed: %s", g, k, t, e)
            return out
        verdict = self.problem.verify(text)
        self.ctx.report({"score": verdict.reward, "references": [rid], "feedback": verdict.reason,
                         "metadata": {"valid": verdict.valid, "kind": verdict.kind, "tttd_step": t,
                                      "parent": parent.id}})
        copy = verdict.valid and (verdict.solution or "").strip() == parent.solution.strip()
        out.update(record_id=rid, reward=verdict.reward, valid=verdict.valid, kind=verdict.kind,
                   solution=verdict.solution, tokens=len(rec.get("token_ids") or []), copy=copy,
                   better=verdict.valid and not copy and verdict.reward > parent.reward)
        if rec.get("token_ids") and rec.get("logprobs"):
            out["sample"] = Sample(record_id=rid, prompt_ids=list(rec["prompt_token_ids"]),
                                   completion_ids=list(rec["token_ids"]), logprobs=list(rec["logprobs"]),
                                   score=verdict.reward, release_id=rec.get("release_id") or "base",
                                   temperature=cfg.temperature, group=f"s{t}g{g}")
        return out

    # ---- the policy -----------------------------------------------------------------------------------------
    @property
    def trainer(self):
        if self._trainer is None:
            self._trainer = make_trainer(self.cfg.trainer,
                                         self.engine.model_dir, self.state["policy_folder"])
        return self._trainer

    def _serve_policy(self, step: int) -> float:
        """Export the policy after `step` and make the engine serve it to the scenario (the next rollouts)."""
        started = time.perf_counter()
        folder = self.folder / f"policy-{step % 2}"
        key = f"{self.scenario}:step{step}"
        self.trainer.export(folder, {"scenario": self.scenario, "tttd_step": step})
        self.releaser.serve_policy(self.scenario, key, folder, previous=self.state["policy"])
        self.state.update(policy=key, policy_folder=str(folder))
        return round(time.perf_counter() - started, 2)

    def finish(self) -> dict:
        """The best solution as files (and a W&B artifact); the final policy as the scenario's next release."""
        best = self.archive.best()
        info = {"scenario": self.scenario, "problem": self.problem.name, "reward": best.reward, "state": best.id,
                "step": best.step, "best_known": self.problem.best_known(), "steps": self.state["step"],
                "lineage": best.ancestors}
        write_atomic(self.folder / "best_solution.py", best.solution.encode())
        write_json(self.folder / "best.json", info, indent=True)
        released = None
        if self.cfg.policy_updates and self._trainer is not None:
            cid, cfolder = self.releaser.start_candidate(self.scenario, {"recipe": "tttd", "best": info,
                                                                       "trainer_step": self.trainer.steps})
            try:
                self.trainer.export(cfolder, {"scenario": self.scenario, "candidate": cid, "best": info})
                write_atomic(cfolder / "best_solution.py", best.solution.encode())
                write_json(cfolder / "best.json", info, indent=True)
            except Exception as e:
                self.releaser.fail(self.scenario, cid, e)
                raise
            released = self.releaser.submit(self.scenario, cid, "always")["release"]  # the final policy serves
            if self.state["policy"]:
                self.releaser.drop_policy(self.state["policy"])
            self.state["policy"] = None
        self.state["released"] = released["release_id"] if released else "none"
        self._save()
        if self.tracker is not None:
            self.tracker.artifact(self.folder / "best_solution.py", f"{self.scenario}-best-solution", "solution",
                                  {k: v for k, v in info.items() if k != "lineage"})
        return info

    def summary(self) -> dict:
        best = self.archive.best()
        rows = self.rows()
        return {"scenario": self.scenario, "steps": self.state["step"], "best_reward": best.reward,
                "best_known": self.problem.best_known(), "initial_reward": min(
                    s.reward for s in self.archive.states.values() if s.initial),
                "rollouts": self.state["step"] * self.cfg.groups * self.cfg.rollouts_per_group,
                "release": self.state.get("released"), "folder": str(self.folder),
                "wall_s": round(sum((r.get("rollout_s") or 0) + (r.get("train_s") or 0) + (r.get("swap_s") or 0)
                                    for r in rows), 1)}

    def rows(self) -> list[dict]:
        if not self.metrics_path.is_file():
            return []
        return [orjson.loads(line) for line in self.metrics_path.read_bytes().splitlines() if line.strip()]

    def _save(self) -> None:
        write_json(self._archive_path, self.archive.to_dict())
        write_json(self._state_path, self.state)

    def close(self) -> None:
        self._trainer = None
