"""Stepping trio's scheduler: let every task run, list the tasks, cancel at a chosen step."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio
import trio.testing


async def settle() -> None:
    """Let every task run until all are blocked (no clock time passes)."""
    await trio.testing.wait_all_tasks_blocked()


def all_tasks() -> list[trio.lowlevel.Task]:
    """Every task of the current run (to pick one for ``CancelAtStep`` to watch)."""
    found, pending = [], [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        if task is None:
            continue
        found.append(task)
        pending.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return found


@attrs.define(eq=False)
class CancelAtStep(trio.abc.Instrument):
    """Cancel ``scope()`` just before the ``at_step``-th step of the tasks ``watch``
    picks, counting only once ``scope()`` returns a scope. Run a scenario for
    ``at_step = 1, 2, ...`` until ``fired`` stays False: every await point of the path
    has then been cancelled once. Install with ``trio.lowlevel.add_instrument``."""

    watch: Callable[[trio.lowlevel.Task], bool]
    scope: Callable[[], trio.CancelScope | None]
    at_step: int
    steps: int = 0
    fired: bool = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.fired or not self.watch(task):
            return
        scope = self.scope()
        if scope is None:
            return
        self.steps += 1
        if self.steps == self.at_step:
            self.fired = True
            scope.cancel()
