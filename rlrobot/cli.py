"""The ``rlrobot`` entry point: finds the command in ``rlrobot.commands.COMMANDS`` and runs it; bad input ends in
one line on the console and exit status 2."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

from rlrobot.commands import COMMANDS
from rlrobot.errors import MissingSystemDependency

console = Console(soft_wrap=True)  # long lines stay one line in logs (CI, nohup), not wrapped at 80 columns
USAGE = ("usage: rlrobot <command> [options]       rlrobot <command> --help for its options\n\ncommands:\n"
         + "".join(f"  {name:<13} {command.help}\n" for name, command in COMMANDS.items())
         + "\n  -V, --version  print the version")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    if argv[0] in ("-V", "--version"):
        import rlrobot  # here, not at the top: --help answers without loading the package

        print(f"rlrobot {rlrobot.__version__}")
        return
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        console.print(f"[red]unknown command {name!r}; valid commands: {', '.join(COMMANDS)}[/]", soft_wrap=True)
        raise SystemExit(2)
    try:
        COMMANDS[name](name, rest)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError, ConnectionError, MissingSystemDependency) as e:
        # escaped: a message may hold brackets that are not markup ("pip install -e '.[vla]'")
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)  # one line per error: greppable in logs
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
