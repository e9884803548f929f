"""Configuration: typed fields for what weir owns, a pass-through mapping for librdkafka.

Everything is validated before a `Consumer` is built, so a contradiction is a `ValidationError`
naming the field, never a half-started member. The `kafka` mapping is checked by librdkafka
itself: a throwaway consumer that knows no broker is built from the whole configuration and
closed at once.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

import confluent_kafka
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import Required, TypedDict

from weir.policy import FailurePolicy

__all__ = [
    "SENSITIVE_KEYS",
    "ConsumerConfig",
    "ConsumerSettings",
    "FlowConfig",
    "is_secret_key",
    "mask_secrets",
]

KafkaValue = str | int | float | bool

# -- secrets ------------------------------------------------------------------------------------

# librdkafka's own list: the properties flagged _RK_SENSITIVE in the property table of its
# src/rdkafka_conf.c, for librdkafka 2.16.0 (the build confluent-kafka 2.16 bundles). librdkafka
# redacts exactly these in its own dump of a configuration; tests/unit/test_config_secrets.py
# checks this list against the installed library. `ssl_key` is internal: it is set through
# rd_kafka_conf_set_ssl_cert(), never by name, and is listed for completeness.
SENSITIVE_KEYS: frozenset[str] = frozenset(
    {
        "ssl.key.location",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.ca.pem",
        "ssl.keystore.password",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
    }
)
# Aliases librdkafka resolves to a sensitive property (the alias itself carries no flag).
_SENSITIVE_ALIASES = frozenset({"sasl.oauthbearer.client.credentials.client.secret"})
# The fallback for names not in the list (a newer librdkafka's, a plugin's): masking a harmless
# value costs a line of debugging, showing a secret costs the secret.
_SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "private",
    "credential",
    "token",
    "jaas",
    "pem",
    "apikey",
    "api.key",
    "api_key",
)

_MASK = "***"


def is_secret_key(key: str) -> bool:
    """Whether the value of setting `key` is masked: librdkafka's sensitive properties, their
    aliases, a plugin's copy of one (`<prefix>.sasl.password`), or a name with a secret word."""
    k = key.lower()
    if k in SENSITIVE_KEYS or k in _SENSITIVE_ALIASES:
        return True
    if any(k.endswith("." + s) for s in SENSITIVE_KEYS):
        return True
    return any(word in k for word in _SECRET_WORDS)


def mask_secrets(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (_MASK if is_secret_key(k) else v) for k, v in conf.items()}


class _NotScalarSecret(SecretStr):
    """A secret given as something other than a scalar: masked like any secret, then refused."""


def _wrap_secret(value: Any) -> SecretStr:
    if isinstance(value, SecretStr):
        return value
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return SecretStr(str(value))
    return _NotScalarSecret("")


def _masked(value: Any) -> Any:
    """`value` with every entry of a secret name wrapped, recursively through mappings."""
    if isinstance(value, Mapping):
        return {
            k: _wrap_secret(v) if isinstance(k, str) and is_secret_key(k) else _masked(v)
            for k, v in value.items()
        }
    return value


# -- the kafka mapping ---------------------------------------------------------------------------

# librdkafka settings that weir exposes as typed fields: setting them in `kafka` would bypass the
# protocol rules below, so they are refused with the name of the field to use instead.
_TYPED_KEYS = {
    "bootstrap.servers": "bootstrap_servers",
    "metadata.broker.list": "bootstrap_servers",
    "group.id": "group_id",
    "group.protocol": "group_protocol",
    "partition.assignment.strategy": "assignment_strategy",
    "group.remote.assignor": "remote_assignor",
    "group.instance.id": "group_instance_id",
    "session.timeout.ms": "session_timeout_s",
    "heartbeat.interval.ms": "heartbeat_interval_s",
    "max.poll.interval.ms": "max_poll_interval_s",
    "auto.offset.reset": "auto_offset_reset",
    # librdkafka sets a name it does not know globally on the default topic configuration, with
    # a "topic." prefix taken off: this one overrode auto_offset_reset without a word.
    "topic.auto.offset.reset": "auto_offset_reset",
    "topic.metadata.refresh.interval.ms": "topic_refresh_s",
}
# weir is the only committer; these would let librdkafka commit offsets of unfinished records.
_FORCED_OFF = ("enable.auto.commit", "enable.auto.offset.store")

_LOGGER_NAME = "weir.librdkafka"
# Callbacks weir sets on the client itself, and what to use instead.
_WEIR_CALLBACKS = {
    "logger": (
        f"weir routes librdkafka's log lines to the stdlib logger {_LOGGER_NAME!r}: configure "
        f"that logger instead (logging.getLogger({_LOGGER_NAME!r}).setLevel(...), handlers), and "
        "set kafka['debug'] for more of them"
    ),
    "log_cb": f"weir routes librdkafka's log lines to the stdlib logger {_LOGGER_NAME!r}",
    "error_cb": (
        "weir receives the client's errors itself: it logs them (kafka_error, all_brokers_down) "
        "and stops the member with KafkaFatalError on a fatal one"
    ),
    "on_commit": (
        "weir commits and receives every commit result itself: use "
        "GroupConsumer.add_commit_listener() to see them"
    ),
    "offset_commit_cb": (
        "weir commits and receives every commit result itself: use "
        "GroupConsumer.add_commit_listener() to see them"
    ),
    "stats_cb": (
        "weir reserves librdkafka's statistics callback; GroupConsumer.stats() has the member's "
        "figures"
    ),
    "throttle_cb": "weir reserves librdkafka's throttle callback",
    "rebalance_cb": (
        "weir handles rebalances itself; a Handler's on_assigned/on_revoked/on_lost hear of them"
    ),
}
_CALLABLE_HINT = (
    "is a callable: kafka takes librdkafka settings, each a str, int, float or bool "
    "(an OAUTHBEARER token callback is not supported: use sasl.oauthbearer.method='oidc')"
)


