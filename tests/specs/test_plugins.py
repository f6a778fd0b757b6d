"""A third-party package adds a registry entry through the ``specformer.plugins`` entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from specformer.registry import Registry

PLUGIN = '''
from typing import Literal

from pydantic import Field

from specformer.specs.base import Spec


class SquaredReLUSpec(Spec):
    """Primer's squared-ReLU MLP (So et al. 2021)."""

    type: Literal["relu2"] = "relu2"
    d_ff: int = Field(64, gt=0)


def register(registry):
    registry.register("ffn", SquaredReLUSpec, "demo_plugin.torch_part:SquaredReLU", source="demo-plugin")
'''


TORCH_PART = '''
from torch import nn


class SquaredReLU(nn.Module):
    def __init__(self, spec, *, d_model):
        super().__init__()
        self.up_proj = nn.Linear(d_model, spec.d_ff)
        self.down_proj = nn.Linear(spec.d_ff, d_model)

    def forward(self, x):
        return self.down_proj(self.up_proj(x).relu().square())
'''


@pytest.fixture
def plugin_path(tmp_path):
    pkg = tmp_path / "demo_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    (pkg / "torch_part.py").write_text(TORCH_PART)
    dist = tmp_path / "demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[specformer.plugins]\ndemo = demo_plugin:register\n")
    return tmp_path


def _run(plugin_path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_plugin_entry_becomes_valid_yaml(plugin_path):
    code = (
        "from specformer import load_spec\n"
        "s = load_spec('gpt-nano', overrides=['decoder.ffn={type: relu2, d_ff: 32}'])\n"
        "print(type(s.decoder.ffn).__name__, s.decoder.ffn.d_ff)\n"
        "from specformer.registry import REGISTRY\n"
        "print(REGISTRY.get('ffn', 'relu2').source)\n"
    )
    result = _run(plugin_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["SquaredReLUSpec", "32", "demo-plugin"]


def test_a_plugin_that_failed_to_load_is_tried_again_and_the_others_kept(plugin_path):
    # a second plugin needs a module that is missing: every load says so; once it is there (a
    # notebook installs it), the next load works, the first plugin's type included, instead of
    # the schema's own types colliding with themselves
    (plugin_path / "needs_more.py").write_text("import not_installed_yet\n\ndef register(registry):\n    pass\n")
    entry = plugin_path / "demo_plugin-0.1.dist-info" / "entry_points.txt"
    entry.write_text(entry.read_text() + "more = needs_more:register\n")
    code = textwrap.dedent("""
        import sys, types
        from specformer import load_spec
        from specformer.registry import PluginError
        for _ in range(2):
            try:
                load_spec("gpt-nano")
            except PluginError as exc:
                print("refused:", "'more'" in str(exc) and "not_installed_yet" in str(exc))
        sys.modules["not_installed_yet"] = types.ModuleType("not_installed_yet")
        spec = load_spec({"extends": "gpt-nano", "decoder": {"ffn": {"type": "relu2", "d_ff": 32}}})
        print("loaded:", spec.decoder.ffn.type)
    """)
    result = _run(plugin_path, code)
    assert result.stdout.split("\n")[:3] == ["refused: True", "refused: True", "loaded: relu2"], result.stderr


def test_plugin_type_is_in_the_json_schema_and_errors(plugin_path):
    code = (
        "import json\n"
        "from specformer.specs.jsonschema import spec_json_schema\n"
        "from specformer import load_spec, SpecError\n"
        "print(json.dumps('relu2' in json.dumps(spec_json_schema())))\n"
        "try:\n"
        "    load_spec('gpt-nano', overrides=['decoder.ffn.type=relu3'])\n"
        "except SpecError as e:\n"
        "    print(json.dumps(e.problems[0].hint))\n"
    )
    result = _run(plugin_path, code)
    assert result.returncode == 0, result.stderr
    in_schema, hint = (json.loads(line) for line in result.stdout.splitlines())
    assert in_schema is True
    assert "did you mean 'relu2'" in hint and "mlp, glu, relu2" in hint


def test_without_the_plugin_the_type_is_unknown():
    from specformer import SpecError, load_spec

    with pytest.raises(SpecError, match="unknown type 'relu2'"):
        load_spec("gpt-nano", overrides=["decoder.ffn.type=relu2"])


def test_a_family_no_spec_reads_is_refused_with_the_closest_name():
    from specformer.specs.schema import MLPSpec

    registry = Registry()
    with pytest.raises(ValueError, match=r"unknown family 'ffx': did you mean 'ffn'\?.*attention, positional"):
        registry.register("ffx", MLPSpec, "x:y")
    assert registry.families() == []


def test_the_families_are_those_the_built_in_types_fill():
    import specformer.specs.schema  # noqa: F401  (registers the model families)
    import specformer.specs.training  # noqa: F401  (and the training ones)
    from specformer.registry import FAMILIES, REGISTRY

    assert sorted(FAMILIES) == REGISTRY.families()


def test_registry_refuses_silent_replacement():
    from specformer.specs.schema import MLPSpec

    registry = Registry()
    registry.register("ffn", MLPSpec, "x:y")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("ffn", MLPSpec, "x:z")
    registry.register("ffn", MLPSpec, "x:z", replace=True)
    assert registry.get("ffn", "mlp").target == "x:z"
    with pytest.raises(LookupError, match="registered: mlp"):
        registry.get("ffn", "moe")


def _show_json(plugin_path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", *args, "--format", "json"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_show_of_a_plugin_type_counts_its_parameters_and_names_what_it_cannot_count(plugin_path, tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  ffn: {type: relu2, d_ff: 32}\n")
    mine, nano = _show_json(plugin_path, str(spec)), _show_json(plugin_path, "gpt-nano")
    # parameters: exact, from the meta build (up 128x32 + 32, down 32x128 + 128, 4 layers)
    assert mine["params"]["counted_from"] == "meta build" and nano["params"]["counted_from"] == "analytic"
    assert mine["params"]["components"]["decoder.ffn"] == 4 * (128 * 32 + 32 + 32 * 128 + 128) == 33408
    assert mine["params"]["total"] == nano["params"]["total"] - nano["params"]["components"]["decoder.ffn"] + 33408
    # FLOPs: the plugin's FFN is named and left out; every other part is gpt-nano's
    flops, nano_flops = mine["flops_per_token"], nano["flops_per_token"]
    assert flops["not_counted"] == {"decoder.ffn": "ffn type 'relu2'"} and nano_flops["not_counted"] == {}
    assert "decoder.ffn" not in flops["components"]
    assert flops["forward"] == nano_flops["forward"] - nano_flops["components"]["decoder.ffn"]
    # memory: weights, gradients and AdamW states of the real parameters; activations name the FFN
    memory = mine["memory"]
    assert memory["weights"] == 4 * mine["params"]["total"] and memory["optimizer"] == 2 * memory["weights"]
    assert memory["not_counted"] == {"decoder.ffn": "ffn type 'relu2'"}
    assert memory["activations"] < nano["memory"]["activations"]
    # the attention is the built-in one: its KV cache is counted
    assert mine["kv_cache_bytes_per_token"] == nano["kv_cache_bytes_per_token"] and mine["kv_cache_not_counted"] == {}

    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", str(spec)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "398,208 parameters" in result.stdout
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    assert "not counted" in lines["decoder.ffn"]
    assert "≥ 918.5 kFLOP" in lines["forward, without decoder.ffn"]
    assert "≥" in lines["activations, without decoder.ffn"] and "≥" not in lines["weights"]
    assert "Counted from the model built on the meta device" in result.stdout


GATED_MHA = '''
import torch
from torch import nn


def register(registry):
    # the built-in name with a module of the plugin's own: mha with a learned gate per head
    registry.register("attention", registry.get("attention", "mha").spec, "gated_mha:build", replace=True)


def build(spec, *, d_model, cross, layer_idx):
    from specformer.components.attention import Attention

    attention = Attention(spec, d_model=d_model, cross=cross, layer_idx=layer_idx)
    attention.gate = nn.Parameter(torch.ones(spec.n_heads))
    return attention
