#!/usr/bin/env python3
"""`driversdk job status` against a running agent beside `docker ps` (issue 26: at most 2x),
measured as a user runs it: the console script of a wheel installed in a clean venv (no system
site-packages, whose .pth files would cost every interpreter ~20 ms), interleaved round by round
with ``docker ps`` and ``<venv>/bin/python -c pass`` (the interpreter's floor); medians printed,
nothing asserted.

The venv is built from ``git archive REV`` (``--ref``, default HEAD), so a figure from before a
change is measured the same way as one after it. The agent is the working tree's (``agent -dev``
on a data dir of the bench's own): only the client differs between refs. Figures with no job and
with one running docker job (busybox ``sleep``, so ``docker ps`` lists one container too).
Everything (the job, the agent, the temp dir with the venv) is removed at the end, whatever happens.

    python3 bench/bench_cli_status.py [--ref REV] [--rounds N] [--no-job]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from driversdk.cli.apiclient import AgentClient  # noqa: E402 - from the working tree, as above

GOAL_RATIO = 2.0
JOB = """job "bench-status" {
  type = "service"
  group "g" {
    task "t" {
      driver = "docker"
      config {
        image   = "driversdk-test/busybox:local"
        command = "sleep"
        args    = ["3600"]
      }
    }
  }
}
"""


def build_venv(work: Path, ref: str) -> Path:
    """A clean venv with driversdk installed from a wheel of ``ref``; its bin directory."""
    src = work / "src"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "--prefix=src/"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
    wheels = work / "whl"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    # The agent verbs need only the standard library: no dependency is installed.
    wheel = [str(w) for w in wheels.glob("*.whl")]
    subprocess.run([*pip, "--python", str(work / "venv" / "bin" / "python"), "install", "-q", "--no-deps", *wheel],
                   check=True)  # fmt: skip
    return work / "venv" / "bin"


class Agent:
    def __init__(self, work: Path) -> None:
        self.data = work / "data"
        self.config = work / "agent.hcl"
        self.log = work / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"unix://{self.data / 'agent.sock'}"

    def client(self) -> AgentClient:
        return AgentClient(self.address, timeout=60)

    def start(self) -> None:
        self.data.mkdir(mode=0o700)
        self.config.write_text(f'data_dir = "{self.data}"\n')
        with open(self.log, "ab") as log:
            argv = [sys.executable, "-m", "driversdk.cli", "agent", "-dev", "-config", str(self.config)]
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the agent exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                self.client().get("/v1/agent/self")
                return
            except Exception:
                time.sleep(0.05)
        raise SystemExit(f"the agent did not answer within 60 s:\n{self.log.read_text()[-3000:]}")

    def run_job(self) -> None:
        client = self.client()
        job = client.request("POST", "/v1/jobs/parse", body={"JobHCL": JOB})[0]
        client.request("PUT", "/v1/jobs", body={"Job": job})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            allocs = client.get("/v1/job/bench-status/allocations") or []
            if any(a["ClientStatus"] == "running" for a in allocs):
                return
            if any(a["ClientStatus"] in ("failed", "complete", "lost") for a in allocs):
                raise SystemExit(f"the bench's job did not keep running: {allocs}")
            time.sleep(0.1)
        raise SystemExit("the bench's job was not running within 60 s")

    def stop(self) -> None:
        """Every job stopped and purged (an agent's exit leaves its tasks running), then SIGTERM."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            client = self.client()
            for job in client.get("/v1/jobs") or []:
                client.request("DELETE", f"/v1/job/{job['ID']}", {"purge": "true"})
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and client.get("/v1/jobs"):
                time.sleep(0.1)
        except Exception as err:
            print(f"(stopping the jobs through the API failed: {err})", file=sys.stderr)
        finally:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took


def measure(commands: dict[str, list[str]], env: dict[str, str], rounds: int) -> dict[str, float]:
    """Median seconds of each command, run in turn each round (the order rotating)."""
    names = list(commands)
    for name in names:  # warm: page cache, docker's first answer
        timed(commands[name], env)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            samples[name].append(timed(commands[name], env))
    return {name: statistics.median(values) for name, values in samples.items()}


def importtime(python: Path, script: Path, env: dict[str, str]) -> list[tuple[int, str]]:
    """The top-level imports of one ``job status`` (-X importtime): cumulative µs and name, largest first."""
    done = subprocess.run([str(python), "-X", "importtime", str(script), "job", "status"], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    top = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if not name.startswith("  ") and cumulative.strip().isdigit():
                top.append((int(cumulative), name.strip()))
    return sorted(top, reverse=True)


def report(label: str, medians: dict[str, float]) -> None:
    ratio = medians["driversdk job status"] / medians["docker ps"]
    print(f"  {label}")
    for name, value in medians.items():
        print(f"    {name:<24}{value * 1000:8.1f} ms")
    verdict = "ok" if ratio <= GOAL_RATIO else "over"
    print(f"    {'ratio to docker ps':<24}{ratio:8.2f}     goal <= {GOAL_RATIO:.1f}  {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="HEAD", help="the commit whose driversdk is measured (git archive)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--no-job", action="store_true", help="only the figures with no job")
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.ref], capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="dsc-", dir="/tmp"))  # short: the agent's sockets live under it
    agent = Agent(work)
    try:
        bin_dir = build_venv(work, args.ref)
        agent.start()
        env = {k: v for k, v in os.environ.items() if k not in ("NOMAD_TOKEN", "PYTHONPATH", "VIRTUAL_ENV")}
        env["NOMAD_ADDR"] = agent.address
        commands = {
            "driversdk job status": [str(bin_dir / "driversdk"), "job", "status"],
            "docker ps": ["docker", "ps"],
            "python -c pass": [str(bin_dir / "python"), "-c", "pass"],
        }
        print(f"driversdk job status at {args.ref} ({commit}), clean venv from its wheel; medians of {args.rounds}")
        report("no job", measure(commands, env, args.rounds))
        if not args.no_job:
            agent.run_job()
            report("one running job", measure(commands, env, args.rounds))
        print("  largest top-level imports of one `job status` (-X importtime, cumulative):")
        for micros, name in importtime(bin_dir / "python", bin_dir / "driversdk", env)[:8]:
            print(f"    {name:<32}{micros / 1000:6.1f} ms")
    finally:
        agent.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
