"""Errors for every input file and document read at the edge (cluster files, job files, config).

A `SpecError` carries one line per problem, each `source: field.path: message`, so the user can
find every mistake in one go; it is raised instead of pydantic's or PyYAML's own exceptions,
which never escape this package. `parse_yaml` is the one place YAML text is read, so that syntax
errors and repeated keys are reported the same way for every kind of file.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, ValidationError


class SpecError(ValueError):
    """Invalid input; `problems` has one `source: path: message` line per mistake."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (
            (problems,) if isinstance(problems, str) else tuple(problems)
        )
        super().__init__("\n".join(self.problems))

    @classmethod
    def from_validation_error(cls, err: ValidationError, source: str) -> SpecError:
        return cls(validation_problems(err, source))


def validation_problems(err: ValidationError, source: str) -> list[str]:
    """One `source: field.path: message` line per error pydantic found."""
    return [f"{source}: {line}" for line in problem_lines(err.errors(include_url=False))]


def problem_lines(errors: Iterable[Mapping[str, Any]]) -> list[str]:
    """One `field.path: message` line (or `message`, for the document itself) per error of
    pydantic's form (`ValidationError.errors()`, FastAPI's `RequestValidationError.errors()`),
    in the project's words rather than pydantic's."""
    out: list[str] = []
    for e in errors:
        # A dict key's own error is located at the key, with a "[key]" marker we drop.
        path = ".".join(str(part) for part in e["loc"] if part != "[key]")
        msg = e["msg"]
        kind, given = e["type"], e.get("input")
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            # Not "... or instance of LimitsModel": the reader writes YAML, not Python.
            msg = "Input should be a mapping (key: value pairs)"
        elif kind == "value_error":
            # Our own validators raise ValueError; pydantic's "Value error, " prefix is noise.
            msg = msg.removeprefix("Value error, ")
        elif kind == "invalid_key":
            msg = "keys should be strings"
        elif kind in ("int_type", "int_from_float", "int_parsing"):
            msg = f"expected an integer, got {describe(given)}"
        else:
            msg = _in_our_words(kind, e.get("ctx") or {}, given) or msg
        out.append(f"{path}: {msg}" if path else msg)
    return out


# pydantic's bounds (`Field(ge=1)`), as our messages say them; the value follows, as given.
_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least"),
    "greater_than": ("gt", "must be more than"),
    "less_than_equal": ("le", "must be at most"),
    "less_than": ("lt", "must be less than"),
}
_EXPECTED = {
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
}


def _in_our_words(kind: str, ctx: dict[str, Any], value: Any) -> str | None:
    """What pydantic's error of type `kind` means, said as the project's own messages say it
    (`must be at least 1, got -1`; `expected a string, got 5 (an integer)`), or None where
    pydantic's words are kept."""
    if kind in _BOUNDS:
        key, says = _BOUNDS[kind]
        given = value.written if isinstance(value, WrittenInt) else value
        return f"{says} {_bound(ctx[key])}, got {given}"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {describe(value)}"
    if kind in ("literal_error", "enum"):
        return f"expected {ctx['expected']}, got {describe(value)}"
    return None


def _bound(value: Any) -> str:
    """A bound as the docs write it: 1,000,000,000; 0 (not 0.0); 0.001."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe(value: Any) -> str:
    """A short description of a value of the wrong type, for messages."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, WrittenInt):
        return f"{value.written} (an integer)"
    if isinstance(value, int):
        return f"{value!r} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    return f"a {type(value).__name__}"


def finite_number(v: Any) -> Any:
    """A number: pydantic would read `true` as 1 and call NaN "over the limit"."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"expected a number, got {describe(v)}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v} is not a finite number")
    return v


Number = Annotated[float, BeforeValidator(finite_number)]
"""A finite number, not a boolean (YAML's `yes`, `.nan` and `.inf` are refused as such)."""


def format_validation_error(err: ValidationError, source: str) -> str:
    """The problems of `err`, one `source: field.path: message` per line."""
    return "\n".join(validation_problems(err, source))


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    # PyYAML keeps the last of a repeated key; in a config file that hides a mistake.
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:  # `{[1]: 2}` or `{{}}`: a list or mapping as a key
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"a key must be a plain value, not a {type(key).__name__}",
                key_node.start_mark,
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"key {key!r} appears twice",
                key_node.start_mark,
            )
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node)
    return mapping


def _construct_object(loader: yaml.SafeLoader, node: yaml.Node, deep: bool = False) -> Any:
    # Some of PyYAML's safe constructors fail with a plain exception on a value their tag does
    # not fit (`!!timestamp x`: AttributeError; `!!int` alone: IndexError; `!!int x`:
    # ValueError); say where instead.
    try:
        return yaml.SafeLoader.construct_object(loader, node, deep)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as e:
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        what = ""
        if isinstance(node, yaml.ScalarNode):
            value = node.value if len(node.value) <= 40 else node.value[:36] + "..."
            what = f"{value!r} "
        why = f": {e}" if isinstance(e, ValueError | OverflowError) else ""  # else PyYAML's own
        raise yaml.constructor.ConstructorError(
            None, None, f"{what}cannot be read as {tag}{why}", node.start_mark
        ) from None


class WrittenInt(int):
    """An integer the YAML text wrote in a form other than its decimal: `0755` (octal in YAML
    1.1), `0x10`, `1:30` (base 60), `1_000`, `+5`. It is that integer wherever one is asked
    for; `written` keeps the text, for where a string is wanted (a command's words, an
    environment value): `chmod 0755` must not run as `chmod 493`."""

    written: str

    def __new__(cls, value: int, written: str) -> WrittenInt:
        made = super().__new__(cls, value)
        made.written = written
        return made


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    value: int = loader.construct_yaml_int(node)
    return value if node.value == str(value) else WrittenInt(value, node.value)


