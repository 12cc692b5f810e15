"""What goes wrong when a user talks to a cluster about jobs, one class per kind of answer, each
with one line that says what to do.

The kubernetes package raises ``ApiException`` for the API server's error answers (the body a
``Status`` object: its reason, message and details) and urllib3's errors when no answer came;
:func:`from_api` and :func:`from_no_answer` turn them into a :class:`ClientError` whose message is
what ``meshrun`` prints, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from meshrun.api.crd import GROUP, PLURAL, VERSION

RESOURCE = f"{PLURAL}.{GROUP}"
"""The jobs' resource as kubectl names it (``kubectl auth can-i list ...``)."""

INSTALL_HINT = (
    "install meshrun first (helm install meshrun helm/meshrun, or "
    "kubectl apply --server-side -f crds/; docs/install.md)"
)


class ClientError(Exception):
    """A request about jobs that did not do what was asked; ``str()`` is one line for the user."""


class NoCluster(ClientError):
    """No cluster to talk to: no kubeconfig, an unknown context, or no answer from the server."""


class NotInstalled(ClientError):
    """The cluster does not serve ParallelTrainingJobs (the CRD is not installed)."""


class NotFound(ClientError):
    """No such job, pod or namespace."""


class AlreadyExists(ClientError):
    """A job of that name exists already."""


class Forbidden(ClientError):
    """The user may not do that (RBAC), or the credentials were refused."""


class Refused(ClientError):
    """The API server refused the request otherwise (invalid object, server error, ...)."""


class WaitTimeout(ClientError):
    """A wait ran out before the job reached the phase awaited."""


class JobEnded(ClientError):
    """The job ended in a phase other than the one awaited (a Failed job, when Succeeded was)."""


@dataclass(frozen=True)
class Request:
    """What was asked, to say it back in an error: kubectl's verb, the resource, the object's
    name (None for a list), its namespace (None across all), and the job it is about."""

    verb: str
    resource: str
    name: str | None
    namespace: str | None
    job: str | None = None


def status_of(body: Any) -> dict[str, Any]:
    """The Status object of an error answer's body ({} when it is not one: a plain-text 404)."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        status = json.loads(body or "{}")
    except ValueError:
        return {}
    return status if isinstance(status, dict) and status.get("kind") == "Status" else {}


def from_api(error: Any, request: Request, server: str) -> ClientError:
    """The ClientError for the API server's error answer ``error`` (an ``ApiException``) to
    ``request`` sent to ``server``."""
    status = status_of(getattr(error, "body", None))
    code = int(getattr(error, "status", 0) or 0)
    message = str(status.get("message") or getattr(error, "reason", "") or "").strip()
    details = status.get("details") or {}
    where = f" -n {request.namespace}" if request.namespace else " -A"
    if code == 401:
        return Forbidden(
            f"the API server at {server} refused your credentials (401 Unauthorized): log in "
            "again, or check the user of your kubeconfig's context (kubectl auth whoami)"
        )
    if code == 403:
        what = message or f"{request.verb} {request.resource} is forbidden"
        return Forbidden(
            f"{what}; ask your cluster's admin for access "
            f"(kubectl auth can-i {request.verb} {request.resource}{where})"
        )
    if code == 404:
        return _not_found(request, details, server)
    if code == 409 and status.get("reason") == "AlreadyExists":
        return AlreadyExists(
            f"job {request.name} already exists in namespace {request.namespace}: to replace "
            f"it, delete it first (meshrun delete {request.name} -n {request.namespace}), or "
            "give the new one another metadata.name"
        )
    if code == 400 and request.resource == "pods/log":
        # The container has not started, or has no previous run: the server says which.
        return Refused(f"{message} (meshrun status {request.job} shows the job's pods)")
    reason = status.get("reason") or getattr(error, "reason", "") or "Error"
    return Refused(
        f"the API server refused to {request.verb} {_what(request)}: {reason}: {message}"
    )


def _not_found(request: Request, details: dict[str, Any], server: str) -> ClientError:
    """A 404: the namespace, the object, or (no details at all) the resource itself is missing.

    The API server answers a missing object with a Status naming it in ``details``, and a path
    it serves nothing at (a group or resource it does not know) with no details, or with a
    plain-text ``404 page not found``.
    """
    kind = details.get("kind")
    if kind == "namespaces":
        return NotFound(
            f"namespace {details.get('name')} not found (kubectl get namespaces lists them)"
        )
    if details.get("name") and kind in (PLURAL, "pods"):
        if kind == PLURAL:
            return NotFound(
                f"no job {details['name']} in namespace {request.namespace} "
                f"(meshrun list -n {request.namespace} lists them)"
            )
        return NotFound(
            f"job {request.job} has no pod {details['name']} now "
            f"(meshrun status {request.job} -n {request.namespace} shows its pods)"
        )
    if request.resource == RESOURCE:
        return NotInstalled(
            f"the cluster at {server} does not serve ParallelTrainingJobs "
            f"({GROUP}/{VERSION}): {INSTALL_HINT}"
        )
    return NotFound(f"{_what(request)} not found")


def _what(request: Request) -> str:
    noun = "job" if request.resource == RESOURCE else request.resource
    named = f" {request.name}" if request.name else "s"
    place = f" in namespace {request.namespace}" if request.namespace else ""
    return f"{noun}{named}{place}"


def from_no_answer(error: BaseException, server: str, context: str | None) -> NoCluster:
    """The NoCluster for a request that got no answer (refused, timed out, TLS failed)."""
    reason = getattr(error, "reason", None) or error
    text = str(reason)
    # urllib3's texts carry the connection object's repr first: keep what follows it.
    for marker in ("Failed to establish a new connection: ", "): "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    which = f" (context {context})" if context else ""
    return NoCluster(
        f"cannot reach the cluster at {server}{which}: {text.strip()}; is it running, and is "
        "this the context you meant? (kubectl cluster-info; --context picks another)"
    )
