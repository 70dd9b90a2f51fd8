"""One registered job's allocations inside the agent, run in a thread of their own.

The allocations are started in the order and batches ``driversdk run`` uses (CSI plugin groups
first, fresh allocations of a plain group side by side), followed until every main task has
finished, and then stopped and closed (their hooks undone, claims released). A stop request
(``DELETE /v1/job/:id``) ends the wait at once. A job recovered after an agent restart takes its
allocations back from their records (RecoverTask, the log collectors and mounts adopted) instead
of starting new ones; one that was stopped while the agent was down is recovered only to be
stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from driversdk.agent.events import Emit, RunEvent, error_event
from driversdk.errors import DriverSDKError, StateWriteError
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.jobspec.job import Job

if TYPE_CHECKING:
    from driversdk.agent.allocrunner.allocrunner import AllocRunner, NodeServices
    from driversdk.agent.pluginmanager.drivermanager import DriverManager


@dataclass
class JobRunner:
    job: Job
    client: ClientConfig
    node: NodeServices
    drivers: DriverManager
    emit: Emit
    on_end: Callable[[JobRunner], None]
    # Recovered only to be stopped: the job was stopped while the agent was down.
    only_to_stop: bool = False
    # Recovered after every allocation of this version had been started: an allocation with no
    # running record ended (or was never to run again) and is not started a second time.
    started: bool = False
    # Called once every allocation was started or recovered (the job is then ``running``).
    on_running: Callable[[JobRunner], None] | None = None
    allocs: list[AllocRunner] = field(default_factory=list)
    failure: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    _bounds: list[int] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"job-{self.job.name}", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop every allocation of the job (each task gets its kill_timeout); with ``wait``,
        return once they are all stopped and closed."""
        self.stopping.set()
        if wait:
            self.ended.wait()

    def _run(self) -> None:
        from driversdk.agent import run

        try:
            plan = run._plan([self.job], self.node)
            if self.only_to_stop or self.started:
                plan = [item for item in plan if item[3] is not None]
            for batch in run._batches(plan):
                if self.stopping.is_set() and not self.only_to_stop:
                    break
                try:
                    run._start_batch(batch, self.client, self.emit, self.node, self.drivers, self.allocs,
                                     self.stopping if not self.only_to_stop else threading.Event())  # fmt: skip
                finally:
                    self._bounds.append(len(self.allocs))
            if not self.only_to_stop:
                if self.on_running is not None and not self.stopping.is_set():
                    self.on_running(self)
                self._follow()
        except StateWriteError as err:
            # This job's allocations could not be recorded: it fails with that sentence and is
            # torn down; the node (the agent's other jobs) goes on.
            self.failure = str(err)
            self.emit(error_event(f"job {self.job.name!r} stopped: {err}", job=self.job.name))
        except DriverSDKError as err:
            if not self.stopping.is_set():
                self.failure = str(err)
                failed = run._failed(err, self.allocs)
                self.emit(failed.event)
        except BaseException as err:
            self.failure = f"{type(err).__name__}: {err}"
            self.emit(error_event(f"job {self.job.name!r} stopped by an unexpected error: {self.failure}",
                                  job=self.job.name))  # fmt: skip
        finally:
            try:
                run._tear_down(self.allocs, self._bounds)
            except DriverSDKError as err:
                self.emit(RunEvent("error", f"stopping job {self.job.name!r}: {err}", job=self.job.name))
            finally:
                self.ended.set()
                self.on_end(self)

    def _follow(self) -> None:
        """Until every main task has finished (CSI plugin tasks serve the others, and sidecars are
        stopped with their main tasks), or the job is stopped."""
        tasks = [t for a in self.allocs for t in a.tasks]
        main = [t for t in tasks if t.task.csi_plugin is None] or tasks
        for t in main:
            while not self.stopping.is_set() and not t.done.wait(0.5):
                pass
