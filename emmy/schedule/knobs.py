"""The knob codec: a schedule is one row of knobs, each value with exactly one
canonical spelling, read and written here only.

    WORK    t<N> | w<M>x<N>                  threads per block, or an M x N grid of warps
    TILE    f<N>[/v<V>] | r<RM>x<RN> | <atom>/f<FM>x<FN>/k<K>
                                             r: an RM x RN register micro-tile a thread (SIMT contractions)
    REDUCE  (empty) | coop | g<N>a | g<N>k
    STAGE   (empty) | regs[/w<N>] | d<D>/smem | d<D>/smem-async | d<D>/smem-tma
                                             regs: a row's fold keeps what its sweep reads again;
                                             /w<N>: a grid's blocks keep N weights in shared memory
    RASTER  (empty) | gm<G>

A `Schedule` holds the five spellings (what pins, measurements and the schedule
rules' relations store) and gives each as a typed value (`Work`, `Tile`,
`Reduce`, `Stage`, `Raster`): code asks `row.tile.mma` or `row.reduce.atomic`,
never looks at the text. Each typed value spells itself (`str(Tile.micro(8, 4))`
is `r8x4`) and `parse_value` reads a spelling back into one.

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
STAGE_PLAIN, STAGE_ASYNC, STAGE_TMA = "smem", "smem-async", "smem-tma"  # how STAGE fills shared memory
STAGE_REGS = "regs"  # a row held in registers from its fold to its sweep (emmy.schedule.held)
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
    "REDUCE": (rf"|coop|g(?P<split>{_NUMBER})(?P<mode>[aks])", "(empty), coop, g<N>a, g<N>k or g<N>s"),
    "STAGE": (rf"|(?P<regs>{STAGE_REGS})(/w(?P<weights>{_NUMBER}))?"
              rf"|d(?P<depth>{_NUMBER})/(?P<how>{STAGE_PLAIN}|{STAGE_ASYNC}|{STAGE_TMA})",
              f"(empty), {STAGE_REGS}[/w<N>], d<D>/smem, d<D>/smem-async or d<D>/smem-tma"),
    "RASTER": (rf"|gm(?P<group>{_NUMBER})", "(empty) or gm<G>"),
}
KNOB_NAMES = tuple(_FORMS)


@dataclass(frozen=True)
class Work:
    """WORK: `threads` a block; under the warp-grid form (mma tiles) `warps_m` x `warps_n` warps."""

    threads: int
    warps_m: int = 0
    warps_n: int = 0

    @staticmethod
    def warp_grid(warps_m: int, warps_n: int) -> Work:
        return Work(32 * warps_m * warps_n, warps_m, warps_n)

    @property
    def warps(self) -> bool:
        return self.warps_m > 0

    def __str__(self) -> str:
        return f"w{self.warps_m}x{self.warps_n}" if self.warps else f"t{self.threads}"


@dataclass(frozen=True)
class Tile:
    """TILE: `elems` (and `vec`-wide loads) a thread (SIMT; 1 in the other forms); an RM x RN register micro-tile a thread
    (`micro_*`); or an mma `atom` with FM x FN fragments a warp and K steps of 16*KC (`frag_*`, `k_chunks`)."""

    elems: int = 1
    vec: int = 1
    micro_m: int = 0
    micro_n: int = 0
    atom: str = ""
    frag_m: int = 0
    frag_n: int = 0
    k_chunks: int = 0

    @staticmethod
    def micro(micro_m: int, micro_n: int) -> Tile:
        return Tile(1, 1, micro_m, micro_n)

    @staticmethod
    def of_atom(atom: str, frag_m: int, frag_n: int, k_chunks: int) -> Tile:
        return Tile(1, 1, 0, 0, atom, frag_m, frag_n, k_chunks)

    @property
    def mma(self) -> bool:
        return bool(self.atom)

    @property
    def is_micro(self) -> bool:
        return self.micro_m > 0

    def __str__(self) -> str:
        if self.atom:
            return f"{self.atom}/f{self.frag_m}x{self.frag_n}/k{self.k_chunks}"
        if self.micro_m:
            return f"r{self.micro_m}x{self.micro_n}"
        return f"f{self.elems}" + (f"/v{self.vec}" if self.vec > 1 else "")


@dataclass(frozen=True)
class Reduce:
    """REDUCE: a thread a fold (serial), a block a fold (`coop`), or `split` blocks a fold that meet
    through atomics (`mode` "a"), a workspace and a finishing kernel (`mode` "k"), or a workspace
    and a grid barrier (`mode` "s": a grid of `split` blocks takes every row in turn, each block a
    slice of it, so a row's sweep follows its fold in the same kernel)."""

    coop: bool = False
    split: int = 1
    mode: str = ""

    @property
    def serial(self) -> bool:
        return not self.coop and self.split == 1

    @property
    def atomic(self) -> bool:
        return self.mode == "a"

    @property
    def workspace(self) -> bool:
        return self.mode == "k"

    @property
    def grid(self) -> bool:
        return self.mode == "s"

    def __str__(self) -> str:
        return f"g{self.split}{self.mode}" if self.mode else "coop" if self.coop else ""


@dataclass(frozen=True)
class Stage:
    """STAGE: operand tiles staged through shared memory `depth` deep, filled by plain loads, cp.async
    or TMA (`how`: STAGE_PLAIN, STAGE_ASYNC, STAGE_TMA); depth 0 reads global memory directly. For
    rows, `how` STAGE_REGS (depth 0): the fold keeps the elements its sweep reads again, and a
    grid-synced row's blocks keep their slices of the first `weights` operands every row reads
    alike in shared memory (emmy.schedule.held.invariant_loads)."""

    depth: int = 0
    how: str = ""
    weights: int = 0

    @property
    def held(self) -> bool:
        return self.how == STAGE_REGS

    def __str__(self) -> str:
        if self.depth:
            return f"d{self.depth}/{self.how}"
        return self.how + (f"/w{self.weights}" if self.weights else "")


@dataclass(frozen=True)
class Raster:
    """RASTER: output tiles visited in groups of `group` tile rows (0: row by row)."""

    group: int = 0

    def __str__(self) -> str:
        return f"gm{self.group}" if self.group else ""


_DEFAULTS = {"WORK": "t32", "TILE": "f1", "REDUCE": "", "STAGE": "", "RASTER": ""}  # an unpinned knob's reading


@dataclass(frozen=True)
class Schedule:
    """One schedule row, as spellings; a None field is not pinned. The typed values (`work`, `tile`,
    `reduce`, `stage`, `raster`) read an unpinned knob as its default (t32, f1, empty)."""

    WORK: str | None = None
    TILE: str | None = None
    REDUCE: str | None = None
    STAGE: str | None = None
    RASTER: str | None = None

    @staticmethod
    def of(work: Work, tile: Tile, reduce: Reduce = Reduce(), stage: Stage = Stage(),
           raster: Raster = Raster()) -> Schedule:
        return Schedule(str(work), str(tile), str(reduce), str(stage), str(raster))

    @property
    def work(self) -> Work:
        return parse_value("WORK", self.WORK if self.WORK is not None else _DEFAULTS["WORK"])

    @property
    def tile(self) -> Tile:
        return parse_value("TILE", self.TILE if self.TILE is not None else _DEFAULTS["TILE"])

    @property
    def reduce(self) -> Reduce:
        return parse_value("REDUCE", self.REDUCE or "")

    @property
    def stage(self) -> Stage:
        return parse_value("STAGE", self.STAGE or "")

    @property
    def raster(self) -> Raster:
        return parse_value("RASTER", self.RASTER or "")

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None)

    def pinned(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _value_error(knob: str, value: str, why: str = "") -> EmmyError:
    reason = f" ({why})" if why else ""
    return EmmyError(f"{knob}={value!r} is not a legal {knob} value{reason}; legal forms: {_FORMS[knob][1]}")


@functools.lru_cache(maxsize=4096)  # the cost model reads the same few hundred values for every row it prices
def parse_value(knob: str, value: str):
    """One spelling -> its typed value (Work, Tile, Reduce, Stage or Raster); an error names the knob,
    the value and the legal forms."""
    if knob not in _FORMS:
        raise EmmyError(f"unknown knob {knob!r}; knobs are {', '.join(KNOB_NAMES)}")
    match = re.fullmatch(_FORMS[knob][0], value)
    if match is None:
        raise _value_error(knob, value)
    g = {k: int(v) if v.isdigit() else v for k, v in match.groupdict().items() if v is not None}
    if knob == "WORK":
        work = Work(g["threads"]) if "threads" in g else Work.warp_grid(g["warps_m"], g["warps_n"])
        if not work.warps and work.threads % 32:
            raise _value_error(knob, value, "threads come in whole warps of 32")
        if work.threads > 1024:
            raise _value_error(knob, value, f"{work.threads} threads exceed CUDA's 1024 per block")
        return work
    if knob == "TILE":
        if "atom" in g:
            return Tile.of_atom(g["atom"], g["frag_m"], g["frag_n"], g["k_chunks"])
        if "micro_m" in g:
            if g["micro_m"] not in MICRO_SIDES or g["micro_n"] not in MICRO_SIDES:
                raise _value_error(knob, value, f"a micro-tile's sides must be one of {MICRO_SIDES}")
            return Tile.micro(g["micro_m"], g["micro_n"])
        vec = g.get("vec", 1)
        if "vec" in g and vec not in VECTOR_WIDTHS:
            raise _value_error(knob, value, f"vector width must be one of {VECTOR_WIDTHS}")
        if g["elems"] % vec:
            raise _value_error(knob, value, "elements per thread must be a multiple of the vector width")
        return Tile(g["elems"], vec)
    if knob == "REDUCE":
        if g.get("split") == 1:
            raise _value_error(knob, value, "a split reduction needs at least 2 blocks")
        return Reduce(value == "coop", g.get("split", 1), g.get("mode", ""))
    if knob == "STAGE":
        return Stage(0, STAGE_REGS, g.get("weights", 0)) if "regs" in g else Stage(g.get("depth", 0), g.get("how", ""))
    return Raster(g.get("group", 0))


def parse_pins(text: str) -> Schedule:
    """`K=V,...` -> Schedule. An empty string pins nothing."""
    pins: dict[str, str] = {}
    for item in [p for p in text.split(",") if p.strip()] if text.strip() else []:
        if "=" not in item:
            raise EmmyError(f"knob pin {item.strip()!r} has no '='; write KNOB=VALUE, e.g. WORK=t256")
        knob, value = (s.strip() for s in item.split("=", 1))
        if knob in pins:
            raise EmmyError(f"knob {knob} is pinned twice")
        parse_value(knob, value)
        pins[knob] = value
    return Schedule(**pins)


def check_target(row: Schedule, target) -> None:
    """Raise when a pinned value needs a feature the target lacks (target: extract.targets.Target)."""
    stage = row.stage
    if stage.how == STAGE_TMA and not target.has_tma:
        raise EmmyError(f"STAGE={row.STAGE} needs sm_90 or newer; target is {target.name}")
    if stage.how == STAGE_ASYNC and not target.has_cp_async:
        raise EmmyError(f"STAGE={row.STAGE} needs sm_80 or newer; target is {target.name}")
    if row.TILE is not None and row.tile.mma and target.compute_capability < (8, 0):
        raise EmmyError(f"TILE={row.TILE} needs sm_80 or newer; target is {target.name}")
