"""The `rack` command-line application object (typer).

Each command module in `rack.cli` registers its commands on `app` (or adds a sub-app);
`rack.cli.main` imports them all.
"""

import typer

app = typer.Typer(
    name="rack",
    help="Emulate a heterogeneous LLM inference rack: GPU prefill, wafer-scale decode, KV link.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
