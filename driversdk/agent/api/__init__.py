"""Nomad's HTTP API on the agent: listeners, the ``/v1`` routes, and state as Nomad's JSON."""
