"""Unit tests for sweep parsing, geometric ranges, the product order and substitution."""

from __future__ import annotations

import copy
import math

import pytest

from userbenchmark.maestro.core.config.patterns import (
    MAX_SWEEP_POINTS,
    SweepVariable,
    check_references,
    geometric_values,
    num_points,
    parse_sweep,
    point_label,
    point_name,
    substitute,
    sweep_points,
)
from userbenchmark.maestro.core.config.problems import Problems, index, join


def parse(raw):
    p = Problems("f")
    variables = parse_sweep(p, raw, "sweep")
    return variables, [(path, message) for path, message, _ in p.items]


def at(*rel):
    path = "sweep"
    for part in rel:
        path = index(path, part) if isinstance(part, int) else join(path, part)
    return path


def parse_ok(raw):
    variables, problems = parse(raw)
    assert problems == []
    return variables


def test_list_values_keep_how_they_were_written():
    (var,) = parse_ok({"size": ["1K", 4096, "1.5M"]})
    assert var.name == "size"
    assert var.values == ("1K", 4096, "1.5M")
    assert var.labels == ("1K", "4096", "1.5M")


def test_bool_and_float_labels():
    (flag, scale) = parse_ok({"flag": [True, False], "scale": [0.5, 2.0]})
    assert flag.labels == ("true", "false")
    assert scale.labels == ("0.5", "2.0")


def test_geometric_size_sweep_uses_sizes_and_formats_labels():
    (var,) = parse_ok({"size": {"from": "1K", "to": "1M", "factor": 4}})
    assert var.values == (1024, 4096, 16384, 65536, 262144, 1048576)
    assert var.labels == ("1K", "4K", "16K", "64K", "256K", "1M")


def test_geometric_includes_to_only_when_hit():
    assert geometric_values(1, 16, 2) == [1, 2, 4, 8, 16]
    assert geometric_values(1, 15, 2) == [1, 2, 4, 8]
    assert geometric_values(1024, 1024, 2) == [1024]


def test_geometric_numbers_and_float_factor():
    (var,) = parse_ok({"m": {"from": 1024, "to": 8192, "factor": 2}})
    assert var.values == (1024, 2048, 4096, 8192)
    assert var.labels == ("1024", "2048", "4096", "8192")
    assert geometric_values(1024, 4000, 1.5) == [1024, 1536, 2304, 3456]
    assert geometric_values(0.5, 4, 2) == [0.5, 1, 2, 4]
    # floats are rounded to 12 significant digits, so 0.1 * 3**k ends exactly on 0.9
    assert geometric_values(0.1, 0.9, 3) == [0.1, 0.3, 0.9]


def test_integers_past_float_range_are_exact_not_a_crash():
    (var,) = parse_ok({"m": {"from": 10**400, "to": 10**400, "factor": 10**400}})
    assert var.values == (10**400,)
    (var,) = parse_ok({"m": {"from": 1, "to": 8, "factor": 10**400}})
    assert var.values == (1,)


def test_geometric_number_of_points_is_bounded():
    with pytest.raises(ValueError, match="more than"):
        geometric_values(1, 2**60, 1.0001)
    with pytest.raises(ValueError, match="more than 5"):
        geometric_values(1, 1000, 2, limit=5)


@pytest.mark.parametrize(
    ("raw", "path", "fragment"),
    [
        ({}, (), "mapping"),
        ([1, 2], (), "mapping"),
        ({"size": []}, ("size",), "at least one"),
        ({"size": 4}, ("size",), "expected a list"),
        ({"size": [1, 1]}, ("size", 1), "listed twice"),
        ({"size": [[1]]}, ("size", 0), "strings, numbers or booleans"),
        ({"size": [None]}, ("size", 0), "strings, numbers or booleans"),
        ({"size": ["a b"]}, ("size", 0), "letters, digits"),
        ({"size": ["x]"]}, ("size", 0), "letters, digits"),
        ({"9x": [1]}, ("9x",), "variable name"),
        ({"size": {"from": 1, "to": 8}}, ("size",), "'factor'"),
        ({"size": {"from": 1, "to": 8, "factor": 2, "step": 1}}, ("size", "step"), "unknown key"),
        ({"size": {"from": 1, "to": 8, "factor": 1}}, ("size", "factor"), "greater than 1"),
        ({"size": {"from": 1, "to": 8, "factor": 0.5}}, ("size", "factor"), "greater than 1"),
        ({"size": {"from": 1, "to": 8, "factor": "2"}}, ("size", "factor"), "greater than 1"),
        ({"size": {"from": 1, "to": 8, "factor": True}}, ("size", "factor"), "greater than 1"),
        ({"size": {"from": "-1K", "to": "8K", "factor": 2}}, ("size", "from"), "positive"),
        ({"size": {"from": 0, "to": 8, "factor": 2}}, ("size", "from"), "positive"),
        ({"size": {"from": 8, "to": 1, "factor": 2}}, ("size",), "to >= from"),
        ({"size": {"from": "1K", "to": "abc", "factor": 2}}, ("size", "to"), "expected a size"),
        ({"size": {"from": 1, "to": 10**9, "factor": 1.001}}, ("size",), "more than"),
        ({"m": {"from": 1, "to": 10**400, "factor": 1.5}}, ("m",), "too large for floating"),
        ({"m": {"from": 1, "to": 8, "factor": math.inf}}, ("m", "factor"), "greater than 1"),
        ({"a": list(range(200)), "b": list(range(200))}, (), "40000 points"),
        ({"a": list(range(MAX_SWEEP_POINTS + 1))}, ("a",), "more than the limit"),
    ],
)
def test_bad_sweeps(raw, path, fragment):
    variables, problems = parse(raw)
    assert problems, "expected a problem"
    paths = [p for p, _ in problems]
    assert at(*path) in paths
    assert any(fragment in message for p, message in problems if p == at(*path)), problems


