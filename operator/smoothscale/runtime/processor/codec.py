"""Values of a Spark type, as the JSON the task's store and changelog keep, and back.

A state variable's value is a tuple of its schema's fields (pyspark's ValueState.update takes
one); a grouping key is a tuple of the grouping columns. Both are kept as JSON guided by the
Spark type, so what a new owner restores is what the old owner wrote, exactly, for every type
smoothscale accepts (`check_type`): a struct is a list of its fields, a map a list of
[key, value] pairs (its keys need not be strings), a timestamp the microseconds since the
epoch and a date the days (Spark's internal forms), a decimal its text, binary base64.
Reading gives back what pyspark's state clients give: a tuple at the top, a Row for a nested
struct, datetime, date, Decimal, bytes.
"""

import base64
import datetime
import math
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    FractionalType,
    IntegralType,
    MapType,
    Row,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

_TIMES = (TimestampType, TimestampNTZType, DateType)
_ATOMS = (BinaryType, BooleanType, DecimalType, FractionalType, IntegralType, StringType)


class UnsupportedType(ValueError):
    """A Spark type smoothscale cannot keep in a state variable or write as output."""


def check_type(dtype: DataType, where: str) -> None:
    """Refuse a type the codec cannot round-trip (`where` names it in the message)."""
    if isinstance(dtype, StructType):
        for field in dtype.fields:
            check_type(field.dataType, f"{where}, field {field.name!r}")
    elif isinstance(dtype, ArrayType):
        check_type(dtype.elementType, f"{where}, array element")
    elif isinstance(dtype, MapType):
        check_type(dtype.keyType, f"{where}, map key")
        check_type(dtype.valueType, f"{where}, map value")
    elif not isinstance(dtype, (*_TIMES, *_ATOMS)):
        raise UnsupportedType(
            f"{where} has type {dtype.simpleString()}, which smoothscale cannot keep: use "
            "strings, numbers, booleans, decimals, binary, dates, timestamps, and arrays, maps "
            "and structs of them"
        )


def plain(value: Any) -> Any:
    """A numpy or pandas scalar as the plain Python value (pandas' missing values as None)."""
    if value is None or isinstance(value, (str, bool, int, float, bytes)):
        return value
    if type(value).__name__ in {"NAType", "NaTType"}:
        return None
    if type(value).__name__ == "datetime64":  # its item() can be an int of nanoseconds
        import pandas as pd

        return pd.Timestamp(value).to_pydatetime()
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    to_datetime = getattr(value, "to_pydatetime", None)
    if callable(to_datetime):
        return to_datetime()
    return value


def to_json(dtype: DataType, value: Any) -> Any:
    """`value`, a Python value of `dtype`, as JSON."""
    value = plain(value)
    if value is None:
        return None
    if isinstance(dtype, StructType):
        return [
            to_json(f.dataType, v) for f, v in zip(dtype.fields, fields(dtype, value), strict=True)
        ]
    if isinstance(dtype, ArrayType):
        return [to_json(dtype.elementType, item) for item in value]
    if isinstance(dtype, MapType):
        return [[to_json(dtype.keyType, k), to_json(dtype.valueType, v)] for k, v in value.items()]
    if isinstance(dtype, _TIMES):
        return dtype.toInternal(value)
    if isinstance(dtype, DecimalType):
        return str(Decimal(value))
    if isinstance(dtype, BinaryType):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(dtype, BooleanType):
        return bool(value)
    if isinstance(dtype, IntegralType):
        if isinstance(value, float) and not value.is_integer():
            raise TypeError(f"{value!r} is not a whole number, for a {dtype.simpleString()}")
        return int(value)
    if isinstance(dtype, FractionalType):
        return float(value)
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string, for a {dtype.simpleString()}")
    return value


def from_json(dtype: DataType, value: Any) -> Any:
    """The Python value of `dtype` that `to_json` gave `value` for (a struct as a Row)."""
    if value is None:
        return None
    if isinstance(dtype, StructType):
        names = [f.name for f in dtype.fields]
        items = [from_json(f.dataType, v) for f, v in zip(dtype.fields, value, strict=True)]
        return Row(**dict(zip(names, items, strict=True)))
    if isinstance(dtype, ArrayType):
        return [from_json(dtype.elementType, item) for item in value]
    if isinstance(dtype, MapType):
        return {from_json(dtype.keyType, k): from_json(dtype.valueType, v) for k, v in value}
    if isinstance(dtype, _TIMES):
        return dtype.fromInternal(value)
    if isinstance(dtype, DecimalType):
        return Decimal(value)
    if isinstance(dtype, BinaryType):
        return base64.b64decode(value)
    return value


def fields(schema: StructType, value: Any) -> list[Any]:
    """The field values of a struct value: a tuple (or Row) of as many fields as `schema`, or
    a dict by field name."""
    if isinstance(value, dict):
        return [value.get(name) for name in schema.names]
    if not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{value!r} is not a tuple of the fields ({', '.join(schema.names)}): state values "
            "are tuples, as in pyspark, e.g. (5,) for a schema of one field"
        )
    if len(value) != len(schema.fields):
        raise TypeError(
            f"{value!r} has {len(value)} field(s), the schema has {len(schema.fields)} "
            f"({', '.join(schema.names)})"
        )
    return list(value)


def row_to_json(schema: StructType, value: Any) -> list[Any]:
    """A state value (a tuple of the schema's fields) as JSON."""
    encoded: list[Any] = to_json(schema, tuple(fields(schema, value)))
    return encoded


def row_from_json(schema: StructType, value: list[Any]) -> tuple[Any, ...]:
    """A state value as pyspark's state clients return it: a tuple."""
    return tuple(from_json(schema, value))


def output_json(dtype: DataType, value: Any) -> Any:
    """An output field as JSON for the output topic's consumers: a struct as an object, a map
    as an object (keys as text), timestamps and dates in ISO 8601, a decimal as its text,
    binary as base64; missing values (None, NaN, NaT) as null."""
    value = plain(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(dtype, StructType):
        parts = fields(dtype, value)
        return {
            f.name: output_json(f.dataType, v) for f, v in zip(dtype.fields, parts, strict=True)
        }
    if isinstance(dtype, ArrayType):
        return [output_json(dtype.elementType, item) for item in value]
    if isinstance(dtype, MapType):
        return {str(plain(k)): output_json(dtype.valueType, v) for k, v in value.items()}
    if isinstance(dtype, _TIMES):
        naive = isinstance(value, datetime.datetime) and value.tzinfo is None
        if naive and isinstance(dtype, TimestampType):
            value = value.replace(tzinfo=datetime.UTC)  # the session's time zone is UTC
        if not isinstance(value, (datetime.date, datetime.datetime)):
            raise TypeError(f"{value!r} is not a date or a timestamp")
        return value.isoformat()
    if isinstance(dtype, DecimalType):
        return str(Decimal(value))
    return to_json(dtype, value)
