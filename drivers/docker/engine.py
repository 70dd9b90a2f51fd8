"""Everything of the driver that needs the docker SDK, in one import.

The driver reaches these through :mod:`drivers.docker.sdk`, which loads this module on first use:
a plugin answers its schema, its config and a fingerprint (:mod:`drivers.docker.probe`) without the
SDK (requests, urllib3, ... ~150 ms of imports), and loads it while the host is still busy.
"""

from __future__ import annotations

import docker
import requests
from docker.auth import encode_header
from docker.constants import MINIMUM_DOCKER_API_VERSION
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from drivers.docker import auth
from drivers.docker import container as containers

__all__ = [
    "MINIMUM_DOCKER_API_VERSION",
    "APIError",
    "DockerException",
    "ImageNotFound",
    "NotFound",
    "auth",
    "containers",
    "docker",
    "encode_header",
    "requests",
]
