"""Entry point of the ``dpsynth`` CLI.

Each command group lives in its own module and exposes a ``typer.Typer`` named ``app``.
Errors derived from :class:`DpsynthError` are printed as one line and exit with status 2.
"""

from __future__ import annotations

import sys

import typer

# Command modules by full name: ``from dpsynth.cli import ...`` would read this package's namespace while
# dpsynth/cli/__init__.py, which imports this module, is still running (an import cycle).
import dpsynth.cli.audit as audit
import dpsynth.cli.config as config
import dpsynth.cli.data as data
import dpsynth.cli.eval as eval_cmd
import dpsynth.cli.jobs as jobs
import dpsynth.cli.ledger as ledger
import dpsynth.cli.models as models
import dpsynth.cli.privacy as privacy
import dpsynth.cli.release as release
import dpsynth.cli.report as report
import dpsynth.cli.run as run
import dpsynth.cli.serve as serve
import dpsynth.cli.train as train
from dpsynth_core.errors import DpsynthError

_app = typer.Typer(
    name="dpsynth",
    help="Differentially private synthetic text and tables on Ray.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
_app.add_typer(privacy.app, name="privacy")
_app.add_typer(ledger.app, name="ledger")
_app.add_typer(models.app, name="models")
_app.add_typer(data.app, name="data")
_app.add_typer(train.app, name="train")
_app.add_typer(run.app, name="run")
_app.add_typer(serve.app, name="serve")
_app.add_typer(eval_cmd.app, name="eval")
_app.add_typer(jobs.app, name="jobs")
_app.add_typer(audit.app, name="audit")
_app.add_typer(config.app, name="config")
jobs.register_top_level(_app)  # `dpsynth submit` and `dpsynth tune`


def _show_version(value: bool) -> None:
    if value:
        from dpsynth_core import __version__

        typer.echo(f"dpsynth {__version__}")
        raise typer.Exit(0)


@_app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", callback=_show_version, is_eager=True),
) -> None:
    """Differentially private synthetic text and tables on Ray."""


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Click's exception base, from typer's vendored copy of click and from click itself (either may raise)."""
    import click

    types: list[type[BaseException]] = [click.exceptions.ClickException]
    try:
        from typer._click.exceptions import ClickException as VendoredClickException

        types.append(VendoredClickException)
    except ImportError:  # a typer that uses click directly
        pass
    return tuple(types)
_app.command("release")(release.release)
_app.command("report")(report.report)


def cli_command():
    """The click command tree of ``dpsynth``, with an example at the end of every command's --help."""
    from dpsynth.cli.examples import add_examples

    command = typer.main.get_command(_app)
    add_examples(command)
    return command


def app() -> None:
    """Console-script entry: run the CLI, turning user-facing errors into one clean line."""
    from dpsynth_core.quiet import quiet_process

    quiet_process()  # before any command imports transformers or starts Ray
    try:
        code = cli_command()(standalone_mode=False)  # non-standalone click returns typer.Exit's code, no exit
        if isinstance(code, int) and code:
            sys.exit(code)
    except DpsynthError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.secho("aborted", err=True)
        sys.exit(1)
    except Exception as exc:  # usage errors arrive here in non-standalone mode: usage + one line, exit 2
        if isinstance(exc, _usage_error_types()):
            exc.show()
            sys.exit(exc.exit_code)
        raise


main = app
