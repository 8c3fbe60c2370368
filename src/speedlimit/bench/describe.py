"""A run's self-checks, the server's own view and the workers that sent the load, as plain (name, text) rows:
one wording for the terminal tables (`speedlimit.cli.bench_view`) and the HTML report (`speedlimit.report`)."""

from __future__ import annotations

from speedlimit.artifacts import SelfChecks, ServerMetrics, WorkersInfo


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.2f}"


def workers_line(info: WorkersInfo) -> str:
    """--workers/--ray: how many, and the clock skew measured between them (offsets are already corrected)."""
    where = "processes" if info.mode == "processes" else f"Ray actors ({info.address or 'local Ray'})"
    hosts = len({w.host for w in info.workers}) or 1
    text = (f"{info.count} {where} on {hosts} host(s); clock skew {info.max_clock_offset_ms:.3f} ms "
            f"(± {info.max_clock_uncertainty_ms:.3f} ms)")
    if info.max_clock_drift_ms is not None:
        text += f", drift {info.max_clock_drift_ms:.3f} ms"
    if info.start_spread_ms is not None:
        text += f", start spread {info.start_spread_ms:.3f} ms"
    if info.cpu_s is not None:
        text += f"; worker CPU {info.cpu_s:.2f} s"
    return text


def self_check_lines(checks: SelfChecks) -> list[tuple[str, str]]:
    """The self-checks as (name, text) rows: printed with every run."""
    rows = []
    if checks.arrivals is not None:
        a = checks.arrivals
        rows.append(("arrival lag", f"p50 {_ms(a.lag_p50_s)} ms, p99 {_ms(a.lag_p99_s)} ms; {a.late} of {a.requests} "
                                    f"sent > {a.late_threshold_s * 1e3:g} ms late"))
    if checks.client is not None:
        c = checks.client
        who = "" if c.processes == 1 else f" (busiest of {c.processes} processes)"
        text = (f"CPU {c.cpu_fraction:.0%} of a core{who}, {c.cpu_s:.2f} s over {c.wall_s:.2f} s; event-loop lag "
                f"p50 {_ms(c.loop_lag_p50_s)} ms, p99 {_ms(c.loop_lag_p99_s)} ms"
                + (f" (workers' worst p99 {_ms(c.worker_loop_lag_p99_s)} ms)" if c.worker_loop_lag_p99_s is not None
                   else ""))
        rows.append(("client", text + ("  ← CLIENT-BOUND" if c.bottleneck else "")))
    if checks.ttft_vs_server is not None:
        t = checks.ttft_vs_server
        rows.append(("TTFT − server's", f"mean {_ms(t.mean_diff_s)} ms (client {_ms(t.client_mean_s)}, server "
                                         f"{_ms(t.server_mean_s)}); p50 {_ms(t.p50_diff_s)} ms (server p50 from "
                                         "buckets)"))
    if checks.output_length is not None:
        o = checks.output_length
        rows.append(("output length", f"{o.exact} of {o.checked} got max_tokens exactly, {o.fewer} fewer, {o.more} "
                                      f"more ({o.token_count_source} counts)"))
    return rows


def server_lines(server: ServerMetrics) -> list[tuple[str, str]]:
    """The server's own view (its /metrics) as (name, text) rows."""
    engine = f"{server.engine} {server.version}" if server.version else server.engine
    rows = [("server metrics", f"{engine} at {server.url}: {server.scrapes} scrapes every {server.interval_s or 0:g} s")]
    for label, gauge, scale, unit in (("running", server.running, 1, ""), ("waiting", server.waiting, 1, ""),
                                      ("KV cache", server.kv_cache_usage, 100, "%")):
        if gauge is not None:
            rows.append((f"  {label}", f"mean {gauge.mean * scale:.3g}{unit}, max {gauge.max * scale:.3g}{unit}"))
    if server.prefix_cache_hit_rate is not None:
        rows.append(("  prefix-cache hits", f"{server.prefix_cache_hit_rate:.1%}"))
    if server.kv_capacity_tokens is not None:
        blocks = f" ({server.kv_capacity_tokens / server.kv_block_size:,.0f} blocks of {server.kv_block_size})" \
            if server.kv_block_size else ""
        rows.append(("  KV capacity", f"{server.kv_capacity_tokens:,.0f} tokens{blocks}"))
    if server.slots is not None:
        context = f" ({server.slot_context_tokens:,}-token context each)" if server.slot_context_tokens else ""
        used = ""
        if server.slot_history:  # least recently used first, as the server will hand them out after the fresh ones
            busy = f", {server.slots_busy} busy" if server.slots_busy else ""
            used = f"; used before the run: {', '.join(str(s) for s in server.slot_history)}{busy}"
        rows.append(("  slots", f"{server.slots:,}{context}{used}"))
    if server.tp is not None:
        sizes = (("tp", server.tp), ("pp", server.pp), ("dp", server.dp), ("ep", server.ep))
        layout = [f"{name} {value}" for name, value in sizes if value is not None]
        layout += ["data-parallel attention"] if server.dp_attention else []
        rows.append(("  layout", ", ".join(layout)))
    scheduler = [f"{server.batched_tokens:,} tokens a prefill step" if server.batched_tokens is not None else "",
                 f"at most {server.max_running:,} running" if server.max_running is not None else ""]
    if any(scheduler):
        rows.append(("  scheduler", ", ".join(part for part in scheduler if part)))
    if server.counters:
        rows.append(("  counters", ", ".join(f"{k} {v:,.6g}" for k, v in server.counters.items())))
    for name, h in server.histograms.items():
        rows.append((f"  {name.removesuffix('_s')}", f"mean {_ms(h.mean)} ms, p50 {_ms(h.p50)}, p99 {_ms(h.p99)} ms "
                                                    f"(n {h.n})"))
    return rows
