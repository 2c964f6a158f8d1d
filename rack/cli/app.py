"""The `rack` command-line application object (typer).

Each command module in `rack.cli` registers its commands on `app` (or adds a sub-app);
`rack.cli.main` imports them all.
"""

import typer


def command_group(**kwargs) -> typer.Typer:
    """A typer app (the root or a sub-command group) whose help texts are plain text:
    with rich markup on, a help's "[default: ...]" note reads as a style tag and vanishes."""
    return typer.Typer(no_args_is_help=True, rich_markup_mode=None, **kwargs)


app = command_group(
    name="rack",
    help="Emulate a heterogeneous LLM inference rack: GPU prefill, wafer-scale decode, KV link.",
    add_completion=False,
    pretty_exceptions_enable=False,
)
