"""Building blocks for drivers that run tasks as host processes (exec, raw_exec, your own).

- :mod:`.taskmap`: the thread-safe map of task id -> the driver's record of a task.
- :mod:`.owner`: which plugin process owns a task's on-disk state, written atomically, so a
  plugin killed inside StartTask leaves state a later plugin can safely find and remove.
- :mod:`.streaming`: one ``nomad alloc exec`` session bridged to a child process.

With :mod:`driversdk.procwatch` (one thread waits for every task) and :mod:`driversdk.exits`
(a task's exit result, waited on or called back), they are what both bundled process drivers
share.
"""
