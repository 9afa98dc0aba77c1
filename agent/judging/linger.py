"""A background thread that lingers: once work arrives it waits a little longer for more, then does it all
in one call, so that a stream of small submissions costs one call (and one wake-up) per linger period rather
than one per submission.

The judge queue (:mod:`agent.judging.queue`) and a challenger's thread
(:mod:`agent.dataplane.challenger`) both run one. The owner keeps its own queue under the condition it
hands over; the loop only reads, holding that condition, whether work waits (``pending``) and whether enough
waits to stop lingering (``enough``), and then calls ``work`` *without* it, so that ``work`` may take its
own locks in whatever order its owner needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from agent.core.os_threads import name_os_thread


class LingerLoop:
    """One named background thread over its owner's queue (see the module docstring). Every attribute that
    a submitter reads (:attr:`idle`, :attr:`stopping`, :attr:`running`) and :meth:`notify` are used holding
    ``cond``."""

    def __init__(
        self,
        cond: threading.Condition,
        name: str,
        linger_seconds: float,
        *,
        pending: Callable[[], bool],
        enough: Callable[[], bool],
        work: Callable[[], None],
    ) -> None:
        self.cond = cond
        self.name = name
        self.linger_seconds = linger_seconds
        self._pending = pending
        self._enough = enough
        self._work = work
        self._thread: threading.Thread | None = None
        #: True from :meth:`stop` until the next :meth:`start`: submitters stop handing work to the thread.
        self.stopping = False
        #: The thread waits for work: a submission must wake it (:meth:`notify`); a lingering one needs no wake-up.
        self.idle = False

    @property
    def running(self) -> bool:
        """Whether the thread was started and not stopped since."""
        return self._thread is not None

    def notify(self) -> None:
        """Wake the thread (holding ``cond``): it stops waiting or lingering and looks at its queue again."""
        self.idle = False
        self.cond.notify()

    def start(self) -> None:
        with self.cond:
            if self._thread is not None:
                return
            self.stopping = False
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Have the thread finish what is pending (bounded by ``timeout``) and end; what is left stays queued."""
        with self.cond:
            thread, self.stopping = self._thread, True
            self.cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self.cond:
            self._thread = None

    def _run(self) -> None:
        name_os_thread(self.name)
        while True:
            with self.cond:
                while not self._pending() and not self.stopping:
                    self.idle = True
                    self.cond.wait()
                self.idle = False
                if not self._pending():  # stopping, and nothing left
                    return
                deadline = time.monotonic() + self.linger_seconds
                while not self.stopping and not self._enough():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            self._work()
