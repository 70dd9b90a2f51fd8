"""Entry point of the ``driversdk-docker`` plugin binary."""

from __future__ import annotations

import sys

from driversdk import serve

# Installed by the `docker` extra, not by `pip install driversdk`.
_EXTRA_MODULES = ("docker", "requests")


def main() -> None:
    try:
        from drivers.docker.driver import DockerDriver
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] not in _EXTRA_MODULES:
            raise
        # A sentence on stderr, which the host shows, instead of a traceback.
        sys.exit(f"driversdk-docker needs the docker extra ({err.name} is missing): pip install 'driversdk[docker]'")
    serve(DockerDriver())


if __name__ == "__main__":
    main()
