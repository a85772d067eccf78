"""Structured output: compile a schema, negotiate the mechanism, validate and convert output.

A schema is JSON Schema draft 2020-12.  It comes from a ``dict``, from JSON text, or is derived
from a Python type (dataclass, TypedDict, pydantic model).  :func:`compile_schema` checks it
once, before anything is launched; :func:`negotiate` picks the mechanism the driver will use;
:meth:`CompiledSchema.validate_text` judges the final assistant text; :func:`convert` turns a
validated value back into the Python type.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import enum
import hashlib
import json
import sys
import types
import typing
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    NewType,
    TypeVar,
    get_args,
    get_origin,
    overload,
)

import orjson

from adaptor import _nesting, _schema_checker, _schema_errors
from adaptor._options import kind_of as _kind_of
from adaptor.driver import (
    Descriptor,
    InvalidOutputSchemaError,
    OutputSchema,
    RunPolicyCaps,
    StructuredOutputHITL,
    StructuredOutputUnsupportedError,
)
from adaptor.result import Result, StructuredOutput

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError
    from referencing import Resource


__all__ = [
    "MAX_OUTPUT_DEPTH",
    "VALIDATION_LIMIT",
    "CompiledSchema",
    "SchemaOptions",
    "compile_schema",
    "convert",
    "instruct",
    "negotiate",
    "run_as",
]

T = TypeVar("T")

Mechanism = Literal["native", "prompt_validate"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_ASK_KINDS = ("permission", "plan_review", "question")
# jsonschema messages embed a repr of the offending instance, which can be the whole output.
_MAX_MESSAGE = 500
# Errors kept per output: an array of 100,000 wrong items made as many errors, and a 4 MB
# exception message, verdict and log line out of them.
_MAX_ERRORS = 20


@dataclass(frozen=True)
class SchemaOptions:
    """How a schema is presented to the driver and what an invalid value does to the run.

    ``name`` and ``description`` are trimmed when used.  ``return_invalid=True`` lets a run
    with invalid or missing output succeed; ``Result.decode`` then raises with the errors.
    """

    name: str | None = None
    description: str | None = None
    return_invalid: bool = False

    def __post_init__(self) -> None:
        # Checked here, not when used: a name of 5 failed inside the run, after it started,
        # and return_invalid="no" was read as yes.
        for label, value in (("name", self.name), ("description", self.description)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"SchemaOptions.{label} takes a str or None, not {_kind_of(value)}")
        if not isinstance(self.return_invalid, bool):
            raise TypeError(
                f"SchemaOptions.return_invalid takes True or False, not {_kind_of(self.return_invalid)}"
            )


@dataclass(frozen=True)
class CompiledSchema:
    """A checked draft 2020-12 schema, ready to hand to a driver and to validate output.

    Treat ``schema`` as read-only: validation uses a private copy taken at construction, so
    mutating it would only make ``schema`` and ``schema_hash`` disagree with what is enforced.
    """

    schema: dict[str, Any] = field(hash=False)
    schema_hash: str
    type_: type | None = None
    _validator: Draft202012Validator = field(init=False, repr=False, compare=False, hash=False)
    _private: dict[str, Any] = field(init=False, repr=False, compare=False, hash=False)
    #: Whether a check could take unbounded time (:func:`adaptor._schema_checker.costly`).
    _costly: bool = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        private = copy.deepcopy(self.schema)
        object.__setattr__(self, "_private", private)
        object.__setattr__(self, "_validator", _new_validator(private))
        object.__setattr__(self, "_costly", _schema_checker.costly(private))

    def validate_text(
        self, text: str, source: Mechanism, *, timeout: float | None = None
    ) -> StructuredOutput:
        """Judge ``text`` as exactly one JSON value valid against the schema.

        Only surrounding whitespace is ignored: a code fence, prose or a second value makes
        the output invalid, because guessing where the "real" JSON is would let a model that
        ignored its instructions pass.

        The check runs in a child process for at most ``timeout`` seconds and never more
        than :data:`VALIDATION_LIMIT`: a pattern that backtracks catastrophically, or
        subschemas applied again and again, would otherwise hold this process's thread (and
        for a pattern, every thread) for hours.  A check that does not finish makes the
        output invalid, saying so.
        """
        body = text.strip()
        if not body:
            return self._invalid(source, "no structured output")
        try:
            value = _parse_one(body)
        except ValueError as exc:
            return self._invalid(source, f"output is not a single JSON value: {exc}")
        if _nests_deeper(body, value, MAX_OUTPUT_DEPTH):
            return self._invalid(
                source, f"output nests arrays and objects deeper than {MAX_OUTPUT_DEPTH} levels"
            )
        limit = (
            VALIDATION_LIMIT if timeout is None else max(0.0, min(timeout, VALIDATION_LIMIT))
        )
        try:
            found = self._errors(value, limit, timeout)
        except _schema_checker.CheckTimeout:
            found = [
                f"$: validation did not finish within {limit:g}s; the schema is too costly "
                "to check against this output (a pattern that backtracks catastrophically, "
                "or subschemas applied again and again)"
            ]
        return StructuredOutput(
            source=source,
            valid=not found,
            value=value,
            errors=tuple(found),
            raw_json=_canonical(value).decode(),
            schema_hash=self.schema_hash,
        )

    def _errors(self, value: Any, limit: float, wall_limit: float | None) -> list[str]:
        try:
            return _schema_checker.errors_of(self._private, value, limit, wall_limit=wall_limit)
        except _schema_checker.Unavailable:
            pass  # validated here instead: what fails there fails here, with its exception
        return _errors_in_process(self._private, value, self._validator)[0]

    def to_output_schema(self, options: SchemaOptions) -> OutputSchema:
        """What the driver receives; a deep copy, so a driver cannot alter what is enforced."""
        return OutputSchema(
            schema=copy.deepcopy(self.schema),
            name=(options.name or "").strip(),
            description=(options.description or "").strip(),
            schema_hash=self.schema_hash,
        )

    def _invalid(self, source: Mechanism, error: str) -> StructuredOutput:
        return StructuredOutput(
            source=source, valid=False, errors=(error,), schema_hash=self.schema_hash
        )


#: The longest judging one output against a schema may take, in seconds.
VALIDATION_LIMIT = 10.0
#: How deeply an output's arrays and objects may nest.  Deeper values are invalid output: the
#: JSON encoder that writes records and verdicts stops at 254 levels (the value sits a few
#: levels down in them), and jsonschema needs several Python frames per level.
MAX_OUTPUT_DEPTH = 128


def _nests_deeper(text: str, value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed from ``text``) nests containers more than ``limit`` deep."""
    if text.count("[") + text.count("{") <= limit:
        return False  # (the usual case, told without a walk)
    return _nesting.deeper_than(value, limit)


