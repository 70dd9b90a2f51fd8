"""The driver plugins of this node: one instance per driver (``drivermanager``) and the bundled
drivers asked in process for checks (``inprocess``)."""
