"""The kit for drivers that run tasks as host processes: exec, raw_exec and your own.

- :mod:`.processdriver`: ``ProcessDriver``, a whole driver from ``command(task)`` or ``launch(task)``.
- :mod:`.base`: ``SupervisedDriver``, the lifecycle (recover, wait, stop, destroy, inspect, signal,
  exec, stats) over a few hooks; ``ProcessDriver``, exec and raw_exec are built on it.
- :mod:`.recorded`: ``RecordedDriver``, exec's and raw_exec's base: the start sequence (record
  first, roll back on failure), the release DestroyTask and the reconciler share, recovery claims.
- :mod:`.fields`: saved task state and records as JSON, older layouts' missing fields defaulted.
- :mod:`.supervisor` and :mod:`.launch`: the task supervisor, its typed ``Launch`` and its
  status file, read by a plugin started after the one that launched the task; :mod:`.shared`:
  one supervisor per plugin state dir (``launch.py serve``) running every task of exec and raw_exec.
- :mod:`.ids`, :mod:`.cgroups`, :mod:`.taskdirs`, :mod:`.logs`, :mod:`.stats`: host users and
  denied ids, per-task cgroups, task dir grants, log fifos, cgroup stats.
- :mod:`.owner`, :mod:`.reconcilecfg`: which plugin owns a task's on-disk state (so a plugin killed
  inside StartTask leaves state a later one can remove), and the ``reconcile`` config block.
- :mod:`.hostcfg`: the plugin options exec and raw_exec share (state and cgroup dirs, denied host
  ids, ``reconcile``): one schema piece and one config base.
- :mod:`.taskmap`, :mod:`.streaming`: the task map, one ``nomad alloc exec`` session.

Nothing here imports a bundled driver (``drivers.*``) or the runner (tests/sdk/test_taskkit_layers.py).
"""
