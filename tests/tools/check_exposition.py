"""Checks Prometheus text expositions with Prometheus' own Python parser (prometheus_client).

Input (stdin): a JSON object {"<process name>": "<the text of its /metrics page>", ...}.
Output (stdout): a JSON object {"<process name>": {"families": N, "problems": [...]}, ...}.

Per family: a HELP line, a known type, one family per name; counters' samples end in `_total`
and no gauge's name does; histograms have `le`-labelled cumulative buckets ending at `+Inf`
equal to `_count`, and a `_sum`, for every label set; no summaries (they cannot be aggregated).
"""
import json
import math
import sys
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families


def check(text):
    problems = []
    families = list(text_string_to_metric_families(text))
    seen = defaultdict(int)
    for f in families:
        seen[f.name] += 1
        if not f.documentation:
            problems.append(f"{f.name}: no HELP")
        if f.type in ("unknown", "untyped"):
            problems.append(f"{f.name}: no TYPE")
        if f.type == "summary":
            problems.append(f"{f.name}: a summary (use a histogram)")
        if f.type == "counter":
            for s in f.samples:
                if not s.name.endswith(("_total", "_created")):
                    problems.append(f"{f.name}: counter sample {s.name} does not end in _total")
        if f.type == "gauge" and f.name.endswith("_total"):
            problems.append(f"{f.name}: a gauge named like a counter")
        if f.type == "histogram":
            problems.extend(check_histogram(f))
        if not f.samples:
            problems.append(f"{f.name}: no samples")
    for name, n in seen.items():
        if n > 1:
            problems.append(f"{name}: {n} families of one name")
    return {"families": len(families), "problems": problems}


def check_histogram(f):
    problems = []
    by_labels = defaultdict(lambda: {"buckets": [], "sum": None, "count": None})
    for s in f.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        key = tuple(sorted(labels.items()))
        if s.name == f.name + "_bucket":
            if "le" not in s.labels:
                problems.append(f"{f.name}{key}: a bucket without le")
                continue
            by_labels[key]["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name == f.name + "_sum":
            by_labels[key]["sum"] = s.value
        elif s.name == f.name + "_count":
            by_labels[key]["count"] = s.value
        else:
            problems.append(f"{f.name}: unexpected sample {s.name}")
    if not by_labels:
        problems.append(f"{f.name}: a histogram without series")
    for key, h in by_labels.items():
        buckets = h["buckets"]
        les = [le for le, _ in buckets]
        if len(buckets) < 2:
            problems.append(f"{f.name}{key}: {len(buckets)} buckets")
            continue
        if les != sorted(les) or len(set(les)) != len(les):
            problems.append(f"{f.name}{key}: bucket bounds not increasing: {les}")
        if not math.isinf(les[-1]):
            problems.append(f"{f.name}{key}: no +Inf bucket")
        counts = [c for _, c in sorted(buckets)]
        if any(b < a for a, b in zip(counts, counts[1:])):
            problems.append(f"{f.name}{key}: bucket counts not cumulative: {counts}")
        if h["count"] is None or h["sum"] is None:
            problems.append(f"{f.name}{key}: no _count or _sum")
        elif counts[-1] != h["count"]:
            problems.append(f"{f.name}{key}: +Inf bucket {counts[-1]} != _count {h['count']}")
    return problems


def main():
    pages = json.load(sys.stdin)
    out = {}
    for process, text in pages.items():
        try:
            out[process] = check(text)
        except Exception as e:  # the parser refusing the page is the finding
            out[process] = {"families": 0, "problems": [f"the parser refused the page: {e!r}"]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
