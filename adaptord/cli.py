"""The ``adaptord`` command."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="adaptor", prog_name="adaptord")
def cli() -> None:
    """The adaptor spool daemon: runs request files dropped into its spool directory."""


def main() -> None:
    cli(prog_name="adaptord")
