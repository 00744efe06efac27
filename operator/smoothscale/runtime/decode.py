"""Decoding input records, and routing the ones that cannot be decoded to the dead-letter topic.

A record's value is JSON of the pipeline's `value_schema`. `decode` splits a raw micro-batch (the
source's rows) into good rows, parsed into columns, and bad rows, each with the reason it is bad
(in two steps, `classify` then `good_rows` and `bad_rows`, for a caller that keeps the
classified rows). Bad records never stop the instance: the runtime sends them to the
dead-letter topic with `send_dead_letters` (reason and origin in headers) and counts them by
reason.

What makes a record bad (the `reason`, one of `REASONS`):
- null-value: the value is null (a tombstone);
- invalid-utf8: the value, or the key when it is the state key, is not UTF-8 text;
- malformed-json: the value is not JSON;
- not-an-object: the value is JSON but not an object;
- wrong-type: a field's JSON value cannot be read as the schema's type ("five" for a LONG);
- missing-field: a field of the schema is absent or null (every field is required);
- missing-key: the pipeline keys by the record key and the record has none;
- pipeline-error: the pipeline's own code raised on the record (its `aggregate` on a batch
  holding it, or its `apply` on the record's key); the exception is in the header
  smoothscale.error. The runtime finds such records by retrying the batch without them.
Fields the schema does not name are ignored. Conversions follow Spark's JSON reader: a STRING
field accepts any JSON value as its text, a number with a fraction does not fit a LONG.
"""

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from smoothscale.runtime.pipeline import PipelineError

if TYPE_CHECKING:
    import confluent_kafka
    from pyspark.sql import Column, DataFrame, Row

RECORD_KEY = "key"
"""`Pipeline.key_column` naming the record key rather than a field of the value."""

NULL_VALUE = "null-value"
INVALID_UTF8 = "invalid-utf8"
MALFORMED_JSON = "malformed-json"
NOT_AN_OBJECT = "not-an-object"
WRONG_TYPE = "wrong-type"
MISSING_FIELD = "missing-field"
MISSING_KEY = "missing-key"
PIPELINE_ERROR = "pipeline-error"
REASONS = (
    NULL_VALUE,
    INVALID_UTF8,
    MALFORMED_JSON,
    NOT_AN_OBJECT,
    WRONG_TYPE,
    MISSING_FIELD,
    MISSING_KEY,
    PIPELINE_ERROR,
)
"""Every reason a record can be bad; few on purpose, as they label the dead-letter counter."""

REASON_HEADER = "smoothscale.reason"
ERROR_HEADER = "smoothscale.error"
ERROR_HEADER_CHARACTERS = 1000
"""The end of the exception's text kept in the header (a Python traceback ends with it)."""
ORIGIN_TOPIC_HEADER = "smoothscale.origin.topic"
ORIGIN_PARTITION_HEADER = "smoothscale.origin.partition"
ORIGIN_OFFSET_HEADER = "smoothscale.origin.offset"

RESERVED_COLUMNS = ("partition", "offset", "timestamp", "key")
"""Columns of a decoded row that are not value fields; the value schema cannot reuse them."""


class JsonInput(Protocol):
    """What decoding needs of a pipeline: a `Pipeline`, or a processor pipeline's
    `json_input`."""

    @property
    def store(self) -> str: ...

    @property
    def value_schema(self) -> str:
        """Spark DDL of the JSON record value."""

    @property
    def key_column(self) -> str:
        """The state key: `RECORD_KEY` or a field of the value schema."""


_CORRUPT_COLUMN = "_smoothscale_corrupt_record"
_PARSED_COLUMN = "_smoothscale_parsed"
_REASON_COLUMN = "_smoothscale_reason"


def decode(batch: "DataFrame", pipeline: JsonInput) -> "tuple[DataFrame, DataFrame]":
    """Split the source's rows into (good rows, bad rows): `good_rows` and `bad_rows` of
    `classify(batch, pipeline)`.

    Both frames derive from `batch`: persist it first if it is costly to read twice (a
    streaming micro-batch is), or persist the classified rows and split those.
    """
    classified = classify(batch, pipeline)
    return good_rows(classified, pipeline), bad_rows(classified)


def classify(batch: "DataFrame", pipeline: JsonInput) -> "DataFrame":
    """The source's rows, each with its value parsed and the reason it is bad (null if good):
    every column of `batch` and two more, which `good_rows` and `bad_rows` read.

    The expressions are SQL text, not column objects: every column function is a call into
    the JVM, and building these for every micro-batch cost tens of milliseconds a batch."""
    fields = _value_fields(pipeline)
    parsed_schema = f"{pipeline.value_schema}, {_CORRUPT_COLUMN} STRING"
    options = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', '{_CORRUPT_COLUMN}')"
    parsed = f"from_json({_TEXT}, {sql_literal(parsed_schema)}, {options}) AS {_PARSED_COLUMN}"
    return batch.selectExpr("*", parsed).selectExpr(
        "*", f"{_reason(pipeline, fields)} AS {_REASON_COLUMN}"
    )


def reason(classified: "DataFrame") -> "Column":
    """The classified rows' reason column: why a row is bad, null for a good row."""
    return classified[_REASON_COLUMN]


def good_rows(classified: "DataFrame", pipeline: JsonInput) -> "DataFrame":
    """The classified rows that are good, with columns partition, offset, timestamp, key (the
    record key as a STRING), then the fields of `pipeline.value_schema`."""
    fields = _value_fields(pipeline)
    return classified.where(f"{_REASON_COLUMN} IS NULL").selectExpr(
        "partition",
        "offset",
        "timestamp",
        "CAST(key AS STRING) AS key",
        *(f"{_PARSED_COLUMN}.{_name(field)} AS {_name(field)}" for field in fields),
    )


