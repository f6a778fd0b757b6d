"""``specformer show`` and ``specformer diff``: parameters, FLOPs, memory and spec differences.

Both work from the spec alone (no torch import, no weights) except ``show --tree``
and the checkpoint-compatibility check of ``diff``, which build on the meta device.
Every output exists as ``--format rich`` (tables), ``markdown`` and ``json``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from specformer.cli.app import app, console, natural_width, print_error
from specformer.cli.spec_cmds import SetOption, load_all_or_exit, load_or_exit

__all__ = [
    "show", "diff", "Section", "render_markdown", "report_markdown", "diff_markdown",
    "human_count", "human_bytes", "human_flops",
]

FORMATS = ("rich", "markdown", "json")

FormatOption = Annotated[
    str, typer.Option("--format", "-f", metavar="[rich|markdown|json]",
                      help="rich (tables), markdown (for a paper or a PR) or json (stable keys).")
]
BatchOption = Annotated[int, typer.Option("--batch", "-b", min=1, help="Sequences per training step (memory).")]
SeqLenOption = Annotated[
    int | None,
    typer.Option("--seq-len", "-t", min=1, help="Tokens per sequence for FLOPs and memory; default: the spec's max_seq_len.",
                 show_default=False),
]
DiffSeqLenOption = Annotated[
    int | None,
    typer.Option("--seq-len", "-t", min=1, help="Tokens per sequence for FLOPs and memory; default: the first spec's "
                 "max_seq_len.", show_default=False),
]
DtypeOption = Annotated[
    str,
    typer.Option("--dtype", "-d", help="Precision of the training step: fp32 (or 32), bf16-mixed (or bf16), "
                 "16-mixed (or 16), fp64 (or 64), as training.precision names them, or pure low precision, weights "
                 "and all in it: bf16-true (or bfloat16, as torch names the dtype), 16-true (or fp16, float16, half; "
                 "Hugging Face's fp16=True is 16-mixed). The KV cache uses the compute dtype."),
]

FlopsCountOption = Annotated[
    str,
    typer.Option("--flops-count", metavar="[needed|executed]", help="How attention scores are counted: needed (the keys each query's mask "
                 "allows; causal: (T+1)/2 on average, sliding windows capped) or executed (every query against "
                 "all T keys, as a dense kernel computes them and as 6N + 12·L·T·d counts a training token)."),
]
FLOPS_COUNTS = ("needed", "executed")


# --------------------------------------------------------------------------- number formatting


def _scaled(n: float, units: tuple[tuple[str, float], ...], digits: int = 3) -> str:
    for unit, size in units:
        if abs(n) >= size:
            return f"{n / size:.{digits}g}{unit}"
    return f"{n:.{digits}g}" if isinstance(n, float) and not float(n).is_integer() else str(int(n))


def human_count(n: float) -> str:
    """124439808 -> '124M'."""
    return _scaled(n, (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)), 4)


def human_flops(n: float) -> str:
    """FLOPs with an SI prefix: 2.66e8 -> '266 MFLOP'."""
    return _scaled(n, ((" PFLOP", 1e15), (" TFLOP", 1e12), (" GFLOP", 1e9), (" MFLOP", 1e6), (" kFLOP", 1e3)), 4) + (
        "" if abs(n) >= 1e3 else " FLOP"
    )


def human_bytes(n: float) -> str:
    """Bytes with a binary prefix: 36864 -> '36 KiB'."""
    return _scaled(n, ((" TiB", 2**40), (" GiB", 2**30), (" MiB", 2**20), (" KiB", 2**10)), 4) + (
        "" if abs(n) >= 1024 else " B"
    )


def _signed_pct(new: float, old: float) -> str:
    if old == new:
        return "0%"
    if old == 0:
        return "new"
    return f"{(new - old) / old * 100:+.1f}%"


def _signed(n: float, fmt: Any) -> str:
    if n == 0:
        return "0"
    return ("+" if n > 0 else "-") + fmt(abs(n))


# --------------------------------------------------------------------------- table model


@dataclass
class Section:
    """A titled table that renders to rich or markdown."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    right: set[int] = field(default_factory=set)  # right-aligned column indices
    bold_rows: set[int] = field(default_factory=set)
    # in a terminal too narrow for the table, print it turned (one row per column)
    turn_when_narrow: bool = False

    def turned(self) -> Section:
        """The table with rows and columns swapped: the first column's cells head the
        columns; a column that is empty in every row is left out."""
        rows = [[c, *(row[i] for row in self.rows)] for i, c in enumerate(self.columns) if i > 0]
        return Section(self.title, [self.columns[0], *(row[0] for row in self.rows)],
                       [r for r in rows if any(r[1:])], list(self.notes))

    def to_rich(self) -> Table:
        # Text, not markup: a spec's name or value such as "gpt[/]" is shown as written
        # at least as wide as its title, which would otherwise wrap onto a second line
        table = Table(title=Text(self.title), title_justify="left", header_style="bold", title_style="bold",
                      min_width=cell_len(self.title))
        for i, c in enumerate(self.columns):
            # a number is never folded onto two lines ("124,439,8" over "08" reads as another
            # number): the text columns give up their width first
            table.add_column(Text(c), justify="right" if i in self.right else "left", overflow="fold",
                             no_wrap=i in self.right)
        for i, row in enumerate(self.rows):
            table.add_row(*map(Text, row), style="bold" if i in self.bold_rows else None)
        return table


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(sections: list[Section], heading: str = "") -> str:
    """GitHub-flavoured markdown of ``sections``."""
    out: list[str] = []
    if heading:
        out += [heading, ""]
    for s in sections:
        out.append(f"**{s.title}**")
        out.append("")
        if s.columns:
            out.append("| " + " | ".join(_md_cell(c) for c in s.columns) + " |")
            out.append("|" + "|".join("---:" if i in s.right else "---" for i in range(len(s.columns))) + "|")
            for row in s.rows:
                out.append("| " + " | ".join(_md_cell(c) for c in row) + " |")
            out.append("")
        for note in s.notes:
            out.append(f"{note}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _emit(sections: list[Section], heading: str, output_format: str) -> None:
    if output_format == "markdown":
        typer.echo(render_markdown(sections, f"### {heading}" if heading else ""), nl=False)
        return
    out = console if console.is_terminal else Console(width=160, soft_wrap=False)
    if heading:
        out.print(heading, style="bold", highlight=False, markup=False)
    for s in sections:
        if s.columns:
            table = s.to_rich()
            if natural_width(table, out) > out.width:
                # too wide for the terminal: rich would crop numbers ("131,072,0") and fold words
                # anywhere; turned (where asked), else with its text wrapped between words and its
                # numbers whole, else as lines of "column: value"
                turned = s.turned() if s.turn_when_narrow else None
                table = ((turned is not None and _fitted(turned, out.width)) or _fitted(s, out.width)
                         or _fitted(s, out.width, fold=True))
                if table is None:
                    _print_as_lines(out, s)
            if table is not None:
                out.print(table)
        for note in s.notes:
            out.print(note, highlight=False, markup=False)
        out.print()


_NUMBER_WORD = re.compile(r"[-+(\[]*\d[\d,.:/%×x+-]*[)\],;]*")


def _fitted(s: Section, width: int, *, fold: bool = False) -> Table | None:
    """``s`` as a table ``width`` columns wide with every number whole and every word of its
    text on one line (a text column gives up width down to its longest word, the widest
    first), or None where even that is too wide. ``fold``: a text column's words may be
    broken too, down to 8 columns, its numbers still whole."""
    cells = [[c, *(row[i] for row in s.rows)] for i, c in enumerate(s.columns)]
    natural = [max(cell_len(line) for cell in column for line in cell.splitlines() or [""]) for column in cells]

    def floor(i: int, column: list[str]) -> int:
        if i in s.right:
            return natural[i]
        words = [word for cell in column for word in cell.split()]
        if fold:
            numbers = [cell_len(word) for word in words if _NUMBER_WORD.fullmatch(word)]
            return min(natural[i], max([8, *numbers]))
        return max((cell_len(word) for word in words), default=0)

    least = [floor(i, column) for i, column in enumerate(cells)]
    room = width - 3 * len(cells) - 1  # a space each side of a cell, and the lines between and around them
    if sum(least) > room:
        return None
    widths = list(natural)
    for _ in range(sum(widths) - room):
        i = max((i for i in range(len(widths)) if widths[i] > least[i]), key=lambda i: widths[i])
        widths[i] -= 1
    table = s.to_rich()
    for column, w in zip(table.columns, widths, strict=True):
        column.width = w
    return table


def _print_as_lines(out: Console, s: Section) -> None:
    """A table too wide for the terminal even with its text wrapped: its title, then each row
    as its first cell and a line of "column: value" for each other cell that has one."""
    out.print(Text(s.title, style="bold"))
    for i, row in enumerate(s.rows):
        out.print(Text(row[0], style="bold" if i in s.bold_rows else ""))
        for column, value in zip(s.columns[1:], row[1:], strict=False):
            if value:
                out.print(Text(f"  {column}: {value}" if column else f"  {value}"))


def _check_options(output_format: str, dtype: str, flops_count: str = "needed") -> None:
    """A bad option value is a usage error, exit status 2, as click gives its own."""
    from specformer.analysis.memory import precision

    if output_format not in FORMATS:
        print_error(f"--format must be one of {', '.join(FORMATS)}, got {output_format!r}")
        raise typer.Exit(2)
    if flops_count not in FLOPS_COUNTS:
        print_error(f"--flops-count must be one of {', '.join(FLOPS_COUNTS)}, got {flops_count!r}")
        raise typer.Exit(2)
    try:
        precision(dtype)
    except ValueError as exc:
        print_error(f"--dtype: {exc}")
        raise typer.Exit(2) from None


def _analysis_errors(fn: Any) -> Any:
    """Run ``fn``; turn a ValueError (unknown dtype, a plugin's module that cannot be built to
    count it) into a message and exit status 1."""
    import warnings

    from specformer.analysis.params import AnalysisError
    from specformer.analysis.report import PositionTableWarning

    try:
        with warnings.catch_warnings():  # said before the tables, in the command's own words
            warnings.simplefilter("ignore", PositionTableWarning)
            return fn()
    except AnalysisError as exc:
        # a plugin's module that fails when built on the meta device to count it
        if exc.__cause__ is not None and os.environ.get("SPECFORMER_DEBUG"):
            raise
        print_error(str(exc), "set SPECFORMER_DEBUG=1 to see the full traceback" if exc.__cause__ else "")
        raise typer.Exit(1) from None
    except ValueError as exc:
        print_error(str(exc))
        raise typer.Exit(1) from None


# --------------------------------------------------------------------------- show


_COMPONENT_LABELS = {
    "embedding": "embeddings",
    "decoder_embedding": "decoder embeddings",
    "head": "output head",
}


def _component_label(key: str) -> str:
    if key in _COMPONENT_LABELS:
        return _COMPONENT_LABELS[key]
    return key.replace(".", " ").replace("_", "-") if key.count(".") == 1 else key


def _architecture_section(report: Any) -> Section:
    s = Section(
        "architecture",
        ["stack", "layers", "d_model", "heads / kv", "head_dim", "d_ff", "ffn", "norm", "positional", "notes"],
        right={1, 2, 3, 4, 5},
        turn_when_narrow=True,
    )
    for row in report.to_dict()["architecture"]:
        s.rows.append(
            [row["stack"], str(row["layers"]), str(row["d_model"]), row["heads_text"], str(row["head_dim"]),
             "—" if row["d_ff"] is None else str(row["d_ff"]), row["ffn"], row["norm"], row["positional"],
             row["extras"]]
        )
    spec = report.spec
    emb = spec.embedding
    bits = [f"vocab {spec.vocab_size:,}", f"max_seq_len {spec.max_seq_len:,}", f"head {spec.head.type}"]
    bits.append("output tied to embeddings" if emb.tie_output and spec.head.type in ("lm", "mlm") else "")
    if spec.kind == "encoder-decoder":
        bits.append("shared encoder/decoder embeddings" if emb.share_encoder_decoder else "separate decoder embeddings")
    if emb.segment_vocab_size:
        bits.append(f"{emb.segment_vocab_size} segment types")
    if emb.norm is not None:
        bits.append(f"embedding {emb.norm.type}")
    s.notes.append(", ".join(b for b in bits if b))
    return s


def _modules_of(shapes: dict[str, tuple[int, ...]], prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, shape in shapes.items():
        if name.startswith(prefix):
            module = name[len(prefix):].split(".")[0]
            n = 1
            for d in shape:
                n *= d
            out[module] = out.get(module, 0) + n
    return out


def _params_section(report: Any) -> Section:
    counts = report.params
    total = counts.total
    s = Section("parameters", ["component", "per layer", "layers", "total", "share"], right={1, 2, 3, 4})
    for key, n in counts.components.items():
        per_layer, layers = "", ""
        parts = key.split(".")
        if len(parts) == 2 and parts[0] in counts.per_layer and parts[1] in ("attention", "cross_attention", "ffn", "norms"):
            values = [layer[parts[1]] for layer in counts.per_layer[parts[0]]]
            layers = str(len(values))
            per_layer = f"{values[0]:,}" if len(set(values)) == 1 else f"{min(values):,}–{max(values):,}"
            if parts[1] == "norms" and getattr(report.spec, parts[0]).final_norm:
                layers += " + final"
        s.rows.append([_component_label(key), per_layer, layers, f"{n:,}", f"{n / total:.1%}"])
        if key in ("embedding", "decoder_embedding"):
            for module, m in _modules_of(counts.shapes, "embed." if key == "embedding" else "decoder_embed.").items():
                if m != n:
                    s.rows.append([f"  {module}", "", "", f"{m:,}", f"{m / total:.1%}"])
    s.rows.append(["total", "", "", f"{total:,}", human_count(total)])
    s.rows.append(["non-embedding", "", "", f"{counts.non_embedding:,}", human_count(counts.non_embedding)])
    s.bold_rows = {len(s.rows) - 2}
    spec = report.spec
    if spec.embedding.tie_output and spec.head.type in ("lm", "mlm"):
        s.notes.append("Tied weights are counted once: the output projection is embed.tokens.")
    if counts.method == "meta build":
        from specformer.analysis.params import plugin_components

        s.notes.append(f"Counted from the model built on the meta device (nothing allocated), for the plugin "
                       f"types: {_parts(plugin_components(spec))}.")
    return s


def _parts(not_counted: dict[str, str]) -> str:
    """``decoder.ffn (ffn type 'relu2'), head (head type 'x')``."""
    return ", ".join(f"{key} ({what})" for key, what in not_counted.items())


def _part_name(key: str, what: str) -> str:
    """``decoder.ffn``, or ``decoder.ffn of layers 0-1`` when only those layers are a plugin's."""
    _, found, layers = what.rpartition(" in layer")
    return f"{key} of layer{layers}" if found else key


def _without(not_counted: dict[str, str]) -> str:
    """The words a figure that leaves ``not_counted`` out is labelled with: `` without decoder.ffn``."""
    return f", without {', '.join(_part_name(k, w) for k, w in not_counted.items())}" if not_counted else ""


def _exact(value: int, not_counted: dict[str, str]) -> str:
    """The bytes column: the number, or nothing when none of it was counted."""
    return "" if not_counted and value == 0 else f"{value:,}"


def _at_least(text: str, not_counted: dict[str, str], value: float | None = None) -> str:
    """A figure missing the parts ``not_counted`` names is a lower bound: ``≥ 918 kFLOP``;
    with nothing counted (``value`` 0), ``not counted``."""
    if not_counted and value == 0:
        return "not counted"
    return f"≥ {text}" if not_counted else text


def _trained(flops: Any) -> str:
    """``396,800 of 891,648 parameters trained``: what a frozen model's training FLOPs count."""
    return f"{flops.trained_parameters:,} of {flops.parameters:,} parameters trained"


def _compute_section(report: Any) -> Section:
    f = report.flops
    s = Section(f"FLOPs per token at seq_len {f.seq_len:,}", ["component", "forward", "share"], right={1, 2})
    scores = ("attention scores count every query against all T keys (--flops-count executed)"
              if f.count == "executed" else
              "attention scores count the keys each query attends (causal: (T+1)/2 on average; sliding windows capped)")
    if not any(key.endswith("attention.scores") for key in f.components):
        scores = "no attention of a built-in type"
    missing, step_missing = f.forward_not_counted, f.not_counted
    objective = {k: v for k, v in step_missing.items() if k not in missing}  # a plugin's objective
    mlm = (report.spec.head.type == "mlm" and getattr(report.spec.training.objective, "mask_prob", 1.0) < 1
           and not objective)
    if f.trained_parameters is None:
        training = "training = 3 × forward"
    else:
        training = (f"training = forward + the backward products needed with {_trained(f)} (a frozen "
                    "weight gets no weight gradient; nothing below the lowest trained parameter is differentiated)")
    if mlm and (f.training != 3 * f.forward or f.trained_parameters is not None):
        training += ", the masked-LM head on its labelled tokens only"
    if objective:
        training += ", the head left out"
    s.notes.append(f"Matrix products only, 2 FLOPs per multiply-add; {scores}; {training}.")
    if missing:
        s.notes.append(f"Not counted: {_parts(missing)}: a plugin's type has no FLOP formula, so the totals "
                       "leave it out and are lower bounds.")
    if objective:
        s.notes.append(f"Not counted in the training step: the head under {_parts(objective)}, a plugin's "
                       "objective, which runs the loss as its module chooses; the training step leaves the "
                       "head out and is a lower bound (the forward counts it).")
    for key, n in f.components.items():
        label = f"{key} of the other layers" if key in missing else key  # a plugin's in some layers only
        s.rows.append([label, human_flops(n), f"{n / f.forward:.1%}" if f.forward and not missing else ""])
    for key, what in missing.items():
        s.rows.append([_part_name(key, what), "not counted", ""])
    s.rows.append([f"forward{_without(missing)}", _at_least(human_flops(f.forward), missing, f.forward),
                   f"{f.forward:,}" if f.forward or not missing else ""])
    share = getattr(report.spec.training.objective, "mask_prob", 1.0)
    if f.trained_parameters is not None:
        step = f"training step (forward + backward, {_trained(f)}" + (
            f", head on {share:.0%} of tokens)" if mlm else ")")
    elif report.spec.head.type == "mlm" and f.training != 3 * f.forward and not objective:
        step = f"training step (3× forward, head on {share:.0%} of tokens)"
    else:
        step = "training step (3× forward)"
    s.rows.append([f"{step}{_without(step_missing)}", _at_least(human_flops(f.training), step_missing, f.training),
                   f"{f.training:,}" if f.training or not step_missing else ""])
    s.bold_rows = {len(s.rows) - 2, len(s.rows) - 1}
    return s


_OPTIMIZER_STATES = {"adamw": ("AdamW", "AdamW states (2 moments)"), "sgd": ("SGD", "SGD momentum"),
                     "adafactor": ("Adafactor", "Adafactor states (factored)")}


def _optimizer_names(spec: Any) -> tuple[str, str]:
    from specformer.registry import REGISTRY

    kind = spec.training.optimizer.type
    if not REGISTRY.is_builtin("optimizer", kind):  # a plugin's, built-in name or not: not AdamW's states
        return kind, f"{kind} states"
    return _OPTIMIZER_STATES.get(kind, (kind, f"{kind} states"))


def _memory_section(report: Any) -> Section:
    m = report.memory
    name, states = _optimizer_names(report.spec)
    s = Section(
        f"memory: {name} training step, batch {m.batch} × seq_len {m.seq_len:,}, {m.dtype}",
        ["item", "bytes", "size"],
        right={1, 2},
    )
    kv_missing = report.kv_cache_not_counted
    self_missing = {k: v for k, v in kv_missing.items() if k == "decoder.attention"}
    cross_missing = {k: v for k, v in kv_missing.items() if k == "decoder.cross_attention"}
    kv = report.kv_cache_bytes_per_token
    s.rows.append([f"KV cache per token ({report.kv_dtype}){_without(self_missing)}", _exact(kv, self_missing),
                   _at_least(human_bytes(kv), self_missing, kv)])
    held = report.kv_cache_bytes  # sliding-window layers hold at most W - 1 + min(W, 128) positions
    s.rows.append([f"KV cache at seq_len {m.seq_len:,}, batch {m.batch}{_without(self_missing)}",
                   _exact(held, self_missing),
                   _at_least(human_bytes(held), self_missing, held)])
    if report.cross_kv_cache_bytes_per_source_token or cross_missing:
        c = report.cross_kv_cache_bytes_per_source_token
        s.rows.append([f"cross-attention KV per source token ({report.kv_dtype}){_without(cross_missing)}",
                       _exact(c, cross_missing), _at_least(human_bytes(c), cross_missing, c)])
    missing = m.not_counted
    parts = {k: v for k, v in missing.items() if k != "training.optimizer"}  # activations
    optimizer = {k: v for k, v in missing.items() if k == "training.optimizer"}
    objective = {k: v for k, v in missing.items() if k == "training.objective"}
    casts = {k: v for k, v in parts.items() if k not in objective}  # a plugin's modules' weight copies
    for label, value, gap in (
        ("weights", m.weights, {}),
        ("gradients", m.gradients, {}),
        (states, m.optimizer, optimizer),
        ("autocast weight copies", m.weight_casts, casts),
        ("activations", m.activations, parts),
    ):
        if label == "autocast weight copies" and not value and not (casts and m.dtype.endswith("mixed")):
            continue
        if gap is optimizer and optimizer:
            s.rows.append([label, "", "not counted"])
            continue
        s.rows.append([f"{label}{_without(gap)}", _exact(value, gap), _at_least(human_bytes(value), gap, value)])
    s.rows.append([f"training total{_without(missing)}", f"{m.total:,}", _at_least(human_bytes(m.total), missing)])
    s.bold_rows = {len(s.rows) - 1}
    if kv_missing:
        s.notes.append(f"KV cache not counted for {_parts(kv_missing)}: a plugin's attention stores its keys "
                       "and values as its module chooses.")
    if casts:
        s.notes.append(f"Activations and autocast weight copies not counted for {_parts(casts)}: only a "
                       "plugin's module knows what it keeps for the backward pass; its weights, gradients and "
                       "optimizer states are counted (from the meta build).")
    if objective:
        s.notes.append(f"Activations of the head's loss not counted: {_parts(objective)} is a plugin's, which "
                       "keeps what its loss chooses (specformer's objectives keep the gradients of the head's "
                       "input and weight, never the logits).")
    if optimizer:
        s.notes.append(f"Optimizer states not counted: {_parts(optimizer)} is a plugin's, which keeps what "
                       "it chooses.")
    from specformer.analysis import trainable_parameters

    total, trained = report.params.total, trainable_parameters(report.spec)
    if trained < total:
        s.notes.append(f"Gradients and optimizer states of the {trained:,} trained parameters: "
                       f"training.optimizer.freeze leaves out {total - trained:,} of {total:,} "
                       f"({100 * (total - trained) / total:.1f}%). Activations: what the backward pass of "
                       "those keeps, nothing below the lowest trained parameter.")
    return s


def _show_sections(report: Any) -> list[Section]:
    memory = _memory_section(report)
    memory.notes.extend(_cpu_attention_note(report.spec, report.memory))
    return [_architecture_section(report), _params_section(report), _compute_section(report), memory]


def _show_heading(report: Any, overrides: list[str] | None = None) -> str:
    """The line above ``show``'s tables; it names the ``--set`` overrides, so that tables
    pasted elsewhere do not pass a variant off as the spec it was made from."""
    total = report.params.total
    changed = "".join(f" --set {o}" for o in overrides or [])
    return f"{report.spec.name}{changed} — {report.spec.kind}, {total:,} parameters ({human_count(total)})"


@app.command()
def show(
    spec: Annotated[str, typer.Argument(metavar="SPEC", help="A preset name, a path to a YAML spec, or a run folder (its spec.yaml).", show_default=False)],
    set_: SetOption = None,
    batch: BatchOption = 1,
    seq_len: SeqLenOption = None,
    dtype: DtypeOption = "bf16-mixed",
    output_format: FormatOption = "rich",
    flops_count: FlopsCountOption = "needed",
    tree: Annotated[
        bool, typer.Option("--tree", help="Print the module tree with shapes and parameter counts (meta build).")
    ] = False,
) -> None:
    """Show a spec's architecture, parameters, FLOPs per token, KV cache and training memory.

    Everything is computed from the spec (nothing is allocated), so a 70B spec takes
    well under a second. A type registered by a plugin is counted from the model built
    on the meta device: its parameters exactly; its FLOPs, KV cache and activations,
    which only its module knows, are left out and named, the totals marked ≥.

    Examples:

    ```
    specformer show gpt2-small
    specformer show llama2-7b --batch 8 --seq-len 2048 --dtype bf16-mixed \\
        --format markdown
    specformer show my.yaml --tree
    ```
    """
    _check_options(output_format, dtype, flops_count)
    resolved = load_or_exit(spec, set_)
    if tree:
        _show_tree(resolved, output_format, set_)
        return
    from specformer.analysis import analyze

    _warn_past_learned_table(resolved, seq_len)
    report = _analysis_errors(lambda: analyze(resolved, batch=batch, seq_len=seq_len, dtype=dtype,
                                                              count=flops_count))
    if output_format == "json":
        shown = report.to_dict()
        # the --set overrides, as the heading of the tables names them: a variant is not the preset
        typer.echo(json.dumps({"name": shown.pop("name"), "overrides": list(set_ or []), **shown}, indent=2))
        return
    sections = _show_sections(report)
    if (batch, seq_len, dtype) == (1, None, "bf16-mixed"):
        sections[-1].notes.extend(_training_step_note(resolved, report.memory))
    _emit(sections, _show_heading(report, set_), output_format)


def _cpu_attention_note(spec: Any, memory: Any) -> list[str]:
    """With attention dropout, what a CPU keeps beside the figures shown (a GPU's)."""
    from specformer.analysis.memory import memory_estimate

    try:
        cpu = memory_estimate(spec, batch=memory.batch, seq_len=memory.seq_len, dtype=memory.dtype, cpu=True)
    except Exception:  # a plugin's part: the figures shown already name it
        return []
    if cpu.activations == memory.activations:
        return []
    return [
        f"On a CPU, attention dropout runs torch's math kernel, which keeps each layer's T × T probabilities: "
        f"activations {human_bytes(cpu.activations)}, total {human_bytes(cpu.total)} (what `specformer train` "
        "checks there). A GPU's fused kernels drop without keeping them, as counted above."
    ]


def _training_step_note(spec: Any, memory: Any) -> list[str]:
    """When `specformer train` would take another step than the one shown (the defaults:
    batch 1, bf16-mixed), the options that show its step."""
    from specformer.analysis.memory import precision

    t = spec.training
    name = precision(t.precision).name
    if (t.batch_size, t.seq_len, name) == (memory.batch, memory.seq_len, memory.dtype):
        return []
    return [
        f"`specformer train` runs batch {t.batch_size} × seq_len {t.seq_len:,} at precision {t.precision} "
        f"(training.batch_size, seq_len, precision): `--batch {t.batch_size} --seq-len {t.seq_len} "
        f"--dtype {t.precision}` shows its step."
    ]


def _warn_past_learned_table(spec: Any, seq_len: int | None, *, name: str | None = None,
                             given: bool = True) -> None:
    """A learned position table has a fixed length: past it the model cannot run (the
    other schemes extend), so say so rather than print costs of an impossible length.
    ``name`` names the spec (diff); ``given``: the length came from --seq-len."""
    from specformer.analysis.report import past_position_table

    rows = past_position_table(spec, seq_len)
    if rows is not None:
        assert seq_len is not None
        length = f"--seq-len {seq_len:,}" if given else f"seq_len {seq_len:,} (the first spec's max_seq_len)"
        whose = f"{name}'s" if name is not None else "this spec's"
        print_error(
            f"{length} is past {whose} learned position table ({rows:,} positions): "
            "the model cannot run at that length; the numbers below are what it would cost",
            label="[yellow]warning:[/]",
        )


# --------------------------------------------------------------------------- show --tree


def module_tree(model: Any) -> dict[str, Any]:
    """A nested description of ``model``: name, type, parameter count, own parameter shapes
    and children. Consecutive numbered children with the same structure (the layers of a
    stack) are collapsed into one entry with ``repeat``; ``params`` is then per copy. A tied parameter
    is counted where it first appears and listed elsewhere with ``tied_to``."""
    first_owner: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first_owner.setdefault(id(p), name)
    return _node(type(model).__name__, model, "", first_owner)


def _node(name: str, module: Any, prefix: str, first_owner: dict[int, str]) -> dict[str, Any]:
    own = []
    for pname, p in module.named_parameters(recurse=False):
        entry: dict[str, Any] = {"name": pname, "shape": list(p.shape), "numel": p.numel()}
        owner = first_owner.get(id(p), f"{prefix}{pname}")
        if owner != f"{prefix}{pname}":
            entry["tied_to"] = owner
        own.append(entry)
    tied = getattr(module, "tied_weight", None)  # a tied head reads the embedding at call time
    if tied is not None:
        own.append({"name": "weight", "shape": list(tied.shape), "numel": tied.numel(),
                    "tied_to": first_owner.get(id(tied), "the token embedding")})
    kids = [_node(cname, child, f"{prefix}{cname}.", first_owner) for cname, child in module.named_children()]
    children: list[dict[str, Any]] = []
    i = 0
    while i < len(kids):
        j = i + 1
        # only numbered siblings (the layers of a stack) collapse into a range: gate_proj and
        # up_proj stay two entries even when their shapes agree
        while j < len(kids) and kids[i]["name"].isdigit() and kids[j]["name"].isdigit() and _structure(kids[j]) == _structure(kids[i]):
            j += 1
        node = kids[i]
        if j - i > 1:
            node = {**node, "name": f"{kids[i]['name']}–{kids[j - 1]['name']}", "repeat": j - i}
        children.append(node)
        i = j
    params = sum(e["numel"] for e in own if "tied_to" not in e)
    params += sum(c["params"] * c.get("repeat", 1) for c in children)
    return {"name": name, "type": type(module).__name__, "params": params, "parameters": own, "children": children}


def _structure(node: dict[str, Any]) -> tuple:
    """Everything about a node but its own name (and the layer index in tied names)."""
    return (
        node["type"],
        node["params"],
        tuple((e["name"], tuple(e["shape"]), "tied_to" in e) for e in node["parameters"]),
        tuple((c["name"], c.get("repeat", 1), _structure(c)) for c in node["children"]),
    )


def _tree_label(node: dict[str, Any]) -> str:
    repeat = node.get("repeat")
    count = f"{node['params']:,} params" + (f" each, ×{repeat} = {node['params'] * repeat:,}" if repeat else "")
    return f"{node['name']} ({node['type']}) · {count}"


def _param_label(entry: dict[str, Any]) -> str:
    shape = "×".join(str(d) for d in entry["shape"])
    tied = f" tied to {entry['tied_to']}" if "tied_to" in entry else ""
    return f"{entry['name']} [{shape}] {entry['numel']:,}{tied}"


def _rich_tree(node: dict[str, Any], parent: Tree | None = None) -> Tree:
    label = Text(_tree_label(node))
    branch = Tree(label) if parent is None else parent.add(label)
    for entry in node["parameters"]:
        branch.add(Text(_param_label(entry), style="dim"))
    for child in node["children"]:
        _rich_tree(child, branch)
    return branch


def _text_tree(node: dict[str, Any], depth: int = 0) -> list[str]:
    pad = "  " * depth
    lines = [f"{pad}{_tree_label(node)}"]
    lines += [f"{pad}  - {_param_label(e)}" for e in node["parameters"]]
    for child in node["children"]:
        lines += _text_tree(child, depth + 1)
    return lines


def _build_meta(spec: Any) -> Any:
    try:
        from specformer.builder import build_model
    except ImportError as exc:
        print_error(f"the module tree needs the torch builder, which failed to import: {exc}")
        raise typer.Exit(1) from None
    from specformer.builder import BuildError

    try:
        return build_model(spec, device="meta")
    except (BuildError, OverflowError, RuntimeError) as exc:
        # a spec that validates but no module can be made of (a plugin's own check, sizes past int64)
        print_error(f"{spec.name}: the model cannot be built: {exc}")
        raise typer.Exit(1) from None
    except Exception as exc:  # a module of one's own that fails in its constructor: say which error
        if os.environ.get("SPECFORMER_DEBUG"):
            raise
        print_error(f"{spec.name}: the model cannot be built: {type(exc).__name__}: {exc}",
                    "set SPECFORMER_DEBUG=1 to see the full traceback")
        raise typer.Exit(1) from None


def _show_tree(spec: Any, output_format: str, overrides: list[str] | None = None) -> None:
    model = _build_meta(spec)
    tree = module_tree(model)
    if output_format == "json":
        typer.echo(json.dumps(tree, indent=2))
    elif output_format == "markdown":
        changed = "".join(f" --set {o}" for o in overrides or [])
        typer.echo(f"### {spec.name}{changed} module tree\n\n```\n" + "\n".join(_text_tree(tree)) + "\n```\n", nl=False)
    else:
        out = console if console.is_terminal else Console(width=160, soft_wrap=False)
        out.print(_rich_tree(tree), highlight=False, markup=False)


# --------------------------------------------------------------------------- diff


def _fmt_value(value: Any) -> str:
    from specformer.analysis import ABSENT

    if value is ABSENT:
        return "—"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)  # 1000001.0 is not 1e+06
    if isinstance(value, list):
        return "[" + ", ".join(_fmt_value(v) for v in value) + "]"
    return str(value)


def _changes_section(d: Any) -> Section:
    names = d.names
    columns = ["field"] + names if len(names) > 2 else ["field", names[0], names[1]]
    title = (
        f"identical to {names[0]} except:" if len(names) == 2 else f"fields that differ from {names[0]}:"
    )
    s = Section(title, columns)
    for ch in d.changes:
        path = ch.path + (" (derived)" if ch.derived else "") + (" (kept)" if ch.kept else "")
        s.rows.append([path] + [_fmt_value(v) for v in ch.values])
    from specformer.analysis import ABSENT

    absent = any(v is ABSENT for ch in d.changes for v in ch.values)
    kept = any(ch.kept for ch in d.changes)
    s.notes.append(("— : the field does not exist in that spec (its type differs, or its section is absent). " if absent else "")
                   + ("(kept): an override keeps these layers as they were while the stack's field changed. "
                      if kept else "")
                   + "Compared after resolving extends, overrides and defaults; derived sizes included.")
    return s


def _metric_rows(report: Any) -> list[tuple[str, float, Any, dict[str, str]]]:
    """(label, value, formatter, parts not counted) of every compared number of one report:
    a figure that leaves out a plugin's part names it."""
    rows: list[tuple[str, float, Any, dict[str, str]]] = []
    exact: dict[str, str] = {}
    for key, n in report.params.components.items():
        rows.append((f"params: {_component_label(key)}", n, lambda x: f"{x:,.0f}", exact))
    rows.append(("params: total", report.params.total, lambda x: f"{x:,.0f}", exact))
    rows.append(("params: non-embedding", report.params.non_embedding, lambda x: f"{x:,.0f}", exact))
    at = f"@ {report.flops.seq_len}" + (" (executed)" if report.flops.count == "executed" else "")
    rows.append((f"FLOPs/token forward {at}", report.flops.forward, human_flops, report.flops.forward_not_counted))
    rows.append((f"FLOPs/token training {at}", report.flops.training, human_flops, report.flops.not_counted))
    kv = {k: v for k, v in report.kv_cache_not_counted.items() if k == "decoder.attention"}
    cross = {k: v for k, v in report.kv_cache_not_counted.items() if k == "decoder.cross_attention"}
    rows.append((f"KV cache bytes/token ({report.kv_dtype})", report.kv_cache_bytes_per_token,
                 lambda x: f"{x:,.0f}", kv))
    # what a sliding window changes: the cache held at the length, not the bytes per token
    m = report.memory
    rows.append((f"KV cache @ {m.seq_len}, batch {m.batch}", report.kv_cache_bytes, human_bytes, kv))
    if report.cross_kv_cache_bytes_per_source_token or cross:
        rows.append(("cross KV bytes/source token", report.cross_kv_cache_bytes_per_source_token,
                     lambda x: f"{x:,.0f}", cross))
    parts = {k: v for k, v in m.not_counted.items() if k != "training.optimizer"}
    optimizer = {k: v for k, v in m.not_counted.items() if k == "training.optimizer"}
    casts = {k: v for k, v in parts.items() if k != "training.objective"}  # the objective copies no weight
    for label, value, gap in (("weights", m.weights, exact), ("gradients", m.gradients, exact),
                              ("optimizer states", m.optimizer, optimizer),
                              ("autocast weight copies", m.weight_casts, casts),
                              ("activations", m.activations, parts), ("training total", m.total, m.not_counted)):
        rows.append((f"memory: {label}", value, human_bytes, gap))
    return rows


def _merged_order(sequences: list[list[str]]) -> list[str]:
    """All items of ``sequences``; an item only a later sequence has goes after its predecessor there."""
    order: list[str] = []
    for seq in sequences:
        at = 0
        for item in seq:
            if item in order:
                at = order.index(item) + 1
            else:
                order.insert(at, item)
                at += 1
    return order


def _consequences_section(d: Any) -> Section:
    reports = d.reports
    first = reports[0]
    m = first.memory
    title = f"consequences (batch {m.batch} × seq_len {m.seq_len:,}, {m.dtype})"
    per = [dict((label, (v, f, gap)) for label, v, f, gap in _metric_rows(r)) for r in reports]
    labels = _merged_order([list(rows) for rows in per])
    if len(reports) == 2:
        s = Section(title, ["", d.names[0], d.names[1], "Δ", "Δ%"], right={1, 2, 3, 4})
    else:
        s = Section(title, [""] + d.names, right=set(range(1, len(reports) + 1)))
    partial = False
    for label in labels:
        values = [rows.get(label, (0, None, {})) for rows in per]
        fmt = next(f for _, f, _ in values if f is not None)
        cells = [_at_least(fmt(v), gap, v) for v, _, gap in values]
        base, base_gap = values[0][0], values[0][2]
        partial = partial or any(gap for _, _, gap in values)
        if len(reports) == 2:
            other, other_gap = values[1][0], values[1][2]
            # a difference between figures that leave out different parts means nothing
            known = not base_gap and not other_gap
            s.rows.append([label, *cells, _signed(other - base, fmt) if known else "?",
                           _signed_pct(other, base) if known else "?"])
        else:
            s.rows.append([label, cells[0]] + [
                f"{cell} ({_signed_pct(v, base)})" if not gap and not base_gap else cell
                for cell, (v, _, gap) in zip(cells[1:], values[1:], strict=True)])
    for name, report in zip(d.names, reports, strict=True):
        f = report.flops
        if f.trained_parameters is not None:
            s.notes.append(f"{name} trains {_trained(f).removesuffix(' trained')} (training.optimizer.freeze): "
                           "its training FLOPs count the backward products those need, its gradients, optimizer "
                           "states and activations what their backward pass keeps.")
    if partial:
        for name, report in zip(d.names, reports, strict=True):
            missing = {**report.flops.not_counted, **report.kv_cache_not_counted, **report.memory.not_counted}
            if missing:
                built = "; its parameters are counted from the meta build" * (report.params.method == "meta build")
                s.notes.append(f"≥: {name} leaves out {_parts(missing)}, a plugin's type with no formula for "
                               f"FLOPs, KV cache, activations or optimizer states (`specformer show` says which "
                               f"figures){built}.")
    return s


_LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


def _layer_group(key: str) -> str:
    return _LAYER_INDEX.sub(".layers.*.", key, count=1)


def _with_layers(group: str, keys: list[str]) -> str:
    """``group`` with its ``*`` replaced by the layers ``keys`` come from, as ranges
    (``decoder.layers.0-1,3.ffn.up_proj.weight``): a ``*`` would read as every layer."""
    found = [_LAYER_INDEX.search(k) for k in keys]
    indices = sorted({int(m.group(1)) for m in found if m is not None})
    if not indices or "*" not in group:
        return keys[0]
    from specformer.analysis.params import index_ranges

    return group.replace(".layers.*.", f".layers.{index_ranges(indices, ',')}.", 1)


def _group_keys(keys: list[str]) -> list[str]:
    """Collapse layer indices: the keys of layers 0, 1 and 3 that differ only there are one
    ``decoder.layers.0-1,3.ffn.gate_proj.weight`` (×3)."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        groups.setdefault(_layer_group(k), []).append(k)
    return [f"{_with_layers(g, ks)} (×{len(ks)})" if len(ks) > 1 else ks[0] for g, ks in groups.items()]


def _first(groups: list[str], n: int = 4) -> str:
    """The first ``n`` groups, and how many more there are (the JSON output lists all)."""
    rest = len(groups) - n
    more = f", … {rest} more group{'s' if rest > 1 else ''}" if rest > 0 else ""
    return ", ".join(groups[:n]) + more


def _compat_section(d: Any) -> Section:
    s = Section("checkpoint compatibility (load_state_dict strict)", ["checkpoint of", "loads into", "result"])
    for c in d.compatibility:
        if c.compatible:
            result = "yes: same keys and shapes"
        else:
            parts = []
            if c.missing:
                parts.append(f"{len(c.missing)} missing: " + _first(_group_keys(c.missing)))
            if c.unexpected:
                parts.append(f"{len(c.unexpected)} unexpected: " + _first(_group_keys(c.unexpected)))
            if c.mismatched:
                mism: dict[tuple, list[str]] = {}
                for key, a, b in c.mismatched:
                    mism.setdefault((_layer_group(key), tuple(a), tuple(b)), []).append(key)
                shown = [f"{_with_layers(g, ks)} {list(a)}→{list(b)}" + (f" (×{len(ks)})" if len(ks) > 1 else "")
                         for (g, a, b), ks in mism.items()]
                parts.append(f"{len(c.mismatched)} shape mismatches: " + _first(shown))
            result = "no: " + "; ".join(parts)
        s.rows.append([c.source, c.target, result])
    methods = sorted({c.method for c in d.compatibility})
    s.notes.append(f"State-dict keys and shapes from: {', '.join(methods)}.")
    return s


def _own_name(arg: str, spec: Any) -> str:
    """The name a column shows for ``spec``, read from ``arg``: its ``name`` (a YAML file that
    writes none has its file's), or a run folder's path (its spec.yaml is resolved: the name
    it holds does not say what a ``--set`` changed in that run)."""
    from pathlib import Path

    path = Path(arg)
    return arg if path.is_dir() and (path / "spec.yaml").is_file() else spec.name


def _labels(args: list[str], specs: list[Any], *, set_last: bool = False) -> list[str]:
    """Column labels: the specs' names, or their arguments where names repeat; with
    ``set_last``, the last one is marked as the one ``--set`` changed."""
    from specformer.analysis.diff import distinct_names

    names = [_own_name(arg, spec) for arg, spec in zip(args, specs, strict=True)]
    if set_last and len(args) == 2 and args[0] == args[1]:
        labels = names  # one spec, against itself with the --set
    elif len(set(names)) == len(names):
        labels = names
    else:
        labels = args if len(set(args)) == len(args) else distinct_names(args)
    if set_last:
        labels = [*labels[:-1], f"{labels[-1]} (--set)"]
    return labels


@app.command()
def diff(
    specs: Annotated[list[str], typer.Argument(
        metavar="SPEC",
        help="Two or more preset names, YAML paths or run folders (their spec.yaml; one, with --set).", show_default=False)],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="FIELD=VALUE",
            help="Override a field of the last spec: `--set decoder.attention.n_kv_heads=4`. With a "
            "single spec, diffs it against itself with the overrides. Repeatable.",
            show_default=False,
        ),
    ] = None,
    batch: BatchOption = 1,
    seq_len: DiffSeqLenOption = None,
    dtype: DtypeOption = "bf16-mixed",
    output_format: FormatOption = "rich",
    flops_count: FlopsCountOption = "needed",
    checkpoints: Annotated[
        bool,
        typer.Option("--checkpoints/--no-checkpoints", help="Check whether checkpoints load across."),
    ] = True,
    meta: Annotated[
        bool,
        typer.Option("--meta", help="Take state-dict keys and shapes from meta-device builds instead of the "
                     "spec (same result for built-in types; needs torch, slower)."),
    ] = False,
) -> None:
    """Diff specs after resolving extends and defaults: changed fields, then consequences.

    Lists every field that differs (derived sizes included), then parameters per
    component, FLOPs per token, KV cache and training memory side by side with
    deltas, and whether a checkpoint of the first spec loads into each other one.
    With three or more specs, one column per spec against the first. `--set` changes
    the last spec; given one spec, it is compared with itself so changed.

    Examples:

    ```
    specformer diff gpt2-small my-variant.yaml
    specformer diff gpt2-small --set decoder.attention.n_kv_heads=4
    specformer diff gpt2-small gpt2-medium gpt2-large --format markdown
    ```
    """
    _check_options(output_format, dtype, flops_count)
    if len(specs) < 2 and not (specs and set_):
        print_error(f"diff needs at least two specs, or one spec and --set, got {len(specs)}")
        raise typer.Exit(2)
    from specformer.analysis import diff_specs

    if specs.count("-") > 1:
        print_error("standard input (-) can be read once: give one spec as -, the others by name or path")
        raise typer.Exit(2)
    if specs == ["-"]:  # read once, then changed by --set
        (first,) = load_all_or_exit([("-", None)])
        specs, resolved = ["-", "-"], [first, *load_all_or_exit([(first, set_)])]
    else:
        if len(specs) == 1:
            specs = [specs[0], specs[0]]
        resolved = load_all_or_exit([(s, set_ if i == len(specs) - 1 else None) for i, s in enumerate(specs)])
    labels = _labels(specs, resolved, set_last=bool(set_))
    for spec_obj, label in zip(resolved, labels, strict=True):
        _warn_past_learned_table(spec_obj, seq_len if seq_len is not None else resolved[0].max_seq_len,
                                 name=label, given=seq_len is not None)
        if seq_len is None and spec_obj.positional.type != "learned" and spec_obj.max_seq_len < resolved[0].max_seq_len:
            print_error(
                f"{label}'s figures are at seq_len {resolved[0].max_seq_len:,} (the first spec's max_seq_len), "
                f"past its own max_seq_len {spec_obj.max_seq_len:,}: `--seq-len {spec_obj.max_seq_len}` "
                "compares them at its length", label="[dim]note:[/]")
    result = _analysis_errors(lambda: diff_specs(
        *resolved, batch=batch, seq_len=seq_len, dtype=dtype, checkpoints=checkpoints,
        checkpoint_method="meta" if meta else "analytic", labels=labels, count=flops_count))
    if output_format == "json":
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    _emit(*_diff_sections(result), output_format)


def _diff_sections(result: Any) -> tuple[list[Section], str]:
    """The tables ``diff`` prints for ``result`` and the heading above them."""
    labels = result.names
    if result.identical:
        heading = (f"{labels[1]} is identical to {labels[0]} (after resolving extends and defaults)"
                   if len(labels) == 2 else f"all {len(labels)} specs are identical (after resolving extends and defaults)")
        sections: list[Section] = []
        if result.compatibility:
            sections.append(_compat_section(result))
        return sections, heading
    sections = [_changes_section(result)]
    if result.reports:
        sections.append(_consequences_section(result))
    if result.compatibility:
        sections.append(_compat_section(result))
    return sections, ""


def report_markdown(report: Any) -> str:
    """What ``specformer show --format markdown`` prints for ``report`` (a ``SpecReport``)."""
    return render_markdown(_show_sections(report), f"### {_show_heading(report)}")


def diff_markdown(result: Any) -> str:
    """What ``specformer diff --format markdown`` prints for ``result`` (a ``SpecDiff``)."""
    sections, heading = _diff_sections(result)
    return render_markdown(sections, f"### {heading}" if heading else "")
