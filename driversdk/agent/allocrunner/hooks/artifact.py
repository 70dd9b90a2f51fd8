"""Artifact hook: each ``artifact`` of the task fetched into the task dir before it starts.

As Nomad's artifact hook: a "Downloading Artifacts" event, then each artifact in order (source,
destination, options and headers interpolated with the task's environment); an artifact fetched
once is not fetched again when the task restarts. A failure is a "Failed Artifact Download" event
with the reason, and a recoverable error, so the task's restart policy decides whether to try
again. What is fetched and how is :mod:`driversdk.jobspec.artifacts`.
"""

from __future__ import annotations

import os

from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.agent.allocrunner.hooks.contract import TaskPrerunRequest, TaskPrerunResponse
from driversdk.jobspec import artifacts

DOWNLOADING = "Downloading Artifacts"  # Nomad's TaskDownloadingArtifacts
FAILED = "Failed Artifact Download"  # Nomad's TaskArtifactDownloadFailed


class ArtifactHook(TaskHook):
    name = "artifact"

    def __init__(self) -> None:
        self._done: set[int] = set()  # fetched already: not again on a restart (Nomad's DoneArtifacts)

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        task = req.task
        wanted = [i for i in range(len(task.task.artifacts)) if i not in self._done]
        if req.restoring is not None or not wanted:
            return TaskPrerunResponse()  # a recovered task's artifacts are there already
        task.event("Client is downloading artifacts", type=DOWNLOADING)
        task_dir = os.path.join(task.alloc.alloc_dir, task.task.name)
        for i in wanted:
            a = task.task.artifacts[i]
            options = {k: str(req.interpolate(v)) for k, v in a.options.items()}
            item = artifacts.Fetch(
                source=str(req.interpolate(a.source)),
                destination=str(req.interpolate(a.destination)),
                mode=a.mode,
                checksum=options.get("checksum", ""),
                archive=options.get("archive", "true").lower() != "false",
                headers=tuple((k, str(req.interpolate(v))) for k, v in a.headers.items()),
                insecure=a.insecure,
            )
            where = f'task "{task.task.name}" artifact[{i}]'
            try:
                artifacts.fetch(item, task_dir, task.alloc.alloc_dir, where)
            except artifacts.ArtifactError as err:
                task.event(f"Failed to download artifacts: {err}", type=FAILED, details={"download_error": str(err)})
                raise
            self._done.add(i)
        return TaskPrerunResponse()
