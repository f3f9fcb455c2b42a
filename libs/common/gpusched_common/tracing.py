"""OpenTelemetry: one span per handled message, context carried in the W3C `traceparent` header.

`configure_tracing` is called once by each process's app; until then spans are no-ops.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gpusched_common.settings import Settings

_PROPAGATOR = TraceContextTextMapPropagator()


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file (for tests and offline inspection)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            lines.append(json.dumps({
                "name": span.name,
                "service": span.resource.attributes.get("service.name"),
                "trace_id": format(ctx.trace_id, "032x"),
                "span_id": format(ctx.span_id, "016x"),
                "parent_span_id": format(span.parent.span_id, "016x") if span.parent else None,
                "start_ns": span.start_time,
                "end_ns": span.end_time,
                "attributes": dict(span.attributes or {}),
            }))
        with self._lock, self._path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def configure_tracing(service_name: str, settings: Settings) -> TracerProvider | None:
    if settings.trace_exporter == "none":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if settings.trace_exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif settings.trace_exporter == "file":
        path = settings.trace_file or Path(".gpusched/traces.jsonl")
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint) if settings.otlp_endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def tracer() -> trace.Tracer:
    return trace.get_tracer("gpusched")


def context_from_traceparent(traceparent: str | None) -> otel_context.Context:
    if not traceparent:
        return otel_context.Context()
    return _PROPAGATOR.extract({"traceparent": traceparent})


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")
