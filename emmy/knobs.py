"""The knob codec: a schedule is one row of knobs, each value with exactly one
canonical spelling.

    WORK    t<N> | w<M>x<N>                  threads per block, or an M x N grid of warps
    TILE    f<N>[/v<V>] | r<RM>x<RN> | <atom>/f<FM>x<FN>/k<K>
                                             r: an RM x RN register micro-tile a thread (SIMT contractions)
    REDUCE  (empty) | coop | g<N>a | g<N>k
    STAGE   (empty) | d<D>/smem | d<D>/smem-async | d<D>/smem-tma
    RASTER  (empty) | gm<G>

The `spell_*` functions write each form (the schedule rules' candidates are
spelt with them), `value_fields` reads one back: a value is parsed and spelt
here and nowhere else.

`parse_pins` reads `K=V,...` (EMMY_KNOBS, --knobs); a misspelt value is an
error naming the knob and its legal forms. `check_target` says which rule
forbids a value on a GPU (`STAGE=d3/smem-tma needs sm_90 or newer; target
is sm_80`). Whether a row suits a particular kernel is the schedule rules'
business, not the codec's.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields

from emmy.errors import EmmyError

MMA_ATOMS = ("mma_m16n8k16_f16_f32", "mma_m16n8k16_bf16_f32")
VECTOR_WIDTHS = (2, 4, 8)
MICRO_SIDES = (4, 8)  # a micro-tile's sides: whole 4-wide shared-memory vectors, at most 64 accumulators
_NUMBER = r"[1-9][0-9]*"  # no leading zeros: one spelling per value

_FORMS = {
    "WORK": (rf"t(?P<threads>{_NUMBER})|w(?P<warps_m>{_NUMBER})x(?P<warps_n>{_NUMBER})", "t<N> or w<M>x<N>"),
    "TILE": (
        rf"f(?P<elems>{_NUMBER})(/v(?P<vec>{_NUMBER}))?"
        rf"|r(?P<micro_m>{_NUMBER})x(?P<micro_n>{_NUMBER})"
        rf"|(?P<atom>{'|'.join(MMA_ATOMS)})/f(?P<frag_m>{_NUMBER})x(?P<frag_n>{_NUMBER})/k(?P<k_chunks>{_NUMBER})",
        f"f<N>[/v<V>], r<RM>x<RN> (RM, RN of {MICRO_SIDES}) or <atom>/f<FM>x<FN>/k<K> with atom "
        f"{' | '.join(MMA_ATOMS)}",
    ),
    "REDUCE": (rf"|coop|g(?P<split>{_NUMBER})(?P<mode>[ak])", "(empty), coop, g<N>a or g<N>k"),
    "STAGE": (rf"|d(?P<depth>{_NUMBER})/(?P<how>smem|smem-async|smem-tma)",
              "(empty), d<D>/smem, d<D>/smem-async or d<D>/smem-tma"),
    "RASTER": (rf"|gm(?P<group>{_NUMBER})", "(empty) or gm<G>"),
}
KNOB_NAMES = tuple(_FORMS)
STAGE_PLAIN, STAGE_ASYNC, STAGE_TMA = "smem", "smem-async", "smem-tma"  # how STAGE fills shared memory


def spell_work_threads(threads: int) -> str:
    return f"t{threads}"


def spell_work_warps(warps_m: int, warps_n: int) -> str:
    return f"w{warps_m}x{warps_n}"


def spell_tile_simt(elems: int, vec: int = 1) -> str:
    return f"f{elems}" + (f"/v{vec}" if vec > 1 else "")


def spell_tile_micro(micro_m: int, micro_n: int) -> str:
    return f"r{micro_m}x{micro_n}"


def spell_tile_mma(atom: str, frag_m: int, frag_n: int, k_chunks: int) -> str:
    return f"{atom}/f{frag_m}x{frag_n}/k{k_chunks}"


def spell_reduce_split(split: int, mode: str) -> str:
    """`mode`: "a" (blocks combine with atomics) or "k" (a workspace and a finishing kernel)."""
    return f"g{split}{mode}"


def split_mode(reduce: str) -> str:
    """A REDUCE value's split mode: "a" (atomics), "k" (workspace), "" (no split)."""
    return str(value_fields("REDUCE", reduce).get("mode", "")) if reduce else ""


