"""The LightningModule of a spec: the built model, its objective, optimizer and schedule.

``SpecModule(spec)`` composes with plain Lightning: pass it to any ``Trainer`` with
:class:`~specformer.data.module.SpecDataModule` (or your own dataloaders yielding the
same batch keys), your own callbacks and loggers. Its checkpoints carry the
resolved spec, the tokenizer and the random states (see
:mod:`specformer.training.checkpoint`).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torch.optim.lr_scheduler import LambdaLR

from specformer.components.attention import symbolic_lengths
from specformer.components.blocks import padded_on_the_right
from specformer.components.positional import warm_tables
from specformer.data.tokenizers import decoder_start_id, forced_ids
from specformer.registry import REGISTRY
from specformer.training.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    check_resumable,
    check_same_model,
    rng_state,
    set_rng_state,
)

__all__ = ["SpecModule", "call_compiled", "mark_lengths_dynamic"]


def mark_lengths_dynamic(*values: Any) -> None:
    """Mark the length (dimension 1) of every (B, L) tensor among ``values`` dynamic for
    ``torch.compile``, so that its first trace already takes the lengths as symbols: padded
    batches of every length then share one graph (dynamo would trace the first length as a
    constant, then again once another came)."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            torch._dynamo.maybe_mark_dynamic(value, 1)


def _all_ones_on_cpu(mask: Any) -> bool:
    """Whether ``mask`` is a CPU tensor of ones (read without a device sync)."""
    return isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and bool(mask.all())


def _right_padded_on_cpu(mask: Any) -> bool:
    """Whether ``mask`` is a (B, L) CPU tensor whose rows are real tokens, then padding only."""
    return (isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and mask.dim() == 2
            and padded_on_the_right(mask))


def call_compiled(compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, padded: bool,
                  training: bool = False, causal_masks: tuple[str, ...] = ()) -> Any:
    """Call a ``torch.compile``'d model as ``training.compile`` does.

    ``padded``: batches padded to their longest row (pairs, SFT, labelled texts), whose length
    changes from batch to batch. Their lengths are traced as symbols from the first step on
    (:func:`mark_lengths_dynamic`; attention's products then run as one opaque operation,
    :func:`~specformer.components.attention.symbolic_lengths`), so every length shares one
    graph. In ``training`` (train mode, gradients on), a mask among ``causal_masks`` (the
    objective's masks of a causal stack, whose labels are -100 under the padding) is left out
    when its rows are padded on the right only, as the eager model leaves it out itself (a
    real token's query sees real keys alone): attention keeps specformer's products instead
    of torch's masked kernel.

    Otherwise an attention mask of ones (masked LM's blocks) is left out here, where its values
    can be read: the eager model drops it itself, a traced one cannot read it and would run
    the masked kernel."""
    if not padded:
        kwargs = {k: None if k.endswith("attention_mask") and _all_ones_on_cpu(v) else v for k, v in kwargs.items()}
        return compiled(*args, **kwargs)
    mark_lengths_dynamic(*args, *kwargs.values())
    if training and torch.is_grad_enabled():
        kwargs = {k: None if k in causal_masks and _right_padded_on_cpu(v) else v for k, v in kwargs.items()}
    with symbolic_lengths():
        return compiled(*args, **kwargs)


