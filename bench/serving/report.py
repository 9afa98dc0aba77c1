"""The serving benchmark's report (:mod:`bench.serving.__main__`): tables per protocol, the CPU ratios
against their targets, where the CPU goes for each missed one, gRPC against HTTP, and the proxy figures."""

from __future__ import annotations

import statistics
from typing import Any

#: Thread groups of the CPU split, in report order (see ``bench.serving.__main__.thread_cpu_seconds``).
THREAD_GROUPS: tuple[str, ...] = ("loop", "icos-worker", "icos-judge", "icos-store", "other")


def print_results(results: dict[str, Any]) -> None:
    """The tables, the headline ratios and the targets of one model; first, every setting that failed."""
    for e in results.get("errors", []):
        print(f"FAILED {e['setting']}: {e['error']}")
    if results["settings"]:
        print_settings(results)
    print(f"imported on the serve path: {results['serve_path_imports']}")
    print_proxy_and_misses(results)


def print_settings(results: dict[str, Any]) -> None:
    """The tables of the settings measured, their ratios against the targets and the agent's figures."""
    print("agent: same outputs as bare (probabilities, label; judged off the request path);")
    print("agent+v: all outputs incl. icos_verdict (judged in the request path)")
    rounds, seconds = results["rounds"], results["seconds"]
    print(f"medians of {rounds} interleaved round(s) of {seconds:g} s; cpu = server CPU ms/request")
    head = f"{'req/s':>7} {'p50 ms':>6} {'p99 ms':>6} {'cpu':>5}"
    print(
        f"{'proto':<5} {'conc':>4} {'batch':>5} | agent {head} | agent+v {head} | bare {head} | "
        f"{'ratio':>5} {'ratio+v':>7}"
    )
    for s in results["settings"]:
        a, v, b = s["agent"], s["agent_with_verdict"], s["bare"]
        cells = [
            f"{r['requests_per_s']:>7.0f} {r['p50_ms']:>6.2f} {r['p99_ms']:>6.2f} "
            f"{r['server_cpu_ms_per_request']:>5.2f}"
            for r in (a, v, b)
        ]
        print(
            f"{s['protocol']:<5} {s['concurrency']:>4} {s['batch']:>5} | agent {cells[0]} | agent+v {cells[1]} | "
            f"bare {cells[2]} | "
            f"{s['throughput_ratio']:>5.2f} {s['throughput_ratio_with_verdict']:>7.2f}"
        )
    print("server CPU ms/request by thread (loop = event loop; other = unnamed threads, e.g. bare's workers):")
    for s in results["settings"]:
        for label, r in (("agent", s["agent"]), ("agent+v", s["agent_with_verdict"]), ("bare", s["bare"])):
            split = " ".join(f"{k} {r.get(f'cpu_ms_per_request_{k}', float('nan')):.3f}" for k in THREAD_GROUPS)
            print(f"{s['protocol']:<5} {s['concurrency']:>4} {s['batch']:>5} | {label:<7} | {split}")
    print("server CPU per request, agent / bare (the headline: it does not depend on the load generator):")
    for s in results["settings"]:
        print(
            f"{s['protocol']:<5} {s['concurrency']:>4} {s['batch']:>5} | agent {s['cpu_ratio']:.2f} (target <= 1.10) | "
            f"agent+v {s['cpu_ratio_with_verdict']:.2f} (target <= 1.30)"
        )
    print_grpc_vs_http(results["settings"])
    worst, worst_v = (
        max(s["cpu_ratio"] for s in results["settings"]),
        max(s["cpu_ratio_with_verdict"] for s in results["settings"]),
    )
    print(
        f"CPU ratio, worst setting: agent {worst:.2f} {'met' if worst <= 1.10 else 'MISSED'}; "
        f"agent+v {worst_v:.2f} {'met' if worst_v <= 1.30 else 'MISSED'}"
    )
    pinned = results["server_cpus"] is not None and results["client_cpus"] is not None
    print(
        f"pinned: servers on {results['server_cpus']}, load generator on {results['client_cpus']}"
        if pinned
        else "not pinned (--server-cpus/--client-cpus): throughput ratios share cores with the load generator"
    )
    ratios = [s["throughput_ratio"] for s in results["settings"]]
    print(f"throughput ratio agent/bare: min {min(ratios):.2f}, median {statistics.median(ratios):.2f} (target >= 0.9)")
    print(
        f"agent RSS after start: {results['agent_rss_after_start_mb']:.0f} MB (target <= 300 MB); "
        f"after load: {results.get('agent_rss_after_load_mb', float('nan')):.0f} MB"
    )
    print(f"agent start to ready: {results['agent_start_to_ready_s']:.2f} s (target <= 3 s)")
    print(f"agent exit code after SIGTERM: {results.get('agent_exit_code_on_sigterm')}")


