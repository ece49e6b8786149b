"""A model's fingerprint: sha256 of a canonical text of its parameters, modules, traced graph and
loss.

What it sees. Every parameter and buffer (name, shape, dtype); every submodule: its path, its
class's qualified name, its `extra_repr`, and its public attributes that are plain numbers,
strings or tuples of them (Linear's widths, Conv2d's kernel and stride, Dropout's p, a loss's
label_smoothing, a user module's `self.scale = 2.0`); the torch.fx graph of `forward` when
symbolic tracing works (every call in order: torch functions such as torch.tanh, tensor
methods, submodule calls, with their arguments and the constants baked into them); and the
loss (its qualified name, or as a module). So the same parameter shapes with Tanh at one agent
and ReLU at another, or torch.relu in place of torch.tanh inside `forward`, differ.

What it cannot see. The code behind a name: the body of a torch module, of a function that
tracing keeps as one call, and of the loss function. A module whose `forward` cannot be traced
(control flow that depends on the data, calls into numpy, ...) is described by its modules
alone, so what its `forward` computes between them is not seen. Attributes that are not plain
values (a tensor held outside the parameters and buffers, a dict, an object). Parameter values
(the initial ones come from the public seed). And the text comes from torch: agents on
different torch versions may disagree on the same model (they are then refused, as for a
different model).

Deterministic across processes and machines: the text holds names, types, shapes and constants,
never an object's address or id, and nothing ordered by hashing (dicts and sets are sorted).
"""

from __future__ import annotations

import functools
import hashlib
import re
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

__all__ = ["describe_model", "model_fingerprint"]

_ADDRESS = re.compile(r"\s+at\s+0x[0-9a-fA-F]+|0x[0-9a-fA-F]{8,}")


def _clean(text: str) -> str:
    """`text` without memory addresses (" at 0x7f...") and on one line."""
    return " ".join(_ADDRESS.sub("", text).split())


def _plain(value: Any) -> bool:
    """A number, string, bool or None, or a tuple/list of them: safe to print as it is."""
    if isinstance(value, tuple | list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)


def _module_text(module: nn.Module) -> str:
    """Class, extra_repr and the public plain attributes (sorted) of one module."""
    attributes = ", ".join(f"{k}={_value(v)}" for k, v in sorted(vars(module).items())
                           if not k.startswith("_") and k != "training" and _plain(v))
    return f"{_qualified(type(module))}({_clean(module.extra_repr())}) [{attributes}]"


def _qualified(obj: Any) -> str:
    """module.qualname of a function, method, class or module instance; never its address."""
    if isinstance(obj, functools.partial):
        args = ", ".join([_qualified(obj.func), *map(_value, obj.args),
                          *(f"{k}={_value(v)}" for k, v in sorted(obj.keywords.items()))])
        return f"functools.partial({args})"
    if isinstance(obj, nn.Module):
        return _module_text(obj)
    if isinstance(obj, types.BuiltinFunctionType):  # torch.tanh, getattr, operator.add, ...
        owner = obj.__self__
        if owner is None or isinstance(owner, types.ModuleType):
            return f"{obj.__module__ or 'builtins'}.{obj.__name__}"
        return f"{_qualified(type(owner))}.{obj.__name__}"  # a method bound to an object
    if isinstance(obj, types.MethodType):
        return f"{_qualified(type(obj.__self__))}.{obj.__name__}"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    module = getattr(obj, "__module__", None) or getattr(
        getattr(obj, "__objclass__", None), "__module__", None)
    if name is None or module is None:
        return f"{type(obj).__module__}.{type(obj).__qualname__}({_clean(repr(obj))})"
    return f"{module}.{name}"


def _value(arg: Any) -> str:
    """An fx node argument as canonical text: nodes by name, containers recursively."""
    if isinstance(arg, fx.Node):
        return "%" + arg.name
    if isinstance(arg, tuple | list):
        inner = ", ".join(_value(a) for a in arg)
        return f"({inner})" if isinstance(arg, tuple) else f"[{inner}]"
    if isinstance(arg, dict):
        items = sorted((_value(k), _value(v)) for k, v in arg.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(arg, set | frozenset):
        return "{" + ", ".join(sorted(_value(a) for a in arg)) + "}"
    if isinstance(arg, slice):
        return f"slice({_value(arg.start)}, {_value(arg.stop)}, {_value(arg.step)})"
    if arg is None or isinstance(arg, bool | int | float | complex | str | bytes):
        return repr(arg)
    if isinstance(arg, torch.dtype | torch.device | torch.memory_format | torch.layout):
        return str(arg)
    if isinstance(arg, torch.Tensor):  # a constant tensor baked into the graph
        return f"tensor({arg.dtype}, {tuple(arg.shape)}, {arg.detach().cpu().flatten().tolist()})"
    if callable(arg):
        return _qualified(arg)
    return f"{_qualified(type(arg))}({_clean(repr(arg))})"


def _graph_lines(model: nn.Module) -> list[str]:
    """The torch.fx graph of model.forward, one line per node; one marker line when it
    cannot be traced (the reason is left out: it may hold addresses)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - any failure of user code under tracing means "untraceable"
        return ["graph: not traceable"]
    lines = []
    for node in graph.nodes:
        target = node.target if isinstance(node.target, str) else _qualified(node.target)
        lines.append(f"graph: %{node.name} = {node.op} {target} {_value(node.args)} "
                     f"{_value(dict(node.kwargs))}")
    return lines


def describe_model(model: nn.Module, *, loss: Callable[..., Any] | None = None) -> str:
    """The canonical text the fingerprint hashes (see the module docstring)."""
    lines = [f"parameter {n} {tuple(p.shape)} {p.dtype}" for n, p in model.named_parameters()]
    lines += [f"buffer {n} {tuple(b.shape)} {b.dtype}" for n, b in model.named_buffers()]
    lines += [f"module {name or '.'} {_module_text(module)}"
              for name, module in model.named_modules()]
    lines += _graph_lines(model)
    lines.append("loss " + ("torch.nn.functional.cross_entropy" if loss is None
                            else _qualified(loss)))
    return "\n".join(lines) + "\n"


def model_fingerprint(model: nn.Module, *, loss: Callable[..., Any] | None = None) -> bytes:
    """sha256 (32 bytes) of describe_model(model, loss=loss)."""
    return hashlib.sha256(describe_model(model, loss=loss).encode()).digest()
