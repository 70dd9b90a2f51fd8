"""The agent: one long-running client that owns the driver plugins, the state store and the
allocations of this node, and serves Nomad's HTTP API to the CLI and to Nomad's own API clients.

``settings`` reads the agent config, ``datadirlock`` makes the data dir one agent's, ``jobstore``
keeps registered jobs in ``state.db``, ``jobrunner`` runs one job's allocations, ``agent`` ties
them together (start, recover, register, stop), ``acl`` holds the tokens, ``shapes`` turns state
into Nomad's JSON, ``routes`` maps ``/v1`` paths to handlers and ``httpserver`` listens.
"""
