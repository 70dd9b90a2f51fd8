"""Entry point of the ``driversdk-raw-exec`` plugin binary (stdlib and driversdk only: no extra)."""

from __future__ import annotations

from driversdk import serve


def main() -> None:
    from drivers.raw_exec.driver import RawExecDriver

    serve(RawExecDriver())


if __name__ == "__main__":
    main()
