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


@pytest.fixture
def plugin_path(tmp_path):
    pkg = tmp_path / "demo_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(PLUGIN))
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


def test_show_of_a_plugin_type_says_what_works_instead(plugin_path, tmp_path):
    # no analytic count for a plugin type: a clear error naming it, and the way to count it
    spec = tmp_path / "p.yaml"
    spec.write_text("extends: gpt-nano\ndecoder:\n  ffn: {type: relu2, d_ff: 32}\n")
    env = {**os.environ, "PYTHONPATH": str(plugin_path), "COLUMNS": "300"}
    result = subprocess.run([sys.executable, "-m", "specformer", "show", str(spec)],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert "no analytic parameter count for ffn type 'relu2'" in result.stderr
    assert "build_model(spec, device='meta')" in result.stderr and "Traceback" not in result.stderr


def test_registering_after_the_schema_is_built_is_refused(monkeypatch):
    # a type registered once the unions exist would be "unknown type" in every spec
    from typing import Literal

    from specformer import load_spec
    from specformer.registry import REGISTRY
    from specformer.specs.base import Spec
    from specformer.specs.schema import MLPSpec

    load_spec("gpt-nano")

    class LateSpec(Spec):
        type: Literal["late"] = "late"

    with pytest.raises(ValueError, match=r"ffn type 'late' is registered after the spec schema was built.*"
                                         r"register it before that.*specformer\.plugins"):
        REGISTRY.register("ffn", LateSpec, "x:y")
    assert "late" not in REGISTRY.names("ffn")
    with pytest.raises(ValueError, match="after the spec schema was built"):
        REGISTRY.register("ffn", LateSpec, "x:y", name="mlp", replace=True)
    # a registered spec class may still get another target
    monkeypatch.setitem(REGISTRY._families["ffn"], "mlp", REGISTRY.get("ffn", "mlp"))
    REGISTRY.register("ffn", MLPSpec, "x:z", replace=True)
    assert REGISTRY.get("ffn", "mlp").target == "x:z"

    fresh = Registry()
    fresh.register("ffn", MLPSpec, "x:y")
    fresh.register("ffn", LateSpec, "x:y")  # nothing built from this registry yet
    assert fresh.names("ffn") == ["mlp", "late"]


def test_a_type_registered_before_the_schema_does_not_become_the_default(tmp_path):
    # a script registers before its first load_spec; a mapping without `type:` stays the built-in
    code = textwrap.dedent('''
        from typing import Literal
        from specformer.registry import register
        from specformer.specs.base import Spec

        class MyAttention(Spec):
            type: Literal["myattn"] = "myattn"

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
