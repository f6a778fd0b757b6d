"""training.optimizer.freeze and lr_scale: frozen parameters stay bit-identical and keep no
optimizer state, scaled groups move at lr × factor, counts and resumes follow."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch

from specformer import load_spec
from specformer.analysis import count_parameters, memory_estimate, trainable_parameters
from specformer.analysis.memory import optimizer_state_elements
from specformer.builder import build_model
from specformer.builder.lightning import SpecModule
from specformer.registry import REGISTRY
from specformer.specs.errors import SpecError
from specformer.training.checkpoint import CheckpointError
from specformer.training.optim import apply_freeze
from specformer.training.run import train

FROZEN = ["embed.*", "decoder.layers.0.self_attn.*"]


class Snapshots(L.Callback):
    """The weights as training starts and ends, and the optimizer's state at the end."""

    def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
        self.before = {n: p.detach().clone() for n, p in module.model.named_parameters()}

    def on_train_end(self, trainer: L.Trainer, module: Any) -> None:
        self.after = {n: p.detach().clone() for n, p in module.model.named_parameters()}
        names = {id(p): n for n, p in module.model.named_parameters()}
        optimizer = trainer.optimizers[0]
        self.with_state = {names[id(p)] for p in optimizer.state}
        self.state_elements = sum(
            v.numel() for s in optimizer.state.values() for k, v in s.items() if k != "step"
        )
        self.requires_grad = {n: p.requires_grad for n, p in module.model.named_parameters()}
        self.groups = [(g["lr_scale"], g["lr"]) for g in optimizer.param_groups]


def test_frozen_weights_stay_bit_identical_and_keep_no_state_while_the_others_train(tiny: Any) -> None:
    spec = load_spec(tiny("decoder", max_steps=3, optimizer={"type": "adamw", "lr": 3e-3, "freeze": FROZEN}))
    snaps = Snapshots()
    result = train(spec, progress=False, callbacks=[snaps])
    frozen = {n for n in snaps.before if n.startswith(("embed.", "decoder.layers.0.self_attn."))}
    assert frozen == {"embed.tokens.weight", "embed.positions.weight"} | {
        f"decoder.layers.0.self_attn.{m}.{w}" for m in ("qkv_proj", "o_proj") for w in ("weight", "bias")}
    for name, before in snaps.before.items():
        if name in frozen:
            assert torch.equal(snaps.after[name], before), name  # weight decay did not touch it either
            assert not snaps.requires_grad[name] and name not in snaps.with_state
        else:
            assert not torch.equal(snaps.after[name], before), name
            assert snaps.requires_grad[name] and name in snaps.with_state
    # the optimizer holds exactly the state the memory estimate counts
    assert snaps.state_elements == optimizer_state_elements(spec)
    n_frozen = sum(snaps.before[n].numel() for n in frozen)
    total = count_parameters(spec).total
    assert result.parameters == total and result.trainable_parameters == total - n_frozen
    assert trainable_parameters(spec) == total - n_frozen
    assert optimizer_state_elements(spec) == 2 * (total - n_frozen)


@pytest.mark.parametrize("optimizer", [{"type": "sgd", "lr": 0.05}, {"type": "adafactor"}])
def test_other_optimizers_keep_the_state_memory_counts(tiny: Any, optimizer: dict[str, Any]) -> None:
    spec = load_spec(tiny("decoder", max_steps=1, optimizer={**optimizer, "freeze": ["decoder.layers.0.ffn.*"]}))
    snaps = Snapshots()
    train(spec, progress=False, callbacks=[snaps])
    assert snaps.state_elements == optimizer_state_elements(spec) > 0
    assert not any(n.startswith("decoder.layers.0.ffn.") for n in snaps.with_state)


def test_memory_counts_gradients_and_optimizer_states_of_the_trained_parameters_only() -> None:
    plain = load_spec("gpt-nano")
    frozen = load_spec("gpt-nano", overrides=["training.optimizer.freeze=[embed.*, decoder.layers.0.*]"])
    total = count_parameters(plain).total
    model = build_model(plain)
    n_frozen = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("embed.", "decoder.layers.0.")))
    assert n_frozen == 98_304 + 198_272
    a, b = (memory_estimate(s, dtype="fp32") for s in (plain, frozen))
    assert a.weights == b.weights == 4 * total
    assert (a.gradients, b.gradients) == (4 * total, 4 * (total - n_frozen))
    assert (a.optimizer, b.optimizer) == (8 * total, 8 * (total - n_frozen))
    # the frozen embeddings and layer 0 keep nothing for the backward pass, nor does the tied
    # head its weight's gradient (the token table): the other three layers' share and less
    assert b.activations < a.activations


