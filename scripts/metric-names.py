#!/usr/bin/env python3
"""Lists the metric names that a Grafana dashboard and Prometheus rule files use.

    scripts/metric-names.py deploy/grafana/quotad.json deploy/alerts.yml
    scripts/metric-names.py --exposition scrape.txt deploy/grafana/quotad.json deploy/alerts.yml

Without --exposition, prints one line per metric name: the name, then where
it is used (file: panel title or alert name). With --exposition FILE (the
text of a /metrics scrape), checks that every quotad_* name appears in it
and exits 1 listing those that do not. A histogram's _bucket, _count and
_sum series count as its name. Names that Prometheus makes itself (up,
scrape_*) are never in a scrape and are not checked. --pending NAME names
a metric the server does not expose yet: it is reported but is not an
error, until it is exposed (then the --pending is an error, so it goes).

Reads .json files as Grafana dashboards (every panel target and template
variable query, rows included) and .yml/.yaml files as Prometheus rule
files (every rule's expr). Needs PyYAML for rule files.
"""

import argparse
import json
import pathlib
import re
import sys

# PromQL words that are not metric names when they stand alone.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
    "group_right", "bool", "offset", "inf", "nan", "atan2",
}
# Series that Prometheus records about its own scrapes.
SYNTHETIC = re.compile(r"^(up|scrape_[a-z_]+)$")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def metric_names(expr):
    """The metric names an expression (PromQL, or a Grafana variable query
    such as label_values(metric{...}, label)) selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+", " ", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    # Label lists of grouping and vector matching.
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )
    # label_values(metric, label): the second argument is a label.
    text = re.sub(r"\blabel_values\s*\(([^,()]*),[^)]*\)", r"(\1)", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        rest = text[match.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        before = text[: match.start()]
        if re.search(r"\d\.?$", before):
            continue  # the tail of a number or a duration, e.g. 1e3, 5m
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def dashboard_exprs(path):
    """(where, expression) for every query of a Grafana dashboard."""
    dashboard = json.loads(path.read_text())

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield f"{path}: panel {panel.get('title', panel.get('id'))!r}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            yield f"{path}: variable ${variable['name']}", query


def rule_exprs(path):
    """(where, expression) for every rule of a Prometheus rule file."""
    try:
        import yaml
    except ImportError:
        sys.exit(f"{path}: reading rule files needs PyYAML (pip install pyyaml)")
    rules = yaml.safe_load(path.read_text())
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            yield f"{path}: rule {name}", str(rule["expr"])


def uses(paths):
    """{metric name: [where it is used]} over the files."""
    found = {}
    for path in paths:
        if path.suffix == ".json":
            exprs = dashboard_exprs(path)
        elif path.suffix in (".yml", ".yaml"):
            exprs = rule_exprs(path)
        else:
            sys.exit(f"{path}: expected a .json dashboard or a .yml rule file")
        for where, expr in exprs:
            for name in metric_names(expr):
                found.setdefault(name, []).append(where)
    return found


def exposed(scrape):
    """Metric names in a Prometheus text exposition."""
    names = set()
    for line in scrape.splitlines():
        if line.startswith("# TYPE ") or line.startswith("# HELP "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=pathlib.Path)
    parser.add_argument(
        "--exposition",
        type=pathlib.Path,
        help="a /metrics scrape: check that every quotad_* name used is in it",
    )
    parser.add_argument(
        "--pending",
        action="append",
        default=[],
        metavar="NAME",
        help="a name the server does not expose yet: reported, not an error",
    )
    args = parser.parse_args()
    found = uses(args.files)
    if args.exposition is None:
        for name in sorted(found):
            print(f"{name}\t{'; '.join(sorted(set(found[name])))}")
        return 0
    available = exposed(args.exposition.read_text())
    missing = []
    for name in sorted(found):
        if SYNTHETIC.match(name):
            continue
        base = name
        for suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in available:
                base = name[: -len(suffix)]
        if name not in available and base not in available:
            missing.append(name)
    for name in missing:
        kind = "pending (not exposed yet)" if name in args.pending else "missing"
        print(f"{kind} in {args.exposition}: {name}", file=sys.stderr)
        for where in sorted(set(found[name])):
            print(f"  used by {where}", file=sys.stderr)
    for name in sorted(set(args.pending) - set(missing)):
        print(f"{name} is exposed now: drop --pending {name}", file=sys.stderr)
    checked = len([n for n in found if not SYNTHETIC.match(n)])
    print(f"{checked - len(missing)} of {checked} metric names used are exposed")
    return 1 if set(missing) - set(args.pending) or set(args.pending) - set(missing) else 0


if __name__ == "__main__":
    sys.exit(main())
