"""``python -m driversdk.cli``: the ``driversdk`` command."""

from driversdk.cli import entry

entry()
