"""Generate the Grafana dashboard from the metric definitions in `spyglass.telemetry.metrics`.

Every query names a metric object from that module, so a renamed or removed metric breaks this
script (and its test) instead of leaving a silently empty panel.

    python dashboards/generate.py           # write dashboards/spyglass.json
    python dashboards/generate.py --check   # fail if the file is out of date
"""

import argparse
import json
import sys
from pathlib import Path

from spyglass.telemetry import metrics as m

OUTPUT = Path(__file__).resolve().parent / "spyglass.json"
MODEL = 'model_name=~"$model_name"'
GEN_AI_MODEL = 'gen_ai_request_model=~"$model_name"'
WINDOW = "[$__rate_interval]"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def series(metric, suffix: str = "") -> str:
    """The exported sample name: counters gain ``_total``, histograms ``_bucket``/``_sum``/``_count``."""
    name = metric._name
    return name + ("_total" if metric._type == "counter" and not suffix else suffix)


def rate(metric, suffix: str = "", selector: str = MODEL, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({series(metric, suffix)}{{{selector}}}{WINDOW}))"


def quantile_targets(histogram, selector: str = MODEL, quantiles=(0.5, 0.9, 0.99)) -> list[dict]:
    """P50/P90/P99 and the mean of a latency histogram, with exemplars."""
    targets = [
        target(
            f"histogram_quantile({q}, {rate(histogram, '_bucket', selector, 'le')})",
            f"P{round(q * 100)}",
            exemplar=True,
        )
        for q in quantiles
    ]
    targets.append(
        target(
            f"{rate(histogram, '_sum', selector)} / {rate(histogram, '_count', selector)}", "mean"
        )
    )
    return targets


def target(expr: str, legend: str, exemplar: bool = False) -> dict:
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "exemplar": exemplar,
        "refId": "",
    }


def gauge(metric, legend: str, by: str = "") -> dict:
    grouping = f" by ({by})" if by else ""
    return target(f"sum{grouping} ({metric._name}{{{MODEL}}})", legend)


def ratio(numerator, denominator, legend: str, by: str = "") -> dict:
    return target(f"{rate(numerator, by=by)} / {rate(denominator, by=by)}", legend)


def panel(
    title: str, unit: str, targets: list[dict], description: str = "", kind: str = "timeseries"
) -> dict:
    for ref, t in zip("ABCDEFGHIJ", targets):
        t["refId"] = ref
    field_config = {"defaults": {"unit": unit}, "overrides": []}
    if unit == "percentunit":
        field_config["defaults"].update(min=0, max=1)
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": field_config,
        "options": {},
    }


def mean_panel(title: str, unit: str, histograms, description: str) -> dict:
    """One time series per ``(histogram, legend)``: its mean (rate of the sum over rate of the count)."""
    return panel(
        title,
        unit,
        [target(f"{rate(h, '_sum')} / {rate(h, '_count')}", legend) for h, legend in histograms],
        description,
    )


def latency_panel(title: str, histogram) -> dict:
    """Percentiles and mean of a latency histogram, described by the metric's own help text."""
    return panel(title, "s", quantile_targets(histogram), histogram._documentation)


def heatmap(title: str, histogram) -> dict:
    expr = f"sum by (le) (increase({series(histogram, '_bucket')}{{{MODEL}}}{WINDOW}))"
    t = target(expr, "{{le}}")
    t["format"] = "heatmap"
    p = panel(title, "short", [t], histogram._documentation, kind="heatmap")
    p["options"] = {"calculate": False, "yAxis": {"unit": "short"}}
    return p


