"""``specformer import-hf`` and ``export-hf``: Hugging Face configs and weights in and out.

Config conversion needs no ``transformers``; neither do the weight files, which are
plain safetensors (``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from specformer.cli.app import (
    app,
    check_output_file,
    console,
    err_console,
    loading,
    print_error,
    stops_cleanly,
)

__all__ = ["import_hf_cmd", "export_hf_cmd", "compact_spec_yaml"]


def _say(text: str) -> None:
    """One line of the report on stdout, never broken at the terminal's width: the paths
    in it are what one copies next."""
    console.print(text, highlight=False, soft_wrap=True)


def _say_on_stderr(text: str) -> None:
    """:func:`_say`'s line on stderr, where the standard output carries the result (``-o -``)."""
    err_console.print(text, highlight=False, soft_wrap=True)


def _fail(message: str, hint: str = "") -> typer.Exit:
    print_error(message, hint)
    return typer.Exit(1)


def _hub_id_hint(source: Path) -> str:
    """For a missing SOURCE written as a Hub model id (``gpt2``, ``org/name``): how to get
    the folder that import-hf reads, since it never downloads."""
    import re

    text = str(source)
    files = (".json", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".yaml", ".yml", ".gguf", ".txt")
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", text) or text.lower().endswith(files) or text.startswith("."):
        return ""
    return (f"import-hf reads a model folder on disk, not a Hub model id; download it first: "
            f"hf download {text} --local-dir {text.rsplit('/', 1)[-1]}  (or save_pretrained a loaded model) "
            "and give that folder")


def compact_spec_yaml(spec: Any, header: str = "") -> str:
    """YAML of ``spec`` with default values left out (``type`` kept, so every choice is
    visible); falls back to the full spec if the short form would not load back equal."""
    from specformer.specs.loader import dump_yaml, load_spec

    full = spec.to_dict()
    short = spec.model_dump(mode="json", exclude_defaults=True)

    def keep_types(small: Any, big: Any) -> Any:
        if not isinstance(big, dict):
            return small
        small = dict(small) if isinstance(small, dict) else {}
        out: dict[str, Any] = {}
        for key, value in big.items():
            if key == "type" or key in small:
                out[key] = keep_types(small.get(key, value), value)
        return out

    data = keep_types(short, full)
    data["name"] = spec.name
    data = {"name": data.pop("name"), **data}
    text = dump_yaml(data)
    try:
        if load_spec(data) != spec:
            text = dump_yaml(full)
    except Exception:  # the short form is a convenience; the full one always loads
        text = dump_yaml(full)
    return header + text


def _folder(source: Path) -> Path:
    return source if source.is_dir() else source.parent


