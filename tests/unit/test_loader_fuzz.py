"""Fuzz the loader: random YAML documents and random mutations of valid files must give either a
SuiteSpec or a ConfigError, never another exception.

CI runs a few hundred examples per test; the long run is
``MAESTRO_FUZZ_EXAMPLES=10000 python -m pytest tests/unit/test_loader_fuzz.py``.
"""

from __future__ import annotations

import copy
import math
import os
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from userbenchmark.maestro.core.config.loader import CONFIGS_DIR, load_suite_text
from userbenchmark.maestro.core.config.spec import SuiteSpec
from userbenchmark.maestro.errors import ConfigError

FUZZ = settings(
    max_examples=int(os.environ.get("MAESTRO_FUZZ_EXAMPLES", "200")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# A valid file that reaches every part of the schema: mesh, like, nccl, sweeps, overrides, whatif.
RICH = """
name: rich
world_size: 4
timeout_s: 30
stop_on_error: false
defaults: {dtype: bf16, warmup_iters: 2, iters: 5, baseline: true, check: false, sync: barrier}
env: {NCCL_ALGO: Ring, NCCL_IB_DISABLE: 1}
mesh: {dp: 2, tp: 2}
axes:
  dp: {priority: high, nccl: {max_ctas: 8, min_ctas: 1, traffic_class: 3, blocking: false}}
  dp_rs: {like: dp}
  ep: {teams: [[0, 1, 2, 3]], priority: normal}
  pairs: {teams: [[0, 1], [2, 3]], nccl: {net_name: IB, cga_cluster_size: 2}}
patterns:
  - name: ag_rs
    register_buffers: false
    blocks:
      - {name: ag, op: all_gather, axis: dp, size: 4M, in_place: true}
      - {name: rs, op: reduce_scatter, axis: dp_rs, size: 4M, reduce_op: sum}
      - {name: mm, op: gemm, axis: tp, m: 512, n: 256, k: 128, dtype: fp32}
      - {name: a2a, op: all_to_all, axis: ep, size: 64K}
      - {name: sr, op: send_recv, axis: pairs, size: 8K}
    whatif:
      same: {}
      more: {ag: {size: x2}, "r*": {dtype: fp32}, axes: {dp: {nccl: {max_ctas: 4}}}}
  - name: sweep
    iters: 3
    sweep: {size: {from: 1K, to: 64K, factor: 4}, dt: [fp32, bf16]}
    blocks:
      - {name: "ar_${size}", op: all_reduce, size: "${size}", dtype: "${dt}"}
      - {name: b, op: broadcast, axis: pairs, size: 2K, root: 1}
      - {name: r, op: reduce, axis: ep, size: 2K, root: 3, reduce_op: max}
      - {name: g, op: gemm, a_shape: [64, 32], b_shape: [32, 16]}
      - {name: z, op: sleep, axis: world, lane: idle, duration_us: 10.5}
    whatif:
      longer: {z: {duration_us: x1.5}, "ar_*": {size: x2, after: [z]}}
"""

VALID_TEXTS = [
    (CONFIGS_DIR / "quickstart.yaml").read_text(),
    (CONFIGS_DIR / "ag_rs.yaml").read_text(),
    RICH,
]
VALID_DOCS = [yaml.safe_load(text) for text in VALID_TEXTS]

# Words of the schema, so random documents reach past the top-level checks.
WORDS = [
    "name",
    "world_size",
    "defaults",
    "env",
    "mesh",
    "axes",
    "patterns",
    "timeout_s",
    "stop_on_error",
    "dtype",
    "warmup_iters",
    "iters",
    "baseline",
    "check",
    "sync",
    "register_buffers",
    "teams",
    "like",
    "priority",
    "nccl",
    "sweep",
    "whatif",
    "x1.5",
    "blocks",
    "op",
    "axis",
    "lane",
    "size",
    "reduce_op",
    "in_place",
    "root",
    "m",
    "n",
    "k",
    "a_shape",
    "b_shape",
    "duration_us",
    "from",
    "to",
    "factor",
    "world",
    "dp",
    "tp",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
    "gemm",
    "sleep",
    "bf16",
    "fp32",
    "int8",
    "max_ctas",
    "high",
    "barrier",
    "none",
    "4M",
    "1.5K",
    "-4M",
    "${size}",
    "${nope}",
    "0",
    "NCCL_ALGO",
    "x:y",
    "os:system",
    "collections:OrderedDict",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    st.text(max_size=12),
)
keys = st.one_of(st.sampled_from(WORDS), st.text(max_size=8), st.integers(-2, 5), st.booleans())
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(keys, children, max_size=6),
    ),
    max_leaves=40,
)
world_sizes = st.sampled_from([None, 1, 2, 3, 4, 8])


