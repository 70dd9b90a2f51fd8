"""Log collection: one collector process per data dir (``collector``) and the client's side of it
(``tasklogs``)."""
