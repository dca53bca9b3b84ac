"""A sample of a program's legal rows run in the simulator against torch: the default row, the
model's next best three and three more drawn with a fixed seed, per kernel."""

import dataclasses
import random

from emmy.kernel_ir.lower import supports


def sample_rows(program, seed=0) -> dict[str, list]:
    """Per kernel: the default row, the model's next best three and three more drawn with a fixed seed."""
    sample = {}
    for kernel in program.loop_ir.kernels:
        ranked = [b.row for b in program.ranked_rows(kernel)]
        sample[kernel.name] = ranked[:4] + random.Random(seed).sample(ranked[4:], min(3, len(ranked[4:])))
    return sample


def check_sampled_rows(base, sample: dict[str, list] | None = None) -> int:
    """Each sampled row's kernels run inside the program in place of the chosen row's, and the
    program's outputs are checked against torch. The rows are built as one translation unit (their
    kernels renamed `<kernel>_row<i>`): one simulator build a program, not one a row. Returns the
    number of rows run."""
    import emmy.sim as sim
    from emmy.config import settings
    from emmy.dtypes import from_device
    from emmy.kernel_ir.cuda import program_source
    from emmy.runtime import check_inputs, compare_outputs, host_buffers, launch_in_order

    kernels, runs = {k.name: k for k in base.kernel_ir}, []
    for kernel, rows in (sample or sample_rows(base)).items():
        if sample is None:
            assert len(rows) == min(7, len(base.schedule_space().rows[kernel]))
        for i, row in enumerate(rows):
            program = base.with_rows({kernel: row})
            assert [t.row for t in program.tile_ir.kernels if t.kernel.name == kernel] == [row]
            assert not any(supports(k, program.buffer_types) for k in program.tile_ir.kernels), row
            mine = (kernel, f"{kernel}_fill", f"{kernel}_finish")
            order = [dataclasses.replace(k, name=f"{k.name}_row{i}") if k.name in mine else k
                     for k in program.kernel_ir]
            kernels |= {k.name: k for k in order}
            runs.append((kernel, row, program, order))
    module = sim.load(program_source(list(kernels.values()), base.buffer_types, {}), "rows.cu",
                      mode=settings().sim_mode)
    for kernel, row, program, order in runs:
        buffers = host_buffers(program, check_inputs(program, program.example_inputs))
        launch_in_order(module, program, order, buffers)
        types = program.buffer_types
        checks = compare_outputs(program, {n: from_device(buffers[n], types[n].dtype) for n in program.loop_ir.outputs})
        assert all(c.ok for c in checks), (kernel, str(row), checks)
    return len(runs)
