"""Entry point of the ``driversdk-docker`` plugin binary."""

from __future__ import annotations

from drivers.docker.driver import DockerDriver
from driversdk import serve


def main() -> None:
    serve(DockerDriver())


if __name__ == "__main__":
    main()
