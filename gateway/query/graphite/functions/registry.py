"""Parameter types, the function registry and the /functions catalog (graphite-web's functions/params.py).

Every group module registers its functions here with ``series_function``; ``REGISTRY`` maps each
graphite-web name (aliases included) to its ``SeriesFunction``.
"""

import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any

from gateway.query.graphite.errors import RenderError
from gateway.query.graphite.functions.safe import INF, VALID_AGG_FUNCS
from gateway.query.graphite.series import TimeSeries
from protocols.graphite.attime import parse_time_offset


@dataclass
class Request:
    """What a function sees of the render request besides its arguments."""

    context: Any  # evaluator.RenderContext
    raw_args: list  # the call's positional argument nodes, to re-evaluate under another range
    evaluate: Callable[[Any, Any], Awaitable[list]]  # (node or target text, context) -> series

    async def evaluate_first_argument(self, **changes) -> list:
        """Evaluate the first argument again with the context fields changed (start=..., end=...)."""
        return await self.evaluate(self.raw_args[0], replace(self.context, **changes))

    async def compute(self, function, *args, **kwargs):
        """Run CPU-bound work through the context's ``offload`` (a thread under the server), so
        the event loop keeps serving other requests meanwhile; directly without one."""
        offload = self.context.offload
        if offload is None:
            return function(*args, **kwargs)
        # bound first: the function's own keywords (func=...) must not reach the offload's
        return await offload(partial(function, *args, **kwargs))


def _validate_boolean(value):
    if isinstance(value, str):
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError(value)
    if type(value) in (int, float):
        if value in (0, 1):
            return value == 1
        raise ValueError(value)
    return bool(value)


def _validate_integer(value):
    if type(value) is float:
        raise ValueError(value)
    return int(value)


def _validate_int_or_inf(value):
    try:
        return _validate_integer(value)
    except (TypeError, ValueError):
        pass
    if float(value) == INF:
        return INF
    raise ValueError(value)


def _validate_int_or_interval(value):
    try:
        return _validate_integer(value)
    except (TypeError, ValueError):
        return _validate_interval(value)