class SpecModule(L.LightningModule):
    """Train the model a spec describes, with the objective its ``training:`` section names.

    Pass it to a ``lightning.Trainer`` with :class:`~specformer.data.module.SpecDataModule`, or
    with dataloaders of your own whose batches are dicts of the keys the objective reads
    (``objective.keys``, ``objective.optional_keys``; causal LM: ``input_ids`` and ``labels``
    shifted by one, optional ``attention_mask``; docs/training.md, "With plain Lightning").
    The built model is ``.model``.

    Logged metrics: ``train/loss``, ``train/lr``, ``val/loss``, ``val/ppl``, for
    sequence-to-sequence ``val/exact_match``, and for sequence classification
    ``val/accuracy`` (in place of ``val/ppl``).
    """

    def __init__(self, spec: Any, *, tokenizer: Any = None) -> None:
        super().__init__()
        from specformer.builder import build_model
        from specformer.specs.loader import load_spec
        from specformer.specs.schema import ModelSpec

        self.spec = spec if isinstance(spec, ModelSpec) else load_spec(spec)
        t = self.spec.training
        if t.objective is None:
            raise ValueError("the spec's training section has no objective")
        self.model = build_model(self.spec)
        from specformer.training.optim import apply_freeze

        # frozen before anything sees the model: the optimizer, DDP and Lightning's summary
        apply_freeze(self.model, t.optimizer)
        self.objective = REGISTRY.build("objective", t.objective, model_spec=self.spec)
        self.tokenizer = tokenizer
        self.tokens_seen = 0  # read by this rank, since the run began (resumes included)
        self.step_lr: float | None = None  # the learning rate of the step under way (train/lr)
        # this run's training tokens by the length their batch ran at (padded): the model FLOPs
        # a token costs grow with it, and pairs, SFT and labelled texts run shorter than seq_len
        self.tokens_by_length: Counter[int] = Counter()
        self.recent_losses: deque[torch.Tensor] = deque(maxlen=max(10, t.log_interval))
        self.val_history: list[dict[str, float]] = []
        # the micro-batches of the step under way: (loss × tokens predicted, tokens predicted),
        # summed over the processes
        self._step_losses: list[tuple[torch.Tensor, int]] = []
        self._step_losses_at: int | None = None
        self._step_loss_read: tuple[tuple[int | None, int], float] | None = None  # step_loss's float, kept
        # the tokens a micro-batch's returned loss is divided by (see training_step)
        self._loss_tokens = max(1, t.batch_size * (t.seq_len or self.spec.max_seq_len))
        # the Hugging Face model_type import-hf recorded in the weights the run started from:
        # export-hf writes an mt5 or xlm-roberta back under that name
        self.imported_model_type: str | None = None
        self._compiled: Any = None
        self._tables_warm = False
        self._padded: bool | None = None  # whether the batches are padded (decided at the first compiled call)
        self._pending_rng: dict[str, Any] | None = None
        self._val_sums: dict[str, float] = {}
        self.train_started: float | None = None
        self.tokens_at_start = 0
        self.val_seconds = 0.0  # spent in validations since training started (tokens/s leaves them out)
        # a compiled model's first step, its compilation with it (tokens/s leaves it out), and its tokens
        self.compile_seconds = 0.0
        self.compile_tokens = 0
        self._first_step_from: int | None = None
        self._val_started: float | None = None

    # ------------------------------------------------------------------ model

    def configure_model(self) -> None:
        if self.spec.training.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        if self.spec.training.compile and self._compiled is None:
            # kept out of the module tree so state-dict names stay those of the model
            self.__dict__["_compiled"] = torch.compile(self.model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._compiled is None:
            return self.model(*args, **kwargs)
        if not self._tables_warm:
            # the positional tables cached before the first trace: constants of the graph
            # instead of computed in it at every step (see warm_tables)
            dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
            warm_tables(self.model, self.device, dtype)
            self._tables_warm = True
        if self._padded is None:
            # a first batch with padding: lengths that change from batch to batch (pairs, SFT,
            # labelled texts), traced symbolic from the first step on, one graph for them all
            masks = [v for k, v in kwargs.items() if k.endswith("attention_mask") and isinstance(v, torch.Tensor)]
            self._padded = any(not bool(m.all()) for m in masks)
        return call_compiled(self._compiled, args, kwargs, padded=self._padded, training=self.training,
                             causal_masks=getattr(self.objective, "causal_masks", ()))

    def setup(self, stage: str) -> None:
        if self.tokenizer is None and self._trainer is not None:
            dm = getattr(self.trainer, "datamodule", None)
            if dm is not None and hasattr(dm, "tokenizer"):
                self.tokenizer = dm.tokenizer

    @property
    def step_loss(self) -> float | None:
        """The loss of the step under way, or of the last one once it is taken: the mean over the
        tokens its micro-batches predict, train/loss's value (None before any)."""
        if not self._step_losses or not sum(n for _, n in self._step_losses):
            return None  # before any step, or a step with no labels to score
        # read once a step (the progress bar's and the divergence check's one device sync)
        key = (self._step_losses_at, len(self._step_losses))
        if self._step_loss_read is None or self._step_loss_read[0] != key:
            self._step_loss_read = (key, float(self._step_mean()))
        return self._step_loss_read[1]

    def _step_mean(self) -> torch.Tensor:
        if len(self._step_losses) == 1:
            total, n = self._step_losses[0]
        else:
            total, n = torch.stack([x for x, _ in self._step_losses]).sum(), sum(n for _, n in self._step_losses)
        return total / max(n, 1)

    # ------------------------------------------------------------------ steps

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self.objective(self, batch)
        self.tokens_seen += out.n_input
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        if isinstance(ids, torch.Tensor) and ids.dim() > 0:
            self.tokens_by_length[int(ids.shape[-1])] += out.n_input
        n = out.n_predicted
        batch_loss = out.loss.detach()
        # a micro-batch with no labels (every target ignore_index: an SFT row whose prompt fills
        # the window) has a NaN mean over nothing: it adds 0, not NaN × 0, to the step's sum
        total = batch_loss * n if n else torch.zeros_like(batch_loss)
        if self._trainer is not None and self.trainer.world_size > 1:
            # the global batch's loss, as one process of the same global batch reports it: the
            # mean over every process's predicted tokens, not the first process's shard's
            summed = self.trainer.strategy.reduce(
                torch.stack([total, torch.tensor(float(n), device=total.device)]), reduce_op="sum")
            total, n = summed[0], int(summed[1])
            batch_loss = total / max(n, 1)
        if n:  # the summary's train loss is of micro-batches that scored some token
            self.recent_losses.append(batch_loss)
        # train/loss at step N is the loss of step N's batch: with accumulate > 1 the mean over
        # the tokens its micro-batches predict (what the step's gradient is of), not the last one's
        step = self.trainer.global_step if self._trainer is not None else None
        if step != self._step_losses_at:
            self._step_losses, self._step_losses_at = [], step
        self._step_losses.append((total, n))
        if any(k for _, k in self._step_losses):  # a step with no labels so far has no loss to log
            loss = batch_loss if len(self._step_losses) == 1 else self._step_mean()
            self.log("train/loss", loss, on_step=True, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        if self._trainer is not None and self.trainer.optimizers:
            # the schedule's lr (training.optimizer.lr's), which each group scales by its lr_scale
            group = self.trainer.optimizers[0].param_groups[0]
            self.step_lr = group["lr"] / group.get("lr_scale", 1.0)  # the step's, before the schedule moves on
            self.log("train/lr", self.step_lr, on_step=True)
        # The gradient of a step is that of the mean over all the tokens its micro-batches (and
        # processes) predict, as one batch of them all would give: a micro-batch's loss is
        # returned as its sum over a fixed count of tokens, and on_before_optimizer_step scales
        # the summed gradients by that count over the step's. Micro-batches of pairs, SFT or
        # masked LM predict different counts, and their means averaged weighed a token of a
        # short one more (transformers' num_items_in_batch). Full blocks need neither.
        own = out.n_predicted
        if not own:  # no labels: a zero loss whose backward still reaches every weight (DDP's buckets)
            return out.loss.nan_to_num(0.0) * 0.0
        return out.loss if own == self._loss_tokens else out.loss * (own / self._loss_tokens)

    def on_fit_start(self) -> None:
        # a Trainer of one's own that names no clipping clips as the spec says (training.grad_clip),
        # as it takes the spec's optimizer and schedule; one that names a value keeps it
        t = self.spec.training
        if self.trainer.gradient_clip_val is None and t.grad_clip and self.automatic_optimization:
            from lightning.pytorch.utilities import GradClipAlgorithmType

            self.trainer.gradient_clip_val = t.grad_clip
            self.trainer.gradient_clip_algorithm = GradClipAlgorithmType.NORM

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self._trainer is None or not self._step_losses:
            return
        predicted = sum(n for _, n in self._step_losses)  # every process's, every micro-batch's
        if predicted == 0:
            # a step with no labels to learn from (every micro-batch's prompts fill the window):
            # its gradients are zeros, and an optimizer given them would still move the weights
            # (AdamW's decay and momentum); without them it leaves each weight and its state as is
            optimizer.zero_grad(set_to_none=True)
            return
        # Lightning divided each micro-batch's loss by accumulate, and DDP averages the processes'
        whole = self._loss_tokens * self.trainer.accumulate_grad_batches * self.trainer.world_size
        if predicted == whole:
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, whole / predicted)

    def on_validation_epoch_start(self) -> None:
        self._val_sums = {"loss": 0.0, "tokens": 0.0, "correct": 0.0, "examples": 0.0}
        self._val_started = time.perf_counter() if self.train_started is not None else None

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        # validation reports the model's negative log-likelihood (the loss behind val/ppl
        # and the unigram comparison): label smoothing is a training regulariser only
        out = self.objective(self._unsmoothed, batch)
        if out.n_predicted == 0:  # a batch of filler rows only (several processes, a short split)
            return
        self._val_sums["loss"] += float(out.loss) * out.n_predicted
        self._val_sums["tokens"] += out.n_predicted
        if out.correct is not None:
            self._val_sums["correct"] += out.correct
            self._val_sums["examples"] += out.n_predicted
        exact = getattr(self.objective, "exact_match", None)
        if exact is not None and self.tokenizer is not None:
            start = decoder_start_id(self.tokenizer, self.spec.training.objective)
            forced_start, _ = forced_ids(self.tokenizer, self.spec.training.objective)
            correct, total = exact(self.model, batch, start_id=start, eos_id=self.tokenizer.eos_id,
                                   forced_start_id=forced_start)
            self._val_sums["correct"] += correct
            self._val_sums["examples"] += total

    def _unsmoothed(self, *args: Any, **kwargs: Any) -> Any:
        if "label_smoothing" in kwargs:
            kwargs["label_smoothing"] = 0.0
        return self(*args, **kwargs)

    # Trainer.test scores the validation split as validation does, logged as test/*; Trainer.predict
    # gives each batch's model output (logits), as the model computes it from the batch's inputs
    def on_test_epoch_start(self) -> None:
        self._val_sums = {"loss": 0.0, "tokens": 0.0, "correct": 0.0, "examples": 0.0}

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        for name, value in (self.val_metrics() or {}).items():
            if name != "val/examples":
                self._log_epoch_metric(name.replace("val/", "test/", 1), value)

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        if not isinstance(batch, Mapping):
            return self(batch)  # a tensor of ids
        import inspect

        accepted = inspect.signature(self.model.forward).parameters
        return self(**{k: v for k, v in batch.items() if k in accepted and k != "labels"})

    def val_metrics(self) -> dict[str, float] | None:
        """``val/loss``, ``val/ppl`` (and ``val/exact_match``; for sequence classification
        ``val/accuracy`` in place of ``val/ppl``, with ``val/examples``, how many they are of) of the validation batches scored
        so far, summed over the processes; None before any token was scored."""
        sums = torch.tensor(
            [self._val_sums[k] for k in ("loss", "tokens", "correct", "examples")], dtype=torch.float64
        )
        if self._trainer is not None and self.trainer.world_size > 1:
            sums = self.trainer.strategy.reduce(sums.to(self.device), reduce_op="sum").cpu()
        loss_sum, tokens, correct, examples = sums.tolist()
        if tokens == 0:
            return None
        loss = loss_sum / tokens
        metrics = {"val/loss": loss}
        if self.objective.name != "classification":  # a loss over classes, not a text's: no perplexity
            metrics["val/ppl"] = math.exp(min(loss, 50.0))
        if examples:
            metrics["val/accuracy" if self.objective.name == "classification" else "val/exact_match"] = correct / examples
            metrics["val/examples"] = examples  # what the share is of: held-out texts, or examples
        return metrics

    def _log_epoch_metric(self, name: str, value: float, *, prog_bar: bool = False) -> None:
        # a float64 model's metrics are logged as float64: Lightning makes a Python number a
        # tensor of the default dtype, float32 outside the steps (metrics.csv, TensorBoard and
        # the checkpoints' monitor would see val/loss rounded to float32's 7 digits)
        logged: Any = value
        if self.dtype == torch.float64:
            logged = torch.tensor(value, dtype=torch.float64, device=self.device)
        self.log(name, logged, prog_bar=prog_bar, sync_dist=False, rank_zero_only=True)

    def on_validation_epoch_end(self) -> None:
        if self._val_started is not None:
            self.val_seconds += time.perf_counter() - self._val_started
            self._val_started = None
        metrics = self.val_metrics()
        if metrics is None or (self._trainer is not None and self.trainer.sanity_checking):
            return  # Lightning's sanity check scores a couple of batches: no validation of the run
        for name, value in metrics.items():
            if name == "val/examples":  # a count, kept in the history beside the share it is of
                continue
            self._log_epoch_metric(name, value, prog_bar=name == "val/loss")
        step = self.trainer.global_step if self._trainer is not None else 0
        self.val_history.append({"step": step, **metrics})

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self) -> dict[str, Any]:
        t = self.spec.training
        precision = str(self.trainer.precision) if self._trainer is not None else str(t.precision)
        optimizer = REGISTRY.build("optimizer", t.optimizer, model=self.model, precision=precision)
        total = self._schedule_steps()
        schedule = REGISTRY.build(
            "schedule", t.schedule, total=total, d_model=self.spec.d_model, base_lr=t.optimizer.lr
        )
        scheduler = LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _schedule_steps(self) -> int:
        """The steps the learning-rate schedule spans: the trainer's max_steps, else its epochs'
        steps where they end (a Trainer of your own with max_epochs and limit_train_batches),
        else the spec's max_steps (no trainer)."""
        t = self.spec.training
        if self._trainer is None:
            return t.max_steps or 1
        if self.trainer.max_steps > 0:
            return self.trainer.max_steps
        steps = self.trainer.estimated_stepping_batches  # -1 or inf where the epochs have no end
        if not math.isfinite(steps) or steps <= 0:
            raise ValueError(
                "SpecModule trains on an endless stream of batches (resumable at any step), so an epoch of "
                "its data module never ends: give the Trainer max_steps (the spec's training.max_steps is "
                f"{t.max_steps}), or epochs of a length with limit_train_batches; specformer's train() turns "
                "training.max_epochs into steps itself"
            )
        return max(1, int(steps))

    # ------------------------------------------------------------------ checkpoints

    def _resume_optimizer_settings(self, checkpoint: dict[str, Any]) -> None:
        """The optimizer's settings (lr, betas, eps, weight decay) are this spec's, not the
        checkpoint's: Lightning restores each group's saved hyperparameters with its
        moments, and the scheduler's base learning rates, so a resumed run that changed
        ``training.optimizer`` would otherwise go on with the old ones."""
        t = self.spec.training
        fresh = REGISTRY.build("optimizer", t.optimizer, model=self.model, precision=str(t.precision))
        # the hyperparameters only: implementation flags (fused, foreach) stay the live optimizer's
        from specformer.training.optim import HYPERPARAMETERS as keys
        settings = [{k: group[k] for k in keys if k in group} for group in fresh.param_groups]
        names = [group.get("param_names") for group in fresh.param_groups]
        for state in checkpoint.get("optimizer_states", []):
            groups = state.get("param_groups", []) if isinstance(state, dict) else []
            saved = [group.get("param_names") for group in groups]
            # a checkpoint written before groups carried names trained every parameter at lr
            grouped = any(getattr(t.optimizer, key, ()) for key in ("freeze", "lr_scale"))
            if saved != names and (any(saved) or grouped):
                raise CheckpointError(
                    "the checkpoint's optimizer state holds other parameter groups than this spec's "
                    "training.optimizer.freeze and lr_scale make: resume with the checkpoint's freeze and "
                    "lr_scale patterns (a factor may change), or start a new run from its weights with --init-from"
                )
        for state in checkpoint.get("optimizer_states", []):
            groups = state.get("param_groups", []) if isinstance(state, dict) else []
            if len(groups) != len(settings):
                continue
            for saved, new in zip(groups, settings, strict=True):
                saved.update(new)
                saved["initial_lr"] = new["lr"]
        for scheduler in checkpoint.get("lr_schedulers", []):
            if isinstance(scheduler, dict) and len(scheduler.get("base_lrs", [])) == len(settings):
                scheduler["base_lrs"] = [new["lr"] for new in settings]

    def on_train_start(self) -> None:
        self._check_epoch_length()
        self.train_started = time.perf_counter()
        self.val_seconds = 0.0
        self.tokens_at_start = self.tokens_seen
        self.tokens_by_length = Counter()
        self.compile_seconds, self.compile_tokens = 0.0, 0
        self._first_step_from = self.trainer.global_step if self._compiled is not None else None
        # after a resume the optimizer holds the lr the old schedule gave; set this one's
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if isinstance(scheduler, LambdaLR):
                for group, base, fn in zip(
                    scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True
                ):
                    group["lr"] = base * fn(scheduler.last_epoch)

    def _check_epoch_length(self) -> None:
        """Epochs of a length (a Trainer of your own with ``limit_train_batches``) must end on
        an optimizer step: Lightning steps on whatever micro-batches an epoch's end leaves, and the
        stream, which reads on from ``global_step × accumulate`` micro-batches, would skip the rest
        of that step's."""
        batches, accumulate = self.trainer.num_training_batches, self.trainer.accumulate_grad_batches
        if math.isfinite(batches) and accumulate > 1 and int(batches) % accumulate:
            raise ValueError(
                f"an epoch of {int(batches)} batches (limit_train_batches) ends between the micro-batches of "
                f"an optimizer step (accumulate_grad_batches={accumulate}): Lightning would step on the last "
                f"{int(batches) % accumulate} alone and the data stream would skip "
                f"{accumulate - int(batches) % accumulate}; give limit_train_batches a multiple of {accumulate}, "
                "or max_steps without epochs"
            )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._first_step_from is not None and self.trainer.global_step > self._first_step_from:
            # the first optimizer step of a compiled model is done: its time is mostly compilation
            self.compile_seconds = time.perf_counter() - (self.train_started or 0.0) - self.val_seconds
            self.compile_tokens = self.tokens_seen - self.tokens_at_start
            self._first_step_from = None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._pending_rng is not None:
            # restored here, not at load time, so nothing between loading and the first
            # step (dataloader start-up, validation) can draw from the restored streams
            set_rng_state(self._pending_rng)
            self._pending_rng = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from specformer import __version__
        from specformer.training.checkpoint import own_modules

        checkpoint["specformer"] = {
            "format": FORMAT_VERSION,
            "version": __version__,
            "spec": self.spec.to_dict(),
            "tokenizer": self.tokenizer.state() if self.tokenizer is not None else None,
            "rng": rng_state(),
            "tokens_seen": int(self.tokens_seen),
            "val_history": [dict(h) for h in self.val_history],
            # the summary's "mean of the last steps": a resumed run averages the same steps
            "recent_losses": [float(x) for x in self.recent_losses],
            "imported_model_type": self.imported_model_type,
            "own_modules": own_modules(self.spec),
        }

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                             strict: bool | None = None, **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint``, with the spec the checkpoint holds unless one is
        given (``spec=``): a specformer checkpoint carries its spec and tokenizer."""
        if "spec" not in kwargs:
            from specformer.training.checkpoint import read_checkpoint

            meta = read_checkpoint(checkpoint_path).get("specformer")
            if not isinstance(meta, dict) or not isinstance(meta.get("spec"), dict):
                raise CheckpointError(f"{checkpoint_path}: not a specformer checkpoint (it has no spec): give spec=")
            kwargs["spec"] = meta["spec"]
        return super().load_from_checkpoint(checkpoint_path, map_location=map_location, hparams_file=hparams_file,
                                            strict=strict, **kwargs)

    def _rebase_batch_counts(self, checkpoint: dict[str, Any], meta: dict[str, Any]) -> None:
        """A run resumed with another ``accumulate`` counts its micro-batches from the step in
        its own: Lightning validates every ``val_interval × accumulate`` micro-batches of its
        restored count, which is the checkpoint's (10 steps at accumulate 1: 10), so a resume at
        accumulate 2 validated at steps 13 and 17, not 12 and 16."""
        if self._trainer is None:
            return
        saved = meta.get("spec", {}).get("training", {}) if isinstance(meta.get("spec"), dict) else {}
        old, new = int(saved.get("accumulate", 1) or 1), int(self.trainer.accumulate_grad_batches)
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        step = int(checkpoint.get("global_step", 0))
        if old == new or not isinstance(progress, dict):
            return
        counts = [progress.get("total"), progress.get("current")]
        if not all(isinstance(c, dict) and c.get("ready") == step * old for c in counts):
            return  # epochs of a length (a Trainer of one's own): left as Lightning counts them
        for count in counts:
            for key in ("ready", "started", "processed", "completed"):
                if key in count:
                    count[key] += step * (new - old)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        source = str(path) if path else "the checkpoint"
        if self._trainer is not None and self.trainer.state.fn is not None and self.trainer.state.fn != "fit":
            check_same_model(checkpoint, self.spec, source=source)  # validate/test/predict: nothing resumed
        else:
            check_resumable(checkpoint, self.spec, source=source)
        meta = checkpoint["specformer"]
        if self.tokenizer is None and meta.get("tokenizer"):
            from specformer.data.tokenizers import tokenizer_from_state

            self.tokenizer = tokenizer_from_state(meta["tokenizer"])
        # the schedule is a function of the step and of this spec's settings: a resumed run
        # that changes max_steps or the schedule gets the new curve from the same step
        for scheduler in checkpoint.get("lr_schedulers", []):
            if isinstance(scheduler, dict) and "lr_lambdas" in scheduler:
                scheduler["lr_lambdas"] = [None] * len(scheduler["lr_lambdas"])
        self._resume_optimizer_settings(checkpoint)
        self._rebase_batch_counts(checkpoint, meta)
        self.tokens_seen = int(meta.get("tokens_seen", 0))
        self.val_history = list(meta.get("val_history", []))
        self.imported_model_type = meta.get("imported_model_type")
        self.recent_losses.clear()
        self.recent_losses.extend(torch.tensor(x) for x in meta.get("recent_losses", []))
        self._pending_rng = meta.get("rng")
