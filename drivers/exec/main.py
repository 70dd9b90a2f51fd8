"""Entry point of the ``driversdk-exec`` plugin binary."""

from __future__ import annotations

from drivers.exec.driver import ExecDriver
from driversdk import serve


def main() -> None:
    serve(ExecDriver())


if __name__ == "__main__":
    main()