'''


def _plugin_installed(root, module: str, source: str, entry: str) -> None:
    """``module`` (its ``source``) as an installed package whose ``specformer.plugins`` entry
    point ``entry`` (``name = module:hook``) registers it, under ``root`` on PYTHONPATH."""
    (root / f"{module}.py").write_text(source)
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[specformer.plugins]\n{entry}\n")


def test_a_built_in_type_name_a_plugin_builds_is_counted_as_a_plugin_type(tmp_path):
    """A plugin that gives `mha` a build target of its own (replace=True): show counts its
    parameters from the meta build and leaves its FLOPs and KV cache out, naming them, as
    for a new plugin type name, rather than the built-in formulas."""
    _plugin_installed(tmp_path, "gated_mha", GATED_MHA, "gated = gated_mha:register")
    mine = _show_json(tmp_path, "gpt-nano")
    nano = _show_json(tmp_path / "elsewhere", "gpt-nano")  # no plugin on the path
    assert nano["params"]["counted_from"] == "analytic" and nano["flops_per_token"]["not_counted"] == {}
    # parameters: exact, the gate's 4 per layer included (4 layers)
    assert mine["params"]["counted_from"] == "meta build"
    assert mine["params"]["total"] == nano["params"]["total"] + 4 * 4
    assert mine["params"]["components"]["decoder.attention"] == nano["params"]["components"]["decoder.attention"] + 16
    what = "attention type 'mha', built by gated_mha:build"
    assert mine["flops_per_token"]["not_counted"] == {"decoder.attention": what}
    assert not any(key.startswith("decoder.attention") for key in mine["flops_per_token"]["components"])
    assert mine["flops_per_token"]["forward"] == nano["flops_per_token"]["forward"] - sum(
        v for k, v in nano["flops_per_token"]["components"].items() if k.startswith("decoder.attention"))
    assert mine["kv_cache_bytes_per_token"] == 0 and mine["kv_cache_not_counted"] == {"decoder.attention": what}
    assert mine["memory"]["not_counted"] == {"decoder.attention": what}
    assert mine["memory"]["activations"] < nano["memory"]["activations"]

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", "gpt-nano"], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert "Counted from the model built on the meta device" in result.stdout
    assert "≥" in result.stdout and "built by gated_mha:build" in " ".join(result.stdout.split())


LAZY_MLP = '''
from torch import nn


def register(registry):
    registry.register("ffn", registry.get("ffn", "mlp").spec, "lazy_mlp:Lazy", replace=True)


class Lazy(nn.Module):
    def __init__(self, spec, *, d_model):
        super().__init__()
        self.up, self.down = nn.LazyLinear(spec.d_ff), nn.Linear(spec.d_ff, d_model)

    def forward(self, x):
        return self.down(self.up(x).relu())
