"""The alloc runner and the task runner, their hooks (``hooks/``, one file each), the order of an
allocation's tasks (``lifecycle``) and its group network (ports, bridge addresses)."""
