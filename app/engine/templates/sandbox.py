"""The Jinja sandbox that runs chat templates from model files, within limits.

A GGUF file's ``tokenizer.chat_template`` is code written by whoever made the
file. It runs here as Hugging Face runs it (``ImmutableSandboxedEnvironment``,
``trim_blocks``/``lstrip_blocks``, loop controls, the ``{% generation %}`` tag,
HF's ``tojson``, ``raise_exception``, ``strftime_now``), with three limits:

- **Time.** Compiling and rendering run on a short-lived thread with a line
  tracer (``sys.settrace``) that ends the render once its deadline passes. The
  tracer sees every Python call and every line of the compiled template, so a
  loop cannot outrun it. The caller stops waiting at the deadline plus a grace
  period, raises in the thread (``PyThreadState_SetAsyncExc``) and abandons it.
- **Size.** Anything that could build a large value in one C call is checked
  *before* the call: ``*``, ``+``, ``**``, ``%``, ``~``, ``str.format``, the
  sized ``str`` methods and filters, and every joined buffer (the output,
  macro bodies, ``{% set %}`` blocks). Every list, tuple and dict the template
  builds is walked (literals, operators, filter and call results): as a tree
  it must stay within the output limit and 100 levels, so shared references
  cannot make a "billion laughs" value whose ``str()``, hash or comparison
  would run for minutes inside one C call, where no tracer can stop it.
- **Depth.** Template calls (macros, ``self`` blocks, recursive loops) nest
  at most ``MAX_CALL_DEPTH`` deep, on a thread with a 16 MiB stack.

A template that breaks a limit, or fails in any other way, raises
``ChatTemplateError`` with a one-line reason. The limits are raised as a
``BaseException`` inside the render, so no ``except Exception`` in Jinja's
own code can swallow them.
"""

from __future__ import annotations

import functools
import json
import re
import string
import time
import types
from collections.abc import Callable, Iterable, Mapping, MappingView, Sequence
from datetime import datetime
from itertools import repeat
from typing import Any, NoReturn, TypeVar

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.ext import Extension, loopcontrols
from jinja2.filters import FILTERS, make_attrgetter
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum, pass_environment

# Re-exported: callers of the sandbox see one module.
from app.engine.chat_message import ChatMessage
from app.engine.templates.guard import Aborted as _Aborted
from app.engine.templates.guard import Guard as _Guard
from app.engine.templates.guard import Raised as _Raised
from app.engine.templates.guard import current_guard as _guard

T = TypeVar("T")

LOAD_BUDGET_S = 2.0  # compiling a model's template and its check renders
RENDER_BUDGET_S = 1.0  # one render, at each reply
MAX_SOURCE_CHARS = 200_000  # real templates are under 20 000
BASE_OUTPUT_CHARS = 200_000  # plus twice the conversation's own text
MAX_NESTING = 100  # levels of lists, tuples and dicts a template may build
MAX_INT_BITS = 8192

# Filters HF templates never use whose regular expressions or text wrapping could
# run for long on a large input inside one call.
REMOVED_FILTERS = frozenset({"striptags", "urlize", "wordwrap"})
# Filters whose numbers are sizes or counts of what they build.
COUNTED_FILTERS = frozenset({"center", "indent", "batch", "slice"})


def input_chars(messages: Sequence[ChatMessage], extra: Mapping[str, Any]) -> int:
    """How much text a render is given (its output may be a bounded multiple of it)."""
    size = sum(
        len(m.content) + len(m.reasoning) + sum(len(c.arguments) for c in m.tool_calls)
        for m in messages
    )
    return size + len(str(extra.get("tools") or ""))


def output_limit(input_chars: int) -> int:
    """How long a render's output, or any value it builds, may grow."""
    return BASE_OUTPUT_CHARS + 2 * max(0, input_chars)


def _too_big(what: str, guard: _Guard) -> NoReturn:
    raise _Aborted(f"builds {what} longer than {guard.limit} characters")


# -- size checks -----------------------------------------------------------------------


