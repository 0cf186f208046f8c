"""The ranks' layout of a pattern file: world size, ``mesh``, ``axes`` (teams, like, priority,
nccl options) and ``env`` (top level and per axis). Each check records its problems and returns
what it could still build, so one run reports every problem."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .problems import YAML11_BOOLEAN_WORDS, Problems, choices, index, join
from .spec import PRIORITIES, WORLD_AXIS, AxisSpec, frozen_mapping

logger = logging.getLogger("maestro.config")

MAX_WORLD_SIZE: Final = 1 << 17
AXIS_KEYS: Final = ("teams", "like", "priority", "nccl", "env")
ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

NCCL_OPTIONS: Final = {
    # name: (kind, minimum) -- ProcessGroupNCCL.Options.config fields
    "max_ctas": ("int", 1),
    "min_ctas": ("int", 1),
    "cga_cluster_size": ("int", 0),
    "net_name": ("str", None),
    "traffic_class": ("int", 0),
    "cta_policy": ("int", 0),
    "blocking": ("bool", None),
    "split_share": ("bool", None),
}

LAUNCHER_ENV_NAMES: Final = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                              "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "NCCL_COMM_ID")  # fmt: skip
"""Variables the launcher sets to place each rank and meet at the rendezvous."""
LAUNCHER_ENV_PREFIXES: Final = ("TORCHELASTIC_", "SLURM_")


def mesh_teams(shape: Sequence[int], dim: int) -> tuple[tuple[int, ...], ...]:
    """DeviceMesh teams of dimension ``dim``: ranks row-major over ``shape``, each team the ranks
    differing only along ``dim``; ``mesh_teams([2, 2], 1) == ((0, 1), (2, 3))``, and dim 0 gives
    ``((0, 2), (1, 3))``."""
    step, degree = math.prod(shape[dim + 1 :]), shape[dim]
    firsts = (r for r in range(math.prod(shape)) if r // step % degree == 0)  # ascending
    return tuple(tuple(range(first, first + step * degree, step)) for first in firsts)


@dataclass
class AxisDraft:
    """An axis while the file is checked; becomes an AxisSpec when its teams are known."""

    name: str
    path: str
    teams: tuple[tuple[int, ...], ...] | None = None
    """None while unknown (no world size, invalid teams, or an unresolved like)."""
    like: str | None = None
    priority: str = "normal"
    nccl: dict[str, Any] = field(default_factory=dict)
    valid: bool = True

    def spec(self) -> AxisSpec:
        assert self.teams is not None
        return AxisSpec(
            name=self.name,
            teams=self.teams,
            like=self.like,
            priority=self.priority,
            nccl=frozen_mapping(self.nccl),
        )


def check_world_size(p: Problems, data: dict[Any, Any], arg: Any) -> int | None:
    """The run's world size: the file's ``world_size`` and ``arg`` (``--world-size``,
    ``--nproc`` or the launcher's world size) must agree when both are set."""
    bounds = {"minimum": 1, "maximum": MAX_WORLD_SIZE}
    from_file = p.get(data, "", "world_size", p.integer, **bounds)
    from_arg = None if arg is None else p.integer(arg, "world size", **bounds)
    if from_file is not None and from_arg is not None and from_file != from_arg:
        p.add(
            "world_size",
            f"the file sets world_size {from_file} but the run has {from_arg} rank(s) "
            "(--nproc, --world-size or the launcher's world size); they must agree",
        )
        return None
    if "world_size" not in data and arg is None:
        p.add(
            "world_size",
            "the world size is unknown: the file sets no world_size, so "
            "pass --world-size N (or launch with N ranks)",
        )
    return from_file if from_file is not None else from_arg


def check_env(p: Problems, raw: Any, path: str) -> dict[str, str]:
    """Environment variables as text; names the launcher owns are refused."""
    if not p.mapping(raw, path, "expected a mapping of environment variables"):
        return {}
    env: dict[str, str] = {}
    for key, value in raw.items():
        sub = join(path, key)
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            problem = (
                f"{p.show(sub, key)} is not an environment variable name (letters, digits "
                "and _, not starting with a digit)"
            )
        elif key in LAUNCHER_ENV_NAMES or key.startswith(LAUNCHER_ENV_PREFIXES):
            problem = (
                f"{key} belongs to the launcher (torchrun, srun or maestro's own --nproc), which "
                "owns the rendezvous and each rank's place in it; a pattern file may not set it"
            )
        elif (
            isinstance(value, str)
            and sub in p.yaml11_words
            and value.lower() in YAML11_BOOLEAN_WORDS
        ):
            problem = (
                f"{value} is ambiguous here: write true or false (set as 1 or 0), or quote "
                f"'{value}' to set the text"
            )
        elif isinstance(value, int | float | str):
            # A boolean becomes 1 or 0, what NCCL and most tools read as true or false.
            env[key] = str(int(value)) if isinstance(value, bool) else str(value)
            continue
        else:
            problem = f"environment values must be strings or numbers, got {p.show(sub, value)}"
        p.add(sub, problem)
    return env


def _declared_axis(
    p: Problems, name: str, path: str, spec: dict[Any, Any], world_size: int | None
) -> AxisDraft:
    draft = AxisDraft(name=name, path=path, valid=False)
    if "teams" in spec and "like" in spec:
        p.add(path, "give either teams or like, not both")
    elif "teams" in spec:
        draft.teams = _teams(p, spec["teams"], join(path, "teams"), world_size)
        draft.valid = draft.teams is not None or world_size is None
    elif spec.get("like") is None:  # like: null names no axis
        p.add(
            path,
            "an axis needs teams (a list of lists of ranks) or like: <axis> "
            "(a second communicator on another axis's teams)",
        )
    else:
        draft.like, draft.valid = spec["like"], True
    return draft


def _new_axis_name(p: Problems, name: Any, path: str, what: str) -> bool:
    """Whether ``name`` can name an axis of the file (a mesh dimension or an ``axes:`` entry)."""
    if p.name(name, path, what) is None:
        return False
    if name == WORLD_AXIS:
        p.add(path, "'world' is the built-in axis of all ranks and cannot be redefined; rename it")
    return name != WORLD_AXIS


def check_axes(p: Problems, data: dict[Any, Any], world_size: int | None) -> dict[str, AxisDraft]:
    """Every axis of the file by name: ``world``, the mesh dimensions, then ``axes:``."""
    world = (tuple(range(world_size)),) if world_size else None
    axes = {WORLD_AXIS: AxisDraft(name=WORLD_AXIS, path="", teams=world)}
    if "mesh" in data:
        _mesh(p, data["mesh"], world_size, axes)
    raw_axes = data.get("axes", {})
    expected = "axes must be a mapping of axis names to {teams: ...} or {like: <axis>}"
    if not p.mapping(raw_axes, "axes", expected):
        raw_axes = {}
    mesh_dims = [n for n in axes if n != WORLD_AXIS]
    for name, spec in raw_axes.items():
        path = join("axes", name)
        if not _new_axis_name(p, name, path, "an axis name"):
            continue
        if not p.mapping(spec, path, f"an axis is a mapping with keys {choices(AXIS_KEYS)}"):
            continue
        p.unknown_keys(spec, path, AXIS_KEYS, f"in axis {name!r}")
        if name in mesh_dims:
            draft = axes[name]
            for key in ("teams", "like"):
                if key in spec:
                    p.add(
                        join(path, key),
                        f"axis {name!r} is a mesh dimension and takes "
                        f"its teams from mesh; remove {key!r} or use another axis name",
                    )
        else:
            draft = axes[name] = _declared_axis(p, name, path, spec, world_size)
        priority = p.get(spec, path, "priority", p.choice, PRIORITIES, "priority", "priorities")
        draft.priority = priority or draft.priority
        draft.nccl = p.get(spec, path, "nccl", check_nccl, p, default={})
        p.get(spec, path, "env", _axis_env, p, name)
    _resolve_likes(p, axes)
    return axes


def _mesh(p: Problems, raw: Any, world_size: int | None, axes: dict[str, AxisDraft]) -> None:
    expected = (
        "mesh must be a mapping of dimension names to degrees, outer to inner, e.g. {dp: 2, tp: 4}"
    )
    if not p.non_empty(raw, "mesh", dict, expected):
        return
    dims: dict[str, int] = {}
    for name, degree in raw.items():
        path = join("mesh", name)
        if not _new_axis_name(p, name, path, "a mesh dimension name"):
            continue
        if (value := p.integer(degree, path, minimum=1, maximum=MAX_WORLD_SIZE)) is not None:
            dims[name] = value
    if len(dims) != len(raw):
        return
    product = math.prod(dims.values())
    if world_size is not None and product != world_size:
        shape = " x ".join(f"{n}={d}" for n, d in dims.items())
        p.add(
            "mesh",
            f"mesh degrees multiply to {product} ({shape}) but the world size is {world_size}",
        )
        return
    shape = list(dims.values())
    for i, name in enumerate(dims):
        axes[name] = AxisDraft(
            name=name,
            path=join("mesh", name),
            teams=mesh_teams(shape, i) if world_size is not None else None,
        )


def _teams(
    p: Problems, raw: Any, path: str, world_size: int | None
) -> tuple[tuple[int, ...], ...] | None:
    expected = "teams must be a non-empty list of lists of ranks, e.g. [[0, 1], [2, 3]]"
    if not p.non_empty(raw, path, list, expected):
        return None
    before = len(p)
    seen: dict[int, str] = {}  # rank: where it was first
    for i, team in enumerate(raw):
        team_path = index(path, i)
        if not p.non_empty(team, team_path, list, "a team must be a non-empty list of ranks"):
            continue
        for j, rank in enumerate(team):
            rank_path = index(team_path, j)
            problem = _rank_problem(p, rank, rank_path, world_size, seen)
            if problem:
                p.add(rank_path, problem)
            else:
                seen[rank] = rank_path
    if len({len(t) for t in raw if isinstance(t, list) and t}) > 1:
        shown = ", ".join(str(len(t)) if isinstance(t, list) else "?" for t in raw)
        p.add(path, f"teams must all have the same size, got sizes {shown}")
    return None if len(p) > before else tuple(tuple(team) for team in raw)


def _rank_problem(
    p: Problems, rank: Any, rank_path: str, world_size: int | None, seen: dict[int, str]
) -> str:
    if isinstance(rank, bool) or not isinstance(rank, int):
        return f"a rank must be an integer, got {p.show(rank_path, rank)}"
    if rank < 0:
        return f"ranks are 0 or more, got {rank}"
    if world_size is not None and rank >= world_size:
        return (
            f"rank {rank} is out of range: ranks are 0 to "
            f"{world_size - 1} for world size {world_size}"
        )
    if rank in seen:
        return (
            f"rank {rank} appears twice in this axis (also at "
            f"{seen[rank]}); a rank may be in at most one team of an axis"
        )
    return ""


def check_nccl(
    raw: Any, path: str, p: Problems, base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The nccl options of ``raw`` over ``base`` (an axis's own, for a ``whatif:`` variant)."""
    options: dict[str, Any] = dict(base or {})
    if not p.mapping(raw, path, "nccl must be a mapping of ProcessGroupNCCL options"):
        return options
    for key, value in raw.items():
        sub = join(path, key)
        if p.choice(key, sub, tuple(NCCL_OPTIONS), "nccl option", "options") is None:
            continue
        kind, minimum = NCCL_OPTIONS[key]
        if kind == "int":
            checked = p.integer(value, sub, minimum=minimum, maximum=2**31 - 1)
        elif kind == "bool":
            checked = p.boolean(value, sub)
        elif isinstance(value, str) and value:
            checked = value
        else:
            p.add(sub, f"expected a non-empty string, got {p.show(sub, value)}")
            checked = None
        if checked is not None:
            options[key] = checked
    if options.get("min_ctas", 0) > options.get("max_ctas", math.inf):
        p.add(
            join(path, "min_ctas"),
            f"min_ctas {options['min_ctas']} is larger than max_ctas {options['max_ctas']}",
        )
    return options


def _axis_env(raw: Any, path: str, p: Problems, axis: str) -> None:
    env = check_env(p, raw, path)
    nccl = sorted(k for k in env if k.startswith("NCCL_"))
    why_nccl = (
        f"NCCL reads NCCL_* variables once per process, so per-axis values cannot take effect "
        f"on axis {axis!r}; move them to the top-level env, or use the axis's nccl: options "
        "(max_ctas, min_ctas, traffic_class, ...)"
    )
    why_others = "environment variables are process-wide; set them in the top-level env"
    for names, why in ((nccl, why_nccl), (sorted(set(env) - set(nccl)), why_others)):
        if names:
            logger.warning("%s: %s: %s not applied: %s", p.file, path, ", ".join(names), why)


def _resolve_likes(p: Problems, axes: dict[str, AxisDraft]) -> None:
    """Give each ``like`` axis the teams at the end of its chain; report unknown names and
    cycles once, at the axis whose own ``like`` is wrong or closes the cycle."""
    for draft in axes.values():
        chain, current = [draft.name], draft
        while current.like is not None and draft.valid:
            target, like_path = current.like, join(current.path, "like")
            if not isinstance(target, str) or target not in axes:
                if current is draft:
                    p.choice(target, like_path, tuple(axes), "axis", "axes")
                draft.valid = False
            elif target in chain:
                if target == draft.name:
                    p.add(join(draft.path, "like"), f"like cycle: {' -> '.join([*chain, target])}")
                draft.valid = False
            else:
                chain.append(target)
                current = axes[target]
        draft.valid = draft.valid and current.valid
        draft.teams = current.teams if draft.valid else None