def print_proxy_and_misses(results: dict[str, Any]) -> None:
    """Proxy-mode figures, and for each CPU-ratio target missed, where the agent's extra CPU goes."""
    for s in results["settings"]:
        for key, label, target in (("cpu_ratio", "agent", 1.10), ("cpu_ratio_with_verdict", "agent+v", 1.30)):
            if s[key] > target:
                r = s["agent" if label == "agent" else "agent_with_verdict"]
                b = s["bare"]
                extra = {k: r.get(f"cpu_ms_per_request_{k}", 0.0) for k in THREAD_GROUPS}
                extra["loop"] -= b.get("cpu_ms_per_request_loop", 0.0)
                extra["model threads"] = -b.get("cpu_ms_per_request_other", 0.0) + extra.pop("icos-worker")
                split = ", ".join(f"{k} {v:+.3f}" for k, v in extra.items())
                print(
                    f"  missed {label} {s[key]:.2f} > {target:.2f} at {s['protocol']} conc {s['concurrency']} "
                    f"batch {s['batch']}: "
                    f"extra CPU ms/request vs bare by thread: {split}"
                )
    for p in results.get("proxy", []):
        print(
            f"proxy mode, conc 1 batch {p['batch']:>2}: p50 {p['proxy']['p50_ms']:.2f} ms "
            f"vs bare {p['bare']['p50_ms']:.2f} ms "
            f"(added {p['added_p50_ms']:+.2f} ms, target <= 1 ms: {'met' if p['added_p50_ms'] <= 1.0 else 'MISSED'}); "
            f"p99 {p['proxy']['p99_ms']:.2f} vs {p['bare']['p99_ms']:.2f} ms; server CPU (agent + bare) / bare "
            f"{p['cpu_ratio']:.2f} (agent {p['agent_cpu_ms_per_request']:.2f} ms/request); with verdicts: "
            f"added {p['added_p50_ms_with_verdict']:+.2f} ms, agent {p['agent_cpu_ms_per_request_with_verdict']:.2f}"
            " ms/request"
        )


def print_grpc_vs_http(settings: list[dict[str, Any]]) -> None:
    """The agent's CPU per request over gRPC ÷ over HTTP, per setting measured with both."""
    by_key = {(s["protocol"], s["concurrency"], s["batch"]): s for s in settings}
    pairs = [(k, by_key[("grpc", *k[1:])]) for k in by_key if k[0] == "http" and ("grpc", *k[1:]) in by_key]
    if not pairs:
        return
    print("agent CPU per request, gRPC / HTTP (each against its own bare server above):")
    for (_, conc, batch), g in pairs:
        h = by_key[("http", conc, batch)]
        ratio = g["agent"]["server_cpu_ms_per_request"] / h["agent"]["server_cpu_ms_per_request"]
        ratio_v = (
            g["agent_with_verdict"]["server_cpu_ms_per_request"] / h["agent_with_verdict"]["server_cpu_ms_per_request"]
        )
        bare = g["bare"]["server_cpu_ms_per_request"] / h["bare"]["server_cpu_ms_per_request"]
        print(f"{conc:>4} {batch:>5} | agent {ratio:.2f} | agent+v {ratio_v:.2f} | bare {bare:.2f}")


def _ratio(value: float, target: float) -> str:
    return f"**{value:.2f}**" if value <= target else f"{value:.2f}"