'''


def test_a_plugin_module_with_lazy_parameters_is_named_not_a_traceback(tmp_path):
    # nn.LazyLinear has no shape until its first forward: show says so instead of torch's error
    _plugin_installed(tmp_path, "lazy_mlp", LAZY_MLP, "lazy = lazy_mlp:register")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", "gpt-nano"], capture_output=True, text=True,
                            env=env)
    said = " ".join(result.stderr.split())
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert ("decoder.layers.0.ffn.up.weight, decoder.layers.0.ffn.up.bias, decoder.layers.1.ffn.up.weight and 5 more "
            "of decoder.ffn (ffn type 'mlp', built by lazy_mlp:Lazy) are lazy parameters") in said, said


def test_a_constructor_that_reads_a_tensor_on_the_meta_device_names_its_part(tmp_path):
    # the model is built on the meta device first: a constructor's .item() fails there, and the
    # error says which family, type and target raised it; a target that cannot be called so
    # names its own module, not the module of the spec class it builds
    plugin = LAZY_MLP.replace("lazy_mlp:Lazy", "reading:Reads").replace(
        "self.up, self.down = nn.LazyLinear(spec.d_ff), nn.Linear(spec.d_ff, d_model)",
        "self.up = nn.Linear(d_model, spec.d_ff)\n        self.scale = float(self.up.weight.abs().max())")
    (tmp_path / "reading.py").write_text(plugin.replace("class Lazy", "class Reads"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import reading, specformer.specs.schema\n"
            "from specformer.registry import REGISTRY; reading.register(REGISTRY)\n"
            "from specformer import build_model\n"
            "try:\n    build_model('gpt-nano')\nexcept RuntimeError as exc:\n    print(exc.__notes__)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "raised building ffn type 'mlp' with reading:Reads; a constructor runs on the meta device first" in out, out
    (tmp_path / "reading.py").write_text(plugin.replace("class Lazy", "class Reads").replace(
        "def __init__(self, spec, *, d_model):", "def __init__(self, spec, *, d_model, extra):"))
    code = code.replace("except RuntimeError as exc:\n    print(exc.__notes__)", "except TypeError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "its target reading:Reads (registered by " in out, out


def test_export_refuses_a_built_in_type_a_module_of_ones_own_builds(tmp_path):
    # its config would be gpt2's, and transformers' GPT-2 computes mha without the gate
    _plugin_installed(tmp_path, "gated_mha", GATED_MHA, "gated = gated_mha:register")
    code = ("from specformer.interop.hf_config import hf_config_from_spec, HFConversionError\n"
            "try:\n    hf_config_from_spec('gpt-nano')\nexcept HFConversionError as exc:\n    print(exc)\n")
    said = _run(tmp_path, code).stdout
    assert said.startswith("decoder.attention (attention type 'mha', built by gated_mha:build): a module of your "
                           "own builds this built-in type"), said
    assert "model_type" in _run(tmp_path / "elsewhere", code.replace("print(exc)", "pass") + "print(hf_config_from_spec('gpt-nano'))").stdout


def test_a_checkpoint_built_with_ones_own_module_for_a_built_in_type_is_refused_without_it(tmp_path):
    # its spec reads as gpt-nano's: without the record, the gated weights would load into the
    # built-in mha (the gate left out, as unexpected or quietly) and compute something else
    _plugin_installed(tmp_path, "gated_mha", GATED_MHA, "gated = gated_mha:register")
    ckpt = tmp_path / "gated.ckpt"
    saved = _run(tmp_path, f"from specformer import build_model\nfrom specformer.training import save_checkpoint\n"
                           f"save_checkpoint(build_model('gpt-nano'), {str(ckpt)!r})\n")
    assert saved.returncode == 0, saved.stderr
    load = (f"from specformer.training import load_checkpoint\nfrom specformer.training.checkpoint import CheckpointError\n"
            f"try:\n    print(load_checkpoint({str(ckpt)!r}).spec.name)\nexcept CheckpointError as exc:\n    print(exc)\n")
    assert _run(tmp_path, load).stdout.strip() == "gpt-nano"  # with the plugin: as it was saved
    said = _run(tmp_path / "elsewhere", load).stdout
    assert ("its model was built with modules of your own (decoder.attention: attention type 'mha', built by "
            "gated_mha:build, here specformer's own attention type 'mha')") in said, said


def test_a_plugin_type_in_some_layers_only_is_named_with_them(plugin_path, tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  overrides:\n    - {layers: [0, 1], ffn: {type: relu2, d_ff: 64}}\n")
    mine, nano = _show_json(plugin_path, str(spec)), _show_json(plugin_path, "gpt-nano")
    flops, nano_flops = mine["flops_per_token"], nano["flops_per_token"]
    assert flops["not_counted"] == {"decoder.ffn": "ffn type 'relu2' in layers 0-1"}
    # layers 2 and 3 keep gpt-nano's MLP, counted: half its FFN FLOPs
    assert flops["components"]["decoder.ffn"] * 2 == nano_flops["components"]["decoder.ffn"]
    # 2 relu2 layers (128 -> 64 -> 128, with biases) and 2 of gpt-nano's 4 MLPs
    assert mine["params"]["components"]["decoder.ffn"] == (
        2 * (128 * 64 + 64 + 64 * 128 + 128) + nano["params"]["components"]["decoder.ffn"] // 2)
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", str(spec)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    assert "524.3 kFLOP" in lines["decoder.ffn of the other layers"]
    assert "not counted" in lines["decoder.ffn of layers 0-1"]
    assert "≥ 1.443 MFLOP" in lines["forward, without decoder.ffn of layers 0-1"]


OWN_CLM = """
def register(registry):
    from specformer.specs.training import CausalLMSpec

    # the built-in name with an objective of the plugin's own
    registry.register("objective", CausalLMSpec, "own_clm:CLM", replace=True)


def CLM(spec, **kwargs):
    from specformer.training.objectives import CausalLM

    return CausalLM(spec, **kwargs)
"""


def test_a_built_in_objective_a_plugin_builds_leaves_the_heads_training_step_uncounted(tmp_path):
    """A plugin that gives `causal_lm` a build target of its own runs the loss as it chooses:
    show counts the forward as the model's, leaves the head out of the training step and of
    the activations, marks those ≥ and names the objective."""
    _plugin_installed(tmp_path, "own_clm", OWN_CLM, "clm = own_clm:register")
    mine = _show_json(tmp_path, "gpt-nano")
    nano = _show_json(tmp_path / "elsewhere", "gpt-nano")  # no plugin on the path
    # without the plugin: the built-in objective's numbers, as before
    t, d, v = 256, 128, 512
    head = t * 2 * d * v // t
    assert nano["flops_per_token"]["not_counted"] == {} and nano["memory"]["not_counted"] == {}
    assert (nano["flops_per_token"]["forward"], nano["flops_per_token"]["training"]) == (1_967_104, 5_901_312)
    assert nano["flops_per_token"]["components"]["head"] == head
    assert nano["memory"]["activations"] == 5_521_408
    what = {"training.objective": "objective type 'causal_lm', built by own_clm:CLM"}
    flops, memory = mine["flops_per_token"], mine["memory"]
    assert flops["not_counted"] == what and memory["not_counted"] == what
    # the forward is the model's: counted in full, the head included
    assert flops["forward"] == 1_967_104 and flops["components"] == nano["flops_per_token"]["components"]
    # the training step: 3 x the forward without the head
    assert flops["training"] == 3 * (1_967_104 - head) == 5_508_096
    # activations without what the fused loss keeps: the head input's gradient (T x D, fp32)
    # and the head weight's (V x D, fp32)
    assert memory["activations"] == 5_521_408 - (t * d * 4 + v * d * 4)
    same = ("weights", "gradients", "optimizer", "weight_casts")
    assert [memory[k] for k in same] == [nano["memory"][k] for k in same]
    assert mine["params"] == nano["params"] and mine["params"]["counted_from"] == "analytic"
    assert mine["kv_cache_bytes_per_token"] == nano["kv_cache_bytes_per_token"] and mine["kv_cache_not_counted"] == {}

    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", "gpt-nano"], capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 2}
    assert "≥" not in lines["forward"] and "1.967 MFLOP" in lines["forward"]
    assert "≥ 5.508 MFLOP" in lines["training step (3× forward), without training.objective"]
    assert "≥" in lines["activations, without training.objective"]
    assert "≥" in lines["training total, without training.objective"]
    assert "≥" not in lines["weights"] + lines["autocast weight copies"]
    text = " ".join(result.stdout.split())
    assert "the head under training.objective (objective type 'causal_lm', built by own_clm:CLM)" in text
    assert "Activations of the head's loss not counted: training.objective" in text

    result = subprocess.run([sys.executable, "-m", "specformer", "diff", "gpt-nano", "gpt-nano", "--set",
                             "decoder.n_layers=2", "--no-checkpoints"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2:-1] for line in result.stdout.splitlines()
            if line.count("│") > 2}
    forward, training = rows["FLOPs/token forward @ 256"], rows["FLOPs/token training @ 256"]
    assert "≥" not in "".join(forward) and "?" not in "".join(forward)
    assert training[0].strip() == "≥ 5.508 MFLOP" and [c.strip() for c in training[2:]] == ["?", "?"]
    assert "?" in "".join(rows["memory: activations"]) and "?" not in "".join(rows["memory: autocast weight copies"])


def test_a_run_gives_no_model_flops_for_a_part_the_analysis_leaves_out(plugin_path):
    """The summary's model FLOPs (the MFU's numerator) of a spec with a plugin's type or
    objective would be a lower bound: a run gives none rather than understate it."""
    (plugin_path / "own_clm.py").write_text(OWN_CLM)
    code = (
        "from specformer import load_spec\n"
        "from specformer.training.run import _training_flops\n"
        "print(_training_flops(load_spec('gpt-nano', ['decoder.ffn={type: relu2, d_ff: 32}'])))\n"
        "print(_training_flops(load_spec('gpt-nano')))\n"
        "import own_clm\n"
        "from specformer.registry import REGISTRY\n"
        "own_clm.register(REGISTRY)\n"
        "print(_training_flops(load_spec('gpt-nano')))\n"
    )
    result = _run(plugin_path, code)
    assert result.returncode == 0, result.stderr
    # nanoGPT's 6N + 12·L·T·d for gpt-nano before the objective is the plugin's
    assert result.stdout.split() == ["None", str(float(6 * 851_968 + 12 * 4 * 256 * 128)), "None"]


OWN_MLM = """
import specformer.specs.training  # noqa: F401  (registers the built-in objectives)
from specformer.registry import REGISTRY, register


def mine(spec, **kwargs):
    from specformer.training.objectives import MaskedLM

    return MaskedLM(spec, **kwargs)


register("objective", REGISTRY.get("objective", "masked_lm").spec, mine, replace=True)

from specformer import load_spec
from specformer.analysis import AnalysisError, activation_bytes, flops_per_token

for extra in ([], ['training.optimizer.freeze=[embed.*]']):
    f = flops_per_token(load_spec("bert-nano", extra))
    print(f.forward, f.training, f.components["head"], f.not_counted)
try:
    activation_bytes("bert-nano", batch=1, seq_len=64)
except AnalysisError as exc:
    print(exc)
"""


def test_a_built_in_masked_lm_a_script_builds_leaves_the_head_out_of_the_training_step(tmp_path):
    import specformer
    from specformer import load_spec
    from specformer.analysis import flops_per_token

    script = tmp_path / "own_mlm.py"
    script.write_text(OWN_MLM)
    root = os.path.dirname(os.path.dirname(os.path.abspath(specformer.__file__)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": root})
    assert result.returncode == 0, result.stderr
    plain, frozen, error = result.stdout.splitlines()
    built = flops_per_token(load_spec("bert-nano"))  # specformer's own masked_lm
    share = load_spec("bert-nano").training.objective.mask_prob
    head = built.components["head"]
    assert built.training == round(3 * (built.forward - head) + 3 * share * head)
    what = "{'training.objective': \"objective type 'masked_lm', built by __main__:mine\"}"
    forward, training, mine_head, not_counted = plain.split(" ", 3)
    assert (int(forward), int(mine_head), not_counted) == (built.forward, head, what)
    assert int(training) == 3 * (built.forward - head)  # the head's training step is the objective's
    frozen_built = flops_per_token(load_spec("bert-nano", ["training.optimizer.freeze=[embed.*]"]))
    forward, training, _, not_counted = frozen.split(" ", 3)
    # frozen: neither the head's forward nor its backward products in the training step: the
    # dense layer's input and weight gradients, the projection's input gradient (its weight is
    # the frozen token table), on the labelled rows
    assert int(forward) == frozen_built.forward and not_counted == what
    d, v = 128, 512
    head_step = share * (head + 2 * (2 * d * d) + 2 * d * v)
    assert abs(int(training) - (frozen_built.training - head_step)) <= 1
    assert error == ("training.objective: no activation count for objective type 'masked_lm', built by "
                     "__main__:mine, which keeps what its own module chooses")


ATTENTION_PLUGIN = '''
from typing import Literal

from specformer.registry import register
from specformer.specs.base import Spec


class MyAttentionSpec(Spec):
    type: Literal["myattn"] = "myattn"
    n_heads: int = 8
    n_kv_heads: int | None = None
    head_dim: int | None = None
    sliding_window: int | None = None


def build(spec, *, d_model, cross, layer_idx):
    # the built-in attention under another name: the same parameters as mha
    from specformer.components.attention import Attention
    from specformer.specs.schema import AttentionSpec

    inner = AttentionSpec(n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, head_dim=spec.head_dim)
    return Attention(inner, d_model=d_model, cross=cross, layer_idx=layer_idx)


register("attention", MyAttentionSpec, build)


class ZeroSpec(Spec):
    """An FFN with no size of its own."""

    type: Literal["zero"] = "zero"


def zero(spec, *, d_model):
    from torch import nn

    class Zero(nn.Module):
        def forward(self, x):
            return x * 0

    return Zero()


register("ffn", ZeroSpec, zero)

from specformer import load_spec
from specformer.analysis import AnalysisError, analyze, activation_bytes, kv_cache_bytes_per_token

mine = load_spec({"extends": "gpt-nano", "decoder": {"attention": {"type": "myattn", "n_heads": 4}}})
nano = load_spec("gpt-nano")
r, n = analyze(mine), analyze(nano)
print(r.params.total == n.params.total, r.params.method, r.memory.weights == n.memory.weights)
print(r.kv_cache_bytes_per_token, r.kv_cache_not_counted)
print(sorted(r.flops.components), r.flops.not_counted)
print(r.flops.forward == n.flops.forward - n.flops.components["decoder.attention.proj"]
      - n.flops.components["decoder.attention.scores"])
for fn in (lambda: kv_cache_bytes_per_token(mine), lambda: activation_bytes(mine, batch=1, seq_len=8)):
    try:
        fn()
    except AnalysisError as exc:
        print(exc)
table = analyze(load_spec({"extends": "gpt-nano", "decoder": {"attention": {"type": "myattn", "n_heads": 4},
                                                              "ffn": {"type": "zero"}}})).to_markdown()
