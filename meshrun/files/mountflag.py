"""``--mount CONTAINER=LOCAL``, the one flag ``meshrun plan`` and ``meshrun run --local`` share:
where the job's container paths are found on this machine (read by ``checks.mount``)."""

from __future__ import annotations

import argparse


def add_mount_flag(parser: argparse.ArgumentParser, purpose: str) -> None:
    """Add the repeatable ``--mount``; ``purpose`` ends its help ("so its files are checked")."""
    parser.add_argument(
        "--mount",
        action="append",
        type=_mount,
        default=[],
        metavar="CONTAINER=LOCAL",
        help="the job's container path CONTAINER (model folder, data, export) is at LOCAL on "
        f"this machine, {purpose}; repeatable",
    )


def parse_mount(text: str) -> tuple[str, str]:
    """(CONTAINER, LOCAL) of a ``--mount`` value; ValueError saying the form when it is none."""
    container, sep, local = text.partition("=")
    if not sep or not container.startswith("/") or not local:
        raise ValueError(f"{text!r} must look like /container/path=local/path")
    return container, local


def _mount(text: str) -> str:
    """``CONTAINER=LOCAL`` as given, refused at the command line (exit 2, the flag named) when
    it is not one."""
    try:
        parse_mount(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text
