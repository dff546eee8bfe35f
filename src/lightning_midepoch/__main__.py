"""The ``lightning-midepoch`` command line (also ``python -m lightning_midepoch``).

``lightning-midepoch inspect CKPT`` says where a checkpoint will resume and whether it resumes exactly, without
resuming it (see :mod:`lightning_midepoch._inspect` and ``docs/inspect.md``).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from lightning_midepoch import _inspect
from lightning_midepoch.__about__ import __version__

PROG = "lightning-midepoch"

_INSPECT_EPILOG = f"""\
exit status:
  {_inspect.EXIT_CODES[_inspect.EXACT]}  exact resume possible
  {_inspect.EXIT_CODES[_inspect.CAVEATS]}  resume possible, with caveats (listed)
  {_inspect.EXIT_CODES[_inspect.NOT_POSSIBLE]}  resume not possible (why, and the opt-out, listed)
  {_inspect.EXIT_BAD_INPUT}  bad input: a missing or unreadable file, not a Lightning checkpoint, a bad command line

The checkpoint is only read, never written. CKPT may be a local path or any fsspec URL Lightning accepts for
`trainer.fit(ckpt_path=...)` (s3://, gs://, file://, ...)."""


class _UsageError(Exception):
    """A bad command line (argparse would exit with status 2, which means "not possible" here)."""


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog=PROG, description="Tools for lightning-midepoch checkpoints.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    inspect = commands.add_parser(
        "inspect",
        help="say where a checkpoint will resume, and whether exactly",
        description=(
            "Say where a Lightning checkpoint will resume (epoch, batch, global step), what it recorded about\n"
            "each train dataloader and the random states, and whether MidEpochResume can continue it exactly."
        ),
        epilog=_INSPECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect.add_argument("checkpoint", metavar="CKPT", help="path or fsspec URL of the checkpoint")
    inspect.add_argument("--json", action="store_true", help="print one JSON object (schema in docs/inspect.md)")
    inspect.add_argument(
        "--trust",
        action="store_true",
        help=(
            "if a weights-only load refuses an object in the file (e.g. hyperparameters), load it with"
            " weights_only=False, which can run code stored in the file: only for files from a source you trust"
        ),
    )
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return _inspect.EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (see ``lightning-midepoch inspect --help``).

    Args:
        argv: The arguments after the program name (``sys.argv[1:]`` when ``None``).

    """
    try:
        args = _parser().parse_args(argv)
    except _UsageError as error:
        return _error(str(error))
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0
    try:
        report = _inspect.inspect_checkpoint(args.checkpoint, trust=args.trust)
        sys.stdout.write(_inspect.render_json(report) if args.json else _inspect.render_text(report))
    except _inspect.InspectError as error:
        return _error(str(error))
    except Exception as error:  # never a traceback: anything unforeseen about the input is one line too
        return _error(f"cannot inspect {args.checkpoint}: {_inspect.one_line(error)}")
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