def test_a_scaled_group_moves_at_lr_times_its_factor() -> None:
    # AdamW's first step moves each weight by lr · g / (|g| + eps), about lr · sign(g)
    spec = load_spec("gpt-nano", overrides=[
        "training.optimizer.weight_decay=0",
        'training.optimizer.lr_scale=[{pattern: "decoder.layers.[01].*", factor: 0.1}]',
    ])
    torch.manual_seed(0)
    model = build_model(spec)
    apply_freeze(model, spec.training.optimizer)
    optimizer = REGISTRY.build("optimizer", spec.training.optimizer, model=model)
    assert [g["lr_scale"] for g in optimizer.param_groups] == [1.0, 1.0, 0.1, 0.1]
    ids = torch.randint(0, 512, (2, 16))
    model(ids[:, :-1], labels=ids[:, 1:]).loss.backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer.step()
    moves: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    for name, p in model.named_parameters():
        big = p.grad.abs() > 1e-5  # eps (1e-8) does not shrink their step
        scaled = name.startswith(("decoder.layers.0.", "decoder.layers.1."))
        moves[scaled].append((p.detach() - before[name])[big].abs())
    lr = spec.training.optimizer.lr
    base, scaled = torch.cat(moves[False]), torch.cat(moves[True])
    assert base.median().item() == pytest.approx(lr, rel=1e-3)
    assert scaled.median().item() == pytest.approx(0.1 * lr, rel=1e-3)


def test_the_schedule_scales_every_group_alike() -> None:
    spec = load_spec("gpt-nano", overrides=[
        "training.optimizer.lr_scale=[{pattern: embed.tokens.*, factor: 3}, {pattern: '*.bias', factor: 0.5}]",
        "training.max_steps=20",
        "training.schedule={type: cosine, warmup_steps: 5}",
    ])
    config = SpecModule(spec).configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    for _ in range(12):
        lrs = {g["lr_scale"]: g["lr"] / g["lr_scale"] for g in optimizer.param_groups}
        assert set(lrs) == {1.0, 3.0, 0.5}
        assert lrs[3.0] == pytest.approx(lrs[1.0]) and lrs[0.5] == pytest.approx(lrs[1.0])
        optimizer.step()
        scheduler.step()
    assert lrs[1.0] < 1e-3  # the cosine decay ran


def test_the_last_lr_scale_pattern_that_matches_a_parameter_applies() -> None:
    spec = load_spec("gpt-nano", overrides=[
        "training.optimizer.lr_scale=[{pattern: 'decoder.*', factor: 0.5}, {pattern: '*norm*', factor: 2}]"])
    model = build_model(spec)
    optimizer = REGISTRY.build("optimizer", spec.training.optimizer, model=model)
    factor = {n: g["lr_scale"] for g in optimizer.param_groups for n in g["param_names"]}
    assert factor["decoder.layers.2.attn_norm.weight"] == 2.0
    assert factor["decoder.layers.2.ffn.up_proj.weight"] == 0.5
    assert factor["embed.tokens.weight"] == 1.0


def test_patterns_that_match_nothing_are_errors_with_the_nearest_names(tmp_path: Any) -> None:
    (tmp_path / "my.yaml").write_text(
        "extends: gpt-nano\n"
        "training:\n"
        "  optimizer:\n"
        "    freeze: [embedding.*, decoder.layers.0]\n"
        "    lr_scale: [{pattern: decoder.layer.0.*, factor: 2}]\n"
    )
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "my.yaml")
    problems = {p.path: str(p) for p in caught.value.problems}
    assert set(problems) == {"training.optimizer.freeze.0", "training.optimizer.freeze.1",
                             "training.optimizer.lr_scale.0.pattern"}
    assert "my.yaml:4:14: training.optimizer.freeze.0: pattern 'embedding.*' matches no parameter" in problems[
        "training.optimizer.freeze.0"]
    assert "nearest names: embed.positions.weight, embed.tokens.weight" in problems["training.optimizer.freeze.0"]
    assert "specformer show SPEC --tree" in problems["training.optimizer.freeze.0"]
    assert "decoder.layers.0.* matches decoder.layers.0." in problems["training.optimizer.freeze.1"]
    assert "nearest names: decoder.layers.0." in problems["training.optimizer.lr_scale.0.pattern"]
    # a tied head has no weight of its own
    with pytest.raises(SpecError, match="'head.[*]' matches only head.weight, which is tied to embed.tokens.weight"):
        load_spec("gpt-nano", overrides=["training.optimizer.lr_scale=[{pattern: head.*, factor: 3}]"])
    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["training.optimizer.freeze=[head.*]"])
    assert "(name it as embed.tokens.weight; freezing or scaling it acts on both uses)" in str(info.value)