def bad_rows(classified: "DataFrame") -> "DataFrame":
    """The classified rows that are bad, with columns topic, partition, offset, key, value (as
    read) and reason."""
    return classified.where(f"{_REASON_COLUMN} IS NOT NULL").selectExpr(
        "topic", "partition", "offset", "key", "value", f"{_REASON_COLUMN} AS reason"
    )


def sql_literal(text: str) -> str:
    """`text` as a Spark SQL string literal."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def _name(field: str) -> str:
    """A field name as a Spark SQL identifier."""
    return "`" + field.replace("`", "``") + "`"


def _value_fields(pipeline: JsonInput) -> list[str]:
    """The value schema's field names, after checking the schema is one the runtime can use."""
    from pyspark.sql.types import DataType, StructType

    try:
        schema = DataType.fromDDL(pipeline.value_schema)
    except Exception as error:
        raise PipelineError(
            f"value schema {pipeline.value_schema!r} of store {pipeline.store!r} is not valid "
            f'Spark DDL (write it like "user STRING, amount LONG"): {error}'
        ) from error
    if not isinstance(schema, StructType) or not schema.fields:
        raise PipelineError(
            f"value schema {pipeline.value_schema!r} must list the fields of a JSON object, "
            'like "user STRING, amount LONG"'
        )
    names = list(schema.names)
    clashes = sorted(set(names) & set(RESERVED_COLUMNS))
    if clashes:
        raise PipelineError(
            f"value schema {pipeline.value_schema!r} names {', '.join(clashes)}, which the "
            f"decoded rows already use for the record's {', '.join(RESERVED_COLUMNS)}: rename "
            "those fields in the schema (a field is matched by name in the JSON value)"
        )
    if pipeline.key_column != RECORD_KEY and pipeline.key_column not in names:
        raise PipelineError(
            f"key column {pipeline.key_column!r} is neither {RECORD_KEY!r} (the record key) nor "
            f"a field of the value schema {pipeline.value_schema!r}"
        )
    return names


_TEXT = "CAST(value AS STRING)"


def _reason(pipeline: JsonInput, fields: list[str]) -> str:
    """Why a row is bad, or null when it is good (SQL); the first failing check names it."""
    corrupt = f"{_PARSED_COLUMN} IS NULL OR {_PARSED_COLUMN}.{_CORRUPT_COLUMN} IS NOT NULL"
    # Only a corrupt value is parsed a second time, to tell which way it is corrupt.
    corrupt_reason = (
        f"CASE WHEN try_parse_json({_TEXT}) IS NULL THEN '{MALFORMED_JSON}' "
        f"WHEN NOT startswith(ltrim({_TEXT}), '{{') THEN '{NOT_AN_OBJECT}' "
        f"ELSE '{WRONG_TYPE}' END"
    )
    field_missing = " OR ".join(f"{_PARSED_COLUMN}.{_name(field)} IS NULL" for field in fields)
    cases = [
        f"WHEN value IS NULL THEN '{NULL_VALUE}'",
        f"WHEN NOT is_valid_utf8({_TEXT}) THEN '{INVALID_UTF8}'",
        f"WHEN {corrupt} THEN {corrupt_reason}",
        f"WHEN {field_missing} THEN '{MISSING_FIELD}'",
    ]
    if pipeline.key_column == RECORD_KEY:
        cases += [
            f"WHEN key IS NULL THEN '{MISSING_KEY}'",
            f"WHEN NOT is_valid_utf8(CAST(key AS STRING)) THEN '{INVALID_UTF8}'",
        ]
    return f"CASE {' '.join(cases)} END"


def pipeline_error(record: "Row", error: BaseException) -> "Row":
    """A raw record (as the source read it) on which the pipeline raised, as a dead letter."""
    from pyspark.sql import Row

    return Row(
        topic=record["topic"],
        partition=record["partition"],
        offset=record["offset"],
        key=record["key"],
        value=record["value"],
        reason=PIPELINE_ERROR,
        error=f"{type(error).__name__}: {error}",
    )


def send_dead_letters(
    rows: "Iterable[Row]", producer: "confluent_kafka.Producer", topic: str
) -> int:
    """Produce each bad row to `topic` as it was read, with its reason and origin in headers.

    Headers: smoothscale.reason, smoothscale.origin.topic, smoothscale.origin.partition and
    smoothscale.origin.offset (text). Returns how many were sent. The records are queued, not
    flushed: the caller commits its transaction (or flushes) to make them durable.
    """
    sent = 0
    for row in rows:
        headers: list[tuple[str, str | bytes | None]] = [
            (REASON_HEADER, str(row["reason"]).encode()),
            (ORIGIN_TOPIC_HEADER, str(row["topic"]).encode()),
            (ORIGIN_PARTITION_HEADER, str(row["partition"]).encode()),
            (ORIGIN_OFFSET_HEADER, str(row["offset"]).encode()),
        ]
        error = row.asDict().get("error")
        if error:
            headers.append((ERROR_HEADER, str(error)[-ERROR_HEADER_CHARACTERS:].encode()))
        key = None if row["key"] is None else bytes(row["key"])
        value = None if row["value"] is None else bytes(row["value"])
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                # The local queue is full: let deliveries drain, then queue this one again.
                producer.poll(0.1)
        sent += 1
    producer.poll(0)
    return sent
