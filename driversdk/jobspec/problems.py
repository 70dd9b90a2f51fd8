"""A problem found before a start: where it is (file, job, group, task, field) and what to do."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, replace

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
    # The line in ``file``, when known; set through :meth:`at` (the other fields are all text,
    # and callers pass them as ``**where``).
    line: int = dataclasses.field(default=0, init=False)

    @classmethod
    def at(cls, line: int, file: str, message: str, **where: str) -> Problem:
        problem = cls(file, message, **where)
        object.__setattr__(problem, "line", line)
        return problem

    def __str__(self) -> str:
        if self.file and self.message.startswith(f"{self.file}:") and not (self.job or self.group or self.task):
            return self.message  # a file-level sentence that names its place itself (file:line:column)
        where = [f"{self.file}:{self.line}" if self.file and self.line else self.file] if self.file else []
        # Names come from the job file: a hostile one is shown escaped and shortened, so it can
        # neither flood the output nor forge lines of it.
        if self.job:
            where.append(f"job {show(self.job)}")
        if self.group:
            where.append(f"group {show(self.group)}")
        if self.task:
            where.append(f"task {show(self.task)}")
        # A field that only repeats the place ("job") or that the sentence starts with is not shown twice.
        shown = self.field and self.field not in _PLACES
        if shown and not self.message.startswith((f"{self.field} ", f"{self.field}:")):
            where.append(self.field)
        return f"{', '.join(where)}: {self.message}" if where else self.message

    def as_dict(self) -> dict[str, str | int | None]:
        # ``line`` is a number where the problem has a place in its file, null where it has none
        # (a file that cannot be read, a problem of the whole job): never text.
        return {
            "file": self.file,
            "job": self.job,
            "group": self.group,
            "task": self.task,
            "field": self.field,
            "line": self.line or None,
            "message": self.message,
            "text": str(self),
        }


_PLACES = ("file", "job", "group", "task")
_KEY = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)[: ]")


def with_field(problem: Problem) -> Problem:
    """``problem`` with ``field`` filled: the key its sentence starts with ("resources: …",
    "kill_timeout '5 minutes' …"), else the most specific place it names (task, group, job,
    or the file)."""
    if problem.field:
        return problem
    match = _KEY.match(problem.message)
    if match and match.group(1) not in ("a", "the", "this", "volume", "task", "group", "job", "no", "only"):
        guess = match.group(1)
    elif problem.task:
        guess = "task"
    elif problem.group:
        guess = "group"
    elif problem.job:
        guess = "job"
    else:
        guess = "file"
    filled = replace(problem, field=guess)
    object.__setattr__(filled, "line", problem.line)
    return filled


class ValidationFailed(ConfigError):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
