"""Kernel IR nodes: frozen dataclasses, one per hardware construct.

Scalar work stays in Loop IR form (`Scalar` wraps Loop IR Assign, Accumulate and Update
statements); what Kernel IR adds is where it runs: which thread, over which elements, through
which registers, vector accesses, shuffles, shared memory and barriers. Nodes hold meaning, not
C: an index is an Affine over the loop variables, a thread's role is a word (`per="block"`,
`worker="warp"`); kernel_ir/cuda.py and the templates spell them. Nodes of many fields are built
by keyword.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from emmy.affine import Affine, Guard
from emmy.dtypes import DType
from emmy.loop_ir.nodes import Init
from emmy.loop_ir.nodes import Stmt as LoopStmt


@dataclass(frozen=True)
class Param:
    name: str
    dtype: DType
    written: bool  # the kernel stores to it (else it is read-only)
    scratch: int = 0  # elements of a buffer the program does not have (a split's workspace): allocate them


@dataclass(frozen=True)
class Tile:
    """What one block owns: `dims` over `extent` elements each; `rows` of them in all."""
    dims: tuple[str, ...]  # e.g. ("row", "col")
    extent: int  # elements along the last dim (a row's length; a map's elements per block)
    rows: int  # blocks' worth of work: rows (row kernels) or elements (maps)
    workers: int  # threads per row (row kernels) or per block (maps)


@dataclass(frozen=True)
class RowIndex:
    """The free loop variables of the row a block or thread owns (row-major)."""
    vars: tuple[tuple[int, int], ...]  # (loop variable, extent), outermost first
    per: str = "block"  # "block": a block a row; "thread": a thread a row; "column": 32 rows a block, a lane each
    split: int = 1  # blocks per row (block index = row * split + slice)


@dataclass(frozen=True)
class Scalar:
    """Loop IR statements (Assign, Accumulate, Update, Init), computed by each thread."""
    stmts: tuple[LoopStmt, ...]


@dataclass(frozen=True)
class VecLoad:
    """`width` consecutive elements of `buffer` at flat `index` into register array `dst`; the
    vector starts where loop variable `base_var` is the thread's vector base."""
    dst: str
    buffer: str
    dtype: DType
    index: Affine  # over the loop variables
    width: int
    base_var: int


@dataclass(frozen=True)
class VecStore:
    """`width` consecutive elements from register array `src` to `buffer` at flat `index` (as VecLoad)."""
    src: str
    buffer: str
    dtype: DType
    index: Affine
    width: int
    base_var: int