@app.command("import-hf")
def import_hf_cmd(
    source: Annotated[
        Path, typer.Argument(metavar="SOURCE", help="A Hugging Face model folder (config.json + weights) or a config.json.")
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the spec YAML (missing folders on its path are made); - prints it, and the report goes to standard error.")],
    weights: Annotated[
        Path | None,
        typer.Option("--weights", "-w", help="Also convert the weights and write them here (.safetensors)."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="The spec's name (default: the config's _name_or_path, else the folder's name).")] = None,
) -> None:
    """Write the specformer spec of a Hugging Face model, and optionally its weights.

    Supported (model_type): decoders GPT-2 (gpt2), GPT-BigCode (gpt_bigcode), OPT (opt),
    BLOOM (bloom), Llama (llama), Mistral (mistral), Qwen2 (qwen2), Qwen3 (qwen3), Phi-3
    (phi3), Gemma (gemma, gemma2, gemma3_text, gemma3), OLMo (olmo), OLMo 2 (olmo2), GPT-NeoX (gpt_neox),
    Phi-1/1.5/2 (phi), GPT-J (gptj), Falcon (falcon), StarCoder2 (starcoder2); encoders BERT
    (bert), RoBERTa (roberta), XLM-RoBERTa (xlm-roberta), DistilBERT (distilbert);
    encoder-decoders T5 v1.0 and v1.1 (t5), mT5 (mt5), BART (bart), Marian (marian).
    Anything the spec language cannot express is refused by name; the
    result is the same model, never a look-alike. `build_model(spec)` plus the
    converted weights reproduces the original's outputs.

    Examples:

    ```
    specformer import-hf path/to/model_dir -o my.yaml
    specformer import-hf path/to/model_dir -o my.yaml --weights my.safetensors
    specformer train my.yaml --init-from my.safetensors \\
        --set 'training.data={type: files, paths: [my_texts/]}'
    ```

    The spec trains with the model's own tokenizer.json (its training.tokenizer names
    the file), which the weights' token ids belong to. An encoder-decoder's also names
    the token its decoder starts from (`training.objective.decoder_start`: T5's `<pad>`,
    BART's `</s>`), so it fine-tunes on your pairs as transformers does:

    ```
    specformer train my.yaml --init-from my.safetensors \\
        --set 'training.data={type: pairs, paths: [pairs.jsonl]}'
    ```

    Tokens the model's generation_config.json forces (BART's forced_bos_token_id and
    forced_eos_token_id) become `training.objective.forced_start` / `forced_end`, which
    generate honours; its other settings (num_beams, no_repeat_ngram_size, ...) are listed,
    with the generate option that gives each.
    """
    with loading():  # torch loads (seconds): Ctrl-C or SIGTERM there is said, not silent
        from specformer.analysis import count_parameters
        from specformer.interop.hf import (
            EXPORTED_AS,
            MULTIMODAL,
            HFConversionError,
            chat_template_source,
            import_hf,
            misspelt_config_keys,
            model_tokenizer,
            read_generation_config,
            read_hf_config,
            save_safetensors,
            unread_generation_settings,
        )

    if not source.exists():
        raise _fail(f"{source}: no such file or folder", _hub_id_hint(source))
    if name is not None and not name.strip():
        raise _fail("--name is empty; give a name, or leave --name out for the model's own")
    if weights is not None and weights.suffix != ".safetensors":
        raise _fail(f"--weights {weights}: the converted weights are written as safetensors; use a .safetensors name")
    to_stdout = str(output) == "-"  # -o -: the YAML on standard output (| less, > FILE), the report on stderr
    say = _say_on_stderr if to_stdout else _say
    if not to_stdout:
        check_output_file(output, "--output")
    if weights is not None:
        check_output_file(weights, "--weights")
        if not to_stdout and weights.resolve() == output.resolve():
            raise _fail(f"--output and --weights are the same file ({output})")
    with stops_cleanly("while importing; nothing was written"):
        misspelt: list[str] = []
        try:
            config = read_hf_config(source)
            misspelt = misspelt_config_keys(config)
            spec, state, report = import_hf(source, weights=weights is not None, name=name)
        except HFConversionError as exc:
            # a key one slip from the one whose default was taken is the likelier cause
            raise _fail(str(exc), "\n".join(misspelt)) from None
        header = (
            f"# Imported by `specformer import-hf` from the Hugging Face {config.get('model_type')} model at\n"
            f"# {source.resolve()}\n"
        )
        text = compact_spec_yaml(spec, header)
        writers: dict[Path, Callable[[Path], None]] = {}
        if not to_stdout:
            writers[output] = lambda path: path.write_text(text, encoding="utf-8")
        if weights is not None:
            assert state is not None
            # the tokenizer the weights' ids belong to: `train --init-from` warns when the spec trains another
            # and its model_type: an mt5 or xlm-roberta (T5's and RoBERTa's model, which the spec
            # is) exports back under that name
            origin = {"specformer.imported_from": str(source.resolve()),
                      "specformer.imported_model_type": str(config.get("model_type"))}
            if (found := model_tokenizer(source)) is not None:
                origin["specformer.tokenizer"] = str(found)
            writers[weights] = lambda path: save_safetensors(state, path, metadata=origin)
        if writers:
            _write_or_fail(writers)
    if to_stdout:  # after the weights: a failed write of them printed no spec that names them
        sys.stdout.write(text)
        sys.stdout.flush()
    for line in misspelt:
        print_error(escape(line), label="[yellow]warning:[/]")
    total = count_parameters(spec).total
    said = "the spec" if to_stdout else f"wrote [bold]{escape(str(output))}[/]"
    say(f"{said}: {spec.kind} {escape(repr(spec.name))}, {total:,} parameters")
    if (model_type := config.get("model_type")) in EXPORTED_AS:
        family = EXPORTED_AS[model_type]
        back = (f"the weights record it, and export-hf writes them (and a run started from them) back as Hugging "
                f"Face {model_type}" if weights is not None else
                f"export-hf writes weights of this spec as Hugging Face {family}, or as {model_type} when they "
                "come from import-hf --weights")
        say(f"  {escape(model_type)} is {family}'s model under another name (the spec is {family}'s): {back}")
    tokenizer = spec.training.tokenizer
    if tokenizer is not None and tokenizer.type == "file":
        say(f"  training.tokenizer: the model's own, {escape(tokenizer.path)}")
        start = getattr(spec.training.objective, "decoder_start", None)
        if start is not None:
            say(f"  training.objective.decoder_start: {escape(start)} (the decoder's first token, as "
                f"decoder_start_token_id {config.get('decoder_start_token_id')} in config.json)")
        generation = read_generation_config(source)
        where = "generation_config.json" if (_folder(source) / "generation_config.json").is_file() else "config.json"
        for field, key, what in (("forced_start", "forced_bos_token_id", "the first token generate gives"),
                                 ("forced_end", "forced_eos_token_id", "the last at its length limit")):
            token = getattr(spec.training.objective, field, None)
            if token is not None:
                say(f"  training.objective.{field}: {escape(token)} ({what}, as {key} {generation.get(key)} in {where})")
    else:
        print_error(
            f"{source} has no tokenizer.json, so the spec's training.tokenizer is a {tokenizer.type if tokenizer else 'new'} "
            "tokenizer whose token ids are not the ones these weights were trained on; to fine-tune, save the "
            "model's tokenizer as tokenizer.json (transformers: AutoTokenizer.from_pretrained(folder)"
            ".save_pretrained(folder)) and set training.tokenizer: {type: file, path: folder/tokenizer.json}",
            label="[yellow]warning:[/]",
        )
    if tokenizer is not None and tokenizer.type == "file" and (chat := chat_template_source(source)) is not None:
        say(f"  the tokenizer has a chat template ({escape(chat)}): generate --chat frames a prompt as a user turn, "
            "training.objective: {type: sft, chat_template: true} fine-tunes on pairs rendered as conversations, "
            "and export-hf writes it back as chat_template.jinja")
    unread = unread_generation_settings(source, spec)
    if unread:
        say(f"  generation settings specformer generate does not read: {escape('; '.join(unread))}")
    if weights is not None:
        assert state is not None and report is not None
        tower = config.get("model_type") in MULTIMODAL
        say(f"wrote [bold]{escape(str(weights))}[/]: {len(state)} tensors")
        if report.tied:
            say(f"  tied copies checked and dropped: {', '.join(report.tied)}")
        if report.ignored:
            say(f"  left out (buffers, unused heads{', the vision tower' if tower else ''}): "
                f"{escape(_grouped(report.ignored))}")
        if not spec.embedding.tie_output and config.get("tie_word_embeddings", True) is not False:
            say("  the checkpoint's output layer is not tied to its embeddings: tie_output: false")


def _grouped(names: list[str], shown: int = 8) -> str:
    """``names``, those under one of a multimodal model's towers as one ``tower.*`` entry each,
    at most ``shown`` listed and the rest counted."""
    import re

    from specformer.interop.hf_weights import TOWERS

    tower = re.compile(TOWERS)
    towers = sorted({m.group(0) for n in names if (m := tower.match(n))})
    rest = [n for n in names if not any(n.startswith(t) for t in towers)]
    parts = [f"{t}* ({sum(n.startswith(t) for n in names)} tensors)" for t in towers] + rest
    more = f" (and {len(parts) - shown} more)" if len(parts) > shown else ""
    return ", ".join(parts[:shown]) + more


@app.command("export-hf")
def export_hf_cmd(
    source: Annotated[
        Path,
        typer.Argument(metavar="SOURCE",
            help="A specformer checkpoint (.ckpt or a run folder), or a .safetensors file of weights with --spec."
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for config.json + model.safetensors (made, with any missing parents).")],
    spec_source: Annotated[
        str | None,
        typer.Option("--spec", help="The spec of a .safetensors SOURCE (a preset name or YAML path)."),
    ] = None,
) -> None:
    """Write a Hugging Face model folder that `transformers` loads with
    `AutoModel*.from_pretrained(OUTPUT)`.

    The spec must map onto GPT-2, GPT-BigCode, OPT, BLOOM, BERT, RoBERTa, DistilBERT, T5, BART, Marian, Llama,
    Mistral, Qwen2, Qwen3, Phi-3, Gemma (1, 2, 3), OLMo, OLMo 2, GPT-NeoX, Phi, GPT-J, Falcon or StarCoder2;
    weights imported from XLM-RoBERTa, mT5 or Phi-3 (and runs started from them) are written under
    that name again, which their file records. A field with no equivalent there is named in the error. Dropout and init settings
    that the family cannot express are reported and left out (they do not change a
    trained model's outputs). A checkpoint's tokenizer is written too (tokenizer.json,
    for `AutoTokenizer.from_pretrained(OUTPUT)`, and an instruct model's chat template,
    kept beside the spec's tokenizer.json, as chat_template.jinja) and gives config.json its bos/eos/pad
    token ids, as is the tokenizer.json that the --spec of weights names (import-hf's
    spec names the model's own); without one they are null.

    Examples:

    ```
    specformer export-hf runs/gpt-nano/<timestamp> -o hf_out
    specformer export-hf my.safetensors --spec my.yaml -o hf_out
    ```
    """
    with loading():  # torch loads (seconds): Ctrl-C or SIGTERM there is said, not silent
        from specformer.interop.hf import EXPORTED_AS, HFConversionError, save_hf

    if not source.exists():
        raise _fail(f"{source}: no such file or folder")
    if str(output) == "-":  # made a folder named -
        raise _fail("--output -: export-hf writes a folder (config.json + model.safetensors), which standard "
                    "output cannot hold; give the folder's name")
    if output.exists() and not output.is_dir():
        raise _fail(f"--output {output}: is a file; export-hf writes a folder (config.json + model.safetensors)")
    check_output_file(output / "config.json", "--output")
    before = _loadable_files(output)
    with stops_cleanly("while exporting; nothing was written"):
        spec, state, tokenizer, imported_as = _read_source(source, spec_source)
        warnings: list[str] = []
        try:
            save_hf(state, spec, output, warnings=warnings, tokenizer=tokenizer, imported_as=imported_as)
        except HFConversionError as exc:
            raise _fail(str(exc)) from None
        except OSError as exc:
            raise _fail(_write_error(exc)) from None
    for warning in warnings:
        print_error(warning, label="[yellow]warning:[/]")
    import json

    model_type = json.loads((output / "config.json").read_text())["model_type"]
    files = "config.json + model.safetensors" + (" + tokenizer.json" if tokenizer is not None else "")
    _say(
        f"wrote [bold]{escape(str(output))}[/]: Hugging Face {model_type} {files} "
        f"({escape(repr(spec.name))}); load it with transformers.{_auto_name(spec)}"
        f".from_pretrained({escape(repr(str(output)))})"
    )
    if model_type in EXPORTED_AS:
        _say(f"  {model_type}, the name the weights were imported under ({EXPORTED_AS[model_type]}'s model, "
             "which the spec is)")
    if tokenizer is None:
        why = ("the spec's training.tokenizer is not a tokenizer.json" if source.suffix == ".safetensors"
               else "the source carries none")
        _say(f"  no tokenizer ({why}): bos/eos/pad token ids are null in config.json")
    # an earlier export's files that this one did not write (a chat template, a tokenizer, a
    # generation config), which from_pretrained would still load beside these weights
    stale = [name for name, seen in before.items() if _loadable_files(output).get(name) == seen]
    if stale:
        listed = ", ".join(stale[:-1]) + (" and " if len(stale) > 1 else "") + stale[-1]
        print_error(
            f"{output} still holds {listed} from before, which this export did not write: "
            "from_pretrained (AutoTokenizer, GenerationConfig) would load "
            f"{'them' if len(stale) > 1 else 'it'} with these weights; remove "
            f"{'them' if len(stale) > 1 else 'it'} unless {'they are' if len(stale) > 1 else 'it is'} "
            "these weights' own",
            label="[yellow]warning:[/]",
        )


# the files of a model folder that transformers' from_pretrained reads beside config.json and
# the weights: an earlier export's that a new one does not write would be loaded with it
_LOADED_BESIDE = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "chat_template.jinja", "chat_template.json", "generation_config.json", "vocab.json",
                  "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                  "model.safetensors.index.json")


def _loadable_files(folder: Path) -> dict[str, tuple[int, int]]:
    """Each of :data:`_LOADED_BESIDE` in ``folder`` by (inode, mtime): a file an export writes
    is a new one renamed into place."""
    found = {}
    for name in _LOADED_BESIDE:
        try:
            stat = (folder / name).stat()
        except OSError:
            continue
        found[name] = (stat.st_ino, stat.st_mtime_ns)
    return found


def _write_error(exc: OSError) -> str:
    return f"{exc.filename or 'output'}: cannot write ({exc.strerror or exc}); nothing was written"


def _write_or_fail(writers: dict[Path, Callable[[Path], None]]) -> None:
    """Write all the files or none (:func:`~specformer.interop.hf.write_files`); an I/O
    error is a one-line error, not a traceback."""
    from specformer.interop.hf import write_files

    try:
        write_files(writers)
    except OSError as exc:
        raise _fail(_write_error(exc)) from None


def _auto_name(spec: Any) -> str:
    from specformer.interop.hf import hf_auto_name

    return hf_auto_name(spec)


def _read_source(source: Path, spec_source: str | None) -> tuple[Any, dict[str, Any], Any, str | None]:
    """(spec, specformer state dict, tokenizer or None, the model_type the weights were
    imported under or None) of a checkpoint, or of weights + --spec."""
    from specformer.cli.spec_cmds import load_or_exit

    if source.suffix == ".safetensors":
        if spec_source is None:
            raise _fail(f"{source} holds weights only; give their spec with --spec SPEC")
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from specformer.data.corpus import DataError, lfs_pointer
        from specformer.training.checkpoint import weights_origin, weights_tokenizer

        spec = load_or_exit(spec_source)
        if pointer := lfs_pointer(source):
            raise _fail(pointer)
        try:
            state = load_file(str(source))
        except (SafetensorError, OSError) as exc:
            raise _fail(f"{source}: not a readable safetensors file ({exc})") from None
        try:  # the spec's tokenizer.json (import-hf writes it so): the one the weights' ids belong to
            imported_as = weights_origin(source).get("specformer.imported_model_type")
            return spec, state, weights_tokenizer(source, spec), imported_as
        except DataError as exc:
            raise _fail(f"--spec {spec_source}: {exc}") from None
    from specformer.specs.errors import SpecError
    from specformer.specs.loader import load_spec
    from specformer.training.checkpoint import CheckpointError, check_own_modules, read_checkpoint

    try:
        raw = read_checkpoint(source)
    except CheckpointError as exc:
        raise _fail(str(exc)) from None
    meta = raw.get("specformer")
    if not isinstance(meta, dict) or "spec" not in meta:
        raise _fail(f"{source}: not a specformer checkpoint (no 'specformer' entry with the spec)")
    if spec_source is not None:
        raise _fail(f"{source} carries its own spec; --spec is only for a .safetensors SOURCE")
    try:
        spec = load_spec(meta["spec"])
        check_own_modules(meta, spec, source=str(source))
    except SpecError as exc:
        raise _fail(f"{source}: the spec stored in the checkpoint is not valid here:\n{exc}") from None
    except CheckpointError as exc:
        raise _fail(str(exc)) from None
    state = raw.get("state_dict")
    if not isinstance(state, dict):
        raise _fail(f"{source}: the checkpoint has no weights (no state_dict)")
    tokenizer = None
    if meta.get("tokenizer"):
        from specformer.data.tokenizers import tokenizer_from_state

        try:
            tokenizer = tokenizer_from_state(meta["tokenizer"])
        except Exception as exc:  # DataError, or `tokenizers`' bare Exception on a bad tokenizer.json
            raise _fail(f"{source}: the checkpoint's tokenizer cannot be rebuilt ({exc})") from None
    imported_as = meta.get("imported_model_type")
    return (spec, {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}, tokenizer,
            imported_as if isinstance(imported_as, str) else None)
