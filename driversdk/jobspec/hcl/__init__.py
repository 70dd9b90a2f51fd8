"""HCL2 job files evaluated as Nomad's jobspec2 evaluates them.

- :mod:`.values`: what a value is (:data:`Value`), type constraints (:data:`Type`) and cty's conversions;
- :mod:`.functions`: the functions a job file may call;
- :mod:`.files`: the file functions, under the evaluation's :class:`FilePolicy`;
- :mod:`.tree`: the parse tree the evaluator walks (python-hcl2's, copied; kept on disk);
- :mod:`.evaluator`: expressions and templates over python-hcl2's parse tree (why: see there);
- :mod:`.document`: a whole file — variables and their values, locals, the job, dynamic blocks.
"""

from driversdk.jobspec.hcl.document import Document, Inputs, evaluate
from driversdk.jobspec.hcl.evaluator import Body, EvalError, HCLSyntaxError
from driversdk.jobspec.hcl.files import FilePolicy
from driversdk.jobspec.hcl.values import Type, Value

__all__ = ["Body", "Document", "EvalError", "FilePolicy", "HCLSyntaxError", "Inputs", "Type", "Value", "evaluate"]