print([line for line in table.splitlines() if line.startswith("| decoder |")][0])
print([line for line in table.splitlines() if line.startswith("Matrix products only")][0].split(";")[1])
'''


def test_a_plugin_attention_leaves_the_kv_cache_uncounted_and_says_so(tmp_path):
    script = tmp_path / "attn.py"
    script.write_text(ATTENTION_PLUGIN)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "True meta build True"  # the same parameters as mha, counted from the module
    assert lines[1] == "0 {'decoder.attention': \"attention type 'myattn'\"}"
    assert lines[2] == "['decoder.ffn', 'head'] {'decoder.attention': \"attention type 'myattn'\"}"
    assert lines[3] == "True"
    assert lines[4].startswith("decoder.attention: no KV-cache count for attention type 'myattn'")
    assert lines[5].startswith("decoder.attention: no activation count for attention type 'myattn'")
    # an FFN with no d_ff and no activation, an attention with no qk_norm: the architecture row says so
    assert lines[6] == "| decoder | 4 | 128 | 4/4 | 32 | — | zero | layernorm (pre) | learned (256 rows) | attention myattn |"
    assert lines[7] == " no attention of a built-in type"


def test_diff_of_a_plugin_type_marks_the_figures_it_leaves_out(plugin_path, tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  ffn: {type: relu2, d_ff: 32}\n")
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "diff", "gpt-nano", str(spec), "--format", "json"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    changes = {c["path"]: c["values"] for c in out["changes"]}
    assert changes["decoder.ffn.type"] == ["mlp", "relu2"] and changes["decoder.ffn.d_ff"] == [512, 32]
    nano, mine = out["reports"]
    assert mine["params"]["components"]["decoder.ffn"] == 33408
    assert mine["flops_per_token"]["not_counted"] == {"decoder.ffn": "ffn type 'relu2'"}
    (compat, *_) = out["compatibility"]
    assert compat["compatible"] is False and compat["method"] == "analytic / meta build"
    assert {"key": "decoder.layers.0.ffn.up_proj.weight", "source": [512, 128], "target": [32, 128]} in (
        compat["mismatched"])
    assert result.stderr == ""

    result = subprocess.run([sys.executable, "-m", "specformer", "diff", "gpt-nano", str(spec)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in result.stdout.splitlines() if line.count("│") > 3}
    # exact figures get a difference; one that leaves the plugin's FFN out is a lower bound, with none
    assert rows["params: decoder ffn"] == ["526,848", "33,408", "-493,440", "-93.7%"]
    assert rows["FLOPs/token forward @ 256"] == ["1.967 MFLOP", "≥ 918.5 kFLOP", "?", "?"]
    assert rows["memory: weights"][3] == "-55.3%" and rows["memory: training total"][2:] == ["?", "?"]
    assert "p leaves out decoder.ffn (ffn type 'relu2')" in " ".join(result.stdout.split())


@pytest.fixture
def registry_restored():
    """The process-wide registry as it was before the test, each family's union made again
    without the types the test registered after the schema was built."""
    from specformer.registry import FAMILIES, REGISTRY
    from specformer.specs import schema  # noqa: F401  (built: the unions exist)

    before = {family: REGISTRY.entries(family) for family in FAMILIES}
    yield
    for family, entries in before.items():
        now = REGISTRY._families.setdefault(family, {})
        added = now.keys() - entries.keys()
        now.clear()
        now.update(entries)
        if added:
            REGISTRY.rebuild_union(family)


def test_a_script_registers_a_subclass_of_a_built_in_spec_class_after_importing_it(registry_restored):
    # importing a built-in spec class builds the schema; a type registered after it was refused
    # ("registered after the spec schema was built ... register it before that"), which a
    # subclass of that class cannot be: its family's union is made again with it
    from typing import Literal

    import torch

    from specformer import build_model, load_spec
    from specformer.components.attention import Attention
    from specformer.registry import REGISTRY, register
    from specformer.specs.errors import SpecError
    from specformer.specs.jsonschema import spec_json_schema
    from specformer.specs.schema import AttentionSpec, ModelSpec
    from specformer.specs.training import AdamWSpec, TrainingSpec

    class CosineAttentionSpec(AttentionSpec):
        type: Literal["cosine"] = "cosine"
        temperature: float = 10.0

    class CosineAttention(Attention):
        pass

    class LionSpec(AdamWSpec):
        type: Literal["lion"] = "lion"

    register("attention", CosineAttentionSpec, CosineAttention)
    register("optimizer", LionSpec, REGISTRY.get("optimizer", "adamw").target)
    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1", "decoder.attention={type: cosine, temperature: 2.0}",
                                            "training.optimizer.type=lion"])
    attention = spec.decoder.attention
    assert type(attention) is CosineAttentionSpec and attention.temperature == 2.0
    assert (attention.n_heads, attention.head_dim) == (4, 32)  # derived as for the built-in class
    assert type(spec.training.optimizer) is LionSpec
    assert type(TrainingSpec.model_validate({"optimizer": {"type": "lion"}}).optimizer) is LionSpec
    assert ModelSpec.model_validate(spec.model_dump()) == spec  # a resolved spec loads back
    model = build_model(spec)
    assert type(model.decoder.layers[0].self_attn) is CosineAttention
    assert model(torch.randint(0, 512, (1, 5))).logits.shape == (1, 5, 512)
    assert {"CosineAttentionSpec", "LionSpec"} <= spec_json_schema()["$defs"].keys()  # `specformer schema`
    with pytest.raises(SpecError, match=r"unknown type 'cosin'\s+did you mean 'cosine'\? allowed: mha, cosine"):
        load_spec("gpt-nano", overrides=["decoder.attention.type=cosin"])
    # specformer's own types are as they were
    assert type(load_spec("gpt-nano").decoder.attention) is AttentionSpec


def test_a_subclass_of_mlp_or_glu_spec_gets_its_parents_d_ff(registry_restored):
    from typing import Literal

    from specformer import build_model, load_spec
    from specformer.registry import REGISTRY, register
    from specformer.specs.schema import GLUSpec, MLPSpec, default_glu_d_ff

    class MyGLUSpec(GLUSpec):
        type: Literal["myglu"] = "myglu"

    class MyMLPSpec(MLPSpec):
        type: Literal["mymlp"] = "mymlp"

    register("ffn", MyGLUSpec, REGISTRY.get("ffn", "glu").target)
    register("ffn", MyMLPSpec, REGISTRY.get("ffn", "mlp").target)
    glu = load_spec("gpt-nano", overrides=["decoder.ffn={type: myglu}"])
    assert glu.decoder.ffn.d_ff == default_glu_d_ff(128) == load_spec("gpt-nano", overrides=["decoder.ffn={type: glu}"]).decoder.ffn.d_ff
    assert load_spec("gpt-nano", overrides=["decoder.ffn={type: mymlp}"]).decoder.ffn.d_ff == 4 * 128
    build_model(glu)  # before: "the FFN spec needs d_ff"


def test_a_new_type_the_schema_cannot_take_after_it_is_built_is_refused_or_undone():
    from typing import Literal

    from specformer.specs.base import Spec
    from specformer.specs.schema import MLPSpec

    class LateSpec(Spec):
        type: Literal["late"] = "late"

    # a registry without a way to make its unions again refuses it, saying what to do instead
    registry = Registry()
    registry.register("ffn", MLPSpec, "x:y")
    registry.mark_built("ffn")
    with pytest.raises(ValueError, match=r"ffn type 'late' is registered after the spec schema was built.*"
                                         r"importing build_model, ModelSpec.*register it before that.*restart the kernel "
                                         r"and run this cell first.*specformer\.plugins.*a spec class derived from a "
                                         r"built-in one, .* is registered from an entry point, whose module finds the "
                                         r"built-in types registered \(REGISTRY\.get\('ffn', name\)\.spec\)"):
        registry.register("ffn", LateSpec, "x:y")
    assert registry.names("ffn") == ["mlp"]
    # a union that cannot be made with it: the type is taken out again, the union made without it
    made = []

    def rebuild(family):
        made.append(sorted(registry.names(family)))
        if "late" in registry.names(family):
            raise TypeError("no schema for it")

    registry.rebuild_union = rebuild
    with pytest.raises(TypeError, match="no schema for it"):
        registry.register("ffn", LateSpec, "x:y")
    assert registry.names("ffn") == ["mlp"] and made == [["late", "mlp"], ["mlp"]]


def test_a_type_registered_after_the_schema_is_built_keeps_its_name_and_class(monkeypatch):
    from typing import Literal

    from specformer import load_spec
    from specformer.registry import REGISTRY
    from specformer.specs.base import Spec
    from specformer.specs.schema import MLPSpec

    load_spec("gpt-nano")

    class LateSpec(Spec):
        type: Literal["late"] = "late"

    class OtherMLPSpec(Spec):
        type: Literal["mlp"] = "mlp"

    # a class of one's own under a built-in name: no new process helps, another name does
    for replace in (False, True):
        with pytest.raises(ValueError, match=r"ffn type 'mlp' is built in: .*give OtherMLPSpec another type name.*"
                                             r"register\('ffn', REGISTRY.get\('ffn', 'mlp'\).spec, target, replace=True\)"):
            REGISTRY.register("ffn", OtherMLPSpec, "x:y", replace=replace)
    # a registered spec class may still get another target
    monkeypatch.setitem(REGISTRY._families["ffn"], "mlp", REGISTRY.get("ffn", "mlp"))
    REGISTRY.register("ffn", MLPSpec, "x:z", replace=True)
    assert REGISTRY.get("ffn", "mlp").target == "x:z"

    fresh = Registry()
    fresh.register("ffn", MLPSpec, "x:y")
    fresh.register("ffn", LateSpec, "x:y")  # nothing built from this registry yet
    assert fresh.names("ffn") == ["mlp", "late"]
    with pytest.raises(ValueError, match=f"ffn type 'late' is already registered \\(by {__name__}\\)"):
        fresh.register("ffn", LateSpec, "x:y")


def test_a_notebook_cell_that_registers_a_type_runs_again_after_the_schema_is_built():
    # each run of a cell makes a new class object from the same class statement
    cell = textwrap.dedent('''
        from typing import Literal
        from specformer.specs.base import Spec

        class CellNormSpec(Spec):
            type: Literal["cellnorm"] = "cellnorm"
            placement: Literal["pre", "post"] = "pre"
            final: bool | None = None
            eps: float = EPS
    ''')

    def run_cell(eps: str = "1e-5") -> type:
        namespace = {"__name__": "__main__"}
        exec(compile(cell.replace("EPS", eps), "<cell>", "exec", dont_inherit=True), namespace)
        return namespace["CellNormSpec"]

    registry = Registry()
    first = run_cell()
    registry.register("norm", first, "x:first", replace=True)
    registry.mark_built("norm")  # the cell's next line: load_spec / build_model
    with pytest.raises(ValueError, match=r"already registered \(by __main__\); pass replace=True.*"
                                         r"a notebook cell run again.*write replace=True"):
        registry.register("norm", run_cell(), "x:second")
    registry.register("norm", run_cell(), "x:second", replace=True)
    entry = registry.get("norm", "cellnorm")
    assert entry.spec is first and entry.target == "x:second"  # the schema's class, the cell's new target
    with pytest.raises(ValueError, match=r"needs a new Python process \(in a notebook, restart the kernel\)"):
        registry.register("norm", run_cell(eps="1e-6"), "x:third", replace=True)  # its fields changed
    assert registry.get("norm", "cellnorm").target == "x:second"


def test_a_cell_run_again_with_another_validator_or_method_needs_a_new_process():
    # the schema keeps the first class: an edited validator or (computed) property would never run
    cell = textwrap.dedent('''
        from typing import Literal
        from pydantic import computed_field, field_validator
        from specformer.specs.base import Spec
        ABOVE
        class CellNormSpec(Spec):
            type: Literal["cellnorm"] = "cellnorm"
            placement: Literal["pre", "post"] = "pre"
            final: bool | None = None
            eps: float = 1e-5

            @field_validator("eps")
            @classmethod
            def _small(cls, value: float) -> float:
                if value > LIMIT:
                    raise ValueError("eps is too large")
                return value

            @computed_field
            @property
            def scale(self) -> float:
                return SCALE * self.eps
    ''')

    def run_cell(limit: str = "0.1", scale: str = "1.0", above: str = "") -> type:
        namespace = {"__name__": "__main__"}
        text = cell.replace("LIMIT", limit).replace("SCALE", scale).replace("ABOVE", above)
        exec(compile(text, "<cell>", "exec", dont_inherit=True), namespace)
        return namespace["CellNormSpec"]

    registry = Registry()
    first = run_cell()
    registry.register("norm", first, "x:first")
    registry.mark_built("norm")
    # the same statement, even below a line added to the cell: the new target is taken
    registry.register("norm", run_cell(above="import math"), "x:second", replace=True)
    assert registry.get("norm", "cellnorm").spec is first
    assert registry.get("norm", "cellnorm").target == "x:second"
    for edited in (run_cell(limit="0.5"), run_cell(scale="2.0")):
        with pytest.raises(ValueError, match=r"needs a new Python process \(in a notebook, restart the kernel\)"):
            registry.register("norm", edited, "x:third", replace=True)
    assert registry.get("norm", "cellnorm").target == "x:second"


def test_a_type_registered_before_the_schema_does_not_become_the_default(tmp_path):
    # a script registers before its first load_spec; a mapping without `type:` stays the built-in
    code = textwrap.dedent('''
        from typing import Literal
        from specformer.registry import register
        from specformer.specs.base import Spec

        class MyAttention(Spec):
            type: Literal["myattn"] = "myattn"
            n_heads: int = 8
            n_kv_heads: int | None = None
            head_dim: int | None = None
            sliding_window: int | None = None

        class MyNorm(Spec):
            type: Literal["mynorm"] = "mynorm"
            placement: Literal["pre", "post"] = "pre"
            final: bool | None = None

        register("attention", MyAttention, "x:y")
        register("norm", MyNorm, "x:y")
        from specformer import load_spec
        stack = {"n_layers": 1, "attention": {"n_heads": 2}, "norm": {"eps": 1e-6}}
        s = load_spec({"kind": "decoder", "vocab_size": 16, "d_model": 8, "decoder": stack})
        print(s.decoder.attention.type, s.decoder.attention.n_heads, s.decoder.norm.type)
        s = load_spec("gpt-nano", overrides=["decoder.norm.type=mynorm"])
        print(s.decoder.norm.type, s.decoder.norm.final)
    ''')
    result = _run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["mha", "2", "layernorm", "mynorm", "True"]


def test_a_spec_class_without_the_fields_its_family_needs_is_refused_at_registration():
    from typing import Literal

    from specformer.specs.base import Spec

    class BareNorm(Spec):
        type: Literal["barenorm"] = "barenorm"

    class BareAttention(Spec):
        type: Literal["bareattn"] = "bareattn"
        n_heads: int = 4

    registry = Registry()
    with pytest.raises(TypeError, match=r"BareNorm lacks the fields placement, final that every norm spec has.*"
                                        r'declare placement: Literal\["pre", "post", "sandwich", "output"\] = "pre"; '
                                        r'final: bool \| None'):
        registry.register("norm", BareNorm, "x:y")
    with pytest.raises(TypeError, match="BareAttention lacks the fields n_kv_heads, head_dim, sliding_window"):
        registry.register("attention", BareAttention, "x:y")
    assert registry.names("norm") == registry.names("attention") == []


def test_an_attention_type_gets_sizes_derived_from_its_own_defaults(tmp_path):
    code = textwrap.dedent('''
        from typing import Literal
        from specformer.registry import register
        from specformer.specs.base import Spec

        class LinearAttention(Spec):
            type: Literal["linear"] = "linear"
            n_heads: int = 2
            n_kv_heads: int | None = None
            head_dim: int | None = None
            sliding_window: int | None = None

        register("attention", LinearAttention, "x:y")
        from specformer import load_spec
        s = load_spec({"kind": "decoder", "vocab_size": 8, "d_model": 128,
                       "decoder": {"n_layers": 1, "attention": {"type": "linear"}}})
        a = s.decoder.attention
        print(a.type, a.n_heads, a.n_kv_heads, a.head_dim)
        # over a preset's attention, the sizes every attention has are the preset's (4 heads)
        s = load_spec("gpt-nano", overrides=["decoder.attention={type: linear}"])
        a = s.decoder.attention
        print(a.type, a.n_heads, a.n_kv_heads, a.head_dim)
    ''')
    result = _run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["linear", "2", "2", "64", "linear", "4", "4", "32"]


def test_registry_refuses_a_spec_class_yaml_could_never_select():
    from typing import Literal

    from pydantic import BaseModel

    from specformer.specs.base import Spec

    class NoType(Spec):
        d_ff: int = 64

    class Loose(BaseModel):  # would accept unknown keys and make specs unhashable
        type: Literal["loose"] = "loose"

    class Named(Spec):
        type: Literal["named"] = "named"

    class Plain(Spec):
        type: str = "plain"

    registry = Registry()
    with pytest.raises(TypeError, match=r"NoType has no 'type' field.*declare type: Literal\[\"name\"\]"):
        registry.register("ffn", NoType, "x:y")
    with pytest.raises(TypeError, match="NoType has no 'type' field"):
        registry.register("ffn", NoType, "x:y", name="notype")  # `type: notype` would be an unknown field
    with pytest.raises(TypeError, match="'Loose' is not a spec class: derive it from specformer.specs.base.Spec"):
        registry.register("ffn", Loose, "x:y")
    with pytest.raises(TypeError, match=r"name 'other' differs from Named.type \('named'\)"):
        registry.register("ffn", Named, "x:y", name="other")
    with pytest.raises(TypeError, match="Plain.type must be a Literal of exactly one string"):
        registry.register("ffn", Plain, "x:y")
    assert registry.names("ffn") == []
    assert registry.register("ffn", Named, "x:y", name="named").name == "named"


def test_a_type_named_as_a_built_in_one_is_refused_not_swapped_in(tmp_path):
    code = textwrap.dedent('''
        from typing import Literal
        from specformer.registry import register
        from specformer.specs.base import Spec

        class MyRMSNorm(Spec):
            type: Literal["rmsnorm"] = "rmsnorm"
            placement: Literal["pre", "post"] = "pre"
            final: bool | None = None

        register("norm", MyRMSNorm, "x:y")
        from specformer import load_spec
        load_spec("llama2-7b")
    ''')
    result = _run(tmp_path, code)
    assert result.returncode == 1
    assert ("ValueError: norm type 'rmsnorm' is built in, and MyRMSNorm, registered under that name before "
            "the schema was built, would replace it in every spec that uses it: give that type another name"
            ) in result.stderr
    # a built-in spec class may get another build target
    code = textwrap.dedent('''
        from specformer import load_spec
        from specformer.registry import REGISTRY, register
        load_spec("gpt-nano")
        register("norm", REGISTRY.get("norm", "rmsnorm").spec, "torch.nn:RMSNorm", replace=True)
        print(load_spec("llama2-7b").decoder.norm.eps)
    ''')
    result = _run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1e-05"]


def test_a_new_objective_is_refused_at_registration_saying_objectives_are_built_in():
    # the data pipeline and the kind checks know the four objectives one by one: a fifth
    # one validated nowhere ("does not train a decoder model (allowed: causal_lm, sft)")
    from typing import Literal

    from specformer.specs.base import Spec

    class PrefixLM(Spec):
        type: Literal["prefix_lm"] = "prefix_lm"

    registry = Registry()
    with pytest.raises(ValueError, match=r"objective type 'prefix_lm': objectives are built in \(causal_lm"):
        registry.register("objective", PrefixLM, "x:y")
    registry.register("objective", PrefixLM, "x:y", source="specformer")  # how the built-ins register
    import specformer.specs.schema  # noqa: F401 - registers the built-in types
    from specformer.registry import BUILT_IN_ONLY, REGISTRY

    listed = BUILT_IN_ONLY["objective"].partition("(")[2].partition(")")[0].split(", ")
    assert listed == REGISTRY.names("objective")  # every built-in objective, in the registry's order


def test_an_unregistered_type_is_unknown_in_every_family_and_the_hint_says_to_register_it():
    # a script that forgot to import the module registering its types, or a plugin not installed
    from specformer import SpecError, load_spec

    with pytest.raises(SpecError) as info:
        load_spec("gpt-nano", overrides=["decoder.attention.type=linear", "decoder.ffn.type=moe",
                                         "training.objective.type=contrastive"])
    problems = {p.path: p for p in info.value.problems}
    # attention has one built-in type, so its union is that class alone: still an unknown type
    attention = problems["decoder.attention.type"]
    assert attention.message == "unknown type 'linear'"
    assert attention.hint == "allowed: mha; a type of your own is registered first (docs/components.md#adding-a-component)"
    assert problems["decoder.ffn.type"].hint.endswith("allowed: mlp, glu; a type of your own is registered first "
                                                     "(docs/components.md#adding-a-component)")
    # objectives take no new types: no advice to register one
    assert problems["training.objective.type"].hint == "allowed: causal_lm, masked_lm, seq2seq, sft, classification"


def test_a_checkpoint_of_an_unregistered_attention_type_says_to_register_it(tmp_path):
    import torch

    from specformer import load_spec
    from specformer.training.checkpoint import CheckpointError, load_checkpoint

    spec = load_spec("gpt-nano", overrides=["decoder.n_layers=1"]).to_dict()
    spec["decoder"]["attention"]["type"] = "linear"
    path = tmp_path / "plugin.ckpt"
    torch.save({"specformer": {"format": 1, "spec": spec}, "state_dict": {}, "global_step": 1}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "decoder.attention.type: unknown type 'linear'" in message
    assert "uses a type that is not registered here" in message


def test_a_class_of_ones_own_never_replaces_a_built_in_type_even_with_replace():
    # before the schema is built too: replace=True swapped LayerNormSpec out of every preset
    from typing import Literal

    from specformer.specs.base import Spec
    from specformer.specs.schema import LayerNormSpec

    class MyLayerNorm(Spec):
        type: Literal["layernorm"] = "layernorm"
        placement: Literal["pre", "post"] = "pre"
        final: bool | None = None

    registry = Registry()
    registry.register("norm", LayerNormSpec, "x:y", source="specformer")
    with pytest.raises(ValueError, match="norm type 'layernorm' is built in: .*give MyLayerNorm another type name"):
        registry.register("norm", MyLayerNorm, "x:z", replace=True)
    assert registry.get("norm", "layernorm").spec is LayerNormSpec
    registry.register("norm", LayerNormSpec, "x:z", replace=True)  # the built-in class, another module
    assert registry.get("norm", "layernorm").target == "x:z"


BROKEN = '''
from typing import Literal

