"""Put a Python driver into a Nomad client's ``plugin_dir``: :mod:`.build` packages it into one
executable file (:mod:`.boot` is that file's ``__main__``), :mod:`.catalog` finds and describes
one the way Nomad's plugin loader does."""
