"""module_utils/check_options.py: the common options of the tool-running modules and their timeout rule."""

import pytest
from ansible_collections.kentino.gpufleet.plugins.module_utils.check_options import (
    check_argument_spec,
    resolve_timeout,
)


class _Failed(Exception):
    pass


class FakeModule:
    def __init__(self, **params):
        self.params = params

    def fail_json(self, msg, **kwargs):
        raise _Failed(msg)


def test_spec_has_the_common_options_and_the_module_ones():
    spec = check_argument_spec(duration=dict(type="int", default=600))
    assert spec["executable"] == {"type": "path"} and spec["timeout"] == {"type": "int"}
    assert spec["duration"] == {"type": "int", "default": 600}


def test_a_module_cannot_redefine_a_common_option():
    with pytest.raises(ValueError, match="timeout"):
        check_argument_spec(timeout=dict(type="int", default=60))


@pytest.mark.parametrize("given,default,expected", [(None, 600, 600), (5, 600, 5), (None, 180, 180)])
def test_timeout_is_the_option_else_the_module_default(given, default, expected):
    module = FakeModule(timeout=given)
    assert resolve_timeout(module, default) == expected
    assert module.params["timeout"] == expected  # the invocation shows what was used


@pytest.mark.parametrize("given", [0, -3])
def test_timeout_below_one_second_fails_the_task(given):
    with pytest.raises(_Failed, match="timeout must be at least 1 second, got %s" % given):
        resolve_timeout(FakeModule(timeout=given), 600)