def _new_validator(schema: dict[str, Any]) -> Draft202012Validator:
    from jsonschema import Draft202012Validator
    from jsonschema_specifications import REGISTRY as metaschemas

    # No retrieval hook: a remote ``$ref`` must fail at compile time, never hit the network.
    return Draft202012Validator(schema, registry=metaschemas)


def _errors_in_process(
    schema: dict[str, Any], value: Any, validator: Draft202012Validator | None = None
) -> tuple[list[str], Draft202012Validator]:
    """``value``'s errors against ``schema``, described and in order; and the validator used.

    The schema checker's child validates with this too.
    """
    if validator is None:
        validator = _new_validator(schema)
    try:
        found = sorted(validator.iter_errors(value), key=_error_order)
    except RecursionError:
        # Compiling refuses references that loop without descending into the value, so this
        # is a value nested too deeply for this schema: jsonschema spends several Python
        # frames per level, more where subschemas apply in place.
        return [
            "$: validation went deeper than Python's recursion limit allows; the output "
            "is nested too deeply to be checked against this schema"
        ], validator
    described = [_describe(error) for error in found[:_MAX_ERRORS]]
    if len(found) > _MAX_ERRORS:
        described.append(f"… and {len(found) - _MAX_ERRORS} more errors")
    return described, validator


# --- compile ------------------------------------------------------------------------------------


def compile_schema(schema: object) -> CompiledSchema:
    """Check and compile ``schema``; raise :class:`InvalidOutputSchemaError` if it cannot be used.

    Accepts a JSON Schema mapping, JSON text (``str``/``bytes``), a dataclass, a TypedDict, a
    pydantic model class, or any type hint the derivation supports.  A ``CompiledSchema`` is
    returned unchanged.
    """
    if isinstance(schema, CompiledSchema):
        return schema
    try:
        return _compile(schema)
    except RecursionError as exc:  # deriving it, or jsonschema checking it, outran the stack
        raise InvalidOutputSchemaError("the schema is nested too deeply", exc) from exc


def _compile(schema: object) -> CompiledSchema:
    if isinstance(schema, str | bytes | bytearray):
        return _compile_document(_parse_schema_text(schema), None)
    if isinstance(schema, Mapping | list | tuple | bool | int | float):
        # Non-object JSON values get the "must be a JSON object" verdict, not a type error.
        return _compile_document(schema, None)
    if schema is None:
        raise InvalidOutputSchemaError("no schema given (got None)")
    if isinstance(schema, type) or _is_type_form(schema):
        derived = _Deriver(schema).derive()
        return _compile_document(derived, schema if isinstance(schema, type) else None)
    raise InvalidOutputSchemaError(
        "expected a JSON Schema object, JSON text, or a type "
        f"(dataclass, TypedDict, pydantic model), got a {type(schema).__name__} instance"
    )


def _compile_document(document: object, type_: type | None) -> CompiledSchema:
    schema = _plain_json(document)
    if not isinstance(schema, dict):
        raise InvalidOutputSchemaError(f"a schema must be a JSON object, got {_nesting.json_type(schema)}")
    dialect = schema.get("$schema")
    if dialect is not None and (not isinstance(dialect, str) or dialect.rstrip("#") != _DIALECT):
        # Validating with draft 2020-12 rules a schema written for another draft would
        # silently change its meaning (``items`` arrays, ``$ref`` siblings, ...).
        raise InvalidOutputSchemaError(f"unsupported $schema {dialect!r}; use {_DIALECT!r}")
    try:
        digest = hashlib.sha256(_canonical(schema)).hexdigest()
    except TypeError as exc:  # orjson refuses integers beyond 64 bits
        raise InvalidOutputSchemaError(f"schema cannot be canonicalized: {exc}", exc) from exc
    # Imported when a schema is first compiled, not with adaptor: jsonschema costs ~45 ms of
    # ``import adaptor``, and most runs have no schema.
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidOutputSchemaError(
            f"not a valid draft 2020-12 schema at {exc.json_path}: {_schema_errors.message(exc)}", exc
        ) from exc
    _check_references(schema)
    return CompiledSchema(schema=schema, schema_hash=f"sha256:{digest}", type_=type_)


# Keywords that apply their subschemas to the very value their schema is applied to.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")


