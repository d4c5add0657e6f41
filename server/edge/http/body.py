"""Reading an HTTP request's parameters: the body within a size and time limit, JSON or a form.

DeepL and LibreTranslate clients send either JSON or application/x-www-form-urlencoded bodies
(the deepl library sends JSON to /v2/translate but a form body with GET /v2/languages;
libretranslatepy sends forms everywhere), and query parameters count too. `Params` gives the
endpoints one view of all of them with typed getters that raise `BadParam` naming the field.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Optional
from urllib.parse import parse_qs

from starlette.requests import Request


class BodyError(Exception):
    """A body the server will not read: `status` is 413 (too large), 408 (too slow), 400 (undecodable)
    or 415 (a content type no endpoint reads)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class BadParam(ValueError):
    """A parameter that is missing or of the wrong type; the message names it."""


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, refused unread when its declared length exceeds `limit`, cut off when more
    arrives than declared or allowed, and failed when it takes longer than `timeout` seconds in all
    (a client trickling a body byte by byte must not hold a request open for ever)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BodyError(400, f"invalid Content-Length {declared[:32]!r}")
        if int(declared) > limit:
            raise BodyError(413, f"request body of {int(declared)} bytes; the limit is {limit}")
    parts, size, end = [], 0, time.monotonic() + timeout
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(end - time.monotonic(), 0.001))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise BodyError(408, f"the request body did not arrive within {timeout:g} s") from None
        size += len(chunk)
        if size > limit:
            raise BodyError(413, f"request body larger than the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


class Params:
    """A request's parameters: the query string, then the body's fields (JSON object or form)."""

    def __init__(self, fields: dict[str, Any], json_body: bool = False):
        self.fields, self.json_body = fields, json_body  # json_body: the body was JSON (else a form or none)

    @classmethod
    async def of(cls, request: Request, limit: int, timeout: float, json_only: bool = False) -> "Params":
        fields: dict[str, Any] = {k: request.query_params.getlist(k) for k in request.query_params.keys()}
        body = await read_body(request, limit, timeout)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not body.strip():
            return cls(fields)
        if kind == "application/json" or (json_only and not kind) or (not kind and body.lstrip()[:1] == b"{"):
            fields.update(parse_json(body))
            return cls(fields, json_body=True)
        elif kind in ("application/x-www-form-urlencoded", "") and not json_only:
            fields.update(parse_form(body))
        else:
            raise BodyError(415, f"unsupported content type {kind!r}: send application/json"
                            + ("" if json_only else " or application/x-www-form-urlencoded"))
        return cls(fields)

    def has(self, name: str) -> bool:
        return name in self.fields

    def text(self, name: str, default: Optional[str] = None) -> Optional[str]:
        """A string field (a form field given once, or a JSON string)."""
        value = self.fields.get(name, default)
        if isinstance(value, list):
            if len(value) != 1:
                raise BadParam(f"parameter '{name}' must be given once")
            value = value[0]
        if value is not None and not isinstance(value, str):
            raise BadParam(f"parameter '{name}' must be a string")
        return value

    def texts(self, name: str) -> Optional[list[str]]:
        """A list of strings: a JSON array or string, or a form field repeated."""
        value = self.fields.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadParam(f"parameter '{name}' must be a string or a list of strings")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        """A boolean: JSON true/false, or "1"/"0"/"true"/"false" as forms send them."""
        value = self.fields.get(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        text = self.text(name)
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off", ""):
            return False
        raise BadParam(f"parameter '{name}' must be a boolean (got {text[:32]!r})")

    def number(self, name: str, default: int = 0, lo: int = 0, hi: int = 1 << 31) -> int:
        value = self.fields.get(name)
        if value is None:
            return default
        if isinstance(value, list):
            value = self.text(name)
        try:
            number = int(value) if not isinstance(value, (bool, float)) or float(value).is_integer() else None
        except (TypeError, ValueError, OverflowError):
            number = None
        if number is None or not lo <= number <= hi:
            raise BadParam(f"parameter '{name}' must be a whole number in [{lo}, {hi}]")
        return number


MAX_DEPTH = 32  # nesting of a JSON body: the APIs' own shapes need 3
MAX_NUMBER_DIGITS = 40  # digits of a JSON number: a 64-bit integer or a float, with room


def _refuse_constant(name: str):
    raise BodyError(400, f"the body holds {name}, which JSON does not allow: send a finite number")


def _finite_float(text: str) -> float:
    if len(text) > MAX_NUMBER_DIGITS:
        raise BodyError(400, f"a number in the body has {len(text)} characters; at most {MAX_NUMBER_DIGITS}")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BodyError(400, f"the number {text[:24]} in the body is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise BodyError(400, f"a number in the body has {len(text)} digits; at most {MAX_NUMBER_DIGITS}")
    return int(text)


def depth(value: Any, limit: int) -> int:
    """How deeply `value` nests (1 for a scalar), counted without recursion up to limit + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            break
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return deepest


def parse_json(body: bytes) -> dict[str, Any]:
    """A JSON object within the limits: nesting <= MAX_DEPTH, numbers finite and <= MAX_NUMBER_DIGITS
    characters (Python's json takes NaN, Infinity and 1e999 as floats, and recurses until a
    RecursionError on deep nesting: each became a 500 before, issue 33)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float,
                           parse_int=_bounded_int)
    except UnicodeDecodeError as e:
        raise BodyError(400, f"the body is not valid UTF-8 (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise BodyError(400, f"the body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise BodyError(400, f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # a number the parsers refuse
        raise BodyError(400, f"the body has a number out of range: {e}") from None
    if not isinstance(value, dict):
        raise BodyError(400, "the body must be a JSON object")
    if depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise BodyError(400, f"the body nests deeper than {MAX_DEPTH} levels")
    # JSON may escape half a surrogate pair ("\ud800"), which is no character: the tokenizer's UTF-8
    # encoding raised on it (a 500 found by the soak). Only a body with such an escape is searched.
    if b"\\ud" in body.lower() and _lone_surrogate(value):
        raise BodyError(400, "the body holds a lone surrogate escape (\\ud800-\\udfff), which is not a character")
    return value


def _lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_form(body: bytes) -> dict[str, list[str]]:
    try:
        # URL-encoded bodies are ASCII with %-escapes of UTF-8; raw UTF-8 (curl -d 'q=fährt') is taken too.
        text = body.decode("utf-8")
        return parse_qs(text, keep_blank_values=True, errors="strict", max_num_fields=10_000)
    except UnicodeDecodeError as e:
        raise BodyError(400, f"the form body is not valid UTF-8 (byte {e.start})") from None
    except UnicodeError:
        raise BodyError(400, "a form field is not valid UTF-8 after URL decoding") from None
    except ValueError as e:
        raise BodyError(400, f"the form body does not parse: {e}") from None
