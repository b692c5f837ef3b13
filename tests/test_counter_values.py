"""Counter values: any real number taken with int(), saturation at the int64
limits (tallied), and errors that name the counter and the value."""

import json
import math
import warnings
from decimal import Decimal
from fractions import Fraction

import pytest

import mxprof
from mxprof import _native, _testing
from mxprof._testing import finish, start

MAX = 2**63 - 1
MIN = -(2**63)

# Every way to change a counter, as (label, call(counter, operand)).
UPDATES = [
    ("set_value", lambda c, v: c.set_value(v)),
    ("increment", lambda c, v: c.increment(v)),
    ("decrement", lambda c, v: c.decrement(v)),
    ("+=", lambda c, v: c.__iadd__(v)),
    ("-=", lambda c, v: c.__isub__(v)),
]


def _exact(op, base, operand):
    """What an update gives in exact arithmetic."""
    if op == "set_value":
        return operand
    return base + operand if op in ("increment", "+=") else base - operand


def _apply(op, base, operand):
    """What an update gives: the exact result held at the int64 limits."""
    return min(max(_exact(op, base, operand), MIN), MAX)


def _saturated():
    return _native.counts()["saturated_values"]


def _samples(trace, name):
    return [e["args"][name] for e in _testing.events(trace, "C", name)]


@pytest.mark.parametrize(("op", "update"), UPDATES, ids=[u[0] for u in UPDATES])
@pytest.mark.parametrize(
    ("operand", "as_int"),
    [
        (2.9, 2),
        (-2.9, -2),
        (0.5, 0),
        (1e18, 10**18),
        (Fraction(7, 2), 3),
        (Fraction(-7, 2), -3),
        (Decimal("7.9"), 7),
        (Decimal("-7.9"), -7),
        (True, 1),
    ],
    ids=repr,
)
def test_real_numbers_are_taken_with_int(trace_file, op, update, operand, as_int):
    c = mxprof.Domain("d").new_counter("real", 100)
    start(trace_file)
    update(c, operand)
    trace = finish(trace_file)
    want = _apply(op, 100, as_int)
    assert c.value == want
    assert _samples(trace, "real") == [want]
    assert trace["otherData"]["saturated_values"] == 0


def test_numpy_scalars_of_every_width(trace_file):
    np = pytest.importorskip("numpy")
    c = mxprof.Domain("d").new_counter("np", 0)
    start(trace_file)
    expected = []
    ints = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
    floats = [np.float16, np.float32, np.float64, np.longdouble]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. numpy's "overflow in scalar negative"
        for t in ints:
            c.set_value(t(100))
            c.decrement(t(5))
            c -= t(5)
            c.increment(t(7))
            c += t(3)
            expected += [100, 95, 90, 97, 100]
        for t in floats:
            c.set_value(t(100.75))
            c.decrement(t(5.5))  # int(5.5) == 5
            c -= t(-5.5)
            c.increment(t(2.5))
            c += t(-2.5)
            expected += [100, 95, 100, 102, 100]
        c.set_value(np.uint64(2**64 - 1))
        c.set_value(np.int64(MIN))
        c.decrement(np.int64(MIN))  # MIN - MIN: no negation overflows
        c.decrement(np.uint64(2**64 - 1))
        expected += [MAX, MIN, 0, MIN]
    trace = finish(trace_file)
    assert _samples(trace, "np") == expected
    assert trace["otherData"]["saturated_values"] == 2
    assert c.value == MIN


@pytest.mark.parametrize(("op", "update"), UPDATES, ids=[u[0] for u in UPDATES])
@pytest.mark.parametrize("base", [MIN, -5, 0, 5, MAX])
@pytest.mark.parametrize(
    "operand",
    [MIN, MAX, 2**63, -(2**63) - 1, 2**63 + 7, 2**64 - 1, 2**64, -(2**64), 2**200, -(2**200)],
)
def test_results_beyond_int64_saturate_and_are_tallied(op, update, base, operand):
    c = mxprof.Domain("d").new_counter("wide", base)
    before = _saturated()
    update(c, operand)
    want = _apply(op, base, operand)
    assert c.value == want
    assert _saturated() - before == (_exact(op, base, operand) != want)