def _check_tree(obj: Any, guard: _Guard) -> int:
    """The size of ``obj`` written out; aborts past the limit or ``MAX_NESTING`` levels.

    Counts nodes and string lengths of the tree that ``obj`` expands to, so a
    structure made of shared references counts as often as it is referenced.
    """
    if isinstance(obj, str):
        if len(obj) > guard.limit:
            _too_big("a string", guard)
        return len(obj)
    limit = guard.limit
    total = 0
    stack: list[tuple[Any, int]] = [(obj, 0)]
    steps = 0
    while stack:
        x, depth = stack.pop()
        if isinstance(x, str):
            total += len(x) + 2
        elif isinstance(x, int):
            total += x.bit_length() // 3 + 1
        elif isinstance(x, list | tuple | set | frozenset | dict | Namespace | range | MappingView):
            if isinstance(x, Namespace):
                x = object.__getattribute__(x, "_Namespace__attrs")
            elif isinstance(x, MappingView):  # keys(), values(), items(): their contents
                x = tuple(x)  # type: ignore[arg-type]
            if isinstance(x, range):
                total += 24  # written as range(a, b, c); its items are made one at a time
            elif len(x):
                if depth >= MAX_NESTING:
                    raise _Aborted(f"builds values nested more than {MAX_NESTING} deep")
                total += 2 + 2 * len(x)
                if total > limit:
                    break
                stack.extend(zip(x, repeat(depth + 1)))
                if isinstance(x, dict):
                    stack.extend(zip(x.values(), repeat(depth + 1)))
        else:
            total += 8
        if total > limit:
            break
        steps += 1
        if not steps & 4095 and time.monotonic() > guard.deadline:
            guard.expire()
    if total > limit:
        _too_big("a value", guard)
    return total


def _check_result(value: Any, guard: _Guard) -> None:
    """Check what a call or filter returned (cheap for strings and scalars)."""
    if isinstance(value, str):
        if len(value) > guard.limit:
            _too_big("a string", guard)
    elif isinstance(value, list | tuple | dict | set | frozenset | Namespace | MappingView):
        _check_tree(value, guard)
    elif isinstance(value, bytes | bytearray) and len(value) > guard.limit:
        _too_big("a byte string", guard)


def _check_ints(args: Iterable[Any], guard: _Guard) -> None:
    """Counts and widths passed to a sized operation stay within the limit."""
    for a in args:
        if type(a) is int and abs(a) > guard.limit:
            raise _Aborted(f"asks for a size of {a}, over the limit of {guard.limit}")


_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent(fmt: str, values: Any, guard: _Guard) -> None:
    """``fmt % values``: widths and precisions add up within the limit."""
    total = len(fmt)
    for m in _PERCENT.finditer(fmt):
        for part in m.groups():
            if part == "*":
                raise _Aborted("uses a computed width in a % format")
            if part:
                if len(part) > 7:
                    _too_big("a % formatted string", guard)
                total += int(part)
    total += _check_tree(values, guard)
    if total > guard.limit:
        _too_big("a % format", guard)


def _check_str_format(fmt: str, args: Any, kwargs: Any, guard: _Guard) -> None:
    """``fmt.format(...)``: no nested fields in a spec, widths within the limit."""
    total = len(fmt)
    for _text, _field, spec, _conv in string.Formatter().parse(fmt):
        if not spec:
            continue
        if "{" in spec:
            raise _Aborted("uses a computed width in str.format")
        for number in re.findall(r"\d+", spec):
            if len(number) > 7:
                _too_big("a formatted string", guard)
            total += int(number)
    total += _check_tree(args, guard) + _check_tree(kwargs, guard)
    if total > guard.limit:
        _too_big("a formatted string", guard)


def _int_bits(value: Any) -> int:
    """Bits of an int operand whose size matters (0 for anything else, and for 0, 1, -1)."""
    return value.bit_length() if type(value) is int and abs(value) > 1 else 0


def _replace_size(s: str, old: Any, new: Any) -> int:
    if not isinstance(old, str) or not isinstance(new, str):
        return len(s)
    count = s.count(old) if old else len(s) + 1
    return len(s) + count * len(new)


