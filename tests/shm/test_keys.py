"""The key contract (docs/design.md §2): key = lane * 2**42 + due_ms, exact everywhere, never from
None."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes_testlib import NOW

from engine import STRIDE, EngineError, due_ms_of, encode, lane_of
from engine.errors import EngineTypeError, EngineValueError
from engine.keys import KEY_LANES, check_due_array, check_due_ms, minute_of

LANES = st.integers(0, KEY_LANES - 1)
DUES = st.integers(0, STRIDE - 1)


def test_stride_and_lane_count_keep_every_key_below_two_to_the_53():
    assert STRIDE == 2**42
    assert KEY_LANES == 2048
    top = encode(KEY_LANES - 1, STRIDE - 1)
    assert top == 2**53 - 1
    assert float(top) == top  # exact as float64
    assert int(np.float64(top)) == top
    assert int(np.uint64(top)) == top


def test_lane_zero_is_the_identity():
    assert encode(0, NOW) == NOW
    assert lane_of(NOW) == 0
    assert due_ms_of(NOW) == NOW


@settings(max_examples=300)
@given(LANES, DUES)
def test_scalar_round_trip_is_exact_at_full_magnitude(lane, due):
    key = encode(lane, due)
    assert isinstance(key, int)
    assert key == lane * 2**42 + due
    assert 0 <= key < 2**53
    for as_type in (int, np.int64, np.uint64, np.float64, float):
        k = as_type(key)
        assert lane_of(k) == lane, as_type
        assert due_ms_of(k) == due, as_type


@settings(max_examples=150)
@given(st.lists(st.tuples(LANES, DUES), min_size=1, max_size=64))
def test_vectorised_round_trip_is_exact_in_int64_uint64_and_float64(pairs):
    lanes = np.array([p[0] for p in pairs], dtype=np.int64)
    dues = np.array([p[1] for p in pairs], dtype=np.int64)
    expected = [lane * 2**42 + due for lane, due in pairs]

    keys = encode(lanes, dues)
    assert keys.dtype == np.int64
    assert keys.tolist() == expected

    for dtype in (np.int64, np.uint64, np.float64):
        k = keys.astype(dtype)
        if dtype is np.float64:  # the cast itself must be exact below 2**53
            assert [int(x) for x in k] == expected
        assert np.asarray(lane_of(k)).tolist() == lanes.tolist(), dtype
        assert np.asarray(due_ms_of(k)).tolist() == dues.tolist(), dtype

    # encode accepts the same values as unsigned and as whole floats
    assert encode(lanes.astype(np.uint64), dues.astype(np.uint64)).tolist() == expected
    assert encode(lanes.astype(np.float64), dues.astype(np.float64)).tolist() == expected


@given(st.lists(DUES, min_size=1, max_size=32))
def test_vectorised_encode_broadcasts_a_scalar_lane(dues):
    keys = encode(5, np.array(dues, dtype=np.int64))
    assert keys.tolist() == [5 * STRIDE + d for d in dues]
    assert np.asarray(lane_of(keys)).tolist() == [5] * len(dues)


ABSENT = [None, math.nan, math.inf, -math.inf, np.nan, np.float64("nan")]


@pytest.mark.parametrize("absent", ABSENT, ids=repr)
def test_absent_due_time_is_rejected_never_encoded_as_zero(absent):
    with pytest.raises(EngineValueError):
        encode(1, absent)
    with pytest.raises(EngineValueError):
        check_due_ms(absent)


@pytest.mark.parametrize("absent", [math.nan, math.inf, -math.inf], ids=repr)
def test_absent_due_time_in_a_float_array_is_rejected(absent):
    dues = np.array([NOW, absent, NOW + 1], dtype=np.float64)
    with pytest.raises(EngineValueError):
        encode(np.array([1, 1, 1]), dues)
    with pytest.raises(EngineValueError):
        check_due_array(dues)


def test_none_in_an_object_array_is_rejected():
    dues = np.array([NOW, None, NOW + 1], dtype=object)
    with pytest.raises(EngineValueError):
        encode(np.array([1, 1, 1]), dues)
    with pytest.raises(EngineValueError):
        check_due_array(dues)
    with pytest.raises(EngineValueError):
        check_due_array([NOW, None])


@pytest.mark.parametrize("due", [-1, -NOW, STRIDE, STRIDE + 1, 2**63 - 1])
def test_negative_or_beyond_horizon_due_time_is_rejected(due):
    with pytest.raises(EngineValueError):
        encode(0, due)
    with pytest.raises(EngineValueError):
        check_due_ms(due)
    with pytest.raises(EngineValueError):
        check_due_array(np.array([NOW, due], dtype=np.int64))


@pytest.mark.parametrize("lane", [-1, KEY_LANES, KEY_LANES + 7, 10**9])
def test_lane_out_of_range_is_rejected(lane):
    with pytest.raises(EngineValueError):
        encode(lane, NOW)
    with pytest.raises(EngineValueError):
        encode(np.array([0, lane]), np.array([NOW, NOW]))


def test_fractional_and_non_numeric_values_are_rejected_not_truncated():
    with pytest.raises(EngineValueError):
        encode(1, NOW + 0.5)
    with pytest.raises(EngineValueError):
        encode(1.5, NOW)
    with pytest.raises(EngineTypeError):
        encode(1, "1800000000000")
    with pytest.raises(EngineTypeError):
        encode(True, NOW)
    with pytest.raises(EngineTypeError):
        encode(np.array(["a"]), np.array([NOW]))
    with pytest.raises(EngineValueError):
        encode(np.array([1]), np.array([NOW + 0.5]))


@pytest.mark.parametrize("key", [-1, KEY_LANES * STRIDE, None, math.nan, math.inf])
def test_key_outside_the_key_space_is_rejected(key):
    with pytest.raises(EngineError):
        lane_of(key)
    with pytest.raises(EngineError):
        due_ms_of(key)


def test_key_arrays_outside_the_key_space_are_rejected():
    with pytest.raises(EngineError):
        lane_of(np.array([0, -1], dtype=np.int64))
    with pytest.raises(EngineError):
        due_ms_of(np.array([0.0, math.nan]))
    with pytest.raises(EngineError):
        lane_of(np.array([float(KEY_LANES * STRIDE)]))


def test_errors_are_engine_errors_and_builtin_kinds():
    assert issubclass(EngineValueError, EngineError)
    assert issubclass(EngineValueError, ValueError)
    assert issubclass(EngineTypeError, EngineError)
    assert issubclass(EngineTypeError, TypeError)


@settings(max_examples=200)
@given(st.integers(1, KEY_LANES - 1), DUES)
def test_horizon_guard_refuses_a_raw_key_where_a_timestamp_belongs(lane, due):
    key = encode(lane, due)
    with pytest.raises(EngineValueError):
        check_due_ms(key)
    with pytest.raises(EngineValueError):
        check_due_array(np.array([due, key], dtype=np.int64))
    with pytest.raises(EngineValueError):
        minute_of(key)
    with pytest.raises(EngineValueError):
        encode(0, key)  # re-encoding a key is a horizon error, not a far-future date


def test_horizon_guard_on_a_lane_one_key_of_now():
    with pytest.raises(EngineValueError):
        check_due_ms(encode(1, NOW))
    assert check_due_ms(due_ms_of(encode(1, NOW))) == NOW


@given(DUES)
def test_minute_of_is_whole_minutes(due):
    assert minute_of(due) == due // 60_000