def test_the_built_model_is_checked_too() -> None:
    # a plugin's type has parameters only its module knows: its patterns meet them at build time
    from specformer.specs.training import AdamWSpec

    model = build_model(load_spec("gpt-nano"))
    with pytest.raises(SpecError, match="'embedding.[*]' matches no parameter.*\\n.*nearest names: embed"):
        apply_freeze(model, AdamWSpec(freeze=("embedding.*",)))
    with pytest.raises(SpecError, match="matches only head.weight, which is tied to embed.tokens.weight"):
        apply_freeze(model, AdamWSpec(freeze=("head.*",)))
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen by a refused spec
    apply_freeze(model, AdamWSpec(freeze=("embed.*",)))
    assert [n for n, p in model.named_parameters() if not p.requires_grad] == [
        "embed.tokens.weight", "embed.positions.weight"]


def test_freezing_everything_and_scaling_only_frozen_parameters_are_errors() -> None:
    with pytest.raises(SpecError, match="freeze all 52 parameters of the model: nothing would train"):
        load_spec("gpt-nano", overrides=["training.optimizer.freeze=['*']"])
    with pytest.raises(SpecError, match=r"lr_scale.0.pattern: 'embed.\*' matches only frozen parameters"):
        load_spec("gpt-nano", overrides=[
            "training.optimizer.freeze=[embed.*]", "training.optimizer.lr_scale=[{pattern: embed.*, factor: 2}]"])


def test_the_fields_take_one_pattern_and_refuse_a_factor_of_zero() -> None:
    spec = load_spec("gpt-nano", overrides=["training.optimizer.freeze=embed.*"])
    assert spec.training.optimizer.freeze == ("embed.*",)
    with pytest.raises(SpecError, match="factor: input should be greater than 0"):
        load_spec("gpt-nano", overrides=["training.optimizer.lr_scale=[{pattern: embed.*, factor: 0}]"])


class LossRecorder(L.Callback):
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, idx: int) -> None:
        self.losses[trainer.global_step] = float(outputs["loss"])


def test_resume_with_frozen_and_scaled_groups_is_exact_and_refuses_other_groups(tiny: Any) -> None:
    def spec(freeze: list[str], factor: float = 0.1, **training: Any) -> Any:
        optimizer = {"type": "adamw", "lr": 3e-3, "freeze": freeze,
                     "lr_scale": [{"pattern": "decoder.layers.0.ffn.*", "factor": factor}]}
        return load_spec(tiny("decoder", checkpoint_interval=3, val_interval=3, optimizer=optimizer, **training))

    full = LossRecorder()
    train(spec(FROZEN, max_steps=5), progress=False, callbacks=[full])
    first = train(spec(FROZEN, max_steps=3), progress=False)
    resumed = LossRecorder()
    train(spec(FROZEN, max_steps=5), resume=first.checkpoint, progress=False, callbacks=[resumed])
    assert sorted(resumed.losses) == [4, 5]
    for step in (4, 5):
        assert resumed.losses[step] == pytest.approx(full.losses[step], abs=1e-6)
    saved = torch.load(first.checkpoint, weights_only=True)["optimizer_states"][0]["param_groups"]
    # the norms at lr; the FFN's matrices, then its biases, at 0.1 lr; nothing else trains
    assert [(g["lr_scale"], g["weight_decay"]) for g in saved] == [(1.0, 0.0), (0.1, 0.1), (0.1, 0.0)]
    assert saved[1]["param_names"] == ["decoder.layers.0.ffn.up_proj.weight", "decoder.layers.0.ffn.down_proj.weight"]
    # another freeze moves parameters between the groups the saved moments belong to
    with pytest.raises(CheckpointError, match=r"now frozen: decoder.layers.0.ffn_norm.weight.*--init-from"):
        train(spec([*FROZEN, "decoder.layers.0.ffn_norm.*"], max_steps=5), resume=first.checkpoint, progress=False)
    with pytest.raises(CheckpointError, match=r"no longer frozen: embed.tokens.weight"):
        train(spec(["decoder.layers.0.self_attn.*"], max_steps=5), resume=first.checkpoint, progress=False)
    # another factor for the same patterns keeps the groups: the new lr applies
    seen = Snapshots()
    train(spec(FROZEN, factor=0.5, max_steps=4), resume=first.checkpoint, progress=False, callbacks=[seen])
    assert [scale for scale, _ in seen.groups] == [1.0, 0.5, 0.5]
    assert seen.groups[1][1] == pytest.approx(0.5 * seen.groups[0][1]) and seen.groups[0][1] == pytest.approx(3e-3)


