"""Reads of a tensor's value into Python that no input reaches, folded into the program as constants.

`.item()` or `int(t)` on a tensor the program computes from constants alone (Reformer's
`position_ids.max().item()` over an `arange`; Funnel's relative positions) is a number known when
the program is captured, but torch.export cannot run it: it leaves an unbacked symbol (`u0`) that
slices and views then take as a size. Such a read is worked out here on the real weights and
constants, written into its readers as the number it is, and every shape the symbol reached is
worked out again (torch's fake tensors, so no tensor is computed twice). A read the inputs reach,
or one standing on a random draw (a new number each call), stays, and emmy refuses it with the line
that made it.

One pass in graph order over the nodes the folded numbers reach; nothing recurses.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def fold_constant_reads(program):
    """`program` (an ExportedProgram) with every value read that no user input reaches folded in;
    the program given is left as it was."""
    import torch

    from emmy.decompose.registry import draws_random

    reads = [node for node in program.graph.nodes if node.target is torch.ops.aten._local_scalar_dense.default]
    if not reads:
        return program
    user_inputs = {spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"}
    # a read an input reaches varies by call; one standing on a random draw (`torch.rand(1).item()`)
    # too, as eager torch draws again on each call
    varying = reached_from(program.graph, lambda node: (node.op == "placeholder" and node.name in user_inputs)
                            or (node.op == "call_function" and draws_random(str(node.target))))
    constant = [read for read in reads if read not in varying]
    if not constant:
        return program
    module = copied(program.graph_module)
    copies = {node.name: node for node in module.graph.nodes}
    numbers = {copies[read.name]: value for read, value in evaluated(program, constant).items()}
    specialized(module, numbers)
    logger.info("%d read(s) of a tensor's value that no input reaches folded in as constants", len(numbers))
    return program._update(module, program.graph_signature)


def reached_from(graph, is_source) -> set:
    """The nodes a source node reaches, sources included (one pass in graph order)."""
    reached = set()
    for node in graph.nodes:
        if is_source(node) or any(source in reached for source in node.all_input_nodes):
            reached.add(node)
    return reached


def evaluated(program, reads: list, user_inputs: list = ()) -> dict:
    """Each read's Python number, computed on the real weights and constants, and on `user_inputs`
    (the tensors the program takes, in order) where an input reaches it: only the nodes the reads
    stand on are run."""
    import torch

    from emmy.decompose.from_aten import weight_values

    needed = set(reads)
    for node in reversed(program.graph.nodes):
        if node in needed:
            needed.update(node.all_input_nodes)
    stored = {name: tensor for name, (_, tensor) in weight_values(program).items()}
    stored |= dict(zip(user_tensors(program), user_inputs))
    values = {}
    with torch.no_grad():
        for node in program.graph.nodes:
            if node not in needed:
                continue
            if node.op == "placeholder":
                values[node] = stored[node.name]
            elif node.op == "get_attr":
                values[node] = getattr(program.graph_module, node.target)
            else:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
                values[node] = node.target(*args, **kwargs)
    return {read: values[read] for read in reads}


def user_tensors(program) -> list[str]:
    """The placeholders of the tensors a user passes, in order (flags and None are no tensors)."""
    import torch

    taken = {spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"}
    return [node.name for node in program.graph.nodes
            if node.name in taken and isinstance(node.meta.get("val"), torch.Tensor)]


def copied(module):
    """A graph module over a copy of `module`'s graph (nodes and their meta copied, weights shared),
    so the caller's exported program is not changed."""
    import torch

    graph = torch.fx.Graph()
    copies: dict = {}
    result = graph.graph_copy(module.graph, copies)
    graph.output(result)
    for old, new in copies.items():
        # fx renames a node that shadows a builtin (an input named `input` becomes input_1), but the
        # export signature names the original: kept (the namespace holds the other, so no new node
        # takes it)
        if new.name != old.name:
            new.name = old.name
    return torch.fx.GraphModule(module, graph)


def specialized(module, numbers: dict, recompute=frozenset()) -> None:
    """Write `numbers` (node -> Python number) into their readers, fold what becomes a number
    (symbolic arithmetic, sizes, assertions), and work out again each value whose shape held a symbol
    and each node in `recompute` (new nodes, or ones whose shapes a rewrite changed)."""
    import torch

    known = dict(numbers)
    changed = set()
    fake_mode = _fake_mode(module.graph)
    for node in module.graph.nodes:
        if node in known or node.op != "call_function":
            continue
        if node not in recompute and not any(source in known or source in changed for source in node.all_input_nodes):
            continue
        node.args, node.kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: known.get(n, n))
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        with fake_mode:
            value = node.target(*args, **kwargs)  # an assertion found false raises here
        if value is None or isinstance(value, (bool, int, float)):
            known[node] = value
        elif node in recompute or _is_symbolic(node.meta.get("val")):  # else worked out again, it is the same
            node.meta["val"] = value
            changed.add(node)
    for node in reversed(module.graph.nodes):
        if node in known:
            if node.users:
                raise AssertionError(f"{node.name} was folded but {list(node.users)} still read it")
            module.graph.erase_node(node)
    module.recompile()


def _fake_mode(graph):
    from torch._guards import detect_fake_mode

    return detect_fake_mode([node.meta["val"] for node in graph.nodes if "val" in node.meta])


def _is_symbolic(value) -> bool:
    """Whether a value (a fake tensor, a number, a list of them) holds a symbol: a size torch
    worked out as equal to a number still reads the symbol it came from."""
    import torch

    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in (*value.shape, *value.stride(), value.storage_offset()))
    if isinstance(value, (list, tuple)):
        return any(_is_symbolic(item) for item in value)
    return False