def test_saturation_is_recorded_in_the_trace_and_the_statistics(trace_file):
    c = mxprof.Domain("d").new_counter("sat", 0)
    start(trace_file)
    c.set_value(2**63)  # saturates
    c.set_value(-5)
    c.increment(2**63)  # exactly 2**63 - 5: fits
    c += 2**63  # saturates
    c.decrement(-(2**63))  # saturates
    c -= 2**64  # ends at the lower limit whatever the value: saturates
    c.set_value(-1)
    c.decrement(MIN)  # -1 - MIN == MAX exactly
    c.increment(float("1e300"))  # saturates
    mxprof.Counter(mxprof.Domain("d"), "init", -(2**70))  # saturates
    stats = json.loads(mxprof.dumps(format="json"))
    trace = finish(trace_file)
    assert _samples(trace, "sat") == [MAX, -5, MAX - 4, MAX, MAX, MIN, -1, MAX, MAX]
    assert _samples(trace, "init") == [MIN]
    assert stats["Profiler"]["saturated_values"] == 6
    assert stats["Counter"]["d"]["sat"]["Min"] == MIN
    assert trace["otherData"]["saturated_values"] == 6
    table = mxprof.dumps()
    assert next(ln for ln in table.splitlines() if ln.startswith("saturated_values")).split() == [
        "saturated_values",
        "6",
    ]


def test_saturation_while_stopped_changes_the_value_and_is_tallied():
    mxprof.set_config(aggregate_stats=True)
    c = mxprof.Counter(mxprof.Domain("d"), "quiet", 2**64)
    assert c.value == MAX
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Profiler"]["saturated_values"] == 1
    assert stats["Profiler"]["ignored_calls"] == 0  # an initial value is not a hot call
    c += 1
    stats = json.loads(mxprof.dumps(format="json"))
    assert (stats["Profiler"]["saturated_values"], stats["Profiler"]["ignored_calls"]) == (2, 1)
    assert stats["Counter"] == {}


NON_NUMBERS = ["3", b"3", None, 1 + 2j, [1], object()]


@pytest.mark.parametrize(("op", "update"), UPDATES, ids=[u[0] for u in UPDATES])
@pytest.mark.parametrize("operand", NON_NUMBERS, ids=lambda v: type(v).__name__)
def test_a_non_number_is_a_type_error_naming_the_counter(trace_file, op, update, operand):
    c = mxprof.Domain("dom").new_counter("named", 7)
    start(trace_file)
    c.increment()
    with pytest.raises(TypeError) as info:
        update(c, operand)
    message = str(info.value)
    assert message.startswith(f"counter 'named' (domain 'dom'): {op} needs a real number, got ")
    assert repr(operand) in message
    c.increment()
    trace = finish(trace_file)
    assert c.value == 9
    assert _samples(trace, "named") == [8, 9]  # the refused call recorded nothing


@pytest.mark.parametrize(("op", "update"), UPDATES, ids=[u[0] for u in UPDATES])
@pytest.mark.parametrize(
    "operand", [math.nan, math.inf, -math.inf, Decimal("NaN"), Decimal("-Infinity")], ids=repr
)
def test_nan_and_infinity_are_a_value_error_naming_the_counter(trace_file, op, update, operand):
    c = mxprof.Domain("dom").new_counter("finite", 7)
    start(trace_file)
    with pytest.raises(ValueError) as info:
        update(c, operand)
    message = str(info.value)
    assert message.startswith(f"counter 'finite' (domain 'dom'): {op} needs a finite number, got ")
    assert repr(operand) in message
    trace = finish(trace_file)
    assert c.value == 7
    assert _samples(trace, "finite") == []
    assert trace["otherData"]["saturated_values"] == 0


def test_numpy_nan_is_a_value_error():
    np = pytest.importorskip("numpy")
    c = mxprof.Domain("dom").new_counter("npnan", 1)
    for bad in (np.float32("nan"), np.float64("inf"), np.float16("-inf")):
        with pytest.raises(ValueError, match="counter 'npnan' .*finite number, got np.float"):
            c.set_value(bad)
    assert c.value == 1


def test_initial_values():
    d = mxprof.Domain("init")
    assert mxprof.Counter(d, "float", 2.75).value == 2
    assert mxprof.Counter(d, "huge", 2**70).value == MAX
    assert d.new_counter("tiny", -(2**70)).value == MIN
    assert mxprof.Counter(d, "bool", True).value == 1
    with pytest.raises(TypeError, match=r"counter 'text' \(domain 'init'\): the initial value"):
        mxprof.Counter(d, "text", "12")
    assert d.new_counter("text").value == 0
    with pytest.raises(ValueError, match=r"counter 'nan' \(domain 'init'\): the initial value"):
        mxprof.Counter(d, "nan", math.nan)


def test_long_values_are_shortened_in_messages():
    c = mxprof.Domain("d").new_counter("long")
    with pytest.raises(TypeError) as info:
        c.set_value("x" * 500)
    assert len(str(info.value)) < 200
    assert str(info.value).endswith("...")
