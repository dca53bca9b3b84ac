"""`--ir torch`: the core-ATen graph that capture produced, one op a line."""

from __future__ import annotations

from emmy.capture import Captured


def _type(node) -> str:
    val = node.meta.get("val")
    if val is None or not hasattr(val, "shape"):
        if isinstance(val, (tuple, list)):
            return "(" + ", ".join(_val_type(v) for v in val) + ")"
        return "?"
    return _val_type(val)


def _val_type(val) -> str:
    from emmy.dtypes import _TORCH_NAMES

    if not hasattr(val, "shape"):
        return type(val).__name__
    dtype = _TORCH_NAMES.get(str(val.dtype))
    name = str(dtype) if dtype else str(val.dtype).removeprefix("torch.")
    return f"{name}[{','.join(str(int(s)) for s in val.shape)}]"


def _arg(value) -> str:
    import torch

    if isinstance(value, torch.fx.Node):
        return value.name
    if isinstance(value, torch._ops.OpOverload):  # with_effects' op (linalg's error check)
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_arg(v) for v in value) + "]"
    return repr(value)


def print_torch_ir(captured: Captured) -> str:
    program = captured.exported
    kinds = {spec.arg.name: spec.kind.name.lower() for spec in program.graph_signature.input_specs}
    lines: list[str] = []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            kind = "input" if kinds.get(node.name) == "user_input" else "weight"
            lines.append(f"{kind} {node.name}: {_type(node)}")
        elif node.op == "call_function":
            args = [_arg(a) for a in node.args] + [f"{k}={_arg(v)}" for k, v in node.kwargs.items()]
            target = getattr(node.target, "__name__", str(node.target))
            target = str(node.target) if "aten" in str(node.target) else target
            line = f"{node.name}: {_type(node)} = {target}({', '.join(args)})"
            where = captured.source.locate(node.meta.get("stack_trace"))
            if where:
                line = f"{line:<60}  # {where}"
            lines.append(line)
        elif node.op == "output":
            outs = node.args[0]
            lines.append("return " + _arg(list(outs) if isinstance(outs, (list, tuple)) else [outs])[1:-1])
    return "\n".join(lines) + "\n"
