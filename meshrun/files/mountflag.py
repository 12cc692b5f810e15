"""``--mount CONTAINER=LOCAL``, the one flag ``meshrun plan`` and ``meshrun run --local`` share:
where the job's container paths are found on this machine (read by ``checks.mount``)."""

from __future__ import annotations

import argparse


def add_mount_flag(parser: argparse.ArgumentParser, purpose: str) -> None:
    """Add the repeatable ``--mount``; ``purpose`` ends its help ("so its files are checked")."""
    parser.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="CONTAINER=LOCAL",
        help="the job's container path CONTAINER (model folder, data, export) is at LOCAL on "
        f"this machine, {purpose}; repeatable",
    )
