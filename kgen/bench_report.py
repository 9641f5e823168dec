"""The benchmark's reports: the Markdown table and the plot of one op's results, and the summary over every
op (what `kgen bench --all` writes). Reads the result dicts `kgen.bench` produces; measures nothing."""

from __future__ import annotations

from pathlib import Path

MB = 1e6
PNG = {"dpi": 110, "bbox_inches": "tight", "metadata": {"Software": None}}  # no version: the same bytes


def missed(row: dict) -> str:
    return "; ".join(name for name, ok in row.get("bars", {}).items() if not ok) or "none"


def summary(results: list[dict]) -> str:
    """One line per op and shape over every op benchmarked: what `kgen bench --all` writes (a backward's with
    kgen's GPU time and its ratio to the best peer's, beside the event times)."""
    gpu = all("gpu_us" in r for result in results for r in result["rows"])
    lines = [
        "| op | shape | MB moved | kgen µs | best peer µs | best peer / kgen | % of 4 GiB copy "
        "| % of same-size copy | "
        + ("kgen GPU µs | best peer / kgen (GPU) | " if gpu else "")
        + "bars missed |",
        "|---" * (9 + 2 * gpu) + "|",
    ]
    met = total = 0
    for result in results:
        for r in result["rows"]:
            peers = {n: t for n, t in r["times_us"].items() if n != "kgen"}
            best = min(peers, key=peers.get) if peers else None
            met += all(r["bars"].values())
            total += 1
            lines.append(
                f"| {result['op']} | {r['label']} | {r['min_bytes'] / MB:.1f} | {r['times_us']['kgen']:.1f} "
                f"| "
                + (f"{peers[best]:.1f} ({best})" if best else "-")
                + f" | {r['best_peer_over_kgen'] or 0:.2f} | {r['kgen_pct_large_copy']:.0f} | "
                f"{r['kgen_pct_same_copy']:.0f} | "
                + (f"{r['gpu_us']['kgen']:.1f} | {r['gpu_best_peer_over_kgen'] or 0:.2f} | " if gpu else "")
                + f"{missed(r)} |"
            )
    first = results[0]
    head = (
        f"{first['dtype']}, {first['device']} ({first['arch']}), torch {first['torch']}, {first['date']}, "
        f"{first['mode']}; median of {first['rounds']} rounds of {first['repeats']} runs. "
        f"Every bar met at {met} of {total} shapes."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Effective GB/s against bytes moved, one line per implementation, with the same-size copies
    and the 4 GiB-copy ceiling measured in the same run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(result["rows"], key=lambda r: r["min_bytes"])
    mb = [r["min_bytes"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for name in implementations(rows):
        # markers only: shapes of different hidden sizes can move the same bytes
        ax.plot(
            [m for m, r in zip(mb, rows) if name in r["times_us"]],
            [r["min_bytes"] / r["times_us"][name] / 1e3 for r in rows if name in r["times_us"]],
            linestyle="none",
            label=name,
            marker="o" if name == "kgen" else "x",
            markersize=8 if name == "kgen" else 6,
        )
    ax.plot(
        mb, [r["min_bytes"] / r["copy_same_us"] / 1e3 for r in rows], "k--", label="copy_ of the same bytes"
    )
    ax.axhline(
        result["large_copy_gbs"],
        color="gray",
        linestyle=":",
        label=f"4 GiB copy_: {result['large_copy_gbs']:.0f} GB/s",
    )
    ax.set(
        xscale="log",
        xlabel="minimum bytes moved (MB)",
        ylabel="effective bandwidth (GB/s)",
        title=f"{result['op']} {result['dtype']} on {result['device']}, torch {result['torch']}, "
        f"{result['date']}",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, **PNG)
    plt.close(fig)


def implementations(rows: list[dict], key: str = "times_us") -> list[str]:
    """Every implementation timed at some shape, in order (a peer may fail at some shapes: Liger's backward at
    3-d inputs)."""
    return list(dict.fromkeys(name for r in rows for name in r[key]))


def us(times: dict, name: str) -> str:
    return f"{times[name]:.1f}" if name in times else "-"


def _times_table(rows: list[dict], key: str, title: str, extra=None) -> list[str]:
    """A second table of the rows' times under ``key`` (with its ``<key prefix>_best_peer_over_kgen``), and an
    optional (header, row -> cell) column before the ratio."""
    names = implementations(rows, key)
    ratio_key = key.removesuffix("_us") + "_best_peer_over_kgen"
    header = " | ".join(f"{n} µs" for n in names) + (f" | {extra[0]}" if extra else "")
    lines = [
        "",
        title,
        "",
        f"| shape | {header} | best peer / kgen |",
        "|---" * (len(names) + 2 + bool(extra)) + "|",
    ]
    for r in rows:
        ratio = r[ratio_key]
        lines.append(
            f"| {r['label']} | "
            + " | ".join(us(r[key], n) for n in names)
            + (f" | {extra[1](r)}" if extra else "")
            + f" | {f'{ratio:.2f}' if ratio else '-'} |"
        )
    return lines


def markdown(result: dict) -> str:
    names = implementations(result["rows"])
    lines = [
        f"{result['op']}, {result['dtype']}, {result['device']} ({result['arch']}), torch {result['torch']}, "
        f"{result['date']}; {result.get('mode', 'events')}, median of {result.get('rounds', 1)} rounds of "
        f"{result['repeats']} runs, L2 flushed; 4 GiB-traffic copy: {result['large_copy_us']:.0f} µs = "
        f"{result['large_copy_gbs']:.0f} GB/s; empty launch {result.get('empty_launch_us', 0):.1f} µs.",
        "",
        "| shape | MB moved | "
        + " | ".join(f"{n} µs" for n in names)
        + " | kgen GB/s | % of 4 GiB copy | % of same-size copy | best peer / kgen | bars missed |",
        "|---" * (len(names) + 7) + "|",
    ]
    if "fwd_bwd_us" in result["rows"][0]:
        lines[0] += " Times are the backward alone; forward + backward below."
    for r in result["rows"]:
        ratio = f"{r['best_peer_over_kgen']:.2f}" if r["best_peer_over_kgen"] else "-"
        lines.append(
            f"| {r['label']} | {r['min_bytes'] / MB:.1f} | "
            + " | ".join(us(r["times_us"], n) for n in names)
            + f" | {r['kgen_gbs']:.0f} | {r['kgen_pct_large_copy']:.0f} | {r['kgen_pct_same_copy']:.0f} | "
            f"{ratio} "
            f"| {missed(r)} |"
        )
    if "gpu_us" in result["rows"][0]:
        lines += _times_table(
            result["rows"],
            "gpu_us",
            "Backward alone, GPU time (the kernels' durations under torch.profiler, L2 flushed, mean of 30 "
            "calls: no host time between launches):",
            ("kgen % of same-size copy", lambda r: f"{r['kgen_gpu_pct_same_copy']:.0f}"),
        )
    if "fwd_bwd_us" in result["rows"][0]:
        lines += _times_table(result["rows"], "fwd_bwd_us", "Forward + backward:")
    return "\n".join(lines) + "\n"


# The region of a Markdown file that `kgen report --into` rewrites; the rest of the file is kept as it is.
REPORT_BEGIN = (
    "<!-- kgen report: begin (`kgen report DIR --into FILE` rewrites what is between these lines) -->"
)
REPORT_END = "<!-- kgen report: end -->"


def report(results: Path, ops: list[str], peers: dict[str, dict[str, str]]) -> str:
    """One run's report from a `kgen bench` output folder: the summary over its ops (forward, then backward),
    the end-to-end tables it holds (e2e-*.md), then each op's table with its peers (``peers``: op -> peer
    name -> what it runs). ``ops`` orders the ops; an op without results there is left out."""
    import json

    runs = {
        s: [json.loads(p.read_text()) for o in ops if (p := results / f"{o}{s}.json").is_file()]
        for s in ("", "-backward")
    }
    if not any(runs.values()):
        raise FileNotFoundError(f"no `kgen bench` results (<op>.json) in {results}")
    parts = [f"### Summary{' of the backward' * bool(s)}\n\n{summary(rs)}" for s, rs in runs.items() if rs]
    parts += [p.read_text().strip() + "\n" for p in sorted(results.glob("e2e-*.md"))]
    for result in runs[""] + runs["-backward"]:
        named = peers.get(result["op"], {})
        timed = [n for n in implementations(result["rows"]) if n != "kgen"]
        said = "; ".join(
            f"{n}: {named[n]}"
            if named.get(n)
            else f"{n}: compiled afresh per shape"
            if "compile(" in n
            else n
            for n in timed
        )
        title = result["op"] + (" (backward)" if "fwd_bwd_us" in result["rows"][0] else "")
        parts.append(f"### {title}\n\n" + (f"Peers: {said}.\n\n" if said else "") + markdown(result))
    return "\n".join(parts)


def replace_region(text: str, body: str, where: str) -> str:
    """``text`` with what lies between REPORT_BEGIN and REPORT_END replaced by ``body``."""
    start, end = text.find(REPORT_BEGIN), text.find(REPORT_END)
    if start < 0 or end < start:
        raise ValueError(
            f"{where} has no region to rewrite: put the lines {REPORT_BEGIN} and {REPORT_END} in it"
        )
    return text[: start + len(REPORT_BEGIN)] + "\n\n" + body.strip() + "\n\n" + text[end:]
