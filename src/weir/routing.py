"""Several topics, several handlers, one member: `GroupConsumer(routes={...})`.

A route maps a topic name, or a compiled regular expression matching topic names, to a handler
with its own deserializers, failure policy and filter (`Route`). The member subscribes to what
the routes name unless `topics=` says otherwise, and every subscribed name or pattern must have
a route: an unrouted topic is refused where the `GroupConsumer` is built, never found record by
record. One member runs one kind of worker and one kind of call, so the routes' handlers are
all thread handlers or all `async def`, and all take one record at a time or all are batch
handlers (docs/routing.md). A batch of a batch-routed member may span routes: each route's
handler gets the batch's records of its topics, in the batch's order; when one raises, the
records of the routes that returned still count finished (`BatchRouter`).

A route may have an ordering of its own (`Route(ordering=...)`, else the member's): the table
resolves a topic's, and the scheduler asks it once per topic and holds the answer
(`weir._engine.scheduling.Orderings`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, cast, get_args

from typing_extensions import TypeVar

from weir._engine.scheduling import Orderings
from weir._engine.workers import LaneOf
from weir._wrapping import await_hook, await_plain
from weir._wrapping import call_plain as _call_plain
from weir.logs import get_logger
from weir.policy import FailurePolicy
from weir.records import (
    BatchContext,
    BatchHandler,
    Context,
    FlushContext,
    Handler,
    Ordering,
    Partition,
    Record,
    as_handler,
    is_async_handler,
    runs_nothing,
)
from weir.serde import Deserializer, DeserializingBatchHandler, check_setting, deserializing

__all__ = ["Route", "RouteKey", "Routes"]

log = get_logger(__name__)

# What the route's value deserializer makes, and so what its handler's records hold
# (`Record[_V]`): a handler of `Record[Order]` with a deserializer of something else is refused by
# the type checker. Any by default: a route without a deserializer, or a `Handler` instance.
_V = TypeVar("_V", default=Any)

_ORDERINGS: tuple[Ordering, ...] = get_args(Ordering)

RouteKey = str | re.Pattern[str]
"""A topic's name, or a compiled regular expression that matches names from their start (as a
subscribed `^` pattern does)."""


@dataclass(frozen=True, slots=True)
class Route(Generic[_V]):
    """What a topic's records get: `handler` (a `Handler` or a function taking a `Record`), the
    deserializers it reads through `record.deserialized_key/value`, its `failure` policy (else
    the member's `failure`), `filter`: a predicate on the raw record; a record it says False
    to is not handled and counts as finished (its offset is committed like any other), and
    `ordering`: what of its topics' records runs one at a time, in offset order ("key",
    "partition" or "unordered"; None: the member's `ordering`)."""

    handler: Handler | Callable[[Record[_V]], object]
    key_deserializer: Deserializer | None = None
    value_deserializer: Callable[[bytes | None], _V] | None = None
    failure: FailurePolicy | None = None
    filter: Callable[[Record], bool] | None = None
    ordering: Ordering | None = None


Routes = Mapping[RouteKey, "Route | Handler | Callable[[Record], object]"]
"""What `GroupConsumer(routes=...)` takes: a route, or a bare handler, per topic or pattern."""


class _Compiled:
    __slots__ = ("filter", "handler", "key", "ordering", "policy")

    def __init__(self, key: RouteKey, route: Route) -> None:
        self.key = key
        self.policy = route.failure
        self.filter = route.filter
        self.ordering = route.ordering
        handler = as_handler(route.handler)
        if route.key_deserializer is not None or route.value_deserializer is not None:
            # A batch handler's lanes (what a record that does not deserialize holds back) are
            # the member's orderings, known once the member's config is: `BatchRouter.bind`.
            handler = deserializing(handler, route.key_deserializer, route.value_deserializer)
        self.handler = handler

    def skips(self, record: Record) -> bool:
        """Whether the route's filter skips `record`. A filter that returns None (one without
        a return, or returning `record.key` of a record without a key) fails the record: taken
        for False, it would skip every such record unseen."""
        assert self.filter is not None
        keep = self.filter(record)
        if keep is None:
            name = getattr(self.filter, "__qualname__", repr(self.filter))
            raise TypeError(
                f"route {_shown(self.key)}: filter {name} returned None for {record.event_id}: "
                "a filter returns True to handle a record, False to skip it"
            )
        return not keep


class _Table:
    """The routes, looked up by topic: an exact name first, then the patterns in the order
    given; each topic's answer is kept (a member sees few topics, each many times)."""

    def __init__(self, routes: object) -> None:
        if not isinstance(routes, Mapping) or not routes:
            raise TypeError(
                "routes must be a non-empty mapping of topic name (or re.compile(...) pattern) "
                f"to a weir.Route or a handler, got {routes!r}"
            )
        self.exact: dict[str, _Compiled] = {}
        self.patterns: list[tuple[re.Pattern[str], _Compiled]] = []
        for key, value in routes.items():
            route = value if isinstance(value, Route) else Route(value)
            _check_route(key, route)
            compiled = _Compiled(key, route)
            if isinstance(key, str):
                self.exact[key] = compiled
            else:
                self.patterns.append((key, compiled))
        self.is_async = self._agree(
            is_async_handler,
            ("async def", "thread"),
            "the routes mix async def and thread handlers; one member runs one kind of worker: "
            "make them all async def or all plain",
        )
        self.is_batch = self._agree(
            lambda h: isinstance(h, BatchHandler),
            ("batch", "one record"),
            "the routes mix batch handlers and handlers of one record; one member makes one kind "
            "of call: make them all weir.BatchHandler subclasses or all take one record",
        )
        self._found: dict[str, _Compiled | None] = {}

    def _agree(self, kind: Callable[[Handler], bool], names: tuple[str, str], mix: str) -> bool:
        """True if every route's handler is of `kind`, False if none is; a mix is refused with
        `mix` and each route's kind (`names`: of `kind`, and not)."""
        kinds = {kind(c.handler) for c in self.all()}
        if len(kinds) > 1:
            each = ", ".join(
                f"{_shown(c.key)}: {names[0] if kind(c.handler) else names[1]}" for c in self.all()
            )
            raise TypeError(f"{mix} ({each})")
        return kinds == {True}

    def all(self) -> list[_Compiled]:
        return [*self.exact.values(), *(c for _, c in self.patterns)]

    def find(self, topic: str) -> _Compiled | None:
        try:
            return self._found[topic]
        except KeyError:
            found = self.exact.get(topic)
            if found is None:
                # As librdkafka reads a subscribed pattern: anchored at the start of the name.
                matched = [c for p, c in self.patterns if p.match(topic)]
                found = matched[0] if matched else None
                if len(matched) > 1:
                    log.warning(
                        "route_patterns_overlap",
                        topic=topic,
                        route=_shown(matched[0].key),
                        also=[_shown(c.key) for c in matched[1:]],
                    )
            self._found[topic] = found
            return found

    def route(self, record: Record) -> _Compiled:
        found = self.find(record.topic)
        if found is None:
            raise LookupError(f"no route for topic {record.topic!r} (routes: {self.names()})")
        return found

    def names(self) -> str:
        return ", ".join(_shown(c.key) for c in self.all())

    def subscription(self) -> list[str]:
        """The `topics=` the routes name: names as they are, patterns anchored with `^` (how
        librdkafka tells a pattern from a name)."""
        return [*self.exact, *(_anchored(p) for p, _ in self.patterns)]

    def unrouted(self, topics: Iterable[str]) -> list[str]:
        """Subscribed names without a route, and subscribed patterns that are not a route's."""
        patterns = {_anchored(p) for p, _ in self.patterns}
        out = []
        for t in topics:
            if (t not in patterns) if t.startswith("^") else (self.find(t) is None):
                out.append(t)
        return out

    def own_policies(self) -> set[str]:
        """The `failure_by_topic` keys of the routes with a policy of their own (patterns as
        subscribed, with their `^`)."""
        return {name for name, c in self.exact.items() if c.policy is not None} | {
            _anchored(p) for p, c in self.patterns if c.policy is not None
        }

    def policies(
        self, fallback: FailurePolicy, mine: Mapping[str, FailurePolicy]
    ) -> dict[str, FailurePolicy]:
        """The member's `failure_by_topic`: the application's entries (`mine`) and the routes'
        own policies. `ConsumerConfig.policy_for` takes a topic's name, else the first pattern
        that matches, as `find` does; so each pattern route's entry goes in the routes' order
        (its own policy, else the application's entry for its pattern), and one with neither
        holds `fallback`, the member's policy, when a later one has one: else a topic both
        match would run on the first route and fail into the later one's policy. A route by
        name with neither holds it too when a pattern's entry matches its name."""
        out = {k: v for k, v in mine.items() if not k.startswith("^")}
        out.update({name: c.policy for name, c in self.exact.items() if c.policy is not None})
        patterns: list[tuple[str, FailurePolicy]] = []
        owned_later = False
        for p, c in reversed(self.patterns):
            key = _anchored(p)
            own = c.policy if c.policy is not None else mine.get(key)
            if own is not None:
                patterns.append((key, own))
                owned_later = True
            elif owned_later:
                patterns.append((key, fallback))
        patterns.reverse()
        # A route by name without a policy (its own or the application's) takes none of a
        # pattern's: the names come first, so it holds the member's when a pattern matches it.
        for name in self.exact:
            if name not in out and any(re.match(key, name) for key, _ in patterns):
                out[name] = fallback
        out.update(patterns)
        # Subscribed patterns are the routes' (`unrouted`): nothing is left, unless that changes.
        out.update({k: v for k, v in mine.items() if k not in out})
        return out

    def orderings(self, default: Ordering) -> Orderings:
        """Each topic's ordering (its route's, else `default`, the member's) and every mode
        some route has."""

        def own(c: _Compiled | None) -> Ordering:
            return default if c is None or c.ordering is None else c.ordering

        def of(topic: str) -> Ordering:
            return own(self.find(topic))

        modes = frozenset(own(c) for c in self.all())
        shown = {name: own(c) for name, c in self.exact.items()}
        shown.update({_anchored(p): own(c) for p, c in self.patterns})
        return Orderings(of, modes, shown)

    def by_route(self, partitions: Sequence[Partition]) -> list[tuple[Handler, list[Partition]]]:
        groups: dict[int, tuple[Handler, list[Partition]]] = {}
        for tp in partitions:
            c = self.find(tp.topic)
            if c is not None:
                groups.setdefault(id(c), (c.handler, []))[1].append(tp)
        return list(groups.values())

    def flush_hooks(self) -> list[Callable[[FlushContext], Awaitable[None] | None]]:
        return [h for c in self.all() if (h := c.handler._flush_hook()) is not None]


class Router(Handler):
    """The member's handler when it has routes: each record to its topic's route (filter,
    deserializers, handler), each hook to the routes of the partitions it names."""

    def __init__(self, table: _Table) -> None:
        self.table = table
        self._flushes = table.flush_hooks()

    def handle(self, record: Record, ctx: Context) -> None:
        route = self.table.route(record)
        if route.filter is not None and route.skips(record):
            return
        _call_plain(route.handler.handle, record, ctx)

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        for handler, tps in self.table.by_route(partitions):
            _call_plain(handler.on_assigned, tps, hook=True)

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        for handler, tps in self.table.by_route(partitions):
            _call_plain(handler.on_revoked, tps, hook=True)

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        for handler, tps in self.table.by_route(partitions):
            _call_plain(handler.on_lost, tps, hook=True)

    def on_shutdown(self) -> None:
        for c in self.table.all():
            _call_plain(c.handler.on_shutdown, hook=True)

    def _flush_hook(self) -> Callable[[FlushContext], Awaitable[None] | None] | None:
        if not self._flushes:
            return None

        def flush(ctx: FlushContext) -> None:
            for hook in self._flushes:
                _call_plain(hook, ctx, hook=True)

        return flush

    def __repr__(self) -> str:
        return f"Router({self.table.names()})"


class AsyncRouter(Router):
    """The same for `async def` handlers: each awaited on the member's event loop."""

    async def handle(self, record: Record, ctx: Context) -> None:  # type: ignore[override]
        route = self.table.route(record)
        if route.filter is not None and route.skips(record):
            return
        await await_plain(route.handler.handle, record, ctx)

    async def on_assigned(self, partitions: Sequence[Partition]) -> None:  # type: ignore[override]
        for handler, tps in self.table.by_route(partitions):
            await await_hook(handler.on_assigned, tps)

    async def on_revoked(self, partitions: Sequence[Partition]) -> None:  # type: ignore[override]
        for handler, tps in self.table.by_route(partitions):
            await await_hook(handler.on_revoked, tps)

    async def on_lost(self, partitions: Sequence[Partition]) -> None:  # type: ignore[override]
        for handler, tps in self.table.by_route(partitions):
            await await_hook(handler.on_lost, tps)

    async def on_shutdown(self) -> None:  # type: ignore[override]
        for c in self.table.all():
            await await_hook(c.handler.on_shutdown)

    def _flush_hook(self) -> Callable[[FlushContext], Awaitable[None] | None] | None:
        if not self._flushes:
            return None

        async def flush(ctx: FlushContext) -> None:
            for hook in self._flushes:
                await await_hook(hook, ctx)

        return flush


class BatchRouter(BatchHandler, Router):
    """The member's handler when its routes are batch handlers: a batch's records to their
    routes (filter, deserializers, `handle_batch`), each route's in the batch's order, one route
    after another on the same `BatchContext` (its marks and outputs are by record).

    Only if some route raises does anything get marked: the records its filter skipped and the
    records of the routes that returned are marked done, so they count finished, and the first
    exception is raised: it fails the batch's other records (but those a route marked) as one
    batch failure, whose retries and splitting then meet only them."""

    def bind(self, lanes: LaneOf | None) -> None:
        """The member's lanes (`weir._engine.scheduling.lane_of`), for the routes' deserializing
        wrappers: a record that does not deserialize holds its lane's later records back."""
        for c in self.table.all():
            if isinstance(c.handler, DeserializingBatchHandler):
                c.handler.hold_lanes(lanes)

    def _split(
        self, records: list[Record]
    ) -> tuple[list[tuple[BatchHandler, list[Record]]], list[Record]]:
        """The batch's records per route, in the batch's order, and those the filters skip."""
        groups: dict[int, tuple[BatchHandler, list[Record]]] = {}
        skipped: list[Record] = []
        route_of = self.table.route
        for record in records:
            route = route_of(record)
            if route.filter is not None and route.skips(record):
                skipped.append(record)
                continue
            group = groups.get(id(route))
            if group is None:
                group = groups[id(route)] = (cast(BatchHandler, route.handler), [])
            group[1].append(record)
        return list(groups.values()), skipped

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        groups, skipped = self._split(records)
        failure: Exception | None = None
        for handler, recs in groups:
            try:
                _call_plain(handler.handle_batch, recs, ctx)
            except Exception as exc:
                failure = failure or exc
                recs.clear()  # not finished: the batch failure meets them
        _raise_after(failure, ctx, groups, skipped)

    def __repr__(self) -> str:
        return f"BatchRouter({self.table.names()})"


class AsyncBatchRouter(BatchRouter, AsyncRouter):  # type: ignore[misc]  # handle: BatchHandler's (never called)
    """The same for `async def handle_batch` routes: each awaited in turn on the member's event
    loop."""

    async def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:  # type: ignore[override]
        groups, skipped = self._split(records)
        failure: Exception | None = None
        for handler, recs in groups:
            try:
                await await_plain(handler.handle_batch, recs, ctx)
            except Exception as exc:
                failure = failure or exc
                recs.clear()
        _raise_after(failure, ctx, groups, skipped)


def _raise_after(
    failure: Exception | None,
    ctx: BatchContext,
    groups: list[tuple[BatchHandler, list[Record]]],
    skipped: list[Record],
) -> None:
    """After a batch's routes ran: if one raised (its records taken out of `groups`), what the
    others returned and the filters skipped counts finished, and the first failure is raised."""
    if failure is not None:
        ctx._finish_unmarked([*skipped, *(r for _, recs in groups for r in recs)])
        raise failure


def router(routes: object) -> Router:
    """The member's handler for `routes` (checked here, in the caller's thread)."""
    table = _Table(routes)
    if table.is_batch:
        return AsyncBatchRouter(table) if table.is_async else BatchRouter(table)
    return AsyncRouter(table) if table.is_async else Router(table)


def _check_route(key: object, route: Route) -> None:
    if isinstance(key, str):
        if not key or key.startswith("^"):
            raise ValueError(
                f"route {key!r}: a topic name must be non-empty and not start with '^'; for a "
                "pattern use re.compile(...)"
            )
    elif not isinstance(key, re.Pattern) or not isinstance(key.pattern, str):
        raise TypeError(
            f"a route's key must be a topic name (str) or re.compile(...) of a str, got {key!r}"
        )
    if route.filter is not None and not callable(route.filter):
        raise TypeError(f"route {_shown(key)}: filter must be a function of the record")
    if route.filter is not None and runs_nothing(route.filter):
        # Its coroutine or generator is truthy: every record would be kept, unfiltered.
        raise TypeError(
            f"route {_shown(key)}: filter must be a plain function returning True or False, "
            "called before the handler and never awaited or iterated; "
            f"{getattr(route.filter, '__qualname__', route.filter)} is async def or has a yield"
        )
    for name, given in (
        ("key_deserializer", route.key_deserializer),
        ("value_deserializer", route.value_deserializer),
    ):
        if given is not None:
            check_setting(f"route {_shown(key)}: {name}", given, serializer=False)
    if route.failure is not None and not isinstance(route.failure, FailurePolicy):
        raise TypeError(f"route {_shown(key)}: failure must be a weir.FailurePolicy")
    if route.ordering is not None and route.ordering not in _ORDERINGS:
        raise ValueError(
            f"route {_shown(key)}: ordering must be one of "
            f"{', '.join(map(repr, _ORDERINGS))} or None (the member's), got {route.ordering!r}"
        )


def _anchored(p: re.Pattern[str]) -> str:
    return p.pattern if p.pattern.startswith("^") else "^" + p.pattern


def _shown(key: object) -> str:
    return f"re.compile({key.pattern!r})" if isinstance(key, re.Pattern) else repr(key)
