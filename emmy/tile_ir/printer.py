"""`--ir tile`: per kernel, its knob row, placement and Fold tree.

    === 0: k_rms_norm ===
    knobs WORK=t256,TILE=f8/v4,REDUCE=coop,STAGE=,RASTER=  (43 legal rows; est 4.31 us)
    place free=(a0) grid=(a0) work t256  [32 blocks x 256 threads]
    Fold[a1 in 0..2048] reduce ⟨REDUCE=coop⟩
    │ init     acc0 = 0.0
    │ lift     λ(a1): in0 = load x[0, a0, a1]; v0 = multiply(in0, in0)
    │ combine  acc0 <- add(acc0, v0)
    epilogue   v1 = multiply(acc0, 0.00048828125); ...
    outputs
    └─ sweep(a2 in 0..2048): in1 = load w[a2]; ...; rms_norm[0, a0, a2] = v6
"""

from __future__ import annotations

from emmy.loop_ir.nodes import Init, Update
from emmy.loop_ir.printer import IDENTITY, _lines, statement_text
from emmy.tensor_ir.printer import literal
from emmy.tile_ir.nodes import TWIST_ROLES, Epilogue, Fold, Sweep, TileKernel, TileProgram


def _flat(body) -> str:
    out: list[str] = []
    _lines(body, 0, out)
    return "; ".join(line.strip() for line in out)


def _fold(fold: Fold, tk: TileKernel, out: list[str]) -> None:
    twist = f" <twist={fold.twist}>" if fold.twist else ""
    what = "contraction" if tk.shape.kind in ("contraction", "attention") else "reduce"
    out.append(f"Fold[a{fold.var} in 0..{fold.extent}] {what} ⟨REDUCE={tk.row.REDUCE}⟩{twist}")
    stepped = {u.acc for u in fold.combine if isinstance(u, Update)}
    state = [i for i in fold.init if i.acc in stepped]
    out.extend(f"│ init     {statement_text(i)}" for i in fold.init if i.acc not in stepped)
    if state:
        roles = TWIST_ROLES.get((fold.twist, len(state)), tuple(i.acc for i in state))
        values = ", ".join(literal(IDENTITY[i.op]) for i in state)
        named = ", ".join(f"{r}={i.acc}" for r, i in zip(roles, state))
        out.append(f"│ init     ({', '.join(roles)}) = ({values})  [{named}]")
    out.append(f"│ lift     λ(a{fold.var}): {_flat(fold.lift)}")
    steps = [s for s in fold.combine if not isinstance(s, Update)]
    updates = [s for s in fold.combine if isinstance(s, Update)]
    for s in steps:
        out.append(f"│ combine  {statement_text(s)}")
    if updates:
        out.append(f"│ step     {'; '.join(statement_text(u) for u in updates)}")
        roles = TWIST_ROLES.get((fold.twist, len(state)), ())
        merge = {"softmax": "online-softmax merge", "welford": "Chan's merge"}[fold.twist]
        out.append(f"│ combine  {merge} ({', '.join(roles)}): associative, splits across threads and blocks")
        if roles == ("m", "d", "z"):
            out.append("│ output   z / d")


def print_tile_kernel(index: int, tk: TileKernel) -> list[str]:
    p = tk.placement
    free = ", ".join(f"a{v}" for v in p.free)
    out = [f"=== {index}: {tk.kernel.name} ===",
           f"knobs {tk.row}  ({tk.legal_rows} legal rows; est {tk.seconds * 1e6:.2f} us)",
           f"place free=({free}) grid=({', '.join(p.grid)}) work {p.work}  [{p.blocks} blocks x {p.threads} threads]"]
    g = tk.geometry
    if tk.shape.kind == "attention":
        unit = tk.row.tile.atom if g.mma else "SIMT"
        stage = f"K, V staged {tk.row.STAGE}" if tk.row.STAGE else "K, V from global memory"
        out.append(f"flash {g.tile_m} query rows x {g.tile_k} keys a step by {unit}, (m, d, z) in registers, {stage}")
    if tk.shape.kind == "contraction":
        unit = tk.row.tile.atom if g.mma else "SIMT"
        stage = f"staged {tk.row.STAGE}" if tk.row.STAGE else "operands from global memory"
        raster = f", raster {tk.row.RASTER}" if tk.row.RASTER else ""
        out.append(f"tile {g.tile_m}x{g.tile_n}x{g.tile_k} by {unit}, {stage}{raster}")
    sweeps = []
    for part in tk.parts:
        if isinstance(part, Fold):
            _fold(part, tk, out)
        elif isinstance(part, Epilogue):
            stores = [s for s in part.body if not isinstance(s, Init)]
            out.append(f"epilogue   {_flat(stores)}")
        elif isinstance(part, Sweep):
            sweeps.append(part)
    out.append("outputs")
    for sweep in sweeps:
        out.append(f"└─ sweep(a{sweep.var} in 0..{sweep.extent}): {_flat(sweep.body)}")
    if not sweeps:
        out += [f"└─ {name}: {t}" for name, t in tk.kernel.outputs]
    return out


def print_tile_ir(program: TileProgram) -> str:
    out: list[str] = []
    for index, tk in enumerate(program.kernels):
        out.extend(print_tile_kernel(index, tk))
    return "\n".join(out) + "\n"