def sections() -> list[tuple[str, list[dict]]]:
    """(row title, panels) in display order."""
    latency = [
        latency_panel("Time to first token", m.TIME_TO_FIRST_TOKEN),
        latency_panel("Time per output token", m.TIME_PER_OUTPUT_TOKEN),
        latency_panel("Inter-token latency", m.INTER_TOKEN_LATENCY),
        latency_panel("End-to-end request latency", m.E2E_REQUEST_LATENCY),
        latency_panel("Queue time", m.REQUEST_QUEUE_TIME),
        latency_panel(
            "Preprocessing before the engine (template, tokens, images)", m.REQUEST_PREPROCESS_TIME
        ),
        mean_panel(
            "Prefill vs decode time (mean)",
            "s",
            (
                (m.REQUEST_PREFILL_TIME, "prefill"),
                (m.REQUEST_DECODE_TIME, "decode"),
                (m.REQUEST_INFERENCE_TIME, "inference (both)"),
            ),
            "Per request: first scheduled to first token, first to last token, first scheduled to finish.",
        ),
    ]
    load = [
        panel(
            "Token throughput",
            "tps",
            [
                target(rate(m.PROMPT_TOKENS), "prompt"),
                target(rate(m.GENERATION_TOKENS), "generation"),
            ],
        ),
        panel(
            "Scheduler state",
            "short",
            [
                gauge(m.NUM_REQUESTS_RUNNING, "running"),
                gauge(m.NUM_REQUESTS_WAITING, "waiting"),
                gauge(
                    m.NUM_REQUESTS_WAITING_BY_CLASS,
                    "waiting: {{scheduling_class}}",
                    "scheduling_class",
                ),
            ],
        ),
        panel(
            "KV cache usage",
            "percentunit",
            [gauge(m.KV_CACHE_USAGE, "used")],
            m.KV_CACHE_USAGE._documentation,
        ),
        panel(
            "Preemptions",
            "ops",
            [target(rate(m.NUM_PREEMPTIONS), "preemptions/s")],
            m.NUM_PREEMPTIONS._documentation,
        ),
        panel(
            "Finished requests by reason",
            "reqps",
            [target(rate(m.REQUEST_SUCCESS, by="finished_reason"), "{{finished_reason}}")],
        ),
        panel(
            "HTTP requests",
            "reqps",
            [
                target(
                    f"sum by (route, status) (rate({series(m.HTTP_REQUESTS)}{WINDOW}))",
                    "{{route}} {{status}}",
                )
            ],
        ),
        panel(
            "HTTP errors by code",
            "reqps",
            [
                target(
                    f"sum by (route, code) (rate({series(m.HTTP_ERRORS)}{WINDOW}))",
                    "{{route}} {{code}}",
                )
            ],
            m.HTTP_ERRORS._documentation,
        ),
        panel(
            "Tool calls by format",
            "reqps",
            [
                target(
                    f"sum by (format) (rate({series(m.TOOL_CALLS)}{WINDOW}))",
                    "{{format}}",
                )
            ],
            m.TOOL_CALLS._documentation,
        ),
        panel(
            "Kept state (responses, chat completions, conversations, files), and work in the background",
            "short",
            [
                target(f"sum({series(m.RESPONSES_KEPT)})", "responses kept"),
                target(f"sum({series(m.CHAT_COMPLETIONS_KEPT)})", "chat completions kept"),
                target(f"sum({series(m.CONVERSATIONS_KEPT)})", "conversations kept"),
                target(f"sum({series(m.FILES_KEPT)})", "files kept"),
                target(f"sum({series(m.BATCHES_RUNNING)})", "batches running"),
                target(f"sum({series(m.RESPONSES_IN_BACKGROUND)})", "in background"),
            ],
            f"Responses kept: {m.RESPONSES_KEPT._documentation} "
            f"Chat completions kept: {m.CHAT_COMPLETIONS_KEPT._documentation} "
            f"Conversations kept: {m.CONVERSATIONS_KEPT._documentation} "
            f"Files kept: {m.FILES_KEPT._documentation} "
            f"Batches running: {m.BATCHES_RUNNING._documentation} "
            f"In background: {m.RESPONSES_IN_BACKGROUND._documentation}",
        ),
        panel(
            "Replica routing: why each request went where it did",
            "reqps",
            [
                target(
                    f"sum by (reason) (rate({series(m.REPLICA_ROUTES)}{WINDOW}))",
                    "{{reason}}",
                )
            ],
            m.REPLICA_ROUTES._documentation,
        ),
        heatmap("Prompt length", m.REQUEST_PROMPT_TOKENS),
        heatmap("Generation length", m.REQUEST_GENERATION_TOKENS),
        mean_panel(
            "Requested limits (mean)",
            "short",
            (
                (m.REQUEST_PARAMS_MAX_TOKENS, "max_tokens"),
                (m.REQUEST_MAX_NUM_GENERATION_TOKENS, "longest output per call"),
                (m.REQUEST_PARAMS_N, "n"),
            ),
            "What clients ask for (max_tokens, n) beside the longest output each API call got.",
        ),
    ]
    engine = [
        panel(
            "Engine step duration",
            "s",
            quantile_targets(m.ENGINE_STEP_DURATION, quantiles=(0.5, 0.99)),
        ),
        panel(
            "Steps scheduled ahead of the device",
            "percentunit",
            [
                target(
                    f"{rate(m.STEPS_SCHEDULED_AHEAD)} / {rate(m.ENGINE_STEP_DURATION, '_count')}",
                    "of steps",
                )
            ],
            m.STEPS_SCHEDULED_AHEAD._documentation,
        ),
        panel(
            "CUDA graphs: steps by forward, padding rows",
            "percentunit",
            [
                target(
                    f"{rate(m.ENGINE_STEP_FORWARDS, by='forward')} / "
                    f"scalar({rate(m.ENGINE_STEP_FORWARDS)})",
                    "{{forward}} of steps",
                ),
                target(
                    f"{rate(m.CUDA_GRAPH_PADDING_TOKENS)} / {rate(m.CUDA_GRAPH_TOKENS)}",
                    "padding of graph rows",
                ),
            ],
            f"{m.ENGINE_STEP_FORWARDS._documentation} {m.CUDA_GRAPH_PADDING_TOKENS._documentation}",
        ),
        latency_panel("Structured outputs: grammar compile time", m.STRUCTURED_OUTPUT_COMPILE_TIME),
        latency_panel("Structured outputs: mask time per step", m.STRUCTURED_OUTPUT_MASK_TIME),
        latency_panel("Vision: encoder time per step", m.VISION_ENCODER_TIME),
        panel(
            "Vision: images encoded, taken from the cache; chunks waiting for a whole image",
            "ops",
            [
                target(rate(m.IMAGES_ENCODED), "encoded/s"),
                target(rate(m.IMAGE_CACHE_HITS), "from the cache/s"),
                target(rate(m.IMAGE_CHUNK_WAITS), "chunks waiting for a whole image/s"),
            ],
            f"{m.IMAGES_ENCODED._documentation} {m.IMAGE_CACHE_HITS._documentation} "
            f"{m.IMAGE_CHUNK_WAITS._documentation}",
        ),
        panel(
            "Step phases (mean)",
            "s",
            [
                target(
                    f"{rate(m.ENGINE_STEP_PHASE_DURATION, '_sum', by='phase')} / "
                    f"{rate(m.ENGINE_STEP_PHASE_DURATION, '_count', by='phase')}",
                    "{{phase}}",
                )
            ],
        ),
        panel(
            "Batch size and tokens per step",
            "short",
            [
                # A mean, not a quantile: histogram_quantile interpolates inside the lowest bucket
                # (le=1) down from 0, so steady batches of one read as 0.7.
                target(
                    f"{rate(m.ENGINE_STEP_BATCH_SIZE, '_sum')} / {rate(m.ENGINE_STEP_BATCH_SIZE, '_count')}",
                    "batch size mean",
                ),
                target(
                    f"{rate(m.ITERATION_TOKENS, '_sum')} / {rate(m.ITERATION_TOKENS, '_count')}",
                    "tokens/step mean",
                ),
            ],
        ),
        panel(
            "Device utilisation",
            "percentunit",
            [target(f"max by (device) ({m.DEVICE_UTILIZATION})", "{{device}}")],
        ),
        panel(
            "Device memory",
            "bytes",
            [target(f"max by (device) ({m.DEVICE_MEMORY_USED})", "{{device}}")],
        ),
        panel(
            "Plugin hook errors",
            "ops",
            [target(rate(m.PLUGIN_HOOK_ERRORS, by="plugin, hook"), "{{plugin}}.{{hook}}")],
        ),
    ]
    quality = [
        panel(
            "SLO attainment",
            "percentunit",
            [
                ratio(m.SLO_TTFT_MET, m.SLO_REQUESTS, "TTFT met"),
                ratio(m.SLO_TPOT_MET, m.SLO_REQUESTS, "TPOT met"),
                ratio(m.SLO_MET, m.SLO_REQUESTS, "both met (goodput)"),
            ],
            "Share of finished requests meeting the TTFT and TPOT targets (spyglass --slo-ttft/--slo-tpot).",
        ),
        panel(
            "SLO deadline misses",
            "ops",
            [target(rate(m.SLO_DEADLINE_MISSES), "misses/s")],
            m.SLO_DEADLINE_MISSES._documentation,
        ),
        panel(
            "Prefix cache hit rate",
            "percentunit",
            [ratio(m.PREFIX_CACHE_HITS, m.PREFIX_CACHE_QUERIES, "hit rate")],
            "Prompt tokens served from the prefix cache over prompt tokens looked up.",
        ),
        panel(
            "Speculative decoding acceptance",
            "percentunit",
            [
                ratio(
                    m.SPEC_DECODE_NUM_ACCEPTED_TOKENS,
                    m.SPEC_DECODE_NUM_DRAFT_TOKENS,
                    "acceptance rate",
                ),
                target(
                    f"{rate(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, by='position')} / "
                    f"scalar({rate(m.SPEC_DECODE_NUM_DRAFTS)})",
                    "position {{position}}",
                ),
            ],
            "Accepted over proposed draft tokens; per position, accepted over drafts.",
        ),
        panel(
            "GenAI semantic-convention latencies (P90)",
            "s",
            [
                target(
                    f"histogram_quantile(0.9, {rate(h, '_bucket', GEN_AI_MODEL, 'le, gen_ai_operation_name')})",
                    f"{legend} {{{{gen_ai_operation_name}}}}",
                    exemplar=True,
                )
                for h, legend in (
                    (m.GEN_AI_TIME_TO_FIRST_TOKEN, "TTFT"),
                    (m.GEN_AI_TIME_PER_OUTPUT_TOKEN, "TPOT"),
                    (m.GEN_AI_REQUEST_DURATION, "duration"),
                )
            ],
            "OpenTelemetry gen_ai.server.* histograms, by operation.",
        ),
    ]
    return [
        ("Latency", latency),
        ("Load and throughput", load),
        ("Engine", engine),
        ("Quality", quality),
        ("LoRA adapters", lora_panels()),
    ]


