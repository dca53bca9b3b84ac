"""Runs simulator launches for a parent process (see emmy.sim.runner.AsanWorker), started with
the ASan runtime preloaded so ASan builds can load. It serves launches until its input closes:
each request and reply is a length-prefixed pickle, a request (library, signature, grid, block,
args, shared bytes, filename), a reply ("ok", arrays) | ("fault", message) | ("error", message).
An ASan fault ends the process (its report goes to stderr); the parent starts another.

Replies travel on a copy of the original stdout; fd 1 is pointed at stderr, so a kernel's printf
cannot corrupt them."""

from __future__ import annotations

import os
import sys

from emmy.errors import EmmyError, KernelFault
from emmy.sim.runner import pack_arguments, read_message, run_in_process, write_message


def handle(request) -> tuple:
    lib_path, signature, grid, block, args, shared_bytes, filename = request
    try:
        run_in_process(lib_path, signature, grid, block, args, shared_bytes, filename, racecheck=False)
        return ("ok", pack_arguments(signature, args)[1])
    except KernelFault as fault:
        return ("fault", str(fault))
    except EmmyError as error:
        return ("error", str(error))


def main() -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while (request := read_message(requests)) is not None:
        write_message(replies, handle(request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
