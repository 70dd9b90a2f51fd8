"""HCL2 job files evaluated as Nomad's jobspec2 evaluates them.

- :mod:`.values`: values, type constraints and cty's conversions;
- :mod:`.functions`: the functions a job file may call;
- :mod:`.evaluator`: expressions and templates over python-hcl2's parse tree (why: see there);
- :mod:`.document`: a whole file — variables and their values, locals, the job, dynamic blocks.
"""

# python-hcl2 is the parser: imported first, so a missing runner extra is named by it.
import hcl2  # noqa: F401  # isort: skip

from driversdk.runner.hcl.document import Document, Inputs, evaluate
from driversdk.runner.hcl.evaluator import Body, EvalError, HCLSyntaxError

__all__ = ["Body", "Document", "EvalError", "HCLSyntaxError", "Inputs", "evaluate"]
