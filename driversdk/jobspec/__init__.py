"""Job files and configs, read and checked, nothing run: the HCL2 evaluator (``hcl``), Nomad's job
specification (``jobschema``) and the job model (``job``), HCL1 and JSON job files, constraints, a
task's environment, restart policy, templates, artifacts, and the client/agent config.

It imports only the SDK core, so ``driversdk validate`` and the agent read a job the same way.
"""
