"""The ``adaptor`` command."""

from __future__ import annotations

import sys

import click
import orjson

from adaptor import errors


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="adaptor", prog_name="adaptor")
def cli() -> None:
    """Run coding agents through one model; talk to the adaptord daemon."""


@cli.command("exit-codes")
@click.option("--json", "as_json", is_flag=True, help="Print the table as a JSON array.")
def exit_codes(as_json: bool) -> None:
    """Print the exit codes every adaptor command uses."""
    if as_json:
        rows = [{"exit_code": code, "meaning": meaning} for code, meaning in errors.EXIT_CODES]
        sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_APPEND_NEWLINE))
        return
    for code, meaning in errors.EXIT_CODES:
        click.echo(f"{code:>4}  {meaning}")


def main() -> None:
    cli(prog_name="adaptor")
