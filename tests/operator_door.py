"""The operator's own API door (kube.py over rest.py) for a test that calls it in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from meshrun_operator.client.errors import ApiTimeout
from meshrun_operator.client.kube import Kube
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest


@asynccontextmanager
async def operator_kube(kubeconfig: str, seconds: float = 30) -> AsyncIterator[Kube]:
    """A Kube with the credentials of ``kubeconfig``, closed on the way out."""
    rest = Rest(Login(kubeconfig), ApiTimeout.of(seconds))
    try:
        yield Kube(rest)
    finally:
        await rest.close()