def _check_references(schema: dict[str, Any]) -> None:
    """Resolve every ``$ref``/``$dynamicRef`` now, so a dangling one fails before launch, and
    refuse references that lead back where they started without descending into the value.

    jsonschema resolves references lazily, only along the branches an instance visits; a
    typo in a rarely taken branch would otherwise surface in the middle of a run.  A loop such
    as ``{"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}}`` applies ``a`` to the same value
    forever: the draft leaves its meaning undefined, and jsonschema recurses until Python's
    recursion limit stops it.
    """
    from jsonschema_specifications import REGISTRY as metaschemas
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    root: Resource[Any] = DRAFT202012.create_resource(schema)
    uri = root.id() or ""
    resolver = metaschemas.with_resource(uri, root).resolver(base_uri=uri)

    # Subschema -> the subschemas applied to the same value, with the reference followed
    # to reach each ("" for a keyword).  Keyed by identity: subschemas are the schema's own
    # dicts, and a reference resolves to the dict it names.
    in_place: dict[int, list[tuple[object, str]]] = {}

    def visit(resource: Resource[Any], resolver: Any) -> None:
        contents = resource.contents
        if isinstance(contents, dict):
            successors = in_place.setdefault(id(contents), [])
            for keyword in ("$ref", "$dynamicRef"):
                ref = contents.get(keyword)
                if isinstance(ref, str):
                    try:
                        target = resolver.lookup(ref).contents
                    except (Unresolvable, LookupError, ValueError) as exc:
                        raise InvalidOutputSchemaError(
                            f"schema does not compile: unresolvable {keyword} {ref!r}", exc
                        ) from exc
                    successors.append((target, f"{keyword} {ref!r}"))
            for keyword in _IN_PLACE_ONE:
                successors.append((contents.get(keyword), ""))
            for keyword in _IN_PLACE_MANY:
                branches = contents.get(keyword)
                successors.extend((branch, "") for branch in (branches or ()))
            dependent = contents.get("dependentSchemas")
            if isinstance(dependent, dict):
                successors.extend((sub, "") for sub in dependent.values())
        for sub in resource.subresources():
            visit(sub, resolver.in_subresource(sub))

    visit(root, resolver)
    _refuse_in_place_loops(in_place)


def _refuse_in_place_loops(in_place: Mapping[int, list[tuple[object, str]]]) -> None:
    """Raise if following in-place keywords and references from a subschema can reach it."""
    done: set[int] = set()
    for start in list(in_place):
        if start in done:
            continue
        # Depth first, without recursion (a schema may nest deeper than Python's stack).
        on_path: dict[int, str] = {start: ""}  # subschema -> the reference that entered it
        stack = [iter(in_place[start])]
        path = [start]
        while stack:
            for successor, via in stack[-1]:
                if not isinstance(successor, dict):
                    continue
                key = id(successor)
                if key in on_path:
                    entered = [on_path[node] for node in path[path.index(key) + 1 :]] + [via]
                    ref = next((r for r in entered if r), "a subschema")
                    raise InvalidOutputSchemaError(
                        f"schema does not compile: {ref} leads back to where it started "
                        "without descending into the value, so validation would never end"
                    )
                if key not in done and key in in_place:
                    on_path[key] = via
                    path.append(key)
                    stack.append(iter(in_place[key]))
                    break
            else:
                finished = path.pop()
                del on_path[finished]
                done.add(finished)
                stack.pop()


def _parse_schema_text(text: str | bytes | bytearray) -> object:
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidOutputSchemaError("schema text is not UTF-8", exc) from exc
    if not text.strip():
        raise InvalidOutputSchemaError("empty schema document")
    try:
        return _parse_one(text.strip())
    except ValueError as exc:
        # The parser's own exception is the useful cause; ours only rephrases it.
        cause = exc.__cause__ or exc
        raise InvalidOutputSchemaError(f"malformed schema JSON: {exc}", cause) from cause


def _parse_one(text: str) -> Any:
    """Exactly one JSON value (no NaN/Infinity); ``ValueError`` says what is wrong otherwise."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        problem = exc
    # orjson does not say whether a complete value preceded the junk; that distinction is the
    # most useful thing to tell someone whose model appended prose after its JSON.
    try:
        _, end = json.JSONDecoder(parse_constant=_reject_constant).raw_decode(text)
    except (ValueError, RecursionError):  # (the latter: nested deeper than orjson's 1024)
        raise ValueError(f"invalid JSON: {problem}") from problem
    if text[end:].strip():
        raise ValueError(
            f"unexpected data after the JSON value at char {end} (more than one value?)"
        ) from problem
    raise ValueError(f"invalid JSON: {problem}") from problem


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _plain_json(value: object, where: str = "$", seen: frozenset[int] = frozenset()) -> Any:
    """A deep copy made only of dict/list/str/int/float/bool/None, or an error naming the spot.

    orjson would happily serialize dataclasses, datetimes or UUIDs, so it cannot be the check.
    """
    if value is None or type(value) in (str, int, bool):
        return value
    if type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidOutputSchemaError(f"schema value at {where} is not finite: {value!r}")
        return value
    if isinstance(value, Mapping | list | tuple):
        if id(value) in seen:
            raise InvalidOutputSchemaError(f"schema contains a reference cycle at {where}")
        inner = seen | {id(value)}
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, item in value.items():
                if type(key) is not str:
                    raise InvalidOutputSchemaError(
                        f"schema object key at {where} is a {type(key).__name__}, not a string"
                    )
                out[key] = _plain_json(item, _join(where, key), inner)
            return out
        return [_plain_json(item, f"{where}[{i}]", inner) for i, item in enumerate(value)]
    raise InvalidOutputSchemaError(
        f"schema value at {where} is a {type(value).__name__}, which is not JSON"
    )


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _error_order(error: ValidationError) -> tuple[list[tuple[int, int | str]], str]:
    # Tag path parts so integer indexes sort numerically and never get compared with keys.
    path: list[tuple[int, int | str]] = [
        (0, p) if isinstance(p, int) else (1, str(p)) for p in error.absolute_path
    ]
    return path, str(error.message)


def _describe(error: ValidationError) -> str:
    message = _schema_errors.message(error)
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 1] + "…"
    return f"{error.json_path}: {message}"


# --- derivation ---------------------------------------------------------------------------------


class _Underivable(Exception):
    """Internal: carries the detail of an unsupported shape up to the root's error."""


