"""A problem found before a start: where it is (file, job, group, task, field) and what to do."""

from __future__ import annotations

from dataclasses import dataclass

from driversdk.errors import ConfigError
from driversdk.paths import show


@dataclass(frozen=True)
class Problem:
    file: str
    message: str
    job: str = ""
    group: str = ""
    task: str = ""
    field: str = ""

    def __str__(self) -> str:
        where = [self.file] if self.file else []
        # Names come from the job file: a hostile one is shown escaped and shortened, so it can
        # neither flood the output nor forge lines of it.
        if self.job:
            where.append(f"job {show(self.job)}")
        if self.group:
            where.append(f"group {show(self.group)}")
        if self.task:
            where.append(f"task {show(self.task)}")
        if self.field:
            where.append(self.field)
        return f"{', '.join(where)}: {self.message}" if where else self.message

    def as_dict(self) -> dict[str, str]:
        return {
            "file": self.file,
            "job": self.job,
            "group": self.group,
            "task": self.task,
            "field": self.field,
            "message": self.message,
            "text": str(self),
        }


class ValidationFailed(ConfigError):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
