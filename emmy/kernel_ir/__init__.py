"""Kernel IR: a Tile IR kernel in hardware terms (threads, registers, vector accesses, shuffles,
shared memory, barriers), lowered deterministically from the chosen knob row; the CUDA
templates render it."""