# A safe loader that rejects repeated keys and says where a tagged value does not fit its tag.
# Made with type() because PyYAML may lack type stubs, and mypy refuses a class statement whose
# base is untyped.
_UniqueKeyLoader: Any = type(
    "_UniqueKeyLoader", (yaml.SafeLoader,), {"construct_object": _construct_object}
)
_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


# The most an input file (a job, cluster, policy or config file) may hold: far more than any
# real one, and a bound on what `/dev/zero` or a mistaken multi-gigabyte file would cost.
MAX_TEXT_FILE = 16 << 20
MAX_JOB_FILE = 1 << 20  # a job file larger than 1 MiB is a mistake, not a job (the API's bound)


def read_text_file(path: str | Path, what: str = "", max_bytes: int = MAX_TEXT_FILE) -> str:
    """The UTF-8 text of the file at `path`; one that cannot be read, is not a regular file
    (a FIFO would block, a device never end), is larger than `max_bytes` or is not UTF-8 is a
    SpecError naming it (`what`: the kind of file, for the message)."""
    kind = f" {what}" if what else ""
    try:
        # Not blocking: opening a FIFO for reading would wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise SpecError(f"{path}: cannot read{kind}: Is a directory")
            if not stat.S_ISREG(mode):
                raise SpecError(f"{path}: cannot read{kind}: not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise SpecError(f"{path}: cannot read{kind}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        what = kind or " input file"
        raise SpecError(f"{path}: larger than {_size(max_bytes)}; no{what} is that large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text: {e.reason}") from None


def expanded_size_problem(docs: Iterable[Any], max_bytes: int = MAX_JOB_FILE) -> str | None:
    """Why `docs` (parsed YAML) are too large once every alias (`*name`) in them is written
    out, or None. An alias costs a few bytes of text and stands for its anchor's whole value:
    without this bound, a 100 KB job file of 2,000 aliases to one 100 KB string was a 200 MB
    command, stored and answered by the service. Measured as the length of every string plus
    one for each container and each of its items, which is never more than the text of a file
    without aliases. The walk stops as soon as it passes the bound, and what it has still to
    visit is counted before it is queued, so it costs no more than the bound whatever the
    aliases nest."""
    size = 0
    todo: list[Any] = list(docs)
    while todo:
        value = todo.pop()
        items: list[Any] = []
        if isinstance(value, dict):
            items = [*value.keys(), *value.values()]
            size += 1 + len(items)
        elif isinstance(value, list):
            items = value
            size += 1 + len(items)
        elif isinstance(value, str | bytes):
            size += len(value)
        if size > max_bytes:
            return (
                f"larger than {_size(max_bytes)} with its aliases (*name) written out; no job "
                "file is that large"
            )
        todo.extend(items)
    return None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def parse_yaml(text: str, source: str) -> Any:
    """The document in `text`; syntax errors become a SpecError with line and column (1-based)."""
    return _parse(text, source, lambda loader: loader.get_single_data())


def parse_yaml_all(text: str, source: str) -> list[Any]:
    """Every document of a multi-document stream (`---` between them), errors as `parse_yaml`."""

    def every(loader: _UniqueKeyLoader) -> list[Any]:
        docs = []
        while loader.check_data():
            docs.append(loader.get_data())
        return docs

    return _parse(text, source, every)  # type: ignore[no-any-return]


def _parse(text: str, source: str, load: Callable[[_UniqueKeyLoader], Any]) -> Any:
    loader: _UniqueKeyLoader | None = None
    try:
        loader = _UniqueKeyLoader(text)  # safe: a SafeLoader subclass; reads its first bytes
        return load(loader)
    except yaml.MarkedYAMLError as e:
        what = e.problem or e.context or "invalid YAML"
        # A .json file is read as YAML (JSON is YAML): its reader calls it JSON.
        kind = "JSON" if source.lower().endswith(".json") else "YAML"
        raise SpecError(
            f"{_at(source, e.problem_mark or e.context_mark)}: {kind} syntax error: {what}"
        ) from None
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: YAML error: {e}") from None
    except RecursionError:
        # Where the reader had got to: at the nesting that ran out of stack, or just past it.
        where = _at(source, loader.get_mark() if loader is not None else None)
        raise SpecError(f"{where}: YAML error: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _at(source: str, mark: yaml.Mark | None) -> str:
    """`source:LINE:COLUMN` (1-based) at `mark`, else `source`."""
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source


def not_unicode_problem(doc: Any) -> str | None:
    """`path: why` for the first string of `doc` (a key or a value) that is not Unicode text
    (a lone surrogate, which JSON's and YAML's escapes can write: `"\\udcff"`), or None. Such a
    string cannot be written as UTF-8: stored, it made every answer showing its job fail."""
    todo: list[tuple[Any, str]] = [(doc, "")]
    while todo:
        value, path = todo.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")  # at C speed: a job file's strings are many
            except UnicodeEncodeError as e:
                return (
                    f"{path or 'document'}: not Unicode text: it holds a lone surrogate "
                    f"(\\u{ord(value[e.start]):04x}), which UTF-8 cannot encode"
                )
        elif isinstance(value, dict):
            for k, v in value.items():
                # A key is named as UTF-8 can write it (the message must be text itself).
                shown = str(k).encode("utf-8", "backslashreplace").decode("utf-8")
                at = f"{path}.{shown}" if path else shown
                todo.append((v, at))
                todo.append((k, f"{at} (its key)"))
        elif isinstance(value, list):
            todo.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value))
    return None
