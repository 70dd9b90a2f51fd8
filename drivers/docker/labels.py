"""The labels the driver puts on its containers: Nomad's, and ours for finding them again.

A module of its own (no docker SDK) so the reconciler, the tests and the container builder share
one spelling, and loading the reconciler does not load the SDK.
"""

from __future__ import annotations

LABEL_ALLOC_ID = "com.hashicorp.nomad.alloc_id"
# Our own label so leak checks and reconciliation can find every container we made.
LABEL_TASK_ID = "io.driversdk.task_id"
