"""Memory of what keeps N running exec tasks supervised: driversdk's processes beside the tasks.

Run as root: python3 bench/bench_supervisor.py [--tasks 100] [--before-tree DIR]

Starts N exec tasks (``/bin/sleep``) through a real exec plugin and sums the resident memory
(VmRSS) of every task supervisor of its state dir (``launch.py supervise`` per task before,
one ``launch.py serve`` now) and of every runc process naming one of the tasks' containers. The
plugin's own RSS is printed beside it. ``--before-tree`` names an unpacked earlier checkout
(``git archive <commit> | tar -x -C DIR``) to measure the same way, side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


@dataclass(frozen=True)
class Figure:
    tree: str
    tasks: int
    supervisors: int
    supervisor_rss: int
    runcs: int
    runc_rss: int
    plugin_rss: int

    def line(self) -> str:
        total = self.supervisor_rss + self.runc_rss
        return (
            f"{self.tree}\n  {self.tasks:>5} tasks | supervisors {self.supervisors:>4} "
            f"{self.supervisor_rss / MIB:8.1f} MiB | runc {self.runcs:>4} {self.runc_rss / MIB:8.1f} MiB | "
            f"total {total / MIB:8.1f} MiB ({total / self.tasks / MIB:.2f} MiB/task) | "
            f"plugin {self.plugin_rss / MIB:.1f} MiB"
        )


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _argvs() -> dict[int, list[bytes]]:
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
    return found


def measure(tree: Path, tasks: int) -> Figure:
    """Run the plugin of ``tree`` (its drivers and driversdk, not the installed ones) from a child."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), str(tasks)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    sup, sup_rss, runcs, runc_rss, plugin_rss = (int(v) for v in out.strip().splitlines()[-1].split())
    return Figure(str(tree), tasks, sup, sup_rss, runcs, runc_rss, plugin_rss)


def child(tree: str, tasks: int) -> None:
    sys.path.insert(0, tree)  # that checkout's driversdk, whatever is installed
    from driversdk.testing import AllocDir, DriverHarness

    base = Path(tempfile.mkdtemp(prefix="bench-supervisor-"))
    state = base / "state"
    names = [f"t{i}" for i in range(tasks)]
    alloc = AllocDir.create(base / "allocs", tasks=names)
    config = {"state_dir": str(state), "cgroup_parent": f"driversdk-bench-{uuid.uuid4().hex[:8]}"}
    plugin = [sys.executable, "-m", "drivers.exec"]
    sleep = {"command": "/bin/sleep", "args": ["600"]}
    with DriverHarness(plugin, plugin_config=config, env={**os.environ, "PYTHONPATH": tree}) as h:
        started = [h.start(alloc.task_config(n, driver_config=sleep)) for n in names]
        cids = {n.encode() for n in os.listdir(state / "tasks") if n.startswith("dsx-") and not n.endswith(".json")}
        sup = runcs = sup_rss = runc_rss = 0
        for pid, argv in _argvs().items():
            if any(b"launch.py" in a for a in argv) and any(str(state).encode() in a for a in argv):
                sup += 1
                sup_rss += _rss(pid)
            elif argv and os.path.basename(argv[0]) == b"runc" and cids.intersection(argv):
                runcs += 1
                runc_rss += _rss(pid)
        plugin_rss = _rss(h.client.process.pid)
        for handle in started:
            h.client.destroy_task(handle.config.id, force=True)
            h.forget(handle.config.id)
    alloc.close()
    print(sup, sup_rss, runcs, runc_rss, plugin_rss)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--before-tree", type=Path)
    args = parser.parse_args()
    figures = []
    if args.before_tree is not None:
        figures.append(measure(args.before_tree.resolve(), args.tasks))
    figures.append(measure(REPO, args.tasks))
    for figure in figures:
        print(figure.line())
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(main())