def _join_items(sep: str, iterable: Any, guard: _Guard) -> list[Any]:
    """The items of a join, read once, after checking the joined length."""
    items = list(iterable)
    total = len(sep) * max(0, len(items) - 1)
    if total > guard.limit:
        _too_big("a joined string", guard)
    for item in items:
        total += len(item) if isinstance(item, str) else _check_tree(item, guard)
        if total > guard.limit:
            _too_big("a joined string", guard)
    return items


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


# -- the environment -------------------------------------------------------------------


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with ``~`` and container literals routed through checks."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"environment.bounded_join({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.bounded_value(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.bounded_value(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # an assignment target, not a value
            super().visit_Tuple(node, frame)
            return
        self.write("environment.bounded_value(")
        super().visit_Tuple(node, frame)
        self.write(")")


def _bounded_concat(parts: Iterable[str]) -> str:
    """``Environment.concat``: the output, and every macro, block and filter buffer."""
    limit = _guard().limit
    out = []
    n = 0
    for p in parts:
        n += len(p)
        if n > limit:
            _too_big("the output", _guard())
        out.append(p)
    return "".join(out)


_SIZED_STR_METHODS = frozenset(
    {"center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate"}
)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """HF's sandbox for chat templates, with the size checks of this module."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator
    concat = staticmethod(_bounded_concat)

    def bounded_join(self, join: Callable[[Any], str], parts: tuple[Any, ...]) -> str:
        guard = _guard()
        total = 0
        for p in parts:
            total += len(p) if isinstance(p, str) else _check_tree(p, guard)
        if total > guard.limit:
            _too_big("a ~ concatenation", guard)
        return join(parts)

    def bounded_value(self, value: T) -> T:
        _check_tree(value, _guard())
        return value

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        guard = _guard()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and type(n) is int
                    and n > 0
                    and _check_tree(seq, guard) * n > guard.limit
                ):
                    _too_big("a repeated value", guard)
            if _int_bits(left) + _int_bits(right) > MAX_INT_BITS:
                raise _Aborted(f"builds a number of more than {MAX_INT_BITS} bits")
        elif operator == "**":
            if type(right) is int and right > 0 and _int_bits(left) * right > MAX_INT_BITS:
                raise _Aborted(f"builds a number of more than {MAX_INT_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right, guard)
        elif (
            operator == "+"
            and isinstance(left, str)
            and isinstance(right, str)
            and len(left) + len(right) > guard.limit
        ):
            _too_big("a + concatenation", guard)
        result = self.binop_table[operator](left, right)
        if operator == "+" and isinstance(result, list | tuple):
            _check_tree(result, guard)
        return result

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        guard = _guard()
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str) and isinstance(obj, types.BuiltinMethodType):
            name = obj.__name__
            if name in _SIZED_STR_METHODS:
                args = self._check_str_method(owner, name, args, kwargs, guard)
        result = super().call(context, obj, *args, **kwargs)
        _check_result(result, guard)
        return result

    @staticmethod
    def _check_str_method(
        s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], guard: _Guard
    ) -> tuple[Any, ...]:
        if name in ("center", "ljust", "rjust", "zfill"):
            _check_ints((*args, *kwargs.values()), guard)
        elif name == "expandtabs":
            tab = _arg(args, kwargs, 0, "tabsize", 8)
            if type(tab) is int and len(s) + s.count("\t") * tab > guard.limit:
                _too_big("expanded tabs", guard)
        elif name == "replace":
            old, new = _arg(args, kwargs, 0, "old", ""), _arg(args, kwargs, 1, "new", "")
            if _replace_size(s, old, new) > guard.limit:
                _too_big("a replaced string", guard)
        elif name == "join" and args:
            return (_join_items(s, args[0], guard), *args[1:])
        elif name == "translate" and args and isinstance(args[0], dict):
            longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
            if len(s) * max(1, longest) > guard.limit:
                _too_big("a translated string", guard)
        return args

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_str_format(fmt, args, kwargs, _guard())
            return wrapped(*args, **kwargs)

        return checked


class GenerationExtension(Extension):
    """HF's ``{% generation %}...{% endgeneration %}``: marks the assistant's text for
    training masks; rendering just writes its body."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's own attribute)

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF's ``tojson``: plain JSON, no HTML escaping, with json.dumps' options."""
    guard = _guard()
    if (type(indent) is int and indent > 32) or (isinstance(indent, str) and len(indent) > 32):
        raise _Aborted("indents JSON by more than 32 characters")
    _check_tree(separators, guard)
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@pass_environment
def _sum(
    environment: _BoundedEnvironment,
    iterable: Iterable[Any],
    attribute: str | int | None = None,
    start: Any = 0,
) -> Any:
    """Jinja's ``sum``, one checked ``+`` at a time (``sum`` of lists is quadratic in C)."""
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    total = start
    for item in iterable:
        total = environment.call_binop(None, "+", total, item)  # type: ignore[arg-type]
    return total


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with its counts and result checked, and its input checked where it can grow."""
    offset = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        guard = _guard()
        if name in COUNTED_FILTERS:
            _check_ints((*args[offset + 1 :], *kwargs.values()), guard)
        if name in ("indent", "format", "replace", "join") and len(args) > offset:
            args = _check_filter_input(name, args, offset, kwargs, guard)
        result = func(*args, **kwargs)
        _check_result(result, guard)
        return result

    return guarded


def _check_filter_input(
    name: str, args: tuple[Any, ...], offset: int, kwargs: dict[str, Any], guard: _Guard
) -> tuple[Any, ...]:
    value = args[offset]
    rest = args[offset + 1 :]
    if name == "indent" and isinstance(value, str):
        width = _arg(rest, kwargs, 0, "width", 4)
        w = len(width) if isinstance(width, str) else width if type(width) is int else 0
        if len(value) + (value.count("\n") + 1) * w > guard.limit:
            _too_big("an indented string", guard)
    elif name == "format" and isinstance(value, str):
        _check_percent(value, (rest, kwargs), guard)
    elif name == "replace" and isinstance(value, str):
        old, new = _arg(rest, kwargs, 0, "old", ""), _arg(rest, kwargs, 1, "new", "")
        if _replace_size(value, old, new) > guard.limit:
            _too_big("a replaced string", guard)
    elif name == "join":
        sep = _arg(rest, kwargs, 0, "d", "")
        if isinstance(sep, str) and _arg(rest, kwargs, 1, "attribute", None) is None:
            return (*args[:offset], _join_items(sep, value, guard), *rest)
    return args


def _raise_exception(message: Any) -> NoReturn:
    raise _Raised(str(message))


def _strftime_now(fmt: Any) -> str:
    if not isinstance(fmt, str) or len(fmt) > 200:
        raise _Aborted("gives strftime_now a format longer than 200 characters")
    return datetime.now().strftime(fmt)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja's ``lipsum`` with at most 10 paragraphs of at most 100 words."""
    n = _clamp(n, 0, 10)
    high = _clamp(max, 1, 100)
    return generate_lorem_ipsum(n, bool(html), _clamp(min, 1, high), high)


def _clamp(value: Any, low: int, high: int) -> int:
    return low if type(value) is not int else value if low <= value <= high else high


def compile_template(source: str) -> Any:
    """``source`` compiled in the bounded sandbox (call it inside ``run_bounded``).

    Returns the ``jinja2.Template``; its ``render`` must also run inside ``run_bounded``.
    """
    if len(source) > MAX_SOURCE_CHARS:
        raise _Aborted(f"is longer than {MAX_SOURCE_CHARS} characters")
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        extensions=[loopcontrols, GenerationExtension],
    )
    env.filters = {
        name: _guard_filter(name, func)
        for name, func in FILTERS.items()
        if name not in REMOVED_FILTERS
    }
    env.filters["tojson"] = _guard_filter("tojson", _tojson)
    env.filters["sum"] = _guard_filter("sum", _sum)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["lipsum"] = _lipsum
    return env.from_string(source)