from specformer.specs.base import Spec


class BareNorm(Spec):
    type: Literal["bare"] = "bare"


class MyAdamW(Spec):
    type: Literal["adamw"] = "adamw"
    lr: float = 1e-3


def bare(registry):
    registry.register("norm", BareNorm, "x:y")


def adamw(registry):
    registry.register("optimizer", MyAdamW, "x:y")
'''


@pytest.mark.parametrize("hook, cause", [
    ("bare", "TypeError: BareNorm lacks the fields placement, final that every norm spec has"),
    # the built-in types are registered before any plugin loads: refused as the plugin registers it
    ("adamw", "ValueError: optimizer type 'adamw' is built in: a spec class of your own under its name"),
    ("missing", "AttributeError"),
])
def test_a_broken_plugin_is_named_by_every_command_without_a_traceback(tmp_path, hook, cause):
    (tmp_path / "broken_plugin.py").write_text(BROKEN)
    dist = tmp_path / "broken_plugin-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(f"[specformer.plugins]\nmine = broken_plugin:{hook}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "400"}
    env.pop("SPECFORMER_DEBUG", None)
    result = subprocess.run([sys.executable, "-m", "specformer", "validate", "gpt-nano"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: the specformer plugin 'mine' (broken_plugin:{hook}, from broken-plugin "
                                    f"0.3) failed to register: {cause}")
    assert "Fix that package or uninstall it" in result.stderr and "Traceback" not in result.stderr


def test_a_target_that_cannot_be_imported_is_named_by_the_commands_that_build(plugin_path, tmp_path):
    # a typo in the "module:attribute" string: found only when a model is built
    init = plugin_path / "demo_plugin" / "__init__.py"
    init.write_text(init.read_text().replace("torch_part:SquaredReLU", "torch_part:SquaredRelu"))
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  ffn: {type: relu2, d_ff: 32}\n")
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "400"}
    env.pop("SPECFORMER_DEBUG", None)
    for args in (["show", str(spec), "--tree"], ["show", str(spec)], ["diff", "gpt-nano", str(spec)]):
        result = subprocess.run([sys.executable, "-m", "specformer", *args], capture_output=True, text=True, env=env)
        assert result.returncode == 1, args
        assert ("ffn type 'relu2' (registered by demo-plugin): its build target 'demo_plugin.torch_part:SquaredRelu' "
                "cannot be imported: AttributeError: module 'demo_plugin.torch_part' has no attribute "
                "'SquaredRelu'") in result.stderr, args
        assert "Traceback" not in result.stderr, args


def test_show_tree_of_a_module_that_fails_in_its_constructor_says_which_error(plugin_path, tmp_path):
    part = plugin_path / "demo_plugin" / "torch_part.py"
    part.write_text(part.read_text().replace("super().__init__()", "super().__init__()\n        {}['experts']"))
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  ffn: {type: relu2, d_ff: 32}\n")
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "400"}
    env.pop("SPECFORMER_DEBUG", None)
    result = subprocess.run([sys.executable, "-m", "specformer", "show", str(spec), "--tree"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("error: p: the model cannot be built: KeyError: 'experts'")
    assert "SPECFORMER_DEBUG=1" in result.stderr and "Traceback" not in result.stderr
    # show's tables count a plugin's parameters from the same build
    result = subprocess.run([sys.executable, "-m", "specformer", "show", str(spec)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("error: p: the model cannot be built on the meta device to count the "
                                    "parameters of decoder.ffn (ffn type 'relu2'): KeyError: 'experts'")
    assert "SPECFORMER_DEBUG=1" in result.stderr and "Traceback" not in result.stderr
    # and so is diff's, its checkpoint check too: an error, never a traceback or half the tables
    for args in (["gpt-nano", str(spec)], ["gpt-nano", str(spec), "--meta", "--no-checkpoints"]):
        result = subprocess.run([sys.executable, "-m", "specformer", "diff", *args], capture_output=True, text=True,
                                env=env)
        assert result.returncode == 1 and result.stdout == "", args
        assert "the model cannot be built on the meta device" in result.stderr and "KeyError: 'experts'" in (
            result.stderr), args
        assert "Traceback" not in result.stderr, args
    # the checkpoint check alone, as diff_specs(reports=False) runs it
    code = ("from specformer.analysis import AnalysisError, diff_specs\n"
            f"try:\n    diff_specs('gpt-nano', {str(spec)!r}, reports=False)\n"
            "except AnalysisError as exc:\n    print(exc)\n")
    result = _run(plugin_path, code)
    assert result.stdout.startswith("p: the model cannot be built on the meta device to list its state dict "
                                    "for the checkpoint check: KeyError: 'experts'"), result.stderr


def test_a_type_registered_without_a_target_says_how_to_give_one():
    from specformer.registry import PluginError
    from specformer.specs.schema import MLPSpec

    registry = Registry()
    registry.register("ffn", MLPSpec)  # a spec class alone validates, but builds nothing
    with pytest.raises(PluginError, match=r"ffn type 'mlp' \(registered by specformer.specs.schema\) has nothing to "
                                          r"build: it was registered without a target; register\('ffn', MLPSpec, "
                                          r"'package.module:Class'\)"):
        registry.build("ffn", MLPSpec(), d_model=8)


def test_an_optimizer_spec_without_a_learning_rate_is_refused_at_registration():
    # the schedule multiplies training.optimizer.lr: without it training stopped before its first step
    from typing import Literal

    from specformer.specs.base import Spec

    class SignSGD(Spec):
        type: Literal["signsgd"] = "signsgd"

    registry = Registry()
    with pytest.raises(TypeError, match=r"SignSGD lacks the field lr that every optimizer spec has .*declare lr: float"):
        registry.register("optimizer", SignSGD, "x:y")


POSITIONAL_SCRIPT = '''
from typing import Literal