def check(text: str, world_size: int | None) -> None:
    """The one property: a SuiteSpec or a ConfigError with at least one located issue."""
    try:
        suite = load_suite_text(text, file="fuzz.yaml", world_size=world_size)
    except ConfigError as err:
        assert err.issues and all(issue.file == "fuzz.yaml" for issue in err.issues)
        assert str(err)
        return
    assert isinstance(suite, SuiteSpec)


def dump(data: Any) -> str | None:
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return None


@FUZZ
@given(documents, world_sizes)
def test_random_documents_raise_only_config_error(data, world_size):
    text = dump(data)
    if text is not None:
        check(text, world_size)


@FUZZ
@given(st.dictionaries(st.sampled_from(WORDS[:9]), documents, max_size=9), world_sizes)
def test_random_top_level_mappings_raise_only_config_error(data, world_size):
    text = dump(data)
    if text is not None:
        check(text, world_size)


def _containers(node: Any, found: list[Any]) -> list[Any]:
    if isinstance(node, dict | list):
        found.append(node)
        for child in node.values() if isinstance(node, dict) else node:
            _containers(child, found)
    return found


def _negate(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return -value if value else -1
    if isinstance(value, str):
        return "-" + value
    return value


def _retype(value: Any) -> Any:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value) if value % 2 else float(value) + 0.5
    if isinstance(value, float):
        return math.nan if not math.isfinite(value) or value > 0 else int(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {"x": value}
    if isinstance(value, dict):
        return list(value.values())
    return 0


MUTATIONS = ["drop", "negate", "retype", "replace", "junk_key", "null", "duplicate", "empty"]


def mutate(doc: Any, draw: Any) -> Any:
    """One random mutation somewhere in a deep copy of ``doc``."""
    doc = copy.deepcopy(doc)
    container = draw(st.sampled_from(_containers(doc, [])))
    kind = draw(st.sampled_from(MUTATIONS))
    if kind == "junk_key":
        if isinstance(container, dict):
            container[draw(keys)] = draw(documents)
        else:
            container.insert(draw(st.integers(0, len(container))), draw(documents))
        return doc
    if not container:
        return doc
    slot = draw(
        st.sampled_from(
            list(container) if isinstance(container, dict) else list(range(len(container)))
        )
    )
    value = container[slot]
    if kind == "drop":
        del container[slot]
    elif kind == "negate":
        container[slot] = _negate(value)
    elif kind == "retype":
        container[slot] = _retype(value)
    elif kind == "replace":
        container[slot] = draw(documents)
    elif kind == "null":
        container[slot] = None
    elif kind == "duplicate" and isinstance(container, list):
        container.append(copy.deepcopy(value))
    elif kind == "empty":
        container[slot] = type(value)() if isinstance(value, dict | list | str) else 0
    return doc


@FUZZ
@given(st.data(), st.sampled_from(range(len(VALID_DOCS))), world_sizes)
def test_mutated_valid_files_raise_only_config_error(data, which, world_size):
    doc = VALID_DOCS[which]
    for _ in range(data.draw(st.integers(1, 3))):
        doc = mutate(doc, data.draw)
    text = dump(doc)
    if text is not None:
        check(text, world_size)


@FUZZ
@given(st.data(), st.sampled_from(range(len(VALID_TEXTS))), world_sizes)
def test_mutated_valid_text_raises_only_config_error(data, which, world_size):
    text = VALID_TEXTS[which]
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 6))
        junk = data.draw(st.text(alphabet="[]{}:,-&*!|>'\"#%@`?\n \t0123456789abK$", max_size=6))
        text = text[:at] + junk + text[at + cut :]
    check(text, world_size)


def test_the_valid_documents_are_valid():
    # The mutation tests start from these: they must load unchanged.
    assert load_suite_text(dump(VALID_DOCS[0]), world_size=2).name == "quickstart"
    assert load_suite_text(dump(VALID_DOCS[1]), world_size=4).name == "ag_rs"
    suite = load_suite_text(dump(VALID_DOCS[2]))
    assert len(suite.patterns) == 1 + 4 * 2
