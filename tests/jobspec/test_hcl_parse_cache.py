"""Parse trees are kept by their text: the same text is parsed once per process, a different
text (another file, or the same file edited) never gets another text's tree."""

from __future__ import annotations

import pytest

from driversdk.jobspec.hcl.document import evaluate
from driversdk.jobspec.hcl.evaluator import HCLSyntaxError, parse


def test_same_text_reuses_its_tree() -> None:
    text = 'job "cache-same" {\n  group "g" {\n    count = 2\n  }\n}\n'
    assert parse(text) is parse(text)


def test_different_texts_give_their_own_values() -> None:
    one = evaluate("job.hcl", 'locals {\n  n = 1 + 1\n}\njob "j" {\n  meta {\n    n = local.n\n  }\n}\n')
    # The same path with edited content, then the first content again.
    two = evaluate("job.hcl", 'locals {\n  n = 2 + 2\n}\njob "j" {\n  meta {\n    n = local.n\n  }\n}\n')
    again = evaluate("job.hcl", 'locals {\n  n = 1 + 1\n}\njob "j" {\n  meta {\n    n = local.n\n  }\n}\n')
    assert not one.errors and not two.errors
    assert (one.locals, two.locals, again.locals) == ({"n": 2}, {"n": 4}, {"n": 2})


def test_a_syntax_error_is_raised_every_time() -> None:
    for _ in range(2):
        with pytest.raises(HCLSyntaxError):
            parse('job "x" {\n  = broken\n')
