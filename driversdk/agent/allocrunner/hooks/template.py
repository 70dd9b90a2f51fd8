"""Template hook: each ``template`` of the task rendered into the task dir before it starts.

The data (``data``, or the file ``source`` below the task dir) is evaluated by
:mod:`driversdk.jobspec.templates` with the task's environment, and written to ``destination``
(relative to the task dir; ``${NOMAD_TASK_DIR}/x`` and ``local/x`` land in the same place,
``${NOMAD_ALLOC_DIR}/x`` in the shared alloc dir) with
``perms`` (and ``uid``/``gid`` when given). ``env = true`` templates are read as ``KEY=value``
lines into the task's environment, over its ``env`` as Nomad's. A template calling Consul, Vault
or Nomad functions is skipped with a task event.

The task dir belongs to the task, which may plant symlinks there (on a restart, or a recovered
run): every path is walked one component at a time from the task dir with ``O_NOFOLLOW``, a
link or non-directory on the way, a link or non-regular file at the destination is refused, and
the file is written under a temporary name and renamed into place (a rename replaces a name,
it never writes through it).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat

from driversdk.agent.allocrunner.hooks import TaskHook
from driversdk.agent.allocrunner.hooks.contract import TaskPrerunRequest, TaskPrerunResponse
from driversdk.dirwalk import UnsafeStep, open_parent
from driversdk.errors import ConfigError
from driversdk.jobspec import templates
from driversdk.jobspec.job import Template
from driversdk.jobspec.taskenv import TaskEnv
from driversdk.paths import show

MAX_SOURCE = 10 * 1024 * 1024  # a template source file larger than this is refused


class TemplateRenderError(ConfigError):
    """A template could not be rendered or written; the sentence names the task and template."""


class TemplateHook(TaskHook):
    name = "template"

    def prerun(self, req: TaskPrerunRequest) -> TaskPrerunResponse:
        task = req.task
        if req.restoring is not None or not task.task.templates:
            return TaskPrerunResponse()  # a recovered task's files and environment are there already
        for i, template in enumerate(task.task.templates):
            if template.cluster_functions:
                task.event(
                    f"Template: template[{i}] for {show(template.destination)} uses "
                    f"{', '.join(template.cluster_functions)}, which need a Consul, Vault or Nomad server; not "
                    "rendered by driversdk run"
                )
        return TaskPrerunResponse(template_env=self.render(req))

    def render(self, req: TaskPrerunRequest) -> dict[str, str]:
        """Render every template the node can answer (again, on a restart with render_templates);
        what the ``env = true`` ones set, for the task's environment."""
        t = req.task.task
        env = TaskEnv(req.env)
        variables = {**req.env, **{k: env.replace(v) for k, v in t.env.items()}}
        alloc_dir = req.task.alloc.alloc_dir
        template_env: dict[str, str] = {}
        for i, template in enumerate(t.templates):
            if template.cluster_functions:
                continue
            where = f'task "{t.name}" template[{i}]'
            root, dest = place(env.replace(template.destination), alloc_dir, t.name, f"{where} destination")
            if template.source:
                src_root, src = place(env.replace(template.source), alloc_dir, t.name, f"{where} source")
                text = _read(src_root, src, where)
            else:
                text = template.data
            try:
                out = templates.render(text, variables, template.left_delimiter, template.right_delimiter)
                if template.env:
                    template_env.update(templates.parse_env(out))
            except templates.TemplateError as err:
                raise TemplateRenderError(f"{where} ({show(template.destination)}): {err}") from None
            _write(root, dest, out.encode(), template, where)
        rendered = len([x for x in t.templates if not x.cluster_functions])
        if rendered:
            req.task.event(f"Template: rendered {rendered} template(s)")
        return template_env


def place(path: str, alloc_dir: str, task: str, what: str) -> tuple[str, list[str]]:
    """The directory a template path is walked from and its components below it: the task dir
    (``/local/x``, ``local/x`` and the host path raw_exec's ``NOMAD_TASK_DIR`` gives all mean
    ``<task dir>/local/x``), or the shared alloc dir for ``alloc/…`` (``${NOMAD_ALLOC_DIR}/x``), as
    Nomad's task dir holds the shared one at ``alloc/``."""
    task_dir = os.path.join(alloc_dir, task)
    shared = os.path.join(alloc_dir, "alloc")
    for root in (shared, task_dir):
        if path.startswith(root.rstrip("/") + "/"):
            path = path[len(root.rstrip("/")) + 1 :]
            if root == shared:
                path = "alloc/" + path
            break
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or any("\x00" in p for p in parts) or parts == ["alloc"]:
        raise TemplateRenderError(
            f"{what} {show(path)} must be a file path inside the task dir, without '..' (such as \"local/app.conf\")"
        )
    if parts[0] == "alloc":
        return shared, parts[1:]
    return task_dir, parts


def _open_dir(task_dir: str, parts: list[str], where: str, *, create: bool) -> int:
    """A descriptor of the directory holding ``parts[-1]``, walked without following links."""
    try:
        return open_parent(task_dir, parts, create=create)
    except UnsafeStep as step:
        if step.missing:
            raise TemplateRenderError(f"{where}: {show('/'.join(parts))} does not exist in the task dir") from None
        raise TemplateRenderError(
            f"{where}: {show(step.name)} in {show('/'.join(parts))} is a symbolic link or not a directory; "
            "driversdk run never follows a link in the task dir"
        ) from None


def _read(task_dir: str, parts: list[str], where: str) -> str:
    fd = _open_dir(task_dir, parts, f"{where} source", create=False)
    try:
        try:
            src = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise TemplateRenderError(
                    f"{where} source {show('/'.join(parts))} is a symbolic link; driversdk run never follows a link "
                    "in the task dir"
                ) from None
            raise TemplateRenderError(f"{where} source {show('/'.join(parts))}: {err.strerror}") from None
        try:
            info = os.fstat(src)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE:
                raise TemplateRenderError(
                    f"{where} source {show('/'.join(parts))} must be a regular file of at most {MAX_SOURCE} bytes"
                )
            data = os.read(src, MAX_SOURCE + 1)
        finally:
            os.close(src)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TemplateRenderError(f"{where} source {show('/'.join(parts))} is not UTF-8 text") from None


def _write(task_dir: str, parts: list[str], data: bytes, template: Template, where: str) -> None:
    shown = show("/".join(parts))
    # Checked before anything is made on the way (validate says it first; a job never gets here).
    why = templates.perms_problem(template.perms, template.destination)
    if why is not None:
        raise TemplateRenderError(f"{where}: {why}")
    fd = _open_dir(task_dir, parts, f"{where} destination", create=True)
    try:
        name = parts[-1]
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISLNK(info.st_mode):
                raise TemplateRenderError(
                    f"{where} destination {shown} is a symbolic link; driversdk run never writes through a link in "
                    "the task dir (remove it, or render to another destination)"
                )
            if not stat.S_ISREG(info.st_mode):
                raise TemplateRenderError(f"{where} destination {shown} exists and is not a regular file")
        mode = int(template.perms, 8)
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view) :]
                if template.uid is not None or template.gid is not None:
                    os.fchown(out, -1 if template.uid is None else template.uid,
                              -1 if template.gid is None else template.gid)  # fmt: skip
                os.fchmod(out, mode)
            finally:
                os.close(out)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
