"""A span exporter that encodes every batch to OTLP protobuf and drops it: tracing's full cost, minus the network."""

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from spyglass.telemetry.tracing import build_resource


class EncodingSinkExporter(SpanExporter):
    """Serialises spans exactly as the OTLP exporters do, then discards the bytes (counting them)."""

    def __init__(self):
        self.num_spans = 0
        self.num_bytes = 0

    def export(self, spans) -> SpanExportResult:
        """Encode and count."""
        self.num_bytes += len(encode_spans(spans).SerializeToString())
        self.num_spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release."""


def sink_tracer_provider() -> tuple[TracerProvider, EncodingSinkExporter]:
    """A provider batching into the sink, as a served engine batches into its OTLP exporter."""
    exporter = EncodingSinkExporter()
    provider = TracerProvider(resource=build_resource())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, exporter