def spell_stage(depth: int, how: str) -> str:
    return f"d{depth}/{how}"


def spell_raster(group: int) -> str:
    return f"gm{group}"


@dataclass(frozen=True)
class KnobRow:
    """One schedule row; a None field is not pinned."""

    WORK: str | None = None
    TILE: str | None = None
    REDUCE: str | None = None
    STAGE: str | None = None
    RASTER: str | None = None

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None)

    def pinned(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _value_error(knob: str, value: str, why: str = "") -> EmmyError:
    reason = f" ({why})" if why else ""
    return EmmyError(f"{knob}={value!r} is not a legal {knob} value{reason}; legal forms: {_FORMS[knob][1]}")


def parse_value(knob: str, value: str) -> str:
    """Validate one value and return it (the canonical spelling is the only spelling)."""
    if knob not in _FORMS:
        raise EmmyError(f"unknown knob {knob!r}; knobs are {', '.join(KNOB_NAMES)}")
    match = re.fullmatch(_FORMS[knob][0], value)
    if match is None:
        raise _value_error(knob, value)
    groups = {k: int(v) for k, v in match.groupdict().items() if v is not None and v.isdigit()}
    if knob == "WORK":
        threads = groups.get("threads") or 32 * groups["warps_m"] * groups["warps_n"]
        if "threads" in groups and threads % 32:
            raise _value_error(knob, value, "threads come in whole warps of 32")
        if threads > 1024:
            raise _value_error(knob, value, f"{threads} threads exceed CUDA's 1024 per block")
    if knob == "TILE" and "vec" in groups:
        if groups["vec"] not in VECTOR_WIDTHS:
            raise _value_error(knob, value, f"vector width must be one of {VECTOR_WIDTHS}")
        if groups["elems"] % groups["vec"]:
            raise _value_error(knob, value, "elements per thread must be a multiple of the vector width")
    if knob == "TILE" and "micro_m" in groups:
        if groups["micro_m"] not in MICRO_SIDES or groups["micro_n"] not in MICRO_SIDES:
            raise _value_error(knob, value, f"a micro-tile's sides must be one of {MICRO_SIDES}")
    if knob == "REDUCE" and groups.get("split") == 1:
        raise _value_error(knob, value, "a split reduction needs at least 2 blocks")
    return value


def value_fields(knob: str, value: str) -> dict[str, int | str]:
    """The parts of a legal value: numbers as ints, the atom, the staging mode, the split mode."""
    return dict(_value_fields(knob, value))


@functools.lru_cache(maxsize=4096)
def _value_fields(knob: str, value: str) -> tuple:
    # cached: the cost model asks for the same few hundred values for every row it prices
    parse_value(knob, value)
    match = re.fullmatch(_FORMS[knob][0], value)
    return tuple((name, int(part) if part.isdigit() else part) for name, part in match.groupdict().items()
                 if part is not None)


def parse_pins(text: str) -> KnobRow:
    """`K=V,...` -> KnobRow. An empty string pins nothing."""
    pins: dict[str, str] = {}
    for item in [p for p in text.split(",") if p.strip()] if text.strip() else []:
        if "=" not in item:
            raise EmmyError(f"knob pin {item.strip()!r} has no '='; write KNOB=VALUE, e.g. WORK=t256")
        knob, value = (s.strip() for s in item.split("=", 1))
        if knob in pins:
            raise EmmyError(f"knob {knob} is pinned twice")
        pins[knob] = parse_value(knob, value)
    return KnobRow(**pins)


def check_target(row: KnobRow, target) -> None:
    """Raise when a pinned value needs a feature the target lacks (target: extract.targets.Target)."""
    stage = row.STAGE or ""
    if stage.endswith(STAGE_TMA) and not target.has_tma:
        raise EmmyError(f"STAGE={stage} needs sm_90 or newer; target is {target.name}")
    if stage.endswith(STAGE_ASYNC) and not target.has_cp_async:
        raise EmmyError(f"STAGE={stage} needs sm_80 or newer; target is {target.name}")
    tile = row.TILE or ""
    if tile.startswith("mma_") and target.compute_capability < (8, 0):
        raise EmmyError(f"TILE={tile} needs sm_80 or newer; target is {target.name}")
