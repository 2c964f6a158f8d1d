"""Layer 8 of rack/ (the top): the `rack` command: `rack run`, `rack estimate`,
`rack validate`, `rack trace stats`, ...

Every module in this package other than `app` defines commands on `rack.cli.app.app`;
they are imported here so that adding a command is adding a module. May import every
layer below (docs/architecture.md); nothing imports it but `rack.__main__`.
"""

import importlib
import pkgutil

from .app import app


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name != "app" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def main() -> None:
    """Entry point of the `rack` console script."""
    _register_commands()
    try:
        app()
    finally:
        # only clean-up is left (Ray's atexit shutdown): a signal now exits at once,
        # without a KeyboardInterrupt traceback from it (rack.runtime.interrupt)
        from rack.runtime.interrupt import quiet_after_command

        quiet_after_command()