import torch
from torch import nn

from specformer.components.positional import Positional, apply_rotary  # the base class docs name
from specformer.registry import register
from specformer.specs.base import Spec


class LearnedSlopeSpec(Spec):
    type: Literal["learned_slope"] = "learned_slope"


class LearnedSlope(Positional):
    """ALiBi with one trained slope per head."""

    module_name = "slopes"

    def __init__(self, spec, *, d_model, max_seq_len, n_heads, head_dim, causal):
        super().__init__()
        self.slope = nn.Parameter(torch.zeros(n_heads))

    def reset_parameters(self):
        nn.init.zeros_(self.slope)

    def bias(self, q_index, k_index, *, dtype):
        distance = (q_index[:, None] - k_index[None, :]).abs().to(dtype)  # (T, Tk)
        return -(self.slope.to(dtype)[:, None, None] * distance)[None]  # (1, H, T, Tk)


register("positional", LearnedSlopeSpec, LearnedSlope)

from specformer import build_model

model = build_model({"extends": "gpt-nano", "positional": {"type": "learned_slope"}})
print(model(torch.randint(0, 512, (1, 8))).logits.shape, model.decoder.slopes.slope.shape)
'''


def test_a_script_subclasses_positional_before_it_registers(tmp_path):
    # importing the components (Positional, apply_rotary, KVCache) leaves the schema unbuilt,
    # so a script defines its module, then registers it
    script = tmp_path / "pos.py"
    script.write_text(POSITIONAL_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "torch.Size([1, 8, 512]) torch.Size([4])"


OPTIMIZER_SCRIPT = '''
from typing import Literal