_SCALAR_SCHEMAS: dict[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_UNIONS: tuple[object, ...] = (typing.Union, types.UnionType)
_SEQUENCES: tuple[object, ...] = (list, collections.abc.Sequence, collections.abc.MutableSequence)
_MAPPINGS: tuple[object, ...] = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_SETS: tuple[object, ...] = (
    set,
    frozenset,
    collections.abc.Set,
    collections.abc.MutableSet,
)
_KEY_WRAPPERS: tuple[object, ...] = (typing.Required, typing.NotRequired)


class _Deriver:
    """Derives one schema.  Nested structs go to ``$defs`` first, then single-use ones inline.

    Referencing first and inlining afterwards keeps one code path for both outcomes: a struct
    used twice stays a ``$ref`` (smaller schema), a struct used once reads naturally inline.
    """

    def __init__(self, root: object) -> None:
        self._root = root
        self._defs: dict[str, dict[str, Any]] = {}
        self._struct_names: dict[type, str] = {}
        self._own: set[str] = set()  # defs this deriver made (pydantic's may be recursive)
        self._pydantic: dict[type, dict[str, Any]] = {}
        self._stack: list[type] = []

    def derive(self) -> dict[str, Any]:
        try:
            if _is_struct(self._root):
                root = typing.cast(type, self._root)
                self._stack.append(root)
                schema = self._struct_body(root, "$")
            else:
                schema = self._schema(self._root, "$")
        except _Underivable as exc:
            # Chain the underlying failure (if any), not the internal carrier exception.
            raise InvalidOutputSchemaError(
                f"cannot derive a schema from {_type_name(self._root)}: {exc}", exc.__cause__
            ) from exc.__cause__
        return self._finish(schema)

    def _schema(self, hint: object, where: str) -> dict[str, Any]:
        if hint is Any:
            return {}
        if hint is None:
            return {"type": "null"}
        origin = get_origin(hint)
        args = get_args(hint)
        if origin is Annotated:
            return self._annotated(args[0], args[1:], where)
        if origin in _KEY_WRAPPERS:
            return self._schema(args[0], where)
        if isinstance(hint, NewType):
            return self._schema(hint.__supertype__, where)
        if isinstance(hint, TypeVar):
            raise _Underivable(f"{where}: unbound type variable {hint!r}")
        if isinstance(hint, str | typing.ForwardRef):
            raise _Underivable(f"{where}: unresolved forward reference {hint!r}")
        if origin is Literal:
            return _enum_schema([_literal_value(a, where) for a in args], where)
        if origin in _UNIONS:
            return {"anyOf": [self._schema(arm, where) for arm in args]}
        if origin in _SEQUENCES:
            return {"type": "array", "items": self._schema(args[0], f"{where}[]") if args else {}}
        if origin is tuple:
            return self._tuple(args, where)
        if origin in _MAPPINGS:
            return self._mapping(args, where)
        if origin in _SETS or hint in _SETS:
            raise _Underivable(f"{where}: sets are not JSON ({_type_name(hint)}); use list[...]")
        if origin is collections.abc.Callable or hint is collections.abc.Callable:
            raise _Underivable(f"{where}: callables are not data ({_type_name(hint)})")
        if origin is not None:
            raise _Underivable(f"{where}: unsupported type {_type_name(hint)}")
        if not isinstance(hint, type):
            raise _Underivable(f"{where}: unsupported type annotation {hint!r}")
        return self._class(hint, where)

    def _class(self, cls: type, where: str) -> dict[str, Any]:
        if issubclass(cls, enum.Enum):
            return _enum_schema([_enum_value(m, where) for m in cls], where)
        scalar = _SCALAR_SCHEMAS.get(cls)
        if scalar is not None:
            return {"type": scalar}
        if cls is list or cls is tuple:
            return {"type": "array"}
        if cls is dict:
            return {"type": "object"}
        if _pydantic_model(cls):
            return self._pydantic_schema(cls, where)
        if _is_struct(cls):
            return self._struct_ref(cls, where)
        if cls in (bytes, bytearray, memoryview):
            raise _Underivable(f"{where}: bytes are not JSON ({cls.__name__}); use str")
        raise _Underivable(
            f"{where}: unsupported class {_type_name(cls)}; "
            "use a dataclass, TypedDict or pydantic model"
        )

    def _annotated(self, base: object, metadata: tuple[Any, ...], where: str) -> dict[str, Any]:
        # A plain string reads as documentation, a mapping as extra JSON Schema keywords; other
        # metadata belongs to other libraries and is ignored.
        schema = self._schema(base, where)
        for item in metadata:
            if isinstance(item, str):
                schema["description"] = item
            elif isinstance(item, Mapping):
                try:
                    schema.update(_plain_json(item, where))
                except InvalidOutputSchemaError as exc:
                    raise _Underivable(f"{where}: Annotated keywords: {exc.reason}") from exc
        return schema

    def _tuple(self, args: tuple[Any, ...], where: str) -> dict[str, Any]:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": self._schema(args[0], f"{where}[]")}
        if args == ((),) or not args:  # tuple[()]: the empty tuple
            return {"type": "array", "maxItems": 0}
        return {
            "type": "array",
            "prefixItems": [self._schema(a, f"{where}[{i}]") for i, a in enumerate(args)],
            "items": False,
            "minItems": len(args),
        }

    def _mapping(self, args: tuple[Any, ...], where: str) -> dict[str, Any]:
        if not args:
            return {"type": "object"}
        key, value = args
        if _strip_wrappers(key) is not str:
            raise _Underivable(f"{where}: JSON object keys are strings, not {_type_name(key)}")
        return {"type": "object", "additionalProperties": self._schema(value, f"{where}.*")}

    def _struct_ref(self, cls: type, where: str) -> dict[str, Any]:
        if cls in self._stack:
            cycle = self._stack[self._stack.index(cls) :] + [cls]
            raise _Underivable(
                f"{where}: recursive type ({' -> '.join(c.__name__ for c in cycle)})"
            )
        name = self._struct_names.get(cls)
        if name is None:
            self._stack.append(cls)
            try:
                body = self._struct_body(cls, where)
            finally:
                self._stack.pop()
            name = self._allocate(cls.__name__)
            self._struct_names[cls] = name
            self._defs[name] = body
            self._own.add(name)
        return {"$ref": f"#/$defs/{name}"}

    def _struct_body(self, cls: type, where: str) -> dict[str, Any]:
        hints = _type_hints(cls, where)
        properties: dict[str, Any] = {}
        required: list[str] = []
        if dataclasses.is_dataclass(cls):
            declared = cls.__dataclass_fields__
            init_only = [
                name
                for name, hint in hints.items()
                if isinstance(hint, dataclasses.InitVar)
                and declared[name].default is dataclasses.MISSING
            ]
            if init_only:
                # Not a field: no schema could ask for it, yet the class cannot be built without.
                raise _Underivable(
                    f"{where}: {cls.__name__} has InitVar field(s) {', '.join(init_only)}, "
                    "which no JSON object can supply"
                )
            for f in dataclasses.fields(cls):
                if not f.init:  # computed in __post_init__: not part of the wire shape
                    continue
                schema = self._schema(hints.get(f.name, f.type), _join(where, f.name))
                description = f.metadata.get("description")
                if isinstance(description, str):
                    schema["description"] = description
                properties[f.name] = schema
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
        else:
            required_keys = _typeddict_required(cls, hints)
            for key, hint in hints.items():
                properties[key] = self._schema(hint, _join(where, key))
                if key in required_keys:
                    required.append(key)
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    def _pydantic_schema(self, model: type, where: str) -> dict[str, Any]:
        cached = self._pydantic.get(model)
        if cached is None:
            try:
                schema = _plain_json(_pydantic_schema(model, where))
            except InvalidOutputSchemaError as exc:
                raise _Underivable(
                    f"{where}: pydantic schema of {model.__name__}: {exc.reason}"
                ) from exc
            # Hoist the model's $defs into ours, renaming on a clash so its refs stay exact.
            renames: dict[str, str] = {}
            for key, body in schema.pop("$defs", {}).items():
                renames[key] = self._allocate(key)
                self._defs[renames[key]] = body
            for node in [schema, *(self._defs[name] for name in renames.values())]:
                _rename_refs(node, renames)
            cached = self._pydantic[model] = schema
        return copy.deepcopy(cached)

    def _allocate(self, base: str) -> str:
        name, n = base, 2
        while name in self._defs:
            name, n = f"{base}{n}", n + 1
        return name

    def _finish(self, schema: dict[str, Any]) -> dict[str, Any]:
        uses: Counter[str] = Counter()
        for node in _walk([schema, *self._defs.values()]):
            name = _local_ref(node)
            if name in self._own:
                uses[name] += 1
        inline = {name for name in self._own if uses[name] == 1}

        def substitute(value: Any) -> Any:
            if isinstance(value, list):
                return [substitute(v) for v in value]
            if not isinstance(value, dict):
                return value
            name = _local_ref(value)
            if name in inline:
                siblings = {k: v for k, v in value.items() if k != "$ref"}
                return {**substitute(self._defs[name]), **substitute(siblings)}
            return {k: substitute(v) for k, v in value.items()}

        result = substitute(schema)
        kept = {name: substitute(body) for name, body in self._defs.items() if name not in inline}
        if kept:
            result["$defs"] = kept
        return typing.cast(dict[str, Any], result)


def _is_struct(hint: object) -> bool:
    return isinstance(hint, type) and (dataclasses.is_dataclass(hint) or _is_typeddict(hint))


def _is_typeddict(hint: object) -> bool:
    # typing.is_typeddict misses typing_extensions.TypedDict classes on 3.11.
    return (
        isinstance(hint, type)
        and issubclass(hint, dict)
        and hasattr(hint, "__required_keys__")
        and hasattr(hint, "__total__")
    )


def _typeddict_required(cls: type, hints: Mapping[str, Any]) -> set[str]:
    # Under ``from __future__ import annotations`` Python 3.11 cannot see Required/NotRequired
    # inside the string annotations, so __required_keys__ is wrong; the resolved hints are not.
    required = set(getattr(cls, "__required_keys__", frozenset()))
    for key, hint in hints.items():
        while get_origin(hint) is Annotated:
            hint = get_args(hint)[0]
        if get_origin(hint) is typing.Required:
            required.add(key)
        elif get_origin(hint) is typing.NotRequired:
            required.discard(key)
    return required


def _pydantic_model(hint: object) -> bool:
    # A model class can only exist if pydantic is already imported; never import it ourselves.
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None)
    return isinstance(hint, type) and base is not None and issubclass(hint, base)


