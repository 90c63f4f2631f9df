"""Pydantic models (v2) and dataclasses as payloads and results.

``to_json`` turns them into the JSON they stand for (pydantic:
``model_dump(mode="json")``; a dataclass: its fields by name, as
``dataclasses.asdict`` does, recursively), so that they are fingerprinted
and stored as that JSON. ``restore`` goes back: stored JSON → the declared
type (a model: ``model_validate``; a dataclass: constructed from the dict,
nested dataclasses too; ``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``,
``Optional[T]``). Pydantic stays optional: it is never imported here; a
value or type is a model only when pydantic is already loaded (no model can
exist otherwise).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

__all__ = ["to_json", "restore", "return_type", "unserializable_part"]


def _base_model() -> type | None:
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    return base if isinstance(base, type) else None


def _is_model_type(tp: object) -> bool:
    base = _base_model()
    return base is not None and isinstance(tp, type) and issubclass(tp, base)


def to_json(value: Any) -> Any:
    """``value`` with every pydantic model and dataclass instance in it
    replaced by its JSON form; other values unchanged (the caller encodes
    them, with its ``default=``)."""
    base = _base_model()
    if base is not None and isinstance(value, base):
        return value.model_dump(mode="json")  # type: ignore[attr-defined]  # a pydantic v2 model
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def _needs_restore(tp: Any) -> bool:
    """Whether ``tp`` mentions a model or a dataclass (else the JSON is
    returned as it is)."""
    if _is_model_type(tp) or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return True
    return any(_needs_restore(a) for a in typing.get_args(tp))


def restore(value: Any, tp: Any) -> Any:
    """The stored JSON ``value`` as the type ``tp`` says: a pydantic model
    (``model_validate``), a dataclass (its fields restored by their own
    annotations), a list/tuple/dict or Optional of those; anything else is
    the JSON as it is. Raises what the model or the constructor raises when
    the JSON does not fit (pydantic's ``ValidationError``, ``TypeError``)."""
    if tp is None or tp is Any or not _needs_restore(tp):
        return value
    if _is_model_type(tp):
        return tp.model_validate(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise TypeError(f"stored result for {tp.__name__} is a {type(value).__name__}, not an object")
        hints = typing.get_type_hints(tp)
        kwargs = {f.name: restore(value[f.name], hints.get(f.name)) for f in dataclasses.fields(tp) if f.init and f.name in value}
        return tp(**kwargs)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if value is None and len(members) < len(args):
            return None
        if len(members) == 1:
            return restore(value, members[0])
        return value  # a union of several types: which one is not recorded
    if origin in (list, Sequence):
        return [restore(v, args[0] if args else None) for v in value]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(restore(v, args[0]) for v in value)
        return tuple(restore(v, a) for v, a in zip(value, args))
    if origin in (dict, Mapping):
        return {k: restore(v, args[1] if len(args) == 2 else None) for k, v in value.items()}
    return value


def return_type(fn: Callable[..., Any]) -> Any:
    """``fn``'s return annotation, resolved (``typing.get_type_hints``), or
    None when there is none or it cannot be resolved (a forward reference to
    a name that does not exist at decoration time: the JSON is returned)."""
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # noqa: BLE001 - an unresolvable annotation: no restoring, never an error at decoration
        return None


_JSON_LEAVES: tuple[Any, ...] = (str, int, float, bool, type(None), None, Any, object)


def unserializable_part(tp: Any) -> str | None:
    """The name of the first type in the annotation ``tp`` that a result
    cannot be stored as without ``default=`` (``Decimal``, ``datetime``,
    ``UUID``, a plain ``Enum``, a class of one's own), or None when every
    part is JSON (``str``, ``int``, ``float``, ``bool``, ``None``, their
    subclasses such as a ``str`` enum, ``list``/``tuple``/``dict``/
    ``Mapping``/``Sequence``/``Union``/``Literal`` of those, a
    ``TypedDict``), a pydantic model, a dataclass, or cannot be told
    (``Any``, a type variable, an unresolved annotation: None)."""
    if tp is None or any(tp is leaf for leaf in _JSON_LEAVES) or isinstance(tp, (typing.TypeVar, str)):
        return None
    if _is_model_type(tp) or (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return None
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return None
    if origin is not None:
        if origin in (typing.Annotated, typing.ClassVar) or origin is getattr(typing, "Required", None):
            return unserializable_part(typing.get_args(tp)[0])
        if origin in (Union, types.UnionType) or (isinstance(origin, type) and issubclass(origin, (Mapping, Sequence, list, tuple, dict))):
            for a in typing.get_args(tp):
                if a is Ellipsis:
                    continue
                found = unserializable_part(a)
                if found is not None:
                    return found
            return None
        return getattr(origin, "__qualname__", None) or repr(tp)
    if isinstance(tp, type):
        if issubclass(tp, (str, int, float, Mapping, list, tuple)):
            return None  # bool is an int; an enum of str or int; a TypedDict is a dict
        return tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
    return None  # NewType, a forward reference, ...: cannot tell
