"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

Several operator processes (two replicas, or an old pod on a node that lost its network and a new
one) may run at once: all watch and keep their indexes warm, only the holder of the Lease acts.

- A candidate takes the Lease when it is free, released, or unchanged for its
  ``leaseDurationSeconds`` as measured on the candidate's own clock from the moment its read of
  the changed record returned (client-go's observedTime; so clock skew between nodes does not
  matter, and a slow read cannot make a standby start counting before the holder's renewal).
- The holder renews it every ``retry`` seconds and counts itself leader only while its last
  successful renewal started less than ``renew_deadline`` ago; ``renew_deadline`` is shorter
  than ``duration``, so a holder cut off from the API server stops acting before anyone else
  may take over. The API door refuses every write while this process is not the leader, checks
  again once the write holds a connection (after its login and its wait for a free connection),
  and gives every write a deadline at the end of the lease (kube.py), so an old leader that wakes
  up late (a frozen VM, a partitioned node) writes nothing.
- On a clean shutdown the holder releases the Lease, and a standby takes over at once.
- The loop survives any failure of its own (background.py): an error answer or none is tried
  again at the next retry, anything else after a backoff; /healthz fails when it ended or has not
  completed an attempt for its deadline.

The kubernetes client's own ``leaderelection`` blocks a thread per candidate, talks through the
global default client without request timeouts, and gives up for good after losing the lease; this
one runs in the operator's event loop, over connections of its own, with the same timeouts as
every other request.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from meshrun_operator import metrics
from meshrun_operator.background import Liveness
from meshrun_operator.client.errors import NO_ANSWER, ApiError, ApiTimeout
from meshrun_operator.client.lease import LeaseApi
from meshrun_operator.client.login import own_namespace
from meshrun_operator.client.rest import Rest

logger = logging.getLogger("meshrun.operator")


@dataclass(frozen=True)
class LeaseTiming:
    """client-go's defaults: 15 s lease, 10 s renew deadline, 2 s between attempts."""

    duration: float = 15.0
    """``leaseDurationSeconds``: how long a standby waits after the last renewal it saw."""
    renew_deadline: float = 10.0
    """The holder stops acting when its last successful renewal started this long ago."""
    retry: float = 2.0
    """Seconds between two attempts to acquire or renew."""

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.duration:
            raise ValueError(
                f"lease timing: need 0 < retry ({self.retry:g}) < renew deadline "
                f"({self.renew_deadline:g}) < duration ({self.duration:g})"
            )


@dataclass(frozen=True)
class LeaseRef:
    """Which Lease the candidates share, and who this one is."""

    name: str
    """The Lease's name."""
    namespace: str
    """Its namespace (the operator's own)."""
    identity: str
    """This process's ``holderIdentity`` (unique per process)."""


def _micro_time(moment: datetime) -> str:
    """A MicroTime as the API server writes it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """Acquires and renews the Lease; ``leading()`` says whether this process may act now."""

    def __init__(
        self,
        api: LeaseApi,
        lease: LeaseRef,
        timing: LeaseTiming | None = None,
        deadline: float = 300.0,
    ) -> None:
        self.api, self.lease = api, lease
        self.timing = timing or LeaseTiming()
        self.liveness = Liveness(
            "lease loop", deadline, backoff_base=self.timing.retry, backoff_max=self.timing.duration
        )
        """Progress: an attempt that got its answers (whoever holds the lease)."""
        self._renewed_at: float | None = None
        """Monotonic time when the last successful acquire or renewal was sent."""
        self._observed: tuple[Any, ...] | None = None
        """The last Lease record seen (holder, renew time, duration)."""
        self._observed_at = 0.0
        """Monotonic time when a read first returned that record."""

    def leading(self) -> bool:
        return self.write_seconds() > 0

    def write_seconds(self) -> float:
        """How long this process may still act (0 when it does not lead): until its last
        successful renewal, counted from before that renewal was sent, is ``renew_deadline``
        old."""
        renewed = self._renewed_at
        if renewed is None:
            return 0.0
        return max(0.0, renewed + self.timing.renew_deadline - time.monotonic())

    async def run(self, on_change: Callable[[bool], None]) -> None:
        """Try to acquire or renew every ``retry`` seconds forever; ``on_change(leading)`` on
        each transition (and the leader gauge)."""
        was = False
        while True:
            try:
                await self._try_acquire_or_renew()
                self.liveness.progressed()
            except (ApiError, *NO_ANSWER) as error:
                logger.warning("leader election: lease %s: %s", self.lease.name, error)
            except (Exception, asyncio.CancelledError) as error:
                await self.liveness.failed(error)
            now = self.leading()
            if now != was:
                logger.info(
                    "leader election: %s %s lease %s/%s",
                    self.lease.identity,
                    "holds" if now else "lost",
                    self.lease.namespace,
                    self.lease.name,
                )
                metrics.LEADER.set(1 if now else 0)
                on_change(now)
                was = now
            await asyncio.sleep(self.timing.retry)

    async def _try_acquire_or_renew(self) -> None:
        sent = time.monotonic()  # a renewal counts from before it was sent: the safe side
        me = self.lease.identity
        current = await self.api.read(self.lease.namespace, self.lease.name)
        seen = time.monotonic()  # another's record counts from when the read returned
        wall = _micro_time(datetime.now(UTC))
        duration = max(1, round(self.timing.duration))
        if current is None:
            first: dict[str, Any] = {
                "holderIdentity": me,
                "leaseDurationSeconds": duration,
                "acquireTime": wall,
                "renewTime": wall,
                "leaseTransitions": 0,
            }
            if await self.api.create(self.lease.namespace, self.lease.name, first):
                self._renewed_at = sent
            return
        spec: dict[str, Any] = current.get("spec") or {}
        holder = spec.get("holderIdentity") or None
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, seen
        held_for = float(spec.get("leaseDurationSeconds") or self.timing.duration)
        if holder not in (None, me) and time.monotonic() < self._observed_at + held_for:
            return  # someone else holds it, and renewed it recently enough
        mine = holder == me
        new_spec = {
            **spec,
            "holderIdentity": me,
            "leaseDurationSeconds": duration,
            "acquireTime": spec.get("acquireTime") if mine else wall,
            "renewTime": wall,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if mine else 1),
        }
        version = str(current["metadata"]["resourceVersion"])
        if await self.api.replace(self.lease.namespace, self.lease.name, version, new_spec):
            self._renewed_at = sent
            self._observed = (me, wall, duration)

    async def release(self) -> None:
        """Give the Lease up (clean shutdown) so a standby takes over without waiting."""
        if not self.leading():
            return
        self._renewed_at = None
        metrics.LEADER.set(0)
        try:
            current = await self.api.read(self.lease.namespace, self.lease.name)
            spec = (current or {}).get("spec") or {}
            if current is None or spec.get("holderIdentity") != self.lease.identity:
                return
            wall = _micro_time(datetime.now(UTC))
            released = {
                **spec,
                "holderIdentity": None,
                "leaseDurationSeconds": 1,
                "acquireTime": wall,
                "renewTime": wall,
            }
            version = str(current["metadata"]["resourceVersion"])
            await self.api.replace(self.lease.namespace, self.lease.name, version, released)
        except (ApiError, *NO_ANSWER) as error:
            logger.warning(
                "leader election: could not release lease %s: %s", self.lease.name, error
            )


@dataclass(frozen=True)
class LeaderOptions:
    """``--leader-election`` and its settings."""

    lease: str
    """Name of the Lease."""
    namespace: str
    """Its namespace."""
    timing: LeaseTiming
    """Duration, renew deadline and retry period."""

    def elector(self, rest: Rest, deadline: float = 300.0) -> Elector:
        """An Elector for this process (identity: host name and a random suffix), talking
        through ``rest``, a session of its own; each Lease request ends within the renew
        deadline; /healthz fails after ``deadline`` seconds without a completed attempt."""
        identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        bounded = ApiTimeout(
            connect=min(rest.timeout.connect, self.timing.renew_deadline),
            read=min(rest.timeout.read, self.timing.renew_deadline),
            total=self.timing.renew_deadline,
        )
        api = LeaseApi(rest, bounded)
        ref = LeaseRef(self.lease, self.namespace, identity)
        return Elector(api, ref, self.timing, deadline)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line flags of leader election."""
    group = parser.add_argument_group("leader election (one acting operator among replicas)")
    group.add_argument(
        "--leader-election",
        action="store_true",
        help="act only while holding a coordination.k8s.io Lease (run several replicas)",
    )
    group.add_argument(
        "--leader-election-lease", default="meshrun-operator", help="the Lease's name"
    )
    group.add_argument(
        "--leader-election-namespace",
        help="the Lease's namespace (default: the operator's own, from POD_NAMESPACE or its "
        "service account)",
    )
    defaults = LeaseTiming()
    for flag, default, meaning in (
        ("--lease-duration-seconds", defaults.duration, "a standby takes over this long after "
         "the last renewal it saw"),
        ("--lease-renew-deadline-seconds", defaults.renew_deadline, "the leader stops acting "
         "when it could not renew for this long"),
        ("--lease-retry-seconds", defaults.retry, "between two attempts to acquire or renew"),
    ):  # fmt: skip
        group.add_argument(
            flag, type=float, default=default, help=f"{meaning} (default {default:g})"
        )


def from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> LeaderOptions | None:
    """The leader election asked for on the command line, or None; bad values exit 2."""
    if not args.leader_election:
        return None
    namespace = args.leader_election_namespace or own_namespace()
    if not namespace:
        parser.error("--leader-election-namespace: needed outside a pod (no POD_NAMESPACE)")
    try:
        timing = LeaseTiming(
            duration=args.lease_duration_seconds,
            renew_deadline=args.lease_renew_deadline_seconds,
            retry=args.lease_retry_seconds,
        )
    except ValueError as error:
        parser.error(f"--lease-*-seconds: {error}")
    return LeaderOptions(args.leader_election_lease, namespace, timing)
