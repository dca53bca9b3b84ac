"""Runs one simulator launch for a parent process (see emmy.sim.runner.run_in_worker):
a pickled request on stdin, a pickled ("ok", arrays) | ("fault", message) | ("error", message)
on stdout. Started with the ASan runtime preloaded, so ASan builds can load."""

from __future__ import annotations

import pickle
import sys

from emmy.errors import EmmyError, KernelFault
from emmy.sim.runner import pack_arguments, run_in_process


def main() -> int:
    lib_path, signature, grid, block, args, shared_bytes, filename = pickle.loads(sys.stdin.buffer.read())
    try:
        run_in_process(lib_path, signature, grid, block, args, shared_bytes, filename, racecheck=False)
        reply = ("ok", pack_arguments(signature, args)[1])
    except KernelFault as fault:
        reply = ("fault", str(fault))
    except EmmyError as error:
        reply = ("error", str(error))
    sys.stdout.buffer.write(pickle.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