def test_the_fit_refuses_optimizer_state_saved_for_other_groups() -> None:
    plain = SpecModule(load_spec("gpt-nano"))
    frozen = SpecModule(load_spec("gpt-nano", overrides=["training.optimizer.freeze=[embed.positions.*]"]))
    state = plain.configure_optimizers()["optimizer"].state_dict()
    with pytest.raises(CheckpointError, match="other parameter groups than this spec's"):
        frozen._resume_optimizer_settings({"optimizer_states": [state]})
    # a checkpoint whose groups carry no names (an older specformer) trained everything at lr
    for group in state["param_groups"]:
        del group["param_names"]
    plain._resume_optimizer_settings({"optimizer_states": [state]})
    with pytest.raises(CheckpointError, match="other parameter groups"):
        frozen._resume_optimizer_settings({"optimizer_states": [state]})


def test_a_checkpoint_from_before_the_fields_resumes_without_a_change_said() -> None:
    from specformer.training.run import _optimizer_group_change, _training_changes

    spec = load_spec("gpt-nano")
    saved = spec.to_dict()
    for key in ("freeze", "lr_scale"):  # a checkpoint written before these fields existed
        del saved["training"]["optimizer"][key]
    raw = {"specformer": {"spec": saved}}
    assert _training_changes(raw, spec) == []
    assert _optimizer_group_change(raw, spec) == ""
    frozen = load_spec("gpt-nano", overrides=["training.optimizer.freeze=[embed.positions.*]"])
    assert _training_changes(raw, frozen) == ["training.optimizer.freeze [] → [embed.positions.*]"]
    assert _optimizer_group_change(raw, frozen) == "now frozen: embed.positions.weight"


def test_the_train_command_says_how_many_parameters_train(tiny: Any, tmp_path: Any) -> None:
    import json

    import yaml
    from typer.testing import CliRunner

    from specformer.cli import app

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(tiny("decoder", max_steps=2, val_interval=2, optimizer={
        "type": "adamw", "freeze": ["embed.*"]})))
    result = CliRunner().invoke(app, ["train", str(path), "--no-progress"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    spec = load_spec(path)
    total = count_parameters(spec).total
    trained = total - (300 + 64) * 32  # the token and position tables
    share = f"{100 * trained / total:.1f}%"
    assert result.output.startswith(
        f"training tiny-decoder (decoder, {total:,} parameters, {trained:,} trainable ({share})) — preparing data…")
    assert f"│ parameters       │ {total:,} parameters, {trained:,} trainable ({share})" in result.output
    summary = json.loads(next((tmp_path / "runs" / "tiny-decoder").glob("*/summary.json")).read_text())
    assert (summary["parameters"], summary["trainable_parameters"]) == (total, trained)


def test_show_says_what_the_memory_of_a_frozen_model_counts() -> None:
    from typer.testing import CliRunner

    from specformer.cli import app

    result = CliRunner().invoke(app, ["show", "gpt-nano", "--set", 'training.optimizer.freeze=[embed.*, "decoder.layers.[0-1].*"]'],
                                env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert ("Gradients and optimizer states of the 396,800 trained parameters: training.optimizer.freeze leaves "
            "out 494,848 of 891,648 (55.5%).") in result.output
    assert "│ gradients                         │  1,587,200 │" in result.output  # 396,800 × 4 bytes
    assert trainable_parameters(load_spec("gpt-nano", overrides=[
        'training.optimizer.freeze=[embed.*, "decoder.layers.[0-1].*"]'])) == 396_800
    # the training FLOPs: the forward and the backward products the trained parameters need
    # (the two upper layers' both products, the tied head's input gradient), 2 x forward here
    assert ("│ training step (forward + backward, 396,800 of 891,648 parameters trained) │ 3.934 MFLOP │ 3,934,208 │"
            in result.output)
    assert "Activations: what the backward pass of those keeps, nothing below the lowest trained parameter." in " ".join(
        result.output.split())


def test_diff_says_how_many_parameters_a_frozen_spec_trains() -> None:
    from typer.testing import CliRunner

    from specformer.cli import app

    freeze = 'training.optimizer.freeze=[embed.*, "decoder.layers.[0-1].*"]'
    result = CliRunner().invoke(app, ["diff", "gpt-nano", "gpt-nano", "--set", freeze], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "│ FLOPs/token training @ 256     │ 5.901 MFLOP │      3.934 MFLOP │ -1.967 MFLOP │ -33.3% │" in result.output
    assert ("gpt-nano (--set) trains 396,800 of 891,648 parameters (training.optimizer.freeze): its training FLOPs "
            "count the backward products those need") in result.output
    plain = CliRunner().invoke(app, ["diff", "gpt-nano", "gpt-nano"], env={"COLUMNS": "300"})
    assert "trains" not in plain.output