@dataclass(frozen=True, kw_only=True)
class ElementLoop:
    """A thread's share of `var` in 0..extent: `width`-wide vectors, `workers` threads striding
    together, `unroll` vectors per thread per step. `tail`: the last extent % width elements
    one at a time after the vector loop."""
    var: int
    extent: int
    width: int
    workers: int
    unroll: int
    worker: str  # which index strides the workers: "thread" (the block's threads), "warp" (its warps), "alone"
    vectors: tuple[VecLoad, ...]  # loads taken a vector at a time
    body: tuple[LoopStmt, ...]  # per element, with `a<var>` bound and `u` the lane within the vector
    tail: bool
    stores: tuple[VecStore, ...] = ()  # stores written a vector at a time
    split: int = 1  # > 1: only this block's slice (the block index modulo `split`) of the extent
    # A row held in registers (STAGE=regs): `steps` > 0 walks a constant number of steps, so the
    # vectors a fold keeps (`keep`: their dst names) sit in register arrays `<dst>_held[step][r]`
    # that later loops of the row read instead of loading (`reuse`: (their dst, the kept dst)).
    steps: int = 0
    keep: tuple[str, ...] = ()
    reuse: tuple[tuple[str, str], ...] = ()
    # A grid-synced row's weights (STAGE=regs/w<N>): (vector dst, byte offset in dynamic shared
    # memory) loaded on the first row into the thread's own slots, read from there on later rows.
    staged: tuple[tuple[str, int], ...] = ()
    # A long fold in chunks of `chunk_steps` steps: each chunk folds `restarted` ((monoid or twist,
    # register type, accumulators) groups) from their identity and is then merged into the row's
    # state, so a thread's sums chain over a chunk, not over its whole share (a chain of 20000
    # additions leans).
    chunk_steps: int = 0
    restarted: tuple[tuple[str, DType, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class MapElements:
    """A map's elements, `width` consecutive ones at a time: vector j of thread t in block b starts
    at element (b * threads * per_thread + j * threads + t) * width for `threads` a block (coalesced)."""
    vars: tuple[tuple[int, int], ...]  # the free loops (variable, extent), outermost first
    per_thread: int
    total: int
    body: tuple[LoopStmt, ...]  # Loop IR statements per element
    width: int = 1
    vectors: tuple[VecLoad, ...] = ()
    stores: tuple[VecStore, ...] = ()


@dataclass(frozen=True)
class WarpShuffle:
    """Butterfly over the warp: every lane ends with the warp's combined value; lane 0 leaves it
    in shared memory `smem` (one slot per warp)."""
    op: str  # sum | max | min | prod | softmax | welford
    accs: tuple[str, ...]
    smem: str
    length: int = 32
    dtype: DType = DType.F32  # the accumulators' register type (I64: arg-reduction keys)


@dataclass(frozen=True)
class Smem:
    dtype: DType
    name: str
    size: int


@dataclass(frozen=True)
class Sync:
    pass


@dataclass(frozen=True)
class TreeHalve:
    """The per-warp values in shared memory combined by the first warp."""
    op: str
    accs: tuple[str, ...]
    smem: str
    length: int
    dtype: DType = DType.F32  # the accumulators' register type


@dataclass(frozen=True, kw_only=True)
class Panel:
    """An operand of a contraction staged through shared memory: the Loop IR load `name` (from
    `buffer`) for its BM (side "a") or BN (side "b") rows of a BK chunk, `depth` buffers deep.
    Laid out rows x cols: K along the columns (`k_fast`, then filled `width` elements at a time
    where the source is contiguous along K) or along the rows (a B operand contiguous along N)."""
    name: str
    buffer: str
    dtype: DType
    side: str
    rows: int
    cols: int
    k_fast: bool = True
    width: int = 1
    fill_along_k: bool = False  # K along the rows, yet filled `width` along K (the source's contiguous axis)
    guards: tuple[Guard, ...] = ()  # the load's guards: the fill reads where they hold, 0 elsewhere (width 1)


@dataclass(frozen=True, kw_only=True)
class ContractionTile:
    """A block's BM x BN tile of a SIMT contraction: each thread owns `per_thread` outputs (strided
    by the block size, or with `micro_m` an RM x RN micro-tile: rows in runs of 4, the runs 4*TY
    apart, columns likewise, so that every K step loads RM + RN panel elements in 4-wide vectors
    into registers for RM * RN products; its panels are K-major); K advances BK at a time through the staged panels (plain loads or cp.async,
    `depth` buffers), then each output's epilogue runs and stores. Loop IR statements keep their
    names: an accumulator `acc` is one register per owned output."""
    m_vars: tuple[tuple[int, int], ...]  # (variable, extent), row-major
    n_vars: tuple[tuple[int, int], ...]
    batch_vars: tuple[tuple[int, int], ...]
    k_var: int
    k_extent: int
    bm: int
    bn: int
    bk: int
    per_thread: int
    depth: int  # 0: operands straight from global memory
    how: str  # "smem" | "smem-async" | ""
    panels: tuple[Panel, ...]
    inits: tuple[Init, ...]
    lift: tuple[LoopStmt, ...]
    combine: tuple[LoopStmt, ...]
    epilogue: tuple[LoopStmt, ...]
    split: int = 1  # blocks along K (grid z): each adds its partial result atomically, or writes it to
    atomics: tuple[tuple[str, str], ...] = ()  # split: (accumulator, monoid) combined into the output
    workspace: str = ""  # ... this buffer, [accumulator][split][batch][M][N], for a finishing kernel
    raster: int = 0  # > 0: blocks walk the output tiles in groups of this many tile rows (L2 reuse)
    k_width: int = 1  # unstaged: K taken this many at a time, `vectors` loaded whole (contiguous along K)
    vectors: tuple[VecLoad, ...] = ()
    micro_m: int = 0  # > 0: each thread owns an RM x RN register micro-tile (BN / RN threads along N)
    micro_n: int = 0


@dataclass(frozen=True, kw_only=True)
class MmaOperand:
    """One operand of a tensor-core contraction: the Loop IR load `name` (from `buffer`, at the
    flat C index `index` over the loop variables). Staged in shared memory as a panel of the
    block's BM (side "a") or BN (side "b") rows by BK: K along the columns when the source is
    contiguous along K (`k_fast`: plain ldmatrix), else K along the rows (ldmatrix .trans).
    `width` elements move at once (8 = 16 bytes) where the source is contiguous along the panel's
    columns; `tma` > 0: the panel arrives as one TMA box of a 2-D tensor map over the buffer read
    as rows of that many elements (a batch's matrices stacked)."""
    name: str
    buffer: str
    dtype: DType
    side: str
    index: Affine  # the flat index over the loop variables
    rows: int  # panel rows (BM or BN when k_fast, else BK)
    cols: int
    k_fast: bool
    width: int = 1
    tma: int = 0
    tma_batch_rows: tuple[tuple[int, int], ...] = ()  # with `tma`, a batched operand: (batch variable, rows a step of it)
    guards: tuple[Guard, ...] = ()  # the load's guards: the fill reads where they hold, 0 elsewhere (width 1)
    prologue: tuple[LoopStmt, ...] = ()  # Loop IR statements turning a loaded element (`name`) into `value`, in registers
    value: str = ""  # what the tensor cores multiply (the prologue's last value; `name` without one)
    # the panel's 16-byte chunk c of row r is stored at chunk c ^ ((r >> swizzle_shift) & swizzle_mask)
    # (lower_mma.panel_swizzle: ldmatrix reads without bank conflicts); mask 0: stored as it is
    swizzle_shift: int = 0
    swizzle_mask: int = 0


@dataclass(frozen=True, kw_only=True)
class MmaTile:
    """A block's BM x BN tile of C on tensor cores: WM x WN warps, each FM x FN mma atoms of 16 x 8
    (`atom`, f32 accumulators in registers, PTX fragment layout), K in steps of BK = 16 * KC. The
    operands reach the fragments by ldmatrix from shared-memory panels `depth` stages deep (plain
    loads, cp.async or TMA), or with `depth` 0 straight from global memory. Then each accumulator
    element's epilogue runs and stores (or a split's partial result goes out as for a
    ContractionTile). `raster`: blocks walk the output tiles in groups of that many tile rows."""
    atom: str
    m_vars: tuple[tuple[int, int], ...]
    n_vars: tuple[tuple[int, int], ...]
    batch_vars: tuple[tuple[int, int], ...]
    k_var: int
    k_extent: int
    warps_m: int
    warps_n: int
    frag_m: int
    frag_n: int
    k_chunks: int
    depth: int
    how: str  # "" | "smem" | "smem-async" | "smem-tma"
    operands: tuple[MmaOperand, MmaOperand]  # (a, b)
    acc: str
    epilogue: tuple[LoopStmt, ...]
    split: int = 1
    atomics: tuple[tuple[str, str], ...] = ()
    workspace: str = ""
    raster: int = 0

    @property
    def bm(self) -> int:
        return 16 * self.frag_m * self.warps_m

    @property
    def bn(self) -> int:
        return 8 * self.frag_n * self.warps_n

    @property
    def bk(self) -> int:
        return 16 * self.k_chunks


@dataclass(frozen=True, kw_only=True)
class FlashRows:
    """Flash attention on SIMT warps: each warp owns `rows_per_warp` query rows; for each key its
    lanes split the q.k dot over the head dimension (`inner_var`, a warp sum after), and lane l
    steps the fold's state for value columns l, l + 32, ... (`cols_per_lane`). The keys advance
    `keys_step` at a time, the K and V tiles staged in shared memory (`panels`, `depth` deep:
    plain loads or cp.async) or read from global memory (`depth` 0). Statements stay in Loop IR
    form: `per_key` (mask, dot, score: one value for the warp), `held` (the dot's statements
    that do not read the key, kept in registers per row), `dot` (the rest of the dot's body),
    `per_col` (the V load and the state step), `epilogue` (per output element)."""
    row_vars: tuple[tuple[int, int], ...]
    col_vars: tuple[tuple[int, int], ...]
    batch_vars: tuple[tuple[int, int], ...]
    key_var: int
    key_extent: int
    inner_var: int
    inner_extent: int
    rows_per_warp: int
    warps: int
    keys_step: int
    cols_per_lane: int
    inner_per_lane: int
    depth: int
    how: str
    panels: tuple[Panel, ...]  # side "k" (keys x head dimension) or "v" (keys x value columns)
    inits: tuple[Init, ...]
    per_key: tuple[LoopStmt, ...]
    held: tuple[LoopStmt, ...]
    dot: tuple[LoopStmt, ...]
    per_col: tuple[LoopStmt, ...]
    epilogue: tuple[LoopStmt, ...]
    # a causal bound or window (emmy.schedule.key_bounds): guards outside which a block's keys are
    # all masked, and the state value holding the running maximum (a row whose m is still -inf
    # walks them all)
    key_range: tuple[Guard, ...] = ()
    running_max: str = ""


@dataclass(frozen=True, kw_only=True)
class FlashMma:
    """Flash attention on tensor cores: WM warps side by side over query rows, each FM atoms of 16
    rows. Per step of BN = 8 * FN keys: S = Q K^T by mma (K = the head dimension), the score
    statements (`scores`: mask, scale) on each S element, the block's row maxima over the lane
    quad, P = exp(score - m) (1 where equal, as the fold's step), the rows' (m, d) rescaled, and
    O += P V by mma with P converted to the atom's dtype in registers (16 keys an atom; a
    missing half is zeros). The state per output element is (m, d, z) = (`state`): m and d per
    row, z in the O fragments; then the epilogue. Operands: q (BM x D), k (BN x D), v (BN
    rounded up to 16 x N), staged `depth` deep (q once) or read from global memory."""
    atom: str
    row_vars: tuple[tuple[int, int], ...]
    col_vars: tuple[tuple[int, int], ...]
    batch_vars: tuple[tuple[int, int], ...]
    key_var: int
    key_extent: int
    inner_var: int
    inner_extent: int
    warps: int
    frag_m: int
    frag_n: int
    depth: int
    how: str
    q: MmaOperand
    k: MmaOperand
    v: MmaOperand
    scores: tuple[LoopStmt, ...]  # Loop IR statements from the dot's sum (`dot_acc`) to the score
    dot_acc: str
    score: str
    state: tuple[str, str, str]  # (m, d, z) accumulators
    epilogue: tuple[LoopStmt, ...]
    key_range: tuple[Guard, ...] = ()  # a causal bound or window, as FlashRows.key_range

    @property
    def bm(self) -> int:
        return 16 * self.frag_m * self.warps

    @property
    def bn(self) -> int:
        return 8 * self.frag_n


@dataclass(frozen=True)
class SplitFinish:
    """One thread per output: each accumulator combined over the split's partial results in the
    workspace, then the contraction's epilogue and store."""
    m_vars: tuple[tuple[int, int], ...]
    n_vars: tuple[tuple[int, int], ...]
    batch_vars: tuple[tuple[int, int], ...]
    split: int
    workspace: str
    accs: tuple[tuple[str, str], ...]  # (accumulator, monoid), in workspace order
    epilogue: tuple[LoopStmt, ...]


@dataclass(frozen=True)
class Fill:
    """Every element of `buffer` set to `value`: the identity a split's atomics combine into."""
    buffer: str
    dtype: DType
    total: int
    value: float


@dataclass(frozen=True)
class Broadcast:
    """Every thread reads the combined values the tree left in shared memory."""
    accs: tuple[str, ...]
    smem: str


@dataclass(frozen=True)
class PartialSlot:
    """Where this row's slice leaves accumulator `slot`'s partial state in a workspace laid out
    [accumulator][row][slice] (`rows` rows, `split` slices). A grid-synced row (REDUCE=g<N>s)
    takes two rows of workspace in turn (`alternate`: the row's parity), so one row's partial
    states are written while the last row's may still be read."""
    slot: int
    rows: int
    split: int
    alternate: bool = False


@dataclass(frozen=True)
class Store:
    """One element of a row's result: `buffer[index] = value` (a value's name, or a constant), or with
    `atomic` (a monoid) the value combined into it, as the blocks of a split row do."""
    buffer: str
    dtype: DType
    index: Affine | PartialSlot
    value: str | float
    atomic: str = ""


@dataclass(frozen=True)
class OnlyThread:
    """Statements one thread of the row runs (a row's result, written once): `who` is "first" (the
    block's first thread), "grid_first" (the first thread of the grid's first block: a grid-synced
    row, which every block holds) or "output_lanes" (in a column reduction, the first warp's lanes
    that own an output)."""
    body: tuple[Store, ...]
    who: str = "first"


@dataclass(frozen=True)
class ColumnCombine:
    """A column reduction's partial states, one per warp for each of the block's 32 outputs (a lane
    each), folded across the warps through shared memory `smem`; every thread ends with its
    lane's combined value."""
    op: str  # sum | max | min | prod | softmax | welford
    accs: tuple[str, ...]
    smem: str
    warps: int
    dtype: DType = DType.F32


Stmt = Union[RowIndex, Scalar, VecLoad, VecStore, ElementLoop, MapElements, WarpShuffle, Smem, Sync, TreeHalve,
             Broadcast, Store, OnlyThread, ColumnCombine, ContractionTile, MmaTile, FlashRows, FlashMma, Fill, SplitFinish]


@dataclass(frozen=True)
class WorkspaceMerge:
    """A row split with a workspace (REDUCE=g<N>k): the `split` partial states of the thread's
    row, laid out [accumulator][row][slice] in `workspace`, merged in slice order by each group's
    monoid or twist; the thread then holds what the whole row's fold would have."""
    groups: tuple[tuple[str, tuple[str, ...]], ...]  # (monoid or twist, accumulators), workspace order
    workspace: str
    split: int
    rows: int


@dataclass(frozen=True)
class GridRows:
    """Every row in turn, for a grid-synced row (REDUCE=g<N>s, a cooperative launch): each of the
    grid's blocks takes a slice (`slice` = its block index) of each row and runs `body` on it,
    meeting the other blocks at a grid barrier after each fold (GridMerge)."""
    vars: tuple[tuple[int, int], ...]  # (loop variable, extent) of the row, outermost first
    body: tuple  # Kernel IR statements, per row


@dataclass(frozen=True)
class GridMerge:
    """After a fold of a grid-synced row: the grid barrier, then the first warp of each block
    merges the blocks' partial states (workspace [accumulator][row parity][slice], `split` slices)
    by each group's monoid or twist, lane l the slices l, l + 32, ... in order, then the lanes by
    butterfly shuffles (the same steps in every block), and the block reads the row's state from
    shared memory `smem`."""
    groups: tuple[tuple[str, tuple[str, ...]], ...]  # (monoid or twist, accumulators), workspace order
    workspace: str
    split: int
    smem: str


@dataclass(frozen=True, kw_only=True)
class KernelIR:
    name: str
    params: tuple[Param, ...]
    tile: Tile
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: tuple[Smem, ...]
    body: tuple[Stmt, ...]  # Kernel IR statements
    knobs: str  # the knob row, for the listing and the CUDA comment
    summary: str  # the Tile IR kernel's shape, for the comment
    # (twist, state accumulators) of the folds that merge by a twist
    twists: tuple[tuple[str, tuple[str, ...]], ...] = ()
    dynamic_smem: int = 0  # bytes of dynamic shared memory the launch provides
    # TMA descriptors passed after the params: (buffer, row length, box rows, box cols)
    tensor_maps: tuple[tuple[str, int, int, int], ...] = ()
    cooperative: bool = False  # launched cooperatively: its blocks meet at grid barriers (GridMerge)