_TERMINATION_SIGNAL = (
    "kafka['internal.termination.signal'] must stay 0: librdkafka installs a handler for that "
    "signal in the whole process whenever a client is built (as validating this configuration "
    "does) and sends it to its own threads on close, so SIGKILL or SIGSTOP would kill or stop "
    "the process, and any other signal loses its handling (SIGINT: KeyboardInterrupt and "
    "weir's graceful stop)"
)


def _kafka_entry_problems(key: str, value: KafkaValue | SecretStr) -> list[str]:
    """What in one `kafka` entry of the right type librdkafka would not read as given, or what
    would harm the process before librdkafka could refuse it."""
    problems = [
        problem
        for problem in (
            _text_problem(f"kafka[{key!r}]: the name", key),
            _text_problem(
                f"kafka[{key!r}]",
                value.get_secret_value() if isinstance(value, SecretStr) else str(value),
            ),
        )
        if problem is not None
    ]
    if key == "internal.termination.signal" and str(value).strip() != "0":
        problems.append(_TERMINATION_SIGNAL)
    return problems


class _Quiet:
    """The throwaway client's logger: confluent-kafka hands it librdkafka's log lines (a missing
    bootstrap.servers warns), which say nothing about the configuration weir will run with."""

    def log(self, level: int, msg: str, *args: object) -> None:
        pass


_QUIET = _Quiet()
_FAILED_PREFIX = re.compile(r"^Failed to create consumer: ")
# Mechanisms whose start does nothing outside the process; OAUTHBEARER with OIDC fetches a token
# over HTTP and GSSAPI runs kinit as soon as a client is built, even one that knows no broker.
_QUIET_MECHANISMS = re.compile(r"PLAIN|SCRAM-SHA-\d+")


def _probe(conf: Mapping[str, Any]) -> str | None:
    """librdkafka's reason for refusing `conf` as a consumer's configuration, or None.

    The Python client passes each setting to rd_kafka_conf_set() (unknown names, bad values and
    ranges) and rd_kafka_new() checks how they combine; the client it builds knows no broker, so
    it connects nowhere, and closing it joins its threads.
    """
    try:
        client = confluent_kafka.Consumer({**conf, "logger": _QUIET})
    except Exception as exc:  # whatever the client raises is its refusal
        error = exc.args[0] if exc.args else exc
        text = error.str() if isinstance(error, confluent_kafka.KafkaError) else str(error)
        return _FAILED_PREFIX.sub("", text)
    client.close()
    return None


