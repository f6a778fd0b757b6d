"""``--help`` whose options read whole at any width.

typer lays a command's options out as a table of up to seven columns (the required mark,
the long and short names, the ``--no-`` names, the type, the help). On 80 columns, the
width of a default terminal and of output that is piped, a command with long option names
(``--repetition-penalty``, ``--stop-at-eot/--no-stop-at-eot``) left its help a column of
16 characters and cut names and words short with an ellipsis (``--repetition-pen…``,
``(encoder-decode…``). Where typer's table would cut anything, or take more lines than
this layout, the panel is laid out as argparse and click lay out theirs instead: each
option's names and type on a line (a flag has no type: it takes no value), its help below
them across the width. Elsewhere (a wide terminal) typer's own table is kept.

Two more of typer's marks read wrong to a user of other command lines, and go: a flag's
``<bool>`` (it takes no value: ``--tree``, not ``--tree true``), and the braces around a
required argument in the usage line (``show [OPTIONS] {SPEC}``), where braces mean a choice
of values; it reads ``SPEC``, as argparse and click write it, optional ones keeping ``[...]``.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.text import Text

__all__ = ["install"]

ELLIPSIS = "…"
HELP_INDENT = 4  # the help's columns in from the names


def _names(param: Any, ctx: Any) -> Text:
    """``--stop-at-eot / --no-stop-at-eot``, ``--prompt, -p``, or an argument's name, then its type."""
    from typer import rich_utils

    if getattr(param, "param_type_name", "") == "argument":
        names = getattr(param, "display_name_raw", None) or param.human_readable_name
        text = Text(names, style="bold cyan")
    else:
        longs = [o for o in param.opts if o.startswith("--")] + [o for o in param.opts if not o.startswith("--")]
        text = rich_utils.highlighter(", ".join(longs))
        if param.secondary_opts:
            text.append(" / ")
            text.append_text(rich_utils.negative_highlighter(", ".join(param.secondary_opts)))
    if getattr(param, "required", False):
        text = Text(rich_utils.REQUIRED_SHORT_STRING + " ", style=rich_utils.STYLE_REQUIRED_SHORT) + text
    kind = None if _is_flag(param) or not hasattr(param, "display_type_rich") else param.display_type_rich(ctx=ctx)
    ranged = param._get_number_range_help_str() if hasattr(param, "_get_number_range_help_str") else None
    if kind:
        text.append("  ")
        text.append(kind + (rich_utils.RANGE_STRING.format(ranged) if ranged else ""), style=rich_utils.STYLE_TYPES)
    return text


def _stacked(*, name: str, params: list[Any], ctx: Any, markup_mode: Any, console: Console) -> None:
    from typer import rich_utils

    rows: list[Any] = []
    for param in params:
        rows.append(_names(param, ctx))
        helped = rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        rows.append(Padding(helped, (0, 0, 0, HELP_INDENT)))
    console.print(Panel(Group(*rows), border_style=rich_utils.STYLE_OPTIONS_PANEL_BORDER, title=name,
                        title_align=rich_utils.ALIGN_OPTIONS_PANEL))


def _rendered(panel: Any, *, console: Console, **kwargs: Any) -> str:
    """What ``panel`` prints at this console's width, without styles."""
    probe = Console(file=io.StringIO(), width=console.width, color_system=None, force_terminal=False)
    panel(console=probe, **kwargs)
    return probe.file.getvalue()


def _stacks_better(panel: Any, *, params: list[Any], **kwargs: Any) -> bool:
    """Whether typer's table cuts a name or a word short at this console's width, or takes
    more lines than the stacked layout (a help column squeezed to a few words a line)."""
    table = _rendered(panel, params=params, **kwargs)
    own = any(ELLIPSIS in (getattr(p, "help", None) or "") for p in params)  # not a sign of a cut
    if ELLIPSIS in table and not own:
        return True
    return table.count("\n") > _rendered(_stacked, params=params, **kwargs).count("\n")


def _is_flag(param: Any) -> bool:
    return bool(getattr(param, "is_flag", False) or getattr(param, "secondary_opts", None))


def _unmark(typer_core: Any) -> None:
    """No ``<bool>`` after a flag in typer's table, no braces around a required argument in the usage line."""
    option, argument = getattr(typer_core, "TyperOption", None), getattr(typer_core, "TyperArgument", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is not None and not getattr(shown, "_specformer", False):
        def display_type_rich(self: Any, ctx: Any) -> str | None:
            return None if _is_flag(self) else shown(self, ctx)

        display_type_rich._specformer = True  # type: ignore[attr-defined]
        option.display_type_rich = display_type_rich
    usage = getattr(argument, "get_usage_pieces", None)  # click's, which typer's arguments override
    if usage is not None and not getattr(usage, "_specformer", False):
        def get_usage_pieces(self: Any, ctx: Any) -> list[str]:
            pieces = usage(self, ctx)
            # "{SPEC}" (typer 0.29), "{SPEC}..." or "{name}:TEXT" (older typers): the braces go
            return [piece[1:].replace("}", "", 1) if piece.startswith("{") and "}" in piece else piece
                    for piece in pieces]

        get_usage_pieces._specformer = True  # type: ignore[attr-defined]
        argument.get_usage_pieces = get_usage_pieces


def install() -> None:
    """Routes typer's options panels through a check of their fit (once): :func:`_stacked` where typer's table
    cuts a word or takes more lines; and takes typer's ``<bool>`` and usage braces out (:func:`_unmark`)."""
    from typer import core as typer_core
    from typer import rich_utils

    _unmark(typer_core)

    typer_panel = getattr(rich_utils, "_print_options_panel", None)
    if typer_panel is None or getattr(typer_panel, "_specformer", False):
        return

    def fitted(**kwargs: Any) -> None:
        known = {"name", "params", "ctx", "markup_mode", "console"} == kwargs.keys()
        if (known and kwargs["params"] and hasattr(rich_utils, "_get_parameter_help")
                and _stacks_better(typer_panel, **kwargs)):
            _stacked(**kwargs)
        else:  # typer's own table: it fits, or this typer's panel is not the one this module knows
            typer_panel(**kwargs)

    fitted._specformer = True  # type: ignore[attr-defined]
    rich_utils._print_options_panel = fitted
