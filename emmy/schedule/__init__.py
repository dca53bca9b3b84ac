"""What a schedule is, in one wing: the knob codec (knobs), a kernel's shape and what a row makes of
it (shape, geometry), the legal rows (space, with rules/schedules.py), their cost (loop_cost,
cost_model, measured) and the choice among them (choose, pricing). It sits below the e-graph in the
import order: extraction prices kernels through it, and the Kernel IR lowering's check reaches it as
a function its caller passes (emmy.program.pricer_for)."""