from specformer.registry import register
from specformer.specs.base import Spec


class LionSpec(Spec):
    type: Literal["lion"] = "lion"
    lr: float = 1e-4


def lion(spec, *, model, precision):
    import torch

    return torch.optim.SGD(model.parameters(), lr=spec.lr)  # stands in for Lion's one moment


register("optimizer", LionSpec, lion)

from specformer.analysis import analyze

report = analyze({"extends": "gpt-nano", "training": {"optimizer": {"type": "lion"}}})
memory = report.memory
print(memory.optimizer, memory.not_counted, memory.weights == 4 * report.params.total, report.params.method)
print(repr(report).split(", training_memory_bytes=")[1])
table = report.to_markdown()
print([line for line in table.splitlines() if line.startswith("| lion states")][0])
print([line for line in table.splitlines() if line.startswith("| training total")][0])
'''


def test_a_plugin_optimizer_leaves_its_states_uncounted_and_says_so(tmp_path):
    script = tmp_path / "lion.py"
    script.write_text(OPTIMIZER_SCRIPT)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "0 {'training.optimizer': \"optimizer type 'lion'\"} True analytic"
    assert lines[1].endswith(", not counted: training.optimizer)")  # the one-line repr says so too
    assert lines[2] == "| lion states |  | not counted |"
    assert lines[3].startswith("| training total, without training.optimizer | ") and "| ≥ " in lines[3]


def test_a_plugin_that_imports_the_components_when_it_loads_registers(plugin_path, tmp_path):
    # an entry point whose module imports specformer.components at its top (for Positional, say):
    # loaded while the schema is being built, it must not need the schema itself
    init = plugin_path / "demo_plugin" / "__init__.py"
    init.write_text("from specformer.components.positional import Positional  # noqa: F401\n" + init.read_text())
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  ffn: {type: relu2, d_ff: 32}\n")
    env = {**os.environ, "PYTHONPATH": str(plugin_path)}
    result = subprocess.run([sys.executable, "-m", "specformer", "validate", str(spec), "-q"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_freeze_patterns_meet_a_plugin_modules_parameter_names(plugin_path):
    # the spec alone does not name a plugin's parameters: its patterns are checked against the
    # model built on the meta device, before a run prepares its data, and counted by memory
    import specformer

    root = os.path.dirname(os.path.dirname(os.path.abspath(specformer.__file__)))
    code = textwrap.dedent("""
        from specformer import load_spec
        from specformer.analysis import count_parameters, trainable_parameters
        from specformer.specs.errors import SpecError
        from specformer.training.run import _check_before_data

        ffn = 'decoder.ffn={type: relu2, d_ff: 32}'
        s = load_spec('gpt-nano', overrides=[ffn, 'training.optimizer.freeze=[decoder.layers.0.ffn.up.*]'])
        try:
            _check_before_data(s, hardware=False)
        except SpecError as exc:
            print(exc.problems[0].path, '|', exc.problems[0].hint.split(',')[0])
        s = load_spec('gpt-nano', overrides=[ffn, 'training.optimizer.freeze=[decoder.layers.*.ffn.*]'])
        _check_before_data(s, hardware=False)
        print(count_parameters(s).total - trainable_parameters(s))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), root])}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=plugin_path)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().splitlines()
    assert first.startswith("training.optimizer.freeze.0 | nearest names: decoder.layers.0.ffn.up_proj.")
    assert int(second) == 4 * (128 * 32 + 32 + 32 * 128 + 128)  # up_proj and down_proj of 4 layers


REPLACED_ADAMW = '''
import specformer.specs.training  # noqa: F401  (registers the built-in optimizers)
from specformer.registry import REGISTRY, register


def mine(spec, *, model, precision):
    import torch

    return torch.optim.SGD(model.parameters(), lr=spec.lr)  # keeps other states than AdamW's


register("optimizer", REGISTRY.get("optimizer", "adamw").spec, mine, replace=True)

from specformer.analysis import analyze

