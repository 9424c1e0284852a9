"""Errors inside programs surface: from run(), in state.error(), and when a variable is read."""

from __future__ import annotations

import pytest

import radixlm as sgl


@sgl.function
def crashes(s, divisor):
    s += "Before the crash. "
    s += str(1 // divisor)


@sgl.function
def bad_gen(s):
    s += "Hello"
    s += sgl.gen("x", max_tokens=2, temperature=-1.0)
    s += sgl.gen("y", max_tokens=2)


def test_an_exception_in_program_code_propagates_from_run(tiny):
    with pytest.raises(ZeroDivisionError):
        crashes.run(divisor=0, backend=tiny)


def test_run_batch_keeps_going_and_reports_each_failure(tiny):
    states = crashes.run_batch([{"divisor": 1}, {"divisor": 0}], backend=tiny)
    assert states[0].error() is None and states[0].text() == "Before the crash. 1"
    assert isinstance(states[1].error(), ZeroDivisionError)
    assert states[1].text() == "Before the crash. "


def test_a_rejected_request_is_reported_by_error_and_on_read(tiny):
    state = bad_gen.run(backend=tiny)
    assert isinstance(state.error(), ValueError)
    assert "temperature" in str(state.error())
    with pytest.raises(sgl.ProgramError, match="temperature") as info:
        state["x"]
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(sgl.ProgramError):
        state["y"]
    assert state.text() == "Hello"


def test_reading_a_failed_variable_inside_the_program_raises_from_run(tiny):
    @sgl.function
    def reads(s):
        s += "Hi" + sgl.gen("x", temperature=-1.0)
        s += "got " + s["x"]

    with pytest.raises(sgl.ProgramError):
        reads.run(backend=tiny)


def test_an_unknown_variable_is_a_key_error(tiny):
    state = crashes.run(divisor=1, backend=tiny)
    with pytest.raises(KeyError):
        state["missing"]