def test_product_in_declaration_order_first_varies_slowest():
    variables = parse_ok({"size": ["1K", "2K"], "dtype": ["fp32", "bf16", "fp16"]})
    points = list(sweep_points(variables))
    assert num_points(variables) == len(points) == 6
    assert [point_label(p) for p in points] == [
        "size=1K,dtype=fp32",
        "size=1K,dtype=bf16",
        "size=1K,dtype=fp16",
        "size=2K,dtype=fp32",
        "size=2K,dtype=bf16",
        "size=2K,dtype=fp16",
    ]
    assert point_name("ar", points[4]) == "ar[size=2K,dtype=bf16]"
    assert point_name("ar", ()) == "ar"


def test_no_variables_is_one_empty_point():
    assert list(sweep_points(())) == [()]
    assert num_points(()) == 1


def test_substitute_whole_values_are_typed_and_embedded_use_labels():
    (var,) = parse_ok({"size": {"from": "1K", "to": "4K", "factor": 4}})
    point = next(iter(sweep_points([var])))
    data = {"name": "ar_${size}", "size": "${size}", "shape": ["${size}", 3], "other": "$x {y}"}
    original = copy.deepcopy(data)
    out = substitute(data, point)
    assert out == {"name": "ar_1K", "size": 1024, "shape": [1024, 3], "other": "$x {y}"}
    assert data == original  # pure: the input is not changed


def test_substitute_list_value_keeps_its_type():
    variables = parse_ok({"m": [1024, 2048], "dt": ["bf16"]})
    point = list(sweep_points(variables))[1]
    assert substitute({"m": "${m}", "dtype": "${dt}", "tag": "${m}x${dt}"}, point) == {
        "m": 2048,
        "dtype": "bf16",
        "tag": "2048xbf16",
    }


def test_substitute_leaves_keys_alone():
    point = (("k", 1, "1"),)
    assert substitute({"${k}": "${k}"}, point) == {"${k}": 1}


def test_check_references():
    data = {
        "blocks": [{"size": "${size}", "name": "x_${dtype}"}, {"m": "${nope}"}, {"bad": "${1x}"}]
    }
    used, problems = check_references(data, ["size", "dtype", "unused"])
    assert used == {"size", "dtype"}
    messages = dict(problems)
    assert "undefined sweep variable 'nope'" in messages["blocks[1].m"]
    assert "bad sweep reference" in messages["blocks[2].bad"]


def test_check_references_without_sweep_says_so():
    _, problems = check_references({"size": "${size}"}, [])
    assert problems and "has no sweep" in problems[0][1]


def test_sweep_variable_is_frozen():
    var = SweepVariable(name="a", values=(1,), labels=("1",))
    with pytest.raises(AttributeError):
        var.name = "b"  # type: ignore[misc]


def test_an_unknown_key_of_a_geometric_sweep_lists_the_valid_ones():
    p = Problems("f.yaml")
    assert parse_sweep(p, {"size": {"from": 1, "to": 8, "fcator": 2}}, "sweep") == ()
    messages = [(path, message) for path, message, _ in p.items]
    assert (
        "sweep.size.fcator",
        "unknown key 'fcator' in a geometric sweep (did you mean 'factor'?); "
        "valid keys: from, to, factor",
    ) in messages
