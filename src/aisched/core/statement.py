"""Tentative changes to a session with commit/discard (Volcano's statement).

Every change goes through `take`/`give` or a registered undo step, so `discard()` restores the
session exactly: a gang that cannot be completed leaves no trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from aisched.core.decisions import TaskBinding

if TYPE_CHECKING:
    from aisched.core.session import Session


class Statement:
    __slots__ = ("_session", "_undo")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._undo: list[Callable[[], None]] = []

    def take(self, node: int, task: TaskBinding) -> None:
        free = self._session.free
        free.take(node, task)
        self._undo.append(lambda: free.give(node, task))

    def take_all(self, tasks: Iterable[TaskBinding]) -> None:
        """`take` every binding of `tasks`, each on its node."""
        index = self._session.arrays.index
        for t in tasks:
            self.take(index[t.node], t)

    def give(self, node: int, task: TaskBinding) -> None:
        free = self._session.free
        free.give(node, task)
        self._session.released()
        self._undo.append(lambda: free.take(node, task))

    def on_discard(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def depth(self) -> int:
        return len(self._undo)

    def rollback_to(self, depth: int) -> None:
        while len(self._undo) > depth:
            self._undo.pop()()

    def discard(self) -> None:
        while self._undo:
            self._undo.pop()()

    def commit(self) -> None:
        self._undo.clear()
