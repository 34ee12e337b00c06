"""The vLLM engine's weights transport without a server: the gate never lets a request run on weights other than
its own, takes turns between releases without starving either, and survives a refused switch; release weights
that an in-place reload would not apply whole are refused before the server sees them."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from reef_lab.engines.vllm import WeightsGate, check_release_weights


def test_no_request_runs_on_weights_other_than_its_own_and_none_starves():
    gate, server = WeightsGate("base"), {"held": "base", "running": 0}
    lock, violations, done = threading.Lock(), [], {"base": 0, "r1": 0, "r2": 0}

    def switch(release):
        with lock:
            if server["running"]:
                violations.append(f"switch to {release} with {server['running']} running")
        time.sleep(0.005)
        server["held"] = release

    def client(release, n):
        rng = random.Random(release + str(n))
        for _ in range(n):
            gate.acquire(release, switch)
            with lock:
                server["running"] += 1
                if server["held"] != release:
                    violations.append(f"{release} ran on {server['held']}")
            time.sleep(rng.random() * 0.002)
            with lock:
                server["running"] -= 1
                done[release] += 1
            gate.release()

    threads = [threading.Thread(target=client, args=(r, 40)) for r in ("base", "base", "base", "r1", "r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a release starved"
    assert violations == []
    assert done == {"base": 120, "r1": 80, "r2": 40} and gate.leases == 0


def test_a_refused_switch_keeps_the_held_weights_and_lets_others_go_on():
    gate = WeightsGate("base")

    def refuse(release):
        raise RuntimeError(f"{release} refused")
    with pytest.raises(RuntimeError, match="bad refused"):
        gate.acquire("bad", refuse)
    assert gate.held == "base" and gate.leases == 0
    gate.acquire("base", refuse)  # the held weights need no switch
    assert gate.leases == 1
    gate.release()


def test_release_weights_are_checked_against_the_base(tmp_path, tiny_model_dir):
    base = tiny_model_dir
    weights = {k: v.clone() for k, v in load_file(str(next(base.glob("*.safetensors")))).items()}
    ok = tmp_path / "ok"
    ok.mkdir()
    nonembed = next(k for k in weights if "embed" not in k)
    save_file({**weights, nonembed: weights[nonembed] + 0.01}, str(ok / "model.safetensors"))
    check_release_weights(base, ok)  # same tensors, other values: fine

    cases = {
        "missing": {k: v for k, v in weights.items() if k != nonembed},
        "shape": {**weights, nonembed: torch.zeros(3, 3)},
        "dtype": {**weights, nonembed: weights[nonembed].to(torch.float16)},
        "embeddings": {k: (v + 1 if "embed_tokens" in k else v) for k, v in weights.items()},
    }
    for name, tensors in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        with pytest.raises(ValueError, match="base model's tensors|embeddings"):
            check_release_weights(base, folder)
    cut = tmp_path / "cut"
    cut.mkdir()
    data = (ok / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:-64])
    with pytest.raises(ValueError, match="cannot be read"):
        check_release_weights(base, cut)
    with pytest.raises(ValueError, match="no safetensors"):
        (tmp_path / "empty").mkdir()
        check_release_weights(base, tmp_path / "empty")
