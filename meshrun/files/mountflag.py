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


def _mount(text: str) -> str:
    """``CONTAINER=LOCAL`` as given, refused at the command line (exit 2, the flag named) when
    it is not one, as ``checks.mount`` would refuse it."""
    container, sep, local = text.partition("=")
    if not sep or not container.startswith("/") or not local:
        raise argparse.ArgumentTypeError(f"{text!r} must look like /container/path=local/path")
    return text
