"""Learning-rate schedules and the optimizer's parameter groups."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from specformer import load_spec
from specformer.builder import build_model
from specformer.registry import REGISTRY
from specformer.specs.training import (
    ConstantScheduleSpec,
    CosineScheduleSpec,
    InverseSqrtScheduleSpec,
    LinearScheduleSpec,
)
from specformer.training.optim import param_groups
from specformer.training.schedules import cosine, inverse_sqrt, linear


def test_inverse_sqrt_is_the_original_papers_formula() -> None:
    # Vaswani et al. 2017, eq. 3, with d_model = 512 and warmup = 4000
    sched = inverse_sqrt(InverseSqrtScheduleSpec(warmup_steps=4000), d_model=512, base_lr=1.0)
    for n in (1, 100, 3999, 4000, 4001, 20000, 100000):
        assert sched.lr(n - 1) == pytest.approx(512**-0.5 * min(n**-0.5, n * 4000**-1.5))
    lrs = [sched.lr(s) for s in range(0, 12000, 10)]
    peak = max(range(len(lrs)), key=lrs.__getitem__)
    assert abs(peak * 10 - 3999) <= 10
    assert sched.lr(3999) == pytest.approx((512 * 4000) ** -0.5)  # the peak: 6.99e-4
    assert sched.lr(3999) == pytest.approx(6.99e-4, rel=1e-3)
    # as a multiplier of the optimizer's lr it reproduces the formula whatever that lr is
    relative = inverse_sqrt(InverseSqrtScheduleSpec(warmup_steps=4000, scale=2.0), d_model=512, base_lr=5e-4)
    assert relative(999) * 5e-4 == pytest.approx(2 * sched.lr(999))


@pytest.mark.parametrize("warmup", [0, -3])
def test_inverse_sqrt_without_warmup_says_what_to_give(warmup: int) -> None:
    # the formula divides by the warmup, which sets its peak: pydantic's "greater than 0" said neither
    from specformer import SpecError

    with pytest.raises(SpecError) as caught:
        load_spec("gpt-nano", overrides=[f"training.schedule={{type: inverse_sqrt, warmup_steps: {warmup}}}"])
    text = str(caught.value)
    assert f"training.schedule.warmup_steps: the inverse_sqrt schedule needs a warmup of at least 1 step, got {warmup}" in text
    assert "give 4000, the paper's, or for a shorter run about a tenth of training.max_steps" in text
    assert "a schedule without warmup is constant, linear or cosine with warmup_steps: 0" in text
    assert "greater than 0" not in text
    assert InverseSqrtScheduleSpec(warmup_steps=1).warmup_steps == 1


def test_warmup_then_cosine_and_linear_decay() -> None:
    # steps 0 .. total - 1; the decay reaches min_lr_ratio * lr at step total, one past the last,
    # so the last step trains: with min_lr_ratio 0 it runs at lr / (total - warmup), not at 0
    c = cosine(CosineScheduleSpec(warmup_steps=10, min_lr_ratio=0.1), total=110)
    assert c(0) == pytest.approx(0.1) and c(9) == pytest.approx(1.0)
    assert c(10) == pytest.approx(1.0)
    assert c(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down the cosine
    assert c(109) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert c(109) > 0.1 and c(110) == pytest.approx(0.1) and c(500) == pytest.approx(0.1)
    lin = linear(LinearScheduleSpec(warmup_steps=0, min_lr_ratio=0.0), total=100)
    assert [lin(s) for s in (0, 25, 50, 99, 100)] == pytest.approx([1.0, 0.75, 0.5, 0.01, 0.0])
    short = linear(LinearScheduleSpec(warmup_steps=2, min_lr_ratio=0.1), total=6)
    assert [short(s) for s in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.775, 0.55, 0.325])
    # one step left after warmup: it runs at the peak (the decay ends after it), as transformers'
    last = cosine(CosineScheduleSpec(warmup_steps=4, min_lr_ratio=0.1), total=5)
    assert [last(s) for s in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    const = REGISTRY.build("schedule", ConstantScheduleSpec(warmup_steps=4), total=100)
    assert [const(s) for s in (0, 3, 50)] == pytest.approx([0.25, 1.0, 1.0])


@pytest.mark.parametrize("warmup,total", [(0, 10), (4, 10), (10, 110), (3, 4)])
def test_schedules_after_warmup_are_transformers_step_for_step(warmup: int, total: int) -> None:
    optimization = pytest.importorskip("transformers.optimization")

    def reference(make: Any, **kw: Any) -> list[float]:
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([param], lr=1.0)
        sched = make(opt, num_warmup_steps=warmup, num_training_steps=total, **kw)
        lrs = []
        for _ in range(total):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return lrs

    cases = [
        (linear(LinearScheduleSpec(warmup_steps=warmup), total=total),
         reference(optimization.get_linear_schedule_with_warmup)),
        (cosine(CosineScheduleSpec(warmup_steps=warmup, min_lr_ratio=0.0), total=total),
         reference(optimization.get_cosine_schedule_with_warmup)),
        (cosine(CosineScheduleSpec(warmup_steps=warmup, min_lr_ratio=0.1), total=total),
         reference(optimization.get_cosine_with_min_lr_schedule_with_warmup, min_lr_rate=0.1)),
    ]
    for ours, theirs in cases:
        # warmup step k runs at transformers' step k + 1 (their step 0 runs at lr 0); from the
        # end of warmup on, every step is theirs, the last one above 0 included
        assert [ours(s) for s in range(warmup)] == pytest.approx(theirs[1 : warmup + 1])
        assert [ours(s) for s in range(warmup, total)] == pytest.approx(theirs[warmup:])
        assert ours(total - 1) > 0


def test_lr_follows_the_schedule_in_a_run(tiny: Any) -> None:
    from specformer.training.run import train

    spec = load_spec(
        tiny("decoder", max_steps=8, val_interval=8, log_interval=1, schedule={"type": "linear", "warmup_steps": 4})
    )
    result = train(spec, progress=False)
    import csv
    from pathlib import Path

    rows = list(csv.DictReader(open(Path(result.run_dir) / "metrics.csv")))
    lrs = [float(r["train/lr"]) for r in rows if r.get("train/lr")]
    # lr of steps 1..8: warmup 1/4..4/4 of 3e-3, then linear decay toward 0 at step 9, one past
    # the last: the last step trains at a quarter of the peak (it ran at lr 0)
    expected = [3e-3 * f for f in (0.25, 0.5, 0.75, 1.0, 1.0, 0.75, 0.5, 0.25)]
    assert lrs == pytest.approx(expected)


def test_weight_decay_skips_biases_norms_and_counts_tied_weights_once() -> None:
    spec = load_spec("gpt-nano")
    model = build_model(spec)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("norm" in names[id(p)] for p in no_decay["params"])
    assert any(names[id(p)].endswith("bias") for p in no_decay["params"])
    total = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert total == sum(p.numel() for p in model.parameters())  # the tied matrix once
    opt = REGISTRY.build("optimizer", spec.training.optimizer, model=model)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["lr"] == spec.training.optimizer.lr
    assert math.isclose(opt.defaults["betas"][1], 0.95)


def test_adamw_is_fused_on_cpu_and_matches_the_plain_implementation():
    import copy

    import torch

    from specformer.specs.training import AdamWSpec
    from specformer.training.optim import adamw

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    spec = AdamWSpec(lr=1e-2, weight_decay=0.1)
    fused = adamw(spec, model=model)
    assert fused.defaults["fused"] is True
    # float16's gradient scaler is unscaled before clipping: no fused optimizer there; bf16
    # has no scaler: fused, without the scaler support Lightning refuses to clip for
    assert not adamw(spec, model=model, precision="16-mixed").defaults["fused"]
    bf16 = adamw(spec, model=model, precision="bf16-mixed")
    assert bf16.defaults["fused"] is True and not bf16._step_supports_amp_scaling
    assert fused._step_supports_amp_scaling  # elsewhere torch's own setting stands
    plain = torch.optim.AdamW(
        [
            {"params": [p for p in twin.parameters() if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in twin.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=tuple(spec.betas),
        eps=spec.eps,
    )
    x = torch.randn(32, 8)
    for _ in range(5):
        for net, opt in ((model, fused), (twin, plain)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("optimizer", [
    {"type": "adamw"},
    {"type": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    {"type": "sgd", "momentum": 0.0},
    {"type": "adafactor", "weight_decay": 0.01},
])
def test_each_optimizer_keeps_the_state_the_memory_estimate_counts(optimizer: dict[str, Any]) -> None:
    from specformer.analysis.memory import memory_estimate, optimizer_state_elements

    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1", f"training.optimizer={optimizer}"])
    model = build_model(spec)
    opt = REGISTRY.build("optimizer", spec.training.optimizer, model=model)
    assert type(opt).__name__.lower() == spec.training.optimizer.type
    decay = {g["weight_decay"] for g in opt.param_groups}
    assert decay == ({optimizer.get("weight_decay", 0.1 if optimizer["type"] == "adamw" else 0.0), 0.0})
    ids = torch.randint(0, spec.vocab_size, (2, 16))
    model(ids[:, :-1], labels=ids[:, 1:]).loss.backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True) if p.ndim >= 2)
    # the elements of every state tensor but the step counters, as torch allocated them
    kept = sum(t.numel() for state in opt.state.values() for k, t in state.items()
               if torch.is_tensor(t) and k != "step")
    assert kept == optimizer_state_elements(spec)
    assert memory_estimate(spec, dtype="fp32").optimizer == 4 * kept


def test_nesterov_needs_momentum() -> None:
    from specformer import SpecError

    with pytest.raises(SpecError, match="nesterov: true needs a momentum above 0"):
        load_spec("gpt-nano", overrides=["training.optimizer={type: sgd, momentum: 0, nesterov: true}"])