report = analyze("gpt-nano")
print(report.memory.optimizer, report.memory.not_counted)
print(report.to_markdown())
'''


def test_a_built_in_optimizer_name_a_script_builds_leaves_its_states_uncounted(tmp_path):
    import specformer

    script = tmp_path / "adamw.py"
    script.write_text(REPLACED_ADAMW)
    root = os.path.dirname(os.path.dirname(os.path.abspath(specformer.__file__)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": root})
    assert result.returncode == 0, result.stderr
    first, *table = result.stdout.splitlines()
    # named as a component a plugin builds under a built-in name is: with its target
    assert first == "0 {'training.optimizer': \"optimizer type 'adamw', built by __main__:mine\"}"
    # its step and states are the plugin's, not AdamW's
    assert "**memory: adamw training step, batch 1 × seq_len 256, bf16-mixed**" in table
    assert "| adamw states |  | not counted |" in table and "AdamW" not in "\n".join(table)


def _install(root, entry_points: str, **modules: str) -> dict:
    """Write ``modules`` and a distribution whose ``specformer.plugins`` entry points are
    ``entry_points`` (loaded in that order) under ``root``; the environment that finds them."""
    for name, text in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(text))
    dist = root / "plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[specformer.plugins]\n{entry_points}")
    return {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "300"}


LOOKS_UP_AT_IMPORT = """
from specformer.registry import REGISTRY

# specformer's own types of every family, looked up as the module is imported
BUILT_IN = {family: REGISTRY.get(family, name) for family, name in (
    ("objective", "causal_lm"), ("optimizer", "adamw"), ("schedule", "cosine"), ("data", "stdlib"),
    ("tokenizer", "bpe"), ("ffn", "mlp"), ("attention", "mha"))}


def register(registry):
    registry.register("objective", BUILT_IN["objective"].spec, "wrapped_clm:CLM", replace=True)


def CLM(spec, **kwargs):
    return BUILT_IN["objective"].resolve()(spec, **kwargs)
"""


def test_a_plugin_looks_up_built_in_training_types_at_import(tmp_path):
    """The registry's own advice, REGISTRY.get(family, name).spec with replace=True, works in a
    plugin's module body: every built-in type is registered before any plugin loads."""
    env = _install(tmp_path, "clm = wrapped_clm:register\n", wrapped_clm=LOOKS_UP_AT_IMPORT)
    result = subprocess.run([sys.executable, "-m", "specformer", "validate", "gpt-nano", "--set",
                             "training.objective.label_smoothing=0.1"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "    type: causal_lm\n    label_smoothing: 0.1\n" in result.stdout
    mine = _show_json(tmp_path, "gpt-nano")
    what = {"training.objective": "objective type 'causal_lm', built by wrapped_clm:CLM"}
    assert mine["flops_per_token"]["not_counted"] == what and mine["memory"]["not_counted"] == what
    assert mine["flops_per_token"]["forward"] == 1_967_104  # gpt-nano's, the plugin's objective aside


IMPORTS_THE_TRAINING_SPECS = """
import specformer.specs.training
from specformer.specs.training import SGDSpec


def register(registry):
    registry.register("optimizer", SGDSpec, "first:sgd", replace=True)
"""

ADDS_AN_OPTIMIZER = """
from typing import Literal

from specformer.specs.base import Spec


class LionSpec(Spec):
    type: Literal["lion"] = "lion"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)


def register(registry):
    registry.register("optimizer", LionSpec, "second:lion")
"""


def test_a_plugin_importing_the_training_specs_leaves_the_next_one_free_to_add_a_type(tmp_path):
    """The training families' unions are made once every plugin has loaded: the first plugin
    imports specformer.specs.training, the second adds an optimizer, and both count."""
    env = _install(tmp_path, "first = first:register\nsecond = second:register\n",
                   first=IMPORTS_THE_TRAINING_SPECS, second=ADDS_AN_OPTIMIZER)
    code = (
        "from specformer import load_spec\n"
        "from specformer.registry import REGISTRY\n"
        "spec = load_spec('gpt-nano', ['training.optimizer={type: lion, lr: 3e-4}'])\n"
        "print(spec.training.optimizer.type, spec.training.optimizer.lr, spec.training.optimizer.betas)\n"
        "print(REGISTRY.get('optimizer', 'sgd').target, REGISTRY.get('optimizer', 'lion').target)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["lion 0.0003 (0.9, 0.99)", "first:sgd second:lion"]
    result = subprocess.run([sys.executable, "-m", "specformer", "validate", "gpt-nano", "-q", "--set",
                             "training.optimizer={type: lion, lr: 3e-4}"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    result = subprocess.run([sys.executable, "-m", "specformer", "validate", "gpt-nano", "-q", "--set",
                             "training.optimizer={type: lino}"], capture_output=True, text=True, env=env)
    assert result.returncode == 1 and "did you mean 'lion'" in result.stdout + result.stderr


def test_a_script_adds_a_training_type_after_importing_the_training_specs(plugin_path):
    """Importing specformer.specs.training makes no union: the schema makes them all, once."""
    code = (
        "from typing import Literal\n"
        "from specformer.specs.training import AdamWSpec, TrainingSpec\n"
        "from specformer.registry import register\n"
        "from specformer.specs.base import Spec\n"
        "class LionSpec(Spec):\n"
        "    type: Literal['lion'] = 'lion'\n"
        "    lr: float = 1e-4\n"
        "register('optimizer', LionSpec, 'x:y')\n"
        # TrainingSpec used first builds the schema, with the plugins' types and the script's
        "print(TrainingSpec.model_validate({'optimizer': {'type': 'lion'}}).optimizer)\n"
        "from specformer import load_spec\n"
        "print(load_spec('gpt-nano', ['decoder.ffn={type: relu2}']).decoder.ffn.type)\n"
    )
    result = _run(plugin_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["type: lion", "lr: 0.0001", "relu2"]  # the part's YAML


@pytest.mark.parametrize("name", ["OptimizerSpec", "TrainingSpec"])
def test_a_plugin_using_what_holds_the_plugins_types_at_import_is_told_what_it_may_use(tmp_path, name):
    use = "TrainingSpec()" if name == "TrainingSpec" else "OptimizerSpec"
    module = f"from specformer.specs.training import {name}\n{use}\n\ndef register(registry):\n    pass\n"
    env = _install(tmp_path, "early = early:register\n", early=module)
    env.pop("SPECFORMER_DEBUG", None)
    result = subprocess.run([sys.executable, "-m", "specformer", "validate", "gpt-nano"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(
        f"error: the specformer plugin 'early' (early:register, from plugins 0.1) failed to register: ImportError: "
        f"{name} is built once every 'specformer.plugins' entry point has loaded")
    assert "REGISTRY.get('optimizer', 'adamw').spec" in result.stderr


def test_a_script_looking_up_a_built_in_before_the_schema_is_told_to_import_it(tmp_path) -> None:
    code = (
        "from specformer.registry import REGISTRY\n"
        "try:\n"
        "    REGISTRY.get('ffn', 'mlp')\n"
        "except LookupError as exc:\n"
        "    print(exc)\n"
        "import specformer.specs.schema\n"
        "print(REGISTRY.get('ffn', 'mlp').name)\n"
        "try:\n"
        "    REGISTRY.get('ffn', 'moe')\n"
        "except LookupError as exc:\n"
        "    print(exc)\n"
    )
    result = _run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    before, found, unknown = result.stdout.splitlines()
    assert before.startswith("unknown ffn type 'mlp'; registered: (none); specformer's own ffn types are registered "
                             "when the spec schema is first imported: `import specformer.specs.schema`")
    assert found == "mlp"
    assert unknown.startswith("unknown ffn type 'moe'; registered: mlp, glu") and "schema" not in unknown


def test_a_script_loading_the_plugins_first_gets_the_built_ins_registered_before_them(tmp_path) -> None:
    pkg = tmp_path / "looks_up"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        from typing import Literal


        def register(registry):
            mlp = registry.get("ffn", "mlp").spec  # a built-in, looked up while registering

            class WideMLPSpec(mlp):
                type: Literal["wide-mlp"] = "wide-mlp"

            registry.register("ffn", WideMLPSpec, registry.get("ffn", "mlp").target, source="looks-up")
    '''))
    dist = tmp_path / "looks_up-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: looks-up\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[specformer.plugins]\nlooks = looks_up:register\n")
    code = (
        "import sys\n"
        "from specformer.registry import REGISTRY, load_plugins\n"
        "print(load_plugins(), 'specformer.specs.schema' in sys.modules)\n"
        "print(load_plugins())\n"  # once only
        "from specformer import load_spec\n"
        "s = load_spec('gpt-nano', overrides=['decoder.ffn={type: wide-mlp, d_ff: 48}'])\n"
        "print(type(s.decoder.ffn).__name__, s.decoder.ffn.d_ff, REGISTRY.get('ffn', 'wide-mlp').source)\n"
    )
    result = _run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['looks'] True", "[]", "WideMLPSpec 48 looks-up"]
