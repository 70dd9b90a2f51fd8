"""One node's client: the agent (``driversdk agent``), and the runners a bare ``driversdk run`` embeds.

At this level: ``agent`` owns the plugins, the stores and a ``jobrunner`` per registered job and
recovers them after a restart; ``main`` and ``settings`` start it from its config; ``run`` is a bare
run; ``validate`` checks everything known before a start. Below it, one package per subsystem:
``allocrunner`` (alloc and task runners, their hooks, the group network), ``pluginmanager`` (the
driver plugins), ``csi`` (volumes, claims, the volume watcher, CSI plugin tasks), ``logmon`` (the log
collector), ``state`` (``state.db``) and ``api`` (Nomad's HTTP API).
"""