def markdown(everything: dict[str, dict[str, Any]], names: dict[str, str]) -> str:
    """The figures of every model measured, as the Markdown block of docs/serving.md's "Performance"
    (bold: target met). ``names``: the model's name in the tables."""
    lines: list[str] = []
    any_results = next(iter(everything.values()))  # every model's run has the same rounds and seconds
    lines += [
        f"Medians of {any_results['rounds']} interleaved round(s) of {any_results['seconds']:g} s per setting; "
        "servers not pinned unless said. The headline, server CPU per request agent ÷ bare (targets ≤ 1.10, "
        "and ≤ 1.30 with `icos_verdict` in the response; bold: met):",
        "",
        "| model | protocol | conc/batch 1/1 | 1/32 | 16/1 | 16/32 | with verdicts 1/1 | 1/32 | 16/1 | 16/32 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, results in everything.items():
        for proto in ("http", "grpc"):
            rows = [s for s in results["settings"] if s["protocol"] == proto]
            if not rows:
                continue
            rows.sort(key=lambda s: (s["concurrency"], s["batch"]))
            plain = [_ratio(s["cpu_ratio"], 1.10) for s in rows]
            verdicts = [_ratio(s["cpu_ratio_with_verdict"], 1.30) for s in rows]
            lines.append(
                f"| {names.get(name, name)} | {proto.upper() if proto == 'http' else 'gRPC'} | "
                + " | ".join(plain + verdicts)
                + " |"
            )
    lines += [
        "",
        "Server CPU ms per request (agent / agent+v / bare) and p50 latency in ms (agent / bare), per setting:",
        "",
        "| model | protocol | conc | batch | CPU agent | agent+v | bare | p50 agent | bare |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, results in everything.items():
        for s in sorted(results["settings"], key=lambda s: (s["protocol"] != "http", s["concurrency"], s["batch"])):
            a, v, b = s["agent"], s["agent_with_verdict"], s["bare"]
            lines.append(
                f"| {names.get(name, name)} | {s['protocol']} | {s['concurrency']} | {s['batch']} | "
                f"{a['server_cpu_ms_per_request']:.2f} | {v['server_cpu_ms_per_request']:.2f} | "
                f"{b['server_cpu_ms_per_request']:.2f} | {a['p50_ms']:.2f} | {b['p50_ms']:.2f} |"
            )
    lines += [
        "",
        "Where the agent's CPU goes, ms per request by thread (`loop`: the event loop; `other`: unnamed threads, "
        "the bare server's model workers among them), batch 32 over HTTP:",
        "",
        "| model | conc | server | " + " | ".join(THREAD_GROUPS) + " |",
        "|---|---:|---|" + "---:|" * len(THREAD_GROUPS),
    ]
    for name, results in everything.items():
        for s in results["settings"]:
            if s["protocol"] != "http" or s["batch"] != 32:
                continue
            for label, r in (("agent", s["agent"]), ("agent+v", s["agent_with_verdict"]), ("bare", s["bare"])):
                cells = " | ".join(f"{r.get(f'cpu_ms_per_request_{k}', float('nan')):.2f}" for k in THREAD_GROUPS)
                lines.append(f"| {names.get(name, name)} | {s['concurrency']} | {label} | {cells} |")
    lines.append("")
    for name, results in everything.items():
        label = names.get(name, name)
        for e in results.get("errors", []):
            lines.append(f"* {label}: **failed**: {e['setting']}: {e['error']}")
        if "agent_rss_after_load_mb" in results:
            lines.append(
                f"* {label}: agent memory after start {results['agent_rss_after_start_mb']:.0f} MB (target ≤ 300 MB), "
                f"after the load {results['agent_rss_after_load_mb']:.0f} MB; start to ready "
                f"{results['agent_start_to_ready_s']:.2f} s (target ≤ 3 s)."
            )
        for p in results.get("proxy", []):
            met = "met" if p["added_p50_ms"] <= 1.0 else "missed"
            lines.append(
                f"* {label}, proxy mode at concurrency 1, batch {p['batch']}: adds {p['added_p50_ms']:+.2f} ms at p50 "
                f"(target ≤ 1 ms, {met}); {p['added_p50_ms_with_verdict']:+.2f} ms with verdicts; CPU of agent + "
                f"bare ÷ bare {p['cpu_ratio']:.2f}."
            )
    return "\n".join(lines)
