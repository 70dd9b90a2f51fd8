"""``driversdk validate`` and ``driversdk run``: the commands that take job files."""

from __future__ import annotations

import argparse
import json
import os
import sys

from driversdk.errors import DriverSDKError

# As `nomad job run -json`; a file whose first non-space character is { is read as JSON anyway.
_JOB_JSON = "the job file is JSON in Nomad's API format (one dash; --json is the output format)"


# As `nomad job run -hcl1` of Nomad 1.0-1.5: the job file is HCL1, read as jobspec v1 read it.
_JOB_HCL1 = "the job file is HCL1, as older Nomad versions ran it with -hcl1 (no variables or functions)"


def add_job_input_flags(parser: argparse.ArgumentParser) -> None:
    """What `validate` and `run` both read a job file with: its format (-json / -hcl1) and its
    variables."""
    job_format = parser.add_mutually_exclusive_group()  # a job file is JSON or HCL1, not both
    job_format.add_argument("-json", dest="job_json", action="store_true", help=_JOB_JSON)
    job_format.add_argument("-hcl1", dest="job_hcl1", action="store_true", help=_JOB_HCL1)
    # As `nomad job run`: -var NAME=VALUE and -var-file FILE, repeatable, the last value wins
    # (after NOMAD_VAR_<name> from the environment).
    parser.add_argument(
        "-var", "--var", action="append", metavar="NAME=VALUE", help="a value for a variable the job declares"
    )
    parser.add_argument(
        "-var-file", "--var-file", action="append", metavar="FILE", help="variable values (HCL, or JSON if .json)"
    )


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a job file against the client config, its drivers and this host before any start."""
    from driversdk.agent.validate import check_files
    from driversdk.jobspec.hcl import FilePolicy
    from driversdk.jobspec.jobjson import JobInputs

    # File functions read only below the job file's directory (see FilePolicy).
    files = FilePolicy.beside(args.job)
    inputs = JobInputs(
        vars=args.var or (),
        var_files=args.var_file or (),
        env=dict(os.environ),
        files=files,
        json=args.job_json,
        hcl1=args.job_hcl1,
    )
    report = check_files(args.job, args.client, inputs)
    # A file that could not be read as a job at all (an empty job name still parses: it is listed).
    if report.parsed is None and report.problems and not report.checked and len(report.problems) == 1:
        problem = report.problems[0]
        if problem.field == "file" and not args.json:  # a file that cannot be read as HCL at all
            print(f"error: {problem}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        # Errors first: an `ok` never comes before an error (validate prints none for an object
        # that has one).
        for problem in report.problems:
            print(f"error {problem}")
        for line in report.checked:
            print(f"ok    {line}")
        for note in report.notes:
            print(f"note  {note}")
        verdict = "valid" if report.valid else f"{len(report.problems)} problem(s)"
        name = report.job or args.job
        # repr escapes control characters; a hostile 5000-character name is shortened.
        print(f"job {name if len(name) <= 60 else name[:60] + '...'!r}: {verdict}")
    return 0 if report.valid else 1


def cmd_run(args: argparse.Namespace) -> int:
    """Run jobs' tasks: submitted to the agent when one is running (followed; Ctrl-C detaches),
    else here through their driver plugins (Ctrl-C stops them cleanly). Exit 0 when every task
    succeeded, 1 when one failed, 2 when the run was refused before anything started."""
    # Before any runner import: with an agent, this process loads no HCL, grpc or plugin client.
    from driversdk.cli import runagent

    found = runagent.find_agent(args)
    if found is not None:
        code = runagent.run_via_agent(found[0], found[1], args)
        if code is not None:
            return code
    if args.detach:
        print("error: -detach needs a running agent to leave the job with; start one with `driversdk agent -dev` "
              "(or set NOMAD_ADDR), or run without -detach", file=sys.stderr)  # fmt: skip
        return 2
    from driversdk.agent.events import error_event, printer
    from driversdk.agent.run import EXIT_REFUSED, EXIT_TASK_FAILED, AllocRefused, RunFailed, RunRefused, run_jobs
    from driversdk.jobspec.clientconfig import load_client
    from driversdk.jobspec.jobjson import JobInputs

    client = load_client(args.client)
    try:
        emit = printer(args.json, lambda s: print(s, flush=True))
        variables = JobInputs(
            vars=args.var or (),
            var_files=args.var_file or (),
            env=dict(os.environ),
            json=args.job_json,
            hcl1=args.job_hcl1,
        )
        return run_jobs(list(args.job), client, emit, variables=variables)
    except RunRefused as err:  # before any task started (an allocation's setup may have refused it)
        if args.json:
            print((err.event if isinstance(err, AllocRefused) else error_event(str(err))).json(), flush=True)
        else:
            print(f"error: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except DriverSDKError as err:
        if not args.json:
            raise  # main's "error: …" line; a RunFailed names the job, allocation and task
        # --json: every line of stdout is an event, the one that ends the run too.
        print((err.event if isinstance(err, RunFailed) else error_event(str(err))).json(), flush=True)
        return EXIT_TASK_FAILED
