"""kopf's watch streams as /healthz sees them: one that ended leaves its resource unseen.

kopf runs one task per resource (and namespace) it watches, named ``watcher for
<resource>@<namespace>`` (kopf's orchestration). When one raises (a listing it cannot decode, a
bug), kopf's orchestrator drops it and stops the operator; one that returns is dropped and
started again only when the cluster's resources or namespaces change. Either way, until then the
operator no longer sees that resource change (its jobs, or their pods) while its own loops go on
and look healthy. So /healthz fails as soon as a watcher ended other than by a cancellation (kopf
cancels a watcher whose resource or namespace went away, and every one when it stops), and
passes again once kopf runs a watcher of that name anew.

kopf offers no hook for its watchers, and one can die within milliseconds of its start (at its
first listing), sooner than any periodic look at the event loop's tasks would see it. So every
task the loop creates gets a done callback that takes note of a watcher's end (a name test, for
the others); a probe looks at the loop's tasks for the watchers that run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from meshrun_operator.background import Stalled

WATCHER = "watcher for "
"""How kopf names a watcher's task (kopf._core.reactor.orchestration.spawn_missing_watchers)."""

TaskFactory = Any
"""An event loop's task factory (typeshed's type differs between Python versions)."""


class Watchers:
    """The ends of kopf's watcher tasks, seen through the event loop's task factory."""

    def __init__(self) -> None:
        self.ended: dict[str, str] = {}
        """How each watcher that ended other than by a cancellation ended, by its name."""
        self._installed: tuple[asyncio.AbstractEventLoop, TaskFactory] | None = None

    def install(self) -> None:
        """Follow every task the running loop creates from now on (call on the loop)."""
        loop = asyncio.get_running_loop()
        previous = loop.get_task_factory()

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **options: Any
        ) -> asyncio.Future[Any]:
            if previous is not None:
                task = previous(loop, coro, **options)
            else:
                task = asyncio.Task(coro, loop=loop, **options)
            task.add_done_callback(self._ended)
            return task

        loop.set_task_factory(factory)  # type: ignore[arg-type]  # typeshed: no options
        self._installed = (loop, previous)

    def uninstall(self) -> None:
        """Give the loop its previous task factory back."""
        if self._installed is not None:
            loop, previous = self._installed
            loop.set_task_factory(previous)
            self._installed = None

    def _ended(self, task: asyncio.Future[Any]) -> None:
        name = task.get_name() if isinstance(task, asyncio.Task) else ""
        if not name.startswith(WATCHER) or task.cancelled():
            return
        error = task.exception()
        self.ended[name] = "it returned" if error is None else f"it raised {error!r}"

    def check(self) -> dict[str, Any]:
        """What /healthz reports (call on the loop): the watchers that run; Stalled when one
        ended other than by a cancellation and kopf runs none of that name since."""
        running = {t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(WATCHER)}
        for name in running:
            self.ended.pop(name, None)  # kopf watches that resource again
        if self.ended:
            name, how = next(iter(self.ended.items()))
            raise Stalled(f"kopf's {name} ended ({how}): that resource's changes go unseen")
        return {"watching": sorted(name[len(WATCHER) :] for name in running)}