def _validate_string(value):
    """graphite-web has no check here, and its functions then fail on a number (a 500)."""
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def _validate_node_or_tag(value):
    """graphite-web looks a float node up as a tag name; inf and nan are neither node nor tag."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(value)
    return value


def _validate_interval(value):
    interval_seconds(value)
    return value


def _validate_series_list(value):
    if not isinstance(value, list) or not all(isinstance(s, TimeSeries) for s in value):
        raise ValueError(value)
    return value


def _validate_series_lists(value):
    if not isinstance(value, list):
        raise ValueError(value)
    for entry in value:
        _validate_series_list(entry)
    return value


def _validate_agg_func(value):
    if value in VALID_AGG_FUNCS or value in [name + "Series" for name in VALID_AGG_FUNCS]:
        return value
    raise ValueError(value)


@dataclass(frozen=True)
class ParamType:
    name: str
    validator: Callable | None = None


BOOLEAN = ParamType("boolean", _validate_boolean)
DATE = ParamType("date")
FLOAT = ParamType("float", float)
INTEGER = ParamType("integer", _validate_integer)
INTERVAL = ParamType("interval", _validate_interval)
INT_OR_INTERVAL = ParamType("intOrInterval", _validate_int_or_interval)
INT_OR_INF = ParamType("intOrInf", _validate_int_or_inf)
NODE = ParamType("node", _validate_integer)
NODE_OR_TAG = ParamType("nodeOrTag", _validate_node_or_tag)
SERIES_LIST = ParamType("seriesList", _validate_series_list)
SERIES_LISTS = ParamType("seriesLists", _validate_series_lists)
STRING = ParamType("string", _validate_string)
TAG = ParamType("tag", _validate_string)
ANY = ParamType("any")
AGG_FUNC = ParamType("aggFunc", _validate_agg_func)
AGG_OR_SERIES_FUNC = ParamType("aggOrSeriesFunc")


def _describe(value) -> str:
    """An argument as an error message shows it: series by name, never all their values."""
    if isinstance(value, TimeSeries):
        return f"the series {value.name!r}"
    if isinstance(value, list) and value:
        shown = ", ".join(_describe(entry) for entry in value[:3])
        return f"[{shown}{', ...' if len(value) > 3 else ''}]"
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


@dataclass
class Param:
    name: str
    type: ParamType
    required: bool = False
    default: Any = None
    multiple: bool = False
    options: list = field(default_factory=list)
    suggestions: list | None = None
    strict_options: bool = True  # False where graphite-web's function itself copes with other values

    def all_options(self) -> list:
        options = list(self.options)
        if self.type is AGG_FUNC:
            options += VALID_AGG_FUNCS
        if self.type is AGG_OR_SERIES_FUNC:
            options += VALID_AGG_FUNCS + [name for name, f in REGISTRY.items() if f.aggregator]
        return sorted(set(options), key=str)

    def to_json(self) -> dict:
        result: dict[str, Any] = {"name": self.name, "type": self.type.name}
        if self.required:
            result["required"] = True
        if self.default is not None:
            result["default"] = self.default
        if self.multiple:
            result["multiple"] = True
        options = self.all_options()
        if options:
            result["options"] = options
        if self.suggestions:
            result["suggestions"] = self.suggestions
        return result

    def validate(self, value, function_name: str):
        if (
            value is None
            and (self.default is not None or not self.required)
            and self.type not in (SERIES_LIST, SERIES_LISTS)
        ):
            return self.default
        options = self.all_options()
        if options and self.strict_options and self.type is not AGG_FUNC and value not in options:
            raise RenderError(
                f'Invalid option specified for function "{function_name}" parameter "{self.name}": {_describe(value)}'
            )
        if self.type.validator is None:
            return value
        try:
            return self.type.validator(value)
        except Exception:
            raise RenderError(
                f'Invalid "{self.type.name}" value specified for function "{function_name}" '
                f'parameter "{self.name}": {_describe(value)}'
            ) from None


@dataclass
class SeriesFunction:
    name: str
    function: Callable
    group: str
    params: list
    aggregator: bool = False

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def validate(self, args: list, kwargs: dict) -> tuple[list, dict]:
        """Check arguments against the parameters, as graphite-web's validateParams."""
        params = self.params
        if len(args) + len(kwargs) > len(params) and not (params and params[-1].multiple):
            raise RenderError(f'Too many parameters specified for function "{self.name}"')
        if len(args) > len(params):
            positional, by_keyword = params, []
        else:
            positional, by_keyword = params[: len(args)], params[len(args) :]
        valid_args = [positional[min(i, len(positional) - 1)].validate(arg, self.name) for i, arg in enumerate(args)]
        valid_kwargs = {}
        for param in by_keyword:
            value = kwargs.get(param.name)
            python_parameter = self.python_parameters[param.name]
            if value is None:
                if param.required and not _can_be_left_out(python_parameter):
                    raise RenderError(f'Missing required parameter "{param.name}" for function "{self.name}"')
                continue
            if python_parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                raise RenderError(f'Parameter "{param.name}" of function "{self.name}" is given by position only')
            valid_kwargs[param.name] = param.validate(value, self.name)
        unexpected = [key for key in kwargs if key not in valid_kwargs and kwargs[key] is not None]
        if unexpected:
            raise RenderError(f"Unexpected key word arguments: {', '.join(unexpected)}")
        return valid_args, valid_kwargs

    @cached_property
    def python_parameters(self) -> dict[str, inspect.Parameter]:
        """Each parameter's Python counterpart, by position (legendValue's differ in name, as graphite-web's)."""
        python = list(inspect.signature(self.function).parameters.values())[1:]
        return {param.name: parameter for param, parameter in zip(self.params, python)}

    def info(self) -> dict:
        signature = inspect.signature(self.function)
        parameters = list(signature.parameters.values())[1:]
        return {
            "name": self.name,
            "function": self.name + str(signature.replace(parameters=parameters)),
            "description": inspect.getdoc(self.function),
            "module": __package__,  # gateway.query.graphite.functions, the library as a whole
            "group": self.group,
            "params": [param.to_json() for param in self.params],
        }


def _can_be_left_out(parameter: inspect.Parameter) -> bool:
    """graphite-web 1.1.8 does not enforce its parameter checks (ENFORCE_INPUT_VALIDATION is off):
    a required parameter left out still answers where the function has a default for it or takes
    it as varargs (highest(x) is highest(x, 1), sumSeries() is [], aliasByNode(x) names series '')."""
    return parameter.default is not inspect.Parameter.empty or parameter.kind is inspect.Parameter.VAR_POSITIONAL


REGISTRY: dict[str, SeriesFunction] = {}


def series_function(*names: str, group: str, params: list, aggregator: bool = False):
    """Register a function under its graphite-web name(s)."""

    def register(function):
        for name in names:
            REGISTRY[name] = SeriesFunction(name, function, group, params, aggregator)
        return function

    return register


def function_catalog(grouped: bool = False, group: str | None = None) -> dict:
    """The /functions document: name -> description (or group -> name -> description)."""
    result: dict = {}
    for name in sorted(REGISTRY):
        info = REGISTRY[name].info()
        if group is not None and info["group"] != group:
            continue
        if grouped:
            result.setdefault(info["group"], {})[name] = info
        else:
            result[name] = info
    return result


def interval_seconds(text) -> int:
    """Seconds of an interval argument; a RenderError (400) naming it when it is not one."""
    try:
        return parse_time_offset(_validate_string(text))
    except ValueError:
        raise RenderError(f"invalid interval {text!r}: use e.g. '5min', '-1h', '2d'") from None


SERIES_LISTS_PARAMS = [Param("seriesLists", SERIES_LIST, required=True, multiple=True)]


N_FLOAT_PARAMS = [Param("seriesList", SERIES_LIST, required=True), Param("n", FLOAT, required=True)]
N_INTEGER_PARAMS = [Param("seriesList", SERIES_LIST, required=True), Param("n", INTEGER, required=True)]
