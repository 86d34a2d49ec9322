"""Reading a /metrics endpoint in the Python front's tests: Prometheus's text exposition format
parsed into samples, and the series a test asks for (test_observe.py, test_observe_launchers.py)."""

import re
import urllib.request


def parse_metrics(text):
    """{(name, ((label, value), ...)): value} of a Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert found, f"not a sample line of the text format: {line!r}"
        labels = tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                         found.group(2) or "")))
        samples[(found.group(1), labels)] = float(found.group(3))
    return samples


def series(samples, name):
    """{labels: value} of the series called `name`."""
    return {labels: value for (n, labels), value in samples.items() if n == name}


def by_rank(samples, name):
    """{rank: value} of the series called `name`."""
    return {dict(labels)["rank"]: value for labels, value in series(samples, name).items()}


def get(url):
    """The body of a GET of `url`, as text."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()