def _pydantic_schema(model: type, where: str) -> Any:
    generate = getattr(model, "model_json_schema", None)
    if generate is None:
        raise _Underivable(f"{where}: pydantic v1 models are not supported ({model.__name__})")
    try:
        return generate(ref_template="#/$defs/{model}")
    except Exception as exc:  # pydantic raises several unrelated error types here
        raise _Underivable(f"{where}: pydantic cannot describe {model.__name__}: {exc}") from exc


def _is_type_form(hint: object) -> bool:
    return (
        hint is Any
        or get_origin(hint) is not None
        or isinstance(hint, NewType | TypeVar | typing.ForwardRef)
    )


def _type_hints(cls: type, where: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # NameError, TypeError, SyntaxError from string annotations
        raise _Underivable(
            f"{where}: cannot resolve the type hints of {cls.__name__}: {exc}"
        ) from exc


def _strip_wrappers(hint: object) -> object:
    while get_origin(hint) is Annotated or get_origin(hint) in _KEY_WRAPPERS:
        hint = get_args(hint)[0]
    while isinstance(hint, NewType):
        hint = hint.__supertype__
    return hint


def _literal_value(value: object, where: str) -> object:
    if isinstance(value, enum.Enum):
        return _enum_value(value, where)
    if value is None or type(value) in (str, int, bool):
        return value
    raise _Underivable(f"{where}: Literal value {value!r} is not a JSON scalar")


def _enum_value(member: enum.Enum, where: str) -> object:
    value = member.value
    if value is None or type(value) in (str, int, bool) or type(value) is float:
        return value
    raise _Underivable(
        f"{where}: {type(member).__name__}.{member.name} has a non-JSON value {value!r}"
    )


def _enum_schema(values: list[object], where: str) -> dict[str, Any]:
    if not values:
        raise _Underivable(f"{where}: an enum needs at least one member")
    schema: dict[str, Any] = {"enum": values}
    kinds = {_nesting.json_type(v) for v in values}
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    if len(kinds) == 1:  # a "type" next to "enum" is redundant but helps provider enforcement
        schema = {"type": kinds.pop(), **schema}
    return schema


def _rename_refs(node: Any, renames: Mapping[str, str]) -> None:
    for value in _walk([node]):
        name = _local_ref(value)
        if name is not None and name in renames:
            value["$ref"] = f"#/$defs/{renames[name]}"


def _walk(values: list[Any]) -> Iterator[dict[str, Any]]:
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            yield value
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _local_ref(node: Mapping[str, Any]) -> str | None:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return ref[len("#/$defs/") :]
    return None


# --- negotiation and prompt instructions --------------------------------------------------------


def negotiate(
    descriptor: Descriptor,
    *,
    ask_kinds: frozenset[str],
    explicit_ask_kinds: frozenset[str],
    streaming: bool,
    schema: CompiledSchema | None = None,
) -> Mechanism:
    """Pick ``"native"`` if eligible, else ``"prompt_validate"``, else refuse.

    ``ask_kinds`` are the run's effective ``ask`` decision kinds, inherited defaults included;
    ``explicit_ask_kinds`` are those the caller set (they count as effective too, and are
    named as such in the refusal reason).  A mechanism is eligible when the descriptor
    offers it, it works with streaming if ``streaming``, and — when its HITL matrix
    (``native_hitl`` / ``prompt_validate_hitl``) is not ``None`` — every effective ask kind is
    ``True`` in the matrix and ``run_policy_caps`` supports ``ask`` for that kind.  Native
    enforcement also needs ``schema``'s root to be ``{"type": "object"}`` when it is given:
    the CLIs hand the schema to the provider as a tool's input schema (Anthropic) or a strict
    response format (OpenAI), which take nothing else, so a ``list[Point]`` or a bare
    ``{"properties": ...}`` could never come back natively.

    A ``None`` matrix means the driver declares no interaction between the mechanism and
    approvals, so no ask kind restricts it here (whether the driver can ask at all is the
    policy check's business).  Upstream's legacy ``WorksWithHITL`` flag has no counterpart
    in :class:`~adaptor.driver.StructuredOutputCaps`, so nothing stricter is possible.

    Raises :class:`StructuredOutputUnsupportedError` whose reason says why each mechanism
    was ineligible.
    """
    effective = frozenset(ask_kinds) | frozenset(explicit_ask_kinds)
    unknown = sorted(effective.difference(_ASK_KINDS))
    if unknown:
        raise ValueError(f"unknown ask kind(s) {unknown}; expected some of {list(_ASK_KINDS)}")
    caps = descriptor.structured_output
    candidates: tuple[tuple[Mechanism, bool, StructuredOutputHITL | None], ...] = (
        ("native", caps.native, caps.native_hitl),
        ("prompt_validate", caps.prompt_validate, caps.prompt_validate_hitl),
    )
    refusals: list[str] = []
    for mechanism, offered, matrix in candidates:
        checked = schema.schema if mechanism == "native" and schema is not None else None
        problems = _ineligibility(
            offered,
            caps.works_with_streaming,
            matrix,
            descriptor.run_policy_caps,
            effective,
            frozenset(explicit_ask_kinds),
            streaming,
            object_root=checked is None or checked.get("type") == "object",
            strict_problem=_strict_problem(checked)
            if checked is not None and caps.native_strict
            else None,
        )
        if not problems:
            return mechanism
        refusals.append(f"{mechanism}: {', '.join(problems)}")
    raise StructuredOutputUnsupportedError(descriptor.type, "; ".join(refusals))


def _ineligibility(
    offered: bool,
    works_with_streaming: bool,
    matrix: StructuredOutputHITL | None,
    policy_caps: RunPolicyCaps,
    effective: frozenset[str],
    explicit: frozenset[str],
    streaming: bool,
    *,
    object_root: bool,
    strict_problem: str | None,
) -> list[str]:
    if not offered:
        return ["not offered by the driver"]
    problems: list[str] = []
    if not object_root:
        problems.append('needs a schema whose root is {"type": "object"}')
    elif strict_problem is not None:
        problems.append(f"needs a schema in the provider's strict subset ({strict_problem})")
    if streaming and not works_with_streaming:
        problems.append("does not work with the streaming transport")
    if matrix is not None:
        for kind in (k for k in _ASK_KINDS if k in effective):
            origin = "set explicitly" if kind in explicit else "inherited default"
            if not getattr(matrix, kind):
                problems.append(f"incompatible with ask for {kind} ({origin})")
            elif not getattr(policy_caps, kind).ask:
                problems.append(f"driver cannot ask for {kind} ({origin})")
    return problems


# Keywords outside OpenAI's strict response format (which answers HTTP 400 for them).  Kept
# on the cautious side: a schema wrongly judged outside only goes through the prompt.
_NOT_STRICT = (
    "allOf", "oneOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "patternProperties", "unevaluatedProperties", "unevaluatedItems", "propertyNames",
    "contains", "minContains", "maxContains", "minProperties", "maxProperties", "$dynamicRef",
)


def _strict_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is outside the strict subset a ``native_strict`` provider takes, if it is.

    That subset: every object says ``"additionalProperties": false`` and lists each of its
    properties in ``required`` (optional means nullable there), and none of
    :data:`_NOT_STRICT` appears.
    """
    for node in _schema_checker.subschemas(schema):
        keyword = next((k for k in _NOT_STRICT if k in node), None)
        if keyword is not None:
            return f"{keyword!r} is not supported"
        kind = node.get("type")
        if not (kind == "object" or (isinstance(kind, list) and "object" in kind)
                or "properties" in node):
            continue
        if node.get("additionalProperties") is not False:
            return 'an object without "additionalProperties": false'
        properties = node.get("properties")
        names = list(properties) if isinstance(properties, dict) else []
        required = node.get("required")
        missing = [n for n in names if not isinstance(required, list) or n not in required]
        if missing:
            return f"property {missing[0]!r} is not required"
    return None


def instruct(prompt: str, compiled: CompiledSchema, options: SchemaOptions) -> str:
    """The prompt with the prompt-validate instruction and the schema in front of it."""
    name = (options.name or "").strip()
    description = (options.description or "").strip()
    named = f" named {json.dumps(name, ensure_ascii=False)}" if name else ""
    lines = [
        "Respond with exactly one JSON value and nothing else: no Markdown code fences, "
        "no prose before or after it.",
        f"The value must be valid against the following JSON Schema (draft 2020-12){named}.",
    ]
    if description:
        lines.append(f"Description: {description}")
    # Author order, not sorted: models tend to emit properties in the order they read them.
    lines.append(orjson.dumps(compiled.schema, option=orjson.OPT_INDENT_2).decode())
    return "\n".join(lines) + "\n\n" + prompt


# --- conversion ---------------------------------------------------------------------------------


def convert(value: Any, type_: type[T]) -> T:
    """Turn a JSON value into ``type_``; ``ValueError`` names the first mismatch by JSON path.

    Dataclasses are built field by field (nested dataclasses, lists, tuples, dicts, unions,
    Literals and Enums included); unknown or missing required keys are errors.  A TypedDict
    gives a new dict whose values are converted the same way.  Pydantic models go through
    ``model_validate``.  ``float`` accepts integers, ``int`` accepts integral floats, and
    ``bool`` never stands in for a number.  An unsupported ``type_`` raises ``TypeError``.
    """
    return typing.cast(T, _convert(value, type_, "$"))


def _convert(value: Any, hint: object, where: str) -> Any:
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is not None:
            raise _mismatch(where, "null", value)
        return None
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Annotated or origin in _KEY_WRAPPERS:
        return _convert(value, args[0], where)
    if isinstance(hint, NewType):
        return _convert(value, hint.__supertype__, where)
    if origin is Literal:
        return _convert_literal(value, args, where)
    if origin in _UNIONS:
        return _convert_union(value, args, where)
    if origin in _SEQUENCES or hint is list:
        items = _expect(value, list, where, "array")
        item_hint = args[0] if args else Any
        return [_convert(v, item_hint, f"{where}[{i}]") for i, v in enumerate(items)]
    if origin is tuple or hint is tuple:
        return _convert_tuple(value, args, where)
    if origin in _MAPPINGS or hint is dict:
        mapping = _expect(value, dict, where, "object")
        item_hint = args[1] if args else Any
        return {k: _convert(v, item_hint, _join(where, k)) for k, v in mapping.items()}
    if origin is not None or not isinstance(hint, type):
        raise TypeError(f"convert does not support {_type_name(hint)}")
    return _convert_class(value, hint, where)


def _convert_class(value: Any, cls: type, where: str) -> Any:
    if issubclass(cls, enum.Enum):
        if isinstance(value, cls):
            return value
        for member in cls:
            if _json_equal(member.value, value):
                return member
        raise ValueError(f"{where}: {value!r} is not a value of {cls.__name__}")
    if cls is bool:
        return _expect(value, bool, where, "boolean")
    if cls is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _mismatch(where, "integer", value)
        return value
    if cls is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _mismatch(where, "number", value)
        return float(value)
    if cls is str:
        return _expect(value, str, where, "string")
    if _pydantic_model(cls):
        if isinstance(value, cls):
            return value
        try:
            return cls.model_validate(value)  # type: ignore[attr-defined]
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"{where}: not a valid {cls.__name__}: {exc}") from exc
    if _is_typeddict(cls):
        return _convert_fields(value, cls, where, construct=False)
    if dataclasses.is_dataclass(cls):
        if isinstance(value, cls):
            return value
        return _convert_fields(value, cls, where, construct=True)
    if isinstance(value, cls):
        return value
    raise ValueError(f"{where}: expected {_type_name(cls)}, got {type(value).__name__}")


def _convert_fields(value: Any, cls: type, where: str, *, construct: bool) -> Any:
    mapping = _expect(value, dict, where, "object")
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise TypeError(f"cannot resolve the type hints of {cls.__name__}: {exc}") from exc
    if construct:
        fields = [f for f in dataclasses.fields(cls) if f.init]
        known = {f.name: hints.get(f.name, f.type) for f in fields}
        required = {
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
    else:
        known = hints
        required = _typeddict_required(cls, hints)
    unexpected = sorted(k for k in mapping if k not in known)
    if unexpected:
        raise ValueError(f"{where}: unexpected field(s) for {cls.__name__}: {unexpected}")
    missing = [name for name in known if name in required and name not in mapping]
    if missing:
        raise ValueError(f"{where}: missing field(s) for {cls.__name__}: {missing}")
    converted = {
        name: _convert(mapping[name], hint, _join(where, name))
        for name, hint in known.items()
        if name in mapping
    }
    if not construct:
        return converted
    try:
        return cls(**converted)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: cannot build {cls.__name__}: {exc}") from exc


def _convert_union(value: Any, arms: tuple[Any, ...], where: str) -> Any:
    # An arm of the value's own type first: in ``float | int`` a 1 stays an int.
    exact = [arm for arm in arms if arm is type(value)]
    problems: list[str] = []
    for arm in exact + [arm for arm in arms if arm not in exact]:
        try:
            return _convert(value, arm, where)
        except ValueError as exc:
            problems.append(str(exc))
    raise ValueError(f"{where}: matches no member of the union: " + "; ".join(problems))


def _convert_literal(value: Any, allowed: tuple[Any, ...], where: str) -> Any:
    for option in allowed:
        plain = option.value if isinstance(option, enum.Enum) else option
        if _json_equal(plain, value):
            return option
    raise ValueError(f"{where}: {value!r} is not one of {list(allowed)!r}")


def _convert_tuple(value: Any, args: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    items = _expect(value, list | tuple, where, "array")
    if not args:
        return tuple(items)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(items))
    expected = () if args == ((),) else args
    if len(items) != len(expected):
        raise ValueError(f"{where}: expected {len(expected)} items, got {len(items)}")
    return tuple(
        _convert(v, h, f"{where}[{i}]")
        for i, (v, h) in enumerate(zip(items, expected, strict=True))
    )


def _expect(value: Any, kind: Any, where: str, name: str) -> Any:
    if not isinstance(value, kind):
        raise _mismatch(where, name, value)
    return value


def _mismatch(where: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"{where}: expected {expected}, got {_nesting.json_type(value)}")


def _json_equal(a: object, b: object) -> bool:
    # JSON keeps true and 1 apart even though Python's == does not.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# --- run helper ---------------------------------------------------------------------------------


@overload
def run_as(runner: Any, prompt: str, type_: type[T], **opts: Any) -> tuple[T, Result]: ...
@overload
def run_as(runner: Any, prompt: str, type_: object, **opts: Any) -> tuple[Any, Result]: ...
def run_as(runner: Any, prompt: str, type_: object, **opts: Any) -> tuple[Any, Result]:
    """Run with a schema derived from ``type_`` and decode the value into it.

    An explicit ``schema=`` in ``opts`` wins over the derived one.  Run errors and decode
    errors propagate unchanged; on a decode error the Result is lost, so call ``run`` and
    ``Result.decode`` separately when you need it.
    """
    opts.setdefault("schema", type_)
    result: Result = runner.run(prompt, **opts)
    return result.decode(type_), result


# --- small helpers ------------------------------------------------------------------------------


def _join(where: str, key: str) -> str:
    if key.isidentifier():
        return f"{where}.{key}"
    return f"{where}[{json.dumps(key, ensure_ascii=False)}]"


def _type_name(hint: object) -> str:
    if isinstance(hint, type) and not get_args(hint):
        if hint.__module__ in ("builtins", "__main__"):
            return hint.__qualname__
        return f"{hint.__module__}.{hint.__qualname__}"
    return repr(hint).replace("typing.", "").replace("collections.abc.", "")