def _probes(conf: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The configuration to probe, and a second one for the SASL mechanism when the first must
    leave SASL out: starting some mechanisms reaches outside the process."""
    probe = {
        k: v for k, v in conf.items() if k not in ("bootstrap.servers", "metadata.broker.list")
    }
    # confluent-kafka wires an AWS token callback for this value and waits up to 10 s for a token.
    if probe.get("sasl.oauthbearer.metadata.authentication.type") == "aws_iam":
        del probe["sasl.oauthbearer.metadata.authentication.type"]
    protocol = str(probe.get("security.protocol", "plaintext"))
    mechanism = str(probe.get("sasl.mechanisms", probe.get("sasl.mechanism", "GSSAPI")))
    if not protocol.lower().startswith("sasl_") or _QUIET_MECHANISMS.fullmatch(mechanism):
        return probe, None
    probe["security.protocol"] = protocol[len("sasl_") :]
    mechanism_probe = {
        "group.id": probe["group.id"],
        "security.protocol": protocol,
        "sasl.mechanism": mechanism,
        # No kinit, and a token made in the process instead of fetched.
        "sasl.kerberos.min.time.before.relogin": 0,
        "enable.sasl.oauthbearer.unsecure.jwt": True,
    }
    return probe, mechanism_probe


def _named(reason: str, keys: Collection[str]) -> list[str]:
    return [k for k in keys if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", reason)]


def _librdkafka_refusals(conf: Mapping[str, Any], kafka: Mapping[str, Any]) -> list[str]:
    """What librdkafka refuses in `conf`, each naming the `kafka` key or field at fault."""
    secrets = [str(v) for k, v in conf.items() if is_secret_key(k) and len(str(v)) >= 3]

    def scrub(reason: str) -> str:
        for secret in secrets:
            reason = reason.replace(secret, _MASK)
        return reason

    def describe(reason: str, keys: list[str]) -> str:
        fields = sorted({_TYPED_KEYS[k] for k in _named(reason, conf) if k in _TYPED_KEYS})
        if keys:
            where = ", ".join(f"kafka[{k!r}]" for k in keys)
            return f"{where}: librdkafka refuses {'it' if len(keys) == 1 else 'them'}: {reason}"
        if fields:
            return f"librdkafka refuses {', '.join(fields)}: {reason}"
        return f"librdkafka refuses the configuration: {reason}"

    refusals: list[str] = []
    reasons: set[str] = set()
    probe, mechanism_probe = _probes(conf)
    # One refusal at a time: drop the keys it names and ask again, so every bad key is reported.
    for _ in range(len(kafka) + 1):
        reason = _probe(probe)
        if reason is None:
            break
        reason = scrub(reason)
        keys = [k for k in _named(reason, kafka) if k in probe]
        if not keys:  # some reasons name nothing (sasl.jaas.config's): find who fails alone
            group = {"group.id": probe["group.id"]}
            keys = [k for k in kafka if k in probe and _probe(_probes({**group, k: probe[k]})[0])]
        if reason not in reasons:  # dropping a key may leave the same complaint
            reasons.add(reason)
            refusals.append(describe(reason, keys))
        if not keys:
            break
        for k in keys:
            del probe[k]
    if mechanism_probe is not None:
        reason = _probe(mechanism_probe)
        if reason is not None:
            given = [k for k in ("sasl.mechanisms", "sasl.mechanism") if k in kafka]
            refusals.append(describe(scrub(reason), given or ["security.protocol"]))
    return refusals


# -- ids and names -----------------------------------------------------------------------------

# librdkafka reads every setting as a C string: a NUL ends it there, so what follows would be
# dropped without a word (`enable.auto.commit\0` in `kafka` would set enable.auto.commit).
_NUL = "\x00"
# librdkafka left-trims string settings with C's isspace() (rd_kafka_anyconf_set): " orders" is
# group "orders" to it, and a blank group id leaves the client without a consumer group, which
# aborts the interpreter in confluent-kafka's Consumer(). Multi-byte UTF-8 never starts with one.
_C_SPACE = " \t\n\v\f\r"
# Kafka's protocol sends ids as strings with an int16 length: at most 32767 bytes of UTF-8 (the
# broker drops the connection on a longer one, and the member never joins).
_MAX_ID_BYTES = 32767
# Under the classic protocol the broker names each member `<group.instance.id or client.id>-<a
# UUID>` and sends that name back: 37 more bytes that must fit too (JoinGroup fails otherwise).
_CLASSIC_MEMBER_SUFFIX = 37


def _text_problem(what: str, value: str) -> str | None:
    """What keeps `value` from reaching librdkafka as typed: a NUL, or text UTF-8 cannot hold."""
    if _NUL in value:
        return (
            f"{what} contains a NUL character (\\x00): librdkafka reads it as a C string, which "
            "ends there, and would drop the rest"
        )
    try:
        value.encode()
    except UnicodeEncodeError:
        return f"{what} holds a lone surrogate, which UTF-8 cannot encode"
    return None


def _id_problem(what: str, value: str, max_bytes: int = _MAX_ID_BYTES, why: str = "") -> str | None:
    """Why `value` cannot be the id `what` (a group, client, instance or transactional id)."""
    allowed = (
        f"an id is any text of 1 to {max_bytes} bytes of UTF-8{why} that does not start with "
        "whitespace and has no NUL character"
    )
    problem = _text_problem(what, value)
    if problem is None and value[:1] in tuple(_C_SPACE):
        stripped = value.lstrip(_C_SPACE)
        problem = (
            f"{what} {_shown(value)} starts with whitespace, which librdkafka strips "
            f"({f'it would be {_shown(stripped)}' if stripped else 'leaving it empty'})"
        )
    if problem is None and len(value.encode()) > max_bytes:
        problem = f"{what} is {len(value.encode())} bytes long"
    return None if problem is None else f"{problem}: {allowed}"


def _refuse(problem: str | None) -> None:
    """A field validator's refusal: pydantic turns the ValueError into its ValidationError."""
    if problem is not None:
        raise ValueError(problem)


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 80 else f"{value[:80]!r}..."


# -- topics ------------------------------------------------------------------------------------

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
# librdkafka matches a classic subscription's patterns with POSIX extended regular expressions
# (libc's regcomp), the broker matches KIP-848 ones with RE2/J: what Python's `re` accepts beyond
# their common part is refused rather than matched differently (`\d` is a plain `d` in POSIX).
_UNESCAPED = r"(?<!\\)(?:\\\\)*"  # after an even run of backslashes: not itself escaped
_NOT_PORTABLE = (
    (
        re.compile(_UNESCAPED + r"\(\?"),
        "'(?...)' groups (flags, lookaround, named or non-capturing groups)",
    ),
    (
        re.compile(_UNESCAPED + r"\\[A-Za-z0-9]"),
        "backslash classes and references such as \\d, \\w, \\b, \\1",
    ),
)


# A pattern ending in an unescaped `.*` or `$` matches the same topics whether the match must
# cover the whole name (the broker) or only start at its beginning (librdkafka's regexec).
_WHOLE_NAME = re.compile(_UNESCAPED + r"(?:\.\*|\$)$")


# A counted repetition: RE2 (the broker's matcher under KIP-848) refuses a count above 1000,
# glibc's regcomp (librdkafka's) one above 32767, and Python's `re` takes far larger ones. A '{'
# that starts no count is a literal to Python (and to RE2 as `{,n}`), an error to regcomp.
_BRACKETS = re.compile(_UNESCAPED + r"(\[\^?\]?(?:\[:[a-z]+:\]|[^\]])*\])")  # a '{' in one is a '{'
_BRACE = re.compile(_UNESCAPED + r"\{")
_COUNT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT = 1000


def _count_problem(shown: str, pattern: str) -> str | None:
    outside = _BRACKETS.sub(lambda m: m.group()[: m.start(1) - m.start()] + "_", pattern)
    for brace in _BRACE.finditer(outside):
        count = _COUNT.match(outside, brace.end() - 1)
        if count is None:
            return (
                f"{shown} has a '{{' that starts no count {{m}}, {{m,}} or {{m,n}}, which the "
                "matchers read differently (librdkafka's POSIX regex refuses it or reads {,n} as "
                "{0,n}, RE2/J takes a literal): write \\{ for a brace"
            )
        if any(len(n.lstrip("0")) > 4 or int(n) > _MAX_REPEAT for n in count.groups() if n):
            return (
                f"{shown} repeats {count.group()}: the broker's RE2/J refuses a count above "
                f"{_MAX_REPEAT} (librdkafka's POSIX regex one above 32767)"
            )
    return None


def _topic_name_problem(name: str) -> str | None:
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        return f"{_shown(name)} is not a topic name (1-249 of A-Z a-z 0-9 . _ -, not '.' or '..')"
    return None


def _topic_problem(topic: str) -> str | None:
    if not topic.startswith("^"):
        problem = _topic_name_problem(topic)
        if problem is not None:
            return f"{problem}; a regular expression subscription starts with '^'"
        return None
    shown = _shown(topic)
    problem = _text_problem(shown, topic)
    if problem is not None:
        return problem
    try:
        re.compile(topic)
    # Not only re.error: a count past sys.maxsize overflows, deep nesting recurses too far.
    except (re.error, ValueError, OverflowError, RecursionError) as exc:
        return f"{shown} is not a valid regular expression: {exc}"
    for construct, what in _NOT_PORTABLE:
        if construct.search(topic):
            return (
                f"{shown} uses {what}, which librdkafka's POSIX regex or the broker's RE2/J "
                "does not read the same way: use [0-9], [A-Za-z0-9_], ( | ) and escaped "
                "punctuation such as \\."
            )
    problem = _count_problem(shown, topic)
    if problem is not None:
        return problem
    if not _WHOLE_NAME.search(topic):
        return (
            f"{shown} must end with an unescaped '.*' or '$': under the classic protocol "
            "librdkafka takes a topic whose name starts with a match, under "
            "group_protocol='consumer' the broker only one whose whole name matches"
        )
    return None


# -- unknown settings --------------------------------------------------------------------------

# Names of 0.1, before every duration said its unit.
_RENAMED = {
    old: f"{old}_s"
    for old in (
        "poll_timeout",
        "commit_interval",
        "revoke_timeout",
        "shutdown_timeout",
        "startup_timeout",
    )
} | {
    f"{name}_ms": f"{name}_s"
    for name in ("session_timeout", "heartbeat_interval", "max_poll_interval")
}


def _unknown(message: str) -> PydanticCustomError:
    return PydanticCustomError("unknown_setting", "{message}", {"message": message})


def _with_suggestions(
    error: ValidationError, explain: Callable[[tuple[int | str, ...]], str]
) -> ValidationError:
    """`error` with each unknown setting explained: renamed, misplaced, or a close match."""
    details: list[InitErrorDetails] = []
    for e in error.errors():
        detail: InitErrorDetails = {"type": e["type"], "loc": e["loc"], "input": e["input"]}
        if "ctx" in e:
            detail["ctx"] = e["ctx"]
        if e["type"] == "extra_forbidden":
            detail = {"type": _unknown(explain(e["loc"])), "loc": e["loc"], "input": e["input"]}
        elif e["type"] == "unknown_setting":  # a nested model's, already explained
            detail = {"type": _unknown(e["msg"]), "loc": e["loc"], "input": e["input"]}
        details.append(detail)
    return ValidationError.from_exception_data(error.title, details, hide_input=True)


def _suggest(name: str, choices: Collection[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"unknown setting {name!r}" + (f": did you mean {close[0]!r}?" if close else "")


# -- models ------------------------------------------------------------------------------------


# librdkafka's upper bound for queued.max.messages.kbytes, which weir sizes to the flow headroom.
_MAX_QUEUED_KBYTES = 2_097_151


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class FlowConfig(BaseModel):
    """In-flight budget: records registered and not finished (queued, running, awaiting retry).

    Fetching pauses when either count reaches its `pause_*` mark and resumes once both are below
    their `resume_*` mark. The gap between `pause_*` and `capacity_*` is the headroom one fetched
    batch may use, so a batch already fetched can never push the total past the capacity.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Numbers are strict: "4" or True is a mistake, not a count.
    capacity_records: int = Field(1200, ge=2, strict=True)
    pause_records: int = Field(1000, ge=1, strict=True)
    resume_records: int = Field(400, ge=0, strict=True)
    capacity_bytes: int = Field(96 * 1024 * 1024, ge=2 * 1024 * 1024, strict=True)
    pause_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024, strict=True)
    resume_bytes: int = Field(32 * 1024 * 1024, ge=0, strict=True)
    # While partitions share the record budget, records consumed past a partition's share wait
    # read ahead, up to this many in all (an even part per partition). Their bytes count in
    # the byte budget above, their number is not in the in-flight counts.
    read_ahead_records: int = Field(10_000, ge=0, strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _explain_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise _with_suggestions(
                exc, lambda loc: _suggest(str(loc[-1]), cls.model_fields)
            ) from None

    @field_validator("pause_records")
    @classmethod
    def _pause_records(cls, v: int, info: ValidationInfo) -> int:
        cap = info.data.get("capacity_records")
        if cap is not None and v >= cap:
            raise ValueError(f"pause_records ({v}) must be below capacity_records ({cap})")
        return v

    @field_validator("resume_records")
    @classmethod
    def _resume_records(cls, v: int, info: ValidationInfo) -> int:
        high = info.data.get("pause_records")
        if high is not None and v >= high:
            raise ValueError(f"resume_records ({v}) must be below pause_records ({high})")
        return v

    @field_validator("pause_bytes")
    @classmethod
    def _pause_bytes(cls, v: int, info: ValidationInfo) -> int:
        cap = info.data.get("capacity_bytes")
        if cap is not None and cap - v < 1024 * 1024:
            raise ValueError(
                f"pause_bytes ({v}) must leave at least 1 MiB of headroom below "
                f"capacity_bytes ({cap}) for the client's fetch buffer"
            )
        if cap is not None and cap - v > _MAX_QUEUED_KBYTES * 1024:
            raise ValueError(
                f"capacity_bytes - pause_bytes ({cap - v}) must stay within 2 GiB: the client's "
                "fetch buffer is sized to it, and librdkafka's queued.max.messages.kbytes "
                f"stops at {_MAX_QUEUED_KBYTES}"
            )
        return v

    @field_validator("resume_bytes")
    @classmethod
    def _resume_bytes(cls, v: int, info: ValidationInfo) -> int:
        high = info.data.get("pause_bytes")
        if high is not None and v >= high:
            raise ValueError(f"resume_bytes ({v}) must be below pause_bytes ({high})")
        return v

    @property
    def headroom_records(self) -> int:
        return self.capacity_records - self.pause_records

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.pause_bytes


def async_flow(max_in_flight: int) -> FlowConfig:
    """The record marks of async handlers when `flow` is not given: 16 records of budget per
    record that may run at once (at least the thread defaults), resume at 40 % and capacity at
    120 % of the pause mark, as the defaults do; the byte marks, which bound memory, stay.
    With 1 ms coroutines 256 at a time drain the thread default of 1000 in a few
    milliseconds, and the loop then waited on fetching at every throttle (benchmarks/README.md
    has the figures)."""
    pause = max(FlowConfig.model_fields["pause_records"].default, 16 * max_in_flight)
    return FlowConfig(
        pause_records=pause, resume_records=pause * 2 // 5, capacity_records=pause * 6 // 5
    )


# librdkafka's session.timeout.ms default, which max.poll.interval.ms may not be below.
_CLIENT_SESSION_TIMEOUT_S = 45.0


class ConsumerConfig(BaseModel):
    """Settings of one `GroupConsumer` member."""

    # Inputs are hidden in errors because the `kafka` mapping may hold credentials.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    # The descriptions are docs/configuration.md's settings table (tests/unit/test_config_docs.py
    # renders it); a count's unit is its json_schema_extra "unit", a duration's the "_s".
    bootstrap_servers: str = Field(
        min_length=1, description="The brokers to start from: `host:port[,host:port...]`."
    )
    group_id: str = Field(
        min_length=1,
        description="The consumer group: 1 to 32767 bytes of UTF-8, not starting with "
        "whitespace, no NUL ([ids](#ids-and-names)).",
    )
    topics: list[str] = Field(
        min_length=1,
        description="Topic names, and regular expressions starting with `^`, in any mix "
        "([below](#topics-and-regular-expressions)).",
    )

    ordering: Literal["key", "partition", "unordered"] = Field(
        "key",
        description="What runs one record at a time, in offset order: a key's records, a "
        "partition's, or none ([workers-and-ordering.md](workers-and-ordering.md)).",
    )
    # Numbers are strict: "4" or True is a mistake, not a count; an int is a fine float.
    workers: int = Field(
        8,
        ge=1,
        le=1024,
        strict=True,
        json_schema_extra={"unit": "threads"},
        description="Thread handlers only: the worker threads (set for an async handler: the "
        "warning `workers_unused`).",
    )
    # Sized for I/O: a coroutine waiting on a socket costs a few kilobytes, not a thread.
    max_in_flight: int = Field(
        256,
        ge=1,
        le=100_000,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="Async handlers only (`async def`): records running at once on the event "
        "loop, in place of worker threads ([handlers.md](handlers.md)).",
    )

    group_protocol: Literal["classic", "consumer"] = Field(
        "classic", description='`"consumer"` is KIP-848 (brokers 4.0 and later).'
    )
    assignment_strategy: Literal["range", "roundrobin", "cooperative-sticky"] | None = Field(
        None, description='Classic protocol only; None: `"cooperative-sticky"`.'
    )
    remote_assignor: Literal["uniform", "range"] | None = Field(
        None, description='`group_protocol="consumer"` only; None: the broker\'s.'
    )
    group_instance_id: str | None = Field(
        None,
        min_length=1,
        description="Static membership ([rebalances.md](rebalances.md)): an id as `group_id`, "
        "at most 32730 bytes under the classic protocol; None: a dynamic member.",
    )
    # Durations are seconds, as everywhere in Python (floats, names ending in _s); weir converts
    # the librdkafka ones to its milliseconds, within librdkafka's ranges.
    session_timeout_s: float | None = Field(
        None,
        ge=0.001,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="Classic protocol only (a broker setting under KIP-848); None: "
        "librdkafka's, 45 s.",
    )
    heartbeat_interval_s: float | None = Field(
        None,
        ge=0.001,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="Classic protocol only; below `session_timeout_s`; None: librdkafka's, 3 s.",
    )
    max_poll_interval_s: float = Field(
        300.0,
        ge=0.001,
        le=86400,
        strict=True,
        allow_inf_nan=False,
        description="How long the member may go without polling before the group drops it; "
        "classic protocol: not below `session_timeout_s` (or librdkafka's 45 s when that is "
        "None).",
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        "earliest", description="Where a partition with no committed offset starts."
    )
    # librdkafka's default is 5 minutes; 30 s costs one metadata request per member every 30 s
    # (all topics' under a regex subscription).
    topic_refresh_s: float = Field(
        30.0,
        ge=0.1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="How often the client refreshes topic metadata: a new topic a classic "
        "pattern matches is consumed within this time "
        "([below](#how-soon-a-new-topic-is-consumed)).",
    )

    flow: FlowConfig = Field(
        FlowConfig(),
        description="The in-flight budget of records and bytes "
        "([flow-control.md](flow-control.md)); its counts are strict ints.",
    )
    max_batch: int = Field(
        200,
        ge=1,
        le=100_000,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="Records fetched at most per poll; at most `flow.capacity_records - "
        "flow.pause_records`.",
    )
    poll_timeout_s: float = Field(
        0.1,
        gt=0,
        le=1.0,
        strict=True,
        allow_inf_nan=False,
        description="The longest the owner thread blocks in the client.",
    )
    commit_interval_s: float = Field(
        1.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="An async commit when this much time or `commit_every` records have passed, "
        "whichever comes first (a restart replays at most about this much).",
    )
    # Each commit request is a write to __consumer_offsets.
    commit_every: int = Field(
        10_000,
        ge=1,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="See `commit_interval_s`.",
    )
    revoke_timeout_s: float = Field(
        10.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="The whole drain of revoked partitions; at most half of "
        "`max_poll_interval_s` ([rebalances.md](rebalances.md)).",
    )
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="The drain on stop or failure.",
    )
    startup_timeout_s: float = Field(
        30.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="How long to wait at start for a broker to answer.",
    )

    offset_map: bool = Field(
        True,
        description="Every commit carries the offsets finished above the committed one, and a "
        "new owner skips them ([offset-map.md](offset-map.md)).",
    )
    # The broker's offset.metadata.max.bytes is 4096 by default.
    offset_map_max_bytes: int = Field(
        4096,
        ge=64,
        le=1_048_576,
        strict=True,
        json_schema_extra={"unit": "bytes"},
        description="The offset map's size per partition, at most the broker's "
        "`offset.metadata.max.bytes` (a larger map is cut, never the commit).",
    )

    transactional_id: str | None = Field(
        None,
        min_length=1,
        description="Exactly-once: the id of the member's transactional producer, unique per "
        "running member (one started with the id of a running one fences it); an id as "
        "`group_id`; None: not transactional ([exactly-once.md](exactly-once.md)).",
    )
    transaction_interval_s: float = Field(
        0.1,
        gt=0,
        le=300,
        strict=True,
        allow_inf_nan=False,
        description="A transaction boundary at least this often.",
    )
    transaction_max_records: int = Field(
        10_000,
        ge=1,
        strict=True,
        json_schema_extra={"unit": "records"},
        description="... and after this many records were marked finished in it.",
    )
    transaction_timeout_s: float = Field(
        10.0,
        ge=1,
        le=900,
        strict=True,
        allow_inf_nan=False,
        description="How long the broker lets a transaction stay open (the producer's "
        "`transaction.timeout.ms`): a member killed mid-transaction holds its partitions back "
        "this long.",
    )

    failure: FailurePolicy = Field(
        FailurePolicy(),
        description="Retries, then what becomes of a record that still fails: stop, dead "
        "letter or block ([failures.md](failures.md)).",
    )
    # Validated when left out too: the dead-letter topic names `failure` makes are checked there.
    failure_by_topic: Mapping[str, FailurePolicy] = Field(
        default_factory=dict,
        validate_default=True,
        description="`failure` per topic: names as subscribed, or topics a subscribed pattern "
        "matches.",
    )

    stuck_after_s: float = Field(
        60.0,
        gt=0,
        strict=True,
        allow_inf_nan=False,
        description="A partition whose watermark has not moved for this long while records of "
        "it are in flight makes the member not ready "
        "([observability.md](observability.md#consumerhealth)).",
    )
    # The owner asks for metadata once a second meanwhile.
    broker_down_unready_s: float | None = Field(
        10.0,
        ge=1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="Once the client reported every broker down, the member is not ready after "
        "this long without a broker answering, and ready again at the first answer. None: an "
        "outage leaves readiness alone ([observability.md](observability.md#consumerhealth)).",
    )
    # Read by a client of its own on a thread of its own.
    watermark_refresh_s: float | None = Field(
        5.0,
        ge=0.1,
        le=3600,
        strict=True,
        allow_inf_nan=False,
        description="How often the owned partitions' high watermarks are read from their "
        "leaders, so lag stays right while a partition is not fetched (paused, or throttled); "
        "None: only the client's own values from its fetch responses "
        "([observability.md](observability.md#high-watermarks-while-a-partition-is-not-fetched)).",
    )

    callback_errors: Literal["log", "stop"] = Field(
        "log",
        description="What a user callback that raises (a commit listener, a `Handler` hook) "
        'does: `"log"` isolates it (logged once, counted in stats), `"stop"` also stops the '
        "member, which still drains, commits and closes.",
    )

    @field_validator("failure_by_topic")
    @classmethod
    def _failure_topics(
        cls, v: Mapping[str, FailurePolicy], info: ValidationInfo
    ) -> Mapping[str, FailurePolicy]:
        topics = info.data.get("topics") or []
        patterns = [re.compile(t) for t in topics if t.startswith("^")]
        for name in v:
            if name not in topics and not any(p.fullmatch(name) for p in patterns):
                raise ValueError(
                    f"failure_by_topic[{name!r}]: not a subscribed topic, nor matched by a "
                    f"subscribed pattern ({', '.join(topics)})"
                )
        problems = [_dead_letter_topic_problem(f"failure_by_topic[{n!r}]", p) for n, p in v.items()]
        # The dead-letter topic a policy without dead_letter_topic makes of each subscribed name
        # (a pattern's topics are known only once matched).
        default = info.data.get("failure")
        for topic in topics:
            policy = v.get(topic, default)
            if topic.startswith("^") or policy is None or policy.final != "dead_letter":
                continue
            made = policy.dead_letter_for(topic)
            if policy.dead_letter_topic is None and _topic_name_problem(made) is not None:
                where = f"failure_by_topic[{topic!r}]" if topic in v else "failure"
                problems.append(
                    f"{where}: the dead-letter topic of {_shown(topic)} would be {_shown(made)}, "
                    f"{len(made)} characters, and a topic name has at most 249: set "
                    "dead_letter_topic"
                )
        if any(problems):
            raise ValueError("; ".join(p for p in problems if p is not None))
        return v

    @field_validator("failure")
    @classmethod
    def _failure(cls, v: FailurePolicy) -> FailurePolicy:
        _refuse(_dead_letter_topic_problem("failure", v))
        return v

    # Validated when left out too: librdkafka checks the whole configuration either way.
    kafka: Mapping[str, KafkaValue | SecretStr] = Field(
        default_factory=dict,
        validate_default=True,
        description="Any other librdkafka setting, by its name "
        "([below](#librdkafka-settings-kafka)).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _explain_unknown(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise _with_suggestions(exc, cls._explain) from None

    @classmethod
    def _explain(cls, loc: tuple[int | str, ...]) -> str:
        name = str(loc[-1])  # flow's own names are explained by FlowConfig
        if name in _RENAMED:
            return f"{name} is now {_RENAMED[name]} (seconds)"
        if name in FlowConfig.model_fields:
            return f"{name} is a flow setting: pass flow=FlowConfig({name}=...)"
        if name in _TYPED_KEYS:
            return f"{name} is librdkafka's name: set {_TYPED_KEYS[name]!r}"
        if "." in name:
            return f"unknown setting {name!r}: librdkafka settings go in kafka={{...}}"
        return _suggest(name, cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _mask_before_validation(cls, data: Any) -> Any:
        # Errors carry their raw input (ValidationError.json() shows it even with
        # hide_input_in_errors), so secrets are wrapped before any rule can fail on them: in the
        # kafka mapping, and in whatever an unknown setting holds.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("kafka"), Mapping):
            data["kafka"] = _masked(data["kafka"])
        for key in [k for k in data if k not in cls.model_fields]:
            if isinstance(key, str) and is_secret_key(key):
                data[key] = _wrap_secret(data[key])
            else:
                data[key] = _masked(data[key])
        return data

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap(cls, v: str) -> str:
        _refuse(_text_problem("bootstrap_servers", v))
        return v

    @field_validator("group_id", "transactional_id")
    @classmethod
    def _ids(cls, v: str | None, info: ValidationInfo) -> str | None:
        _refuse(None if v is None else _id_problem(str(info.field_name), v))
        return v

    @field_validator("group_instance_id")
    @classmethod
    def _instance_id(cls, v: str | None, info: ValidationInfo) -> str | None:
        _refuse(None if v is None else _member_id_problem("group_instance_id", v, info.data))
        return v

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str]) -> list[str]:
        problems = [p for p in map(_topic_problem, v) if p is not None]
        # librdkafka refuses a subscription that names a topic or pattern twice ("Invalid
        # argument"), which would fail the member at start.
        twice = sorted({t for t in v if v.count(t) > 1})
        if twice:
            problems.append(f"{', '.join(map(_shown, twice))} listed more than once")
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("assignment_strategy")
    @classmethod
    def _strategy(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("group_protocol") == "consumer":
            raise ValueError(
                "assignment_strategy is a classic-protocol setting; with group_protocol="
                "'consumer' the broker assigns partitions: use remote_assignor"
            )
        return v

    @field_validator("remote_assignor")
    @classmethod
    def _remote(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("group_protocol") != "consumer":
            raise ValueError("remote_assignor needs group_protocol='consumer'")
        return v

    @field_validator("session_timeout_s", "heartbeat_interval_s")
    @classmethod
    def _classic_timeouts(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("group_protocol") == "consumer":
            raise ValueError(
                f"{info.field_name} is a broker setting under group_protocol='consumer' "
                "(group.consumer.session.timeout.ms / group.consumer.heartbeat.interval.ms); "
                "the client refuses to start with it"
            )
        return v

    @field_validator("heartbeat_interval_s")
    @classmethod
    def _heartbeat(cls, v: float | None, info: ValidationInfo) -> float | None:
        session = info.data.get("session_timeout_s")
        if v is not None and session is not None and v >= session:
            raise ValueError(
                f"heartbeat_interval_s must be below session_timeout_s ({v} >= {session})"
            )
        return v

    @field_validator("max_poll_interval_s")
    @classmethod
    def _max_poll(cls, v: float, info: ValidationInfo) -> float:
        if info.data.get("group_protocol") != "classic" or "session_timeout_s" not in info.data:
            return v
        session = info.data["session_timeout_s"]
        if v < (session or _CLIENT_SESSION_TIMEOUT_S):
            given = "session_timeout_s" if session else "librdkafka's default session timeout"
            raise ValueError(
                f"max_poll_interval_s ({v:g} s) must not be below {given} "
                f"({session or _CLIENT_SESSION_TIMEOUT_S:g} s) under the classic protocol"
            )
        return v

    @field_validator("max_batch")
    @classmethod
    def _max_batch(cls, v: int, info: ValidationInfo) -> int:
        flow = info.data.get("flow")
        if flow is not None and v > flow.headroom_records:
            raise ValueError(
                f"max_batch ({v}) is larger than the flow headroom flow.capacity_records - "
                f"flow.pause_records ({flow.headroom_records}): one fetched batch could pass "
                "the capacity"
            )
        return v

    @field_validator("revoke_timeout_s")
    @classmethod
    def _revoke_timeout(cls, v: float, info: ValidationInfo) -> float:
        max_poll = info.data.get("max_poll_interval_s")
        if max_poll is not None and v > max_poll / 2:
            raise ValueError(
                f"revoke_timeout_s ({v:g} s) must stay below half of max_poll_interval_s "
                f"({max_poll:g} s): the drain runs inside the rebalance callback, where the "
                "member does not poll"
            )
        return v

    @field_validator("kafka", mode="before")
    @classmethod
    def _kafka_values(cls, v: Any) -> Any:
        # One clear error per key, before the type check would list every type a value is not.
        if not isinstance(v, Mapping):
            return v
        problems = []
        for key, value in v.items():
            if key in _WEIR_CALLBACKS:
                problems.append(f"kafka[{key!r}] cannot be set: {_WEIR_CALLBACKS[key]}")
            elif callable(value) and not isinstance(value, SecretStr):
                problems.append(f"kafka[{key!r}] {_CALLABLE_HINT}")
            elif isinstance(value, _NotScalarSecret) or not isinstance(
                value, str | int | float | bool | SecretStr
            ):
                problems.append(f"kafka[{key!r}] must be a str, int, float or bool")
            else:
                problems.extend(_kafka_entry_problems(key, value))
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("kafka")
    @classmethod
    def _kafka(
        cls, v: Mapping[str, KafkaValue | SecretStr], info: ValidationInfo
    ) -> Mapping[str, KafkaValue | SecretStr]:
        client_id = v.get("client.id")
        if isinstance(client_id, str):
            # The broker names a classic member after its client id unless it has an instance id.
            _refuse(
                _member_id_problem("kafka['client.id']", client_id, info.data)
                if info.data.get("group_instance_id") is None
                else _id_problem("kafka['client.id']", client_id)
            )
        for key, value in v.items():
            if key in _TYPED_KEYS:
                raise ValueError(f"set {_TYPED_KEYS[key]!r} instead of kafka[{key!r}]")
            if key in _FORCED_OFF and str(value).lower() not in ("false", "0"):
                raise ValueError(
                    f"kafka[{key!r}] must stay false: weir commits only finished records "
                    "itself, and librdkafka's automatic commit would skip unfinished ones"
                )
        flow = info.data.get("flow")
        try:
            queued_kb = int(str(v.get("queued.max.messages.kbytes", 0)))
        except ValueError:
            queued_kb = 0  # not a number: librdkafka says so below
        if flow is not None and queued_kb * 1024 > flow.headroom_bytes:
            raise ValueError(
                f"kafka['queued.max.messages.kbytes'] ({queued_kb}) exceeds the flow byte "
                f"headroom flow.capacity_bytes - flow.pause_bytes ({flow.headroom_bytes})"
            )
        # librdkafka reads the whole configuration only once every field is valid.
        if all(name in info.data for name in cls.model_fields if name != "kafka"):
            refusals = _librdkafka_refusals(_client_conf({**info.data, "kafka": v}), v)
            if refusals:
                raise ValueError("; ".join(refusals))
        return v

    def effective_strategy(self) -> str | None:
        return _effective_strategy(self.group_protocol, self.assignment_strategy)

    @property
    def incremental(self) -> bool:
        """Whether rebalances hand over only the moved partitions (cooperative or KIP-848)."""
        return self.group_protocol == "consumer" or self.effective_strategy() == (
            "cooperative-sticky"
        )

    def policy_for(self, topic: str) -> FailurePolicy:
        """The failure policy of records of `topic`."""
        return self.failure_by_topic.get(topic, self.failure)

    def librdkafka_config(self) -> dict[str, Any]:
        """The dict for `confluent_kafka.Consumer`, without callbacks."""
        return _client_conf({name: getattr(self, name) for name in type(self).model_fields})

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            if name == "kafka" and isinstance(value, Mapping):
                yield name, mask_secrets(value)
            else:
                yield name, value


def _dead_letter_topic_problem(where: str, policy: FailurePolicy) -> str | None:
    name = policy.dead_letter_topic
    problem = None if name is None else _topic_name_problem(name)
    return None if problem is None else f"{where}.dead_letter_topic: {problem}"


def _member_id_problem(what: str, value: str, values: Mapping[str, Any]) -> str | None:
    """`_id_problem` for the id a classic group's broker names the member after: the group
    instance id if there is one, else the client id."""
    if values.get("group_protocol") == "classic":
        why = (
            " (a classic group's broker names the member '<id>-<UUID>', which must fit in "
            f"{_MAX_ID_BYTES})"
        )
        return _id_problem(what, value, _MAX_ID_BYTES - _CLASSIC_MEMBER_SUFFIX, why)
    return _id_problem(what, value)


def _effective_strategy(protocol: str, strategy: str | None) -> str | None:
    if protocol == "consumer":
        return None
    return strategy or "cooperative-sticky"


def _client_conf(values: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka's configuration from validated field values (a ConsumerConfig's, or those a
    validator has seen so far)."""
    flow: FlowConfig = values["flow"]
    conf: dict[str, Any] = {
        "bootstrap.servers": values["bootstrap_servers"],
        "group.id": values["group_id"],
        "group.protocol": values["group_protocol"],
        "auto.offset.reset": values["auto_offset_reset"],
        "max.poll.interval.ms": _ms(values["max_poll_interval_s"]),
        "topic.metadata.refresh.interval.ms": _ms(values["topic_refresh_s"]),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        # The client buffer is part of the stated memory bound: it may hold at most one
        # fetched batch worth of bytes beyond the pause mark.
        "queued.max.messages.kbytes": max(1024, flow.headroom_bytes // 1024),
        # librdkafka counts queued.min.messages over the consumer's one queue, not per
        # partition: a lower count made every resumed partition wait fetch.queue.backoff.ms
        # behind one fetch response of others. Its default keeps the count out of the way;
        # the byte bound above still holds.
        "queued.min.messages": 100_000,
        # librdkafka may pass its queue bound by one fetch response: cap that too.
        "fetch.max.bytes": max(1_048_576, min(52_428_800, flow.headroom_bytes)),
        # A resumed partition joins the next fetch request, which may wait behind a long
        # poll of partitions at the log end (client default 500 ms) or a queue-full backoff
        # (default 1 s), and partitions paused for their share of the budget resume many
        # times a second (flow-control.md). The price: about 100 empty fetches a second per
        # broker while caught up.
        "fetch.wait.max.ms": 10,
        "fetch.queue.backoff.ms": 50,
    }
    strategy = _effective_strategy(values["group_protocol"], values["assignment_strategy"])
    if strategy is not None:
        conf["partition.assignment.strategy"] = strategy
    if values["remote_assignor"] is not None:
        conf["group.remote.assignor"] = values["remote_assignor"]
    if values["group_instance_id"] is not None:
        conf["group.instance.id"] = values["group_instance_id"]
    if values["session_timeout_s"] is not None:
        conf["session.timeout.ms"] = _ms(values["session_timeout_s"])
    if values["heartbeat_interval_s"] is not None:
        conf["heartbeat.interval.ms"] = _ms(values["heartbeat_interval_s"])
    conf.update(
        (k, v.get_secret_value() if isinstance(v, SecretStr) else v)
        for k, v in values["kafka"].items()
    )
    return conf


# `GroupConsumer(handler, **settings)`'s keyword settings, for type checkers: the fields of
# ConsumerConfig (a unit test keeps the two equal). The functional form keeps the types objects at
# run time, so __required_keys__ is right there too (this module postpones annotations, which
# hides Required from a class body).
ConsumerSettings = TypedDict(  # noqa: UP013
    "ConsumerSettings",
    {
        "bootstrap_servers": Required[str],
        "group_id": Required[str],
        "topics": Required[list[str]],
        "ordering": Literal["key", "partition", "unordered"],
        "workers": int,
        "max_in_flight": int,
        "group_protocol": Literal["classic", "consumer"],
        "assignment_strategy": Literal["range", "roundrobin", "cooperative-sticky"] | None,
        "remote_assignor": Literal["uniform", "range"] | None,
        "group_instance_id": str | None,
        "session_timeout_s": float | None,
        "heartbeat_interval_s": float | None,
        "max_poll_interval_s": float,
        "auto_offset_reset": Literal["earliest", "latest", "error"],
        "topic_refresh_s": float,
        "flow": FlowConfig,
        "max_batch": int,
        "poll_timeout_s": float,
        "commit_interval_s": float,
        "commit_every": int,
        "revoke_timeout_s": float,
        "shutdown_timeout_s": float,
        "startup_timeout_s": float,
        "transactional_id": str | None,
        "transaction_interval_s": float,
        "transaction_max_records": int,
        "transaction_timeout_s": float,
        "offset_map": bool,
        "offset_map_max_bytes": int,
        "failure": FailurePolicy,
        "failure_by_topic": Mapping[str, FailurePolicy],
        "stuck_after_s": float,
        "broker_down_unready_s": float | None,
        "watermark_refresh_s": float | None,
        "callback_errors": Literal["log", "stop"],
        "kafka": Mapping[str, KafkaValue | SecretStr],
    },
    total=False,
)
