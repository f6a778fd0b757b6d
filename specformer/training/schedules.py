"""Learning-rate schedules, as multipliers of the optimizer's peak lr for ``LambdaLR``.

Each schedule is a small object with plain-number attributes, so the scheduler's
``state_dict`` (which stores them) loads with ``torch.load(weights_only=True)``.
``step`` counts optimizer steps from 0.
"""

from __future__ import annotations

import math

from specformer.specs.training import (
    ConstantScheduleSpec,
    CosineScheduleSpec,
    InverseSqrtScheduleSpec,
    LinearScheduleSpec,
)

__all__ = ["Schedule", "constant", "linear", "cosine", "inverse_sqrt"]


class Schedule:
    """lr(step) / peak lr: warmup, then a shape that decays over ``total`` steps.

    Warmup step k (from 0) runs at (k + 1) / warmup, so step 0 trains; after warmup the
    multiplier is transformers' ``get_linear_schedule_with_warmup`` /
    ``get_cosine_with_min_lr_schedule_with_warmup`` (``min_lr_rate``) at the same step.
    """

    def __init__(self, shape: str, *, warmup: int, total: int, min_ratio: float = 0.0) -> None:
        self.shape, self.warmup, self.total, self.min_ratio = shape, warmup, max(total, 1), min_ratio

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if self.shape == "constant":
            return 1.0
        # steps run 0 .. total - 1 and the decay reaches min_ratio at step ``total``, the
        # step after the last, as transformers' get_linear/get_cosine_schedule_with_warmup
        # do: every step trains (with min_ratio 0 a last step at lr 0 would be wasted), the
        # last at 1 / (total - warmup) of the way above min_ratio
        span = self.total - self.warmup
        progress = 1.0 if span <= 0 else min(1.0, (step - self.warmup) / span)
        if self.shape == "linear":
            return 1.0 - (1.0 - self.min_ratio) * progress
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def __repr__(self) -> str:
        return f"Schedule({self.shape}, warmup={self.warmup}, total={self.total}, min_ratio={self.min_ratio})"


class InverseSqrt:
    """Vaswani et al. 2017, eq. 3: lr = scale · d_model^-0.5 · min(n^-0.5, n · warmup^-1.5), n = step + 1.

    The formula gives the lr itself; as a multiplier it is divided by the peak lr.
    """

    def __init__(self, *, d_model: int, warmup: int, scale: float, base_lr: float) -> None:
        self.d_model, self.warmup, self.scale, self.base_lr = d_model, warmup, scale, base_lr

    def lr(self, step: int) -> float:
        n = step + 1
        return self.scale * self.d_model**-0.5 * min(n**-0.5, n * self.warmup**-1.5)

    def __call__(self, step: int) -> float:
        return self.lr(step) / self.base_lr


def constant(spec: ConstantScheduleSpec, *, total: int, **_: object) -> Schedule:
    return Schedule("constant", warmup=spec.warmup_steps, total=total)


def linear(spec: LinearScheduleSpec, *, total: int, **_: object) -> Schedule:
    return Schedule("linear", warmup=spec.warmup_steps, total=total, min_ratio=spec.min_lr_ratio)


def cosine(spec: CosineScheduleSpec, *, total: int, **_: object) -> Schedule:
    return Schedule("cosine", warmup=spec.warmup_steps, total=total, min_ratio=spec.min_lr_ratio)


def inverse_sqrt(spec: InverseSqrtScheduleSpec, *, d_model: int, base_lr: float, **_: object) -> InverseSqrt:
    return InverseSqrt(d_model=d_model, warmup=spec.warmup_steps, scale=spec.scale, base_lr=base_lr)
