"""The one exception tree of metricbus.

::

    MetricbusError                  every error we raise; .retriable says whether trying again can help
    ├── ConfigError                 a setting, flag or argument is wrong (the message names it and the fix)
    │   └── InvalidNameError        a run id / project name that cannot be used as a path or key
    ├── SchemaError                 bytes or values that do not fit the event contract
    │   ├── ForgedRepeatError       a record repeating taken events with other bytes
    │   ├── ForgedSignatureError    an events record without the project's HMAC (signing key set)
    │   ├── EncodeError             a value of the wrong type for its schema field
    │   ├── BadMagicError           not Avro single-object encoding (no C3 01 marker)
    │   ├── UnknownSchemaError      a writer fingerprint that no schema version in schemas/ has
    │   ├── TruncatedRecordError    the record ends before the schema says it should
    │   └── UnsafeRecordError       decodes, but its run id or producer id cannot be used safely
    ├── MetricValueError            a logged value that can never be a scalar (strict mode only)
    └── BrokerError                 the Kafka-protocol broker could not be started or reached
        └── PortInUseError          the local broker's port is taken
"""

from __future__ import annotations


class MetricbusError(Exception):
    """Base of every error metricbus raises."""

    retriable: bool = False


class ConfigError(MetricbusError):
    """A setting, flag or argument is wrong; the message says which and how to fix it."""


class InvalidNameError(ConfigError):
    """A run id or project name that cannot be used safely as a path or a Kafka key."""


class SchemaError(MetricbusError):
    """Bytes or values that do not fit the event contract."""


class ForgedRepeatError(SchemaError):
    """A record whose events were all taken before, from a record with other bytes.

    A producer encodes a record once and sends those same bytes on every retry, so this is no
    repeat: it is forged (someone else writing as that producer) or corrupted. Dead-lettered;
    what was taken first stays.
    """


class ForgedSignatureError(SchemaError):
    """An events record without a valid HMAC where the project signs its records (``_signing``)."""


class EncodeError(SchemaError):
    """A value of the wrong type for the schema field it was given to."""


class BadMagicError(SchemaError):
    """The bytes do not start with the Avro single-object marker C3 01."""


class UnknownSchemaError(SchemaError):
    """The writer fingerprint is not one of the schema versions kept in schemas/."""


class TruncatedRecordError(SchemaError):
    """The record ends before its schema says it should."""


class UnsafeRecordError(SchemaError):
    """A record that decodes but whose run id or producer id is unusable as a path or key."""


class MetricValueError(MetricbusError):
    """A logged value that can never be encoded as a scalar (raised only with strict=True)."""


class BrokerError(MetricbusError):
    """The Kafka-protocol broker could not be started or reached."""

    retriable = True


class PortInUseError(BrokerError):
    """The port asked for the local broker is already taken."""

    retriable = False