def lora_panels() -> list[dict]:
    """Per adapter (``lora_name``): live requests, finishes and generated tokens."""
    return [
        panel(
            "LoRA: live requests",
            "short",
            [gauge(m.LORA_REQUESTS_ACTIVE, "{{lora_name}}", "lora_name")],
            m.LORA_REQUESTS_ACTIVE._documentation,
        ),
        panel(
            "LoRA: finished requests",
            "reqps",
            [target(rate(m.LORA_REQUEST_SUCCESS, by="lora_name"), "{{lora_name}}")],
            "Finished requests per adapter, all finish reasons.",
        ),
        panel(
            "LoRA: generation throughput",
            "tps",
            [target(rate(m.LORA_GENERATION_TOKENS, by="lora_name"), "{{lora_name}}")],
            "Generated tokens per second per adapter, counted when each request finishes.",
        ),
    ]


def layout(rows: list[tuple[str, list[dict]]]) -> list[dict]:
    """Rows of three panels, each 8 wide and 8 high, with ids in order."""
    panels, y, next_id = [], 0, 1
    for title, row_panels in rows:
        panels.append(
            {
                "type": "row",
                "title": title,
                "id": next_id,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        next_id, y = next_id + 1, y + 1
        for i, p in enumerate(row_panels):
            p["id"], next_id = next_id, next_id + 1
            p["gridPos"] = {"h": 8, "w": 8, "x": 8 * (i % 3), "y": y + 8 * (i // 3)}
            panels.append(p)
        y += 8 * ((len(row_panels) + 2) // 3)
    return panels


def templating() -> dict:
    return {
        "list": [
            {
                "type": "datasource",
                "name": "datasource",
                "label": "Prometheus",
                "query": "prometheus",
                "current": {"text": "Prometheus", "value": "prometheus"},
                "hide": 0,
            },
            {
                "type": "query",
                "name": "model_name",
                "label": "Model",
                "datasource": DATASOURCE,
                "query": {
                    "query": f"label_values({m.NUM_REQUESTS_RUNNING._name}, model_name)",
                    "refId": "model_name",
                },
                "refresh": 2,
                "multi": True,
                "includeAll": True,
                "current": {"text": "All", "value": "$__all"},
                "hide": 0,
                "sort": 1,
            },
        ]
    }


def dashboard() -> dict:
    """The whole dashboard as Grafana's JSON model."""
    return {
        "uid": "spyglass-overview",
        "title": "Spyglass",
        "description": "Generated by dashboards/generate.py from spyglass.telemetry.metrics; do not edit by hand.",
        "tags": ["spyglass", "llm"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "timezone": "browser",
        "templating": templating(),
        "annotations": {"list": []},
        "links": [],
        "panels": layout(sections()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed dashboard is out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text() != render():
            print(f"{OUTPUT} is out of date: run python dashboards/generate.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
