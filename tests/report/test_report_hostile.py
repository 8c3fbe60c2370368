"""Stored XSS: hostile strings in every field of summary.json and requests.jsonl never reach report.html as markup.

The page may contain only the template's own tags, no event-handler attribute, and images only as inlined PNGs;
each hostile string must appear escaped (it was rendered, not dropped) and never raw.
"""

from __future__ import annotations


import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markupsafe import escape

from speedlimit.report import build_report
from tests.report.test_report import fake_requests, write_jsonl

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "</script><script>alert(1)</script>",
    '"><svg onload=alert(1)>',
    "' onmouseover='alert(1)' x='",
    "</style></table><iframe src=javascript:alert(1)>",
    "$\\frac{a}{ $ math {{ 7*7 }}",
]
TEMPLATE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "dl", "dt", "dd", "section",
                 "table", "tr", "th", "td", "img"}


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attributes.extend((name, value or "") for name, value in attrs)


def assert_no_markup_from_files(text: str) -> None:
    parser = _Markup()
    parser.feed(text)
    assert parser.tags <= TEMPLATE_TAGS, parser.tags - TEMPLATE_TAGS
    assert not [name for name, _ in parser.attributes if name.startswith("on")]
    assert all(value.startswith("data:image/png;base64,") for name, value in parser.attributes if name == "src")
    for bad in HOSTILE:
        if str(escape(bad)) != bad:  # the last one has no markup; it must show literally (not as mathtext or a template)
            assert bad not in text
    assert "<script" not in text.lower() and "<svg" not in text.lower() and "<iframe" not in text.lower()


def hostile_rows(n: int, word: str) -> list[dict]:
    rows = fake_requests(n, failures=n // 2)
    for row in rows:
        row.update(error_kind=word if row["error_kind"] else None, error_text=word if row["error_kind"] else None,
                   finish_reason=word, token_count_source=word, prompt_token_source=word)
    return rows


def hostile_run_summary(word: str, source: str = "bench") -> dict:
    mapping = {word: word, "url": word, "nested": {word: [word]}}
    return {
        "schema": "speedlimit.run/1", "source": source, "requests": 6, "completed": 3, "failed": 3,
        "errors": {word: 3}, "duration_s": 1.5, "output_tok_s": 100.0,
        "ttft_s": {"mean": 0.1, "p50": 0.1, "p99": 0.2, "n": 3}, "slo": {word: 0.5},
        "token_count_source": word, "token_count_sources": {word: 3}, "prompt_token_source": word, "prompt_token_sources": {word: 3},
        "endpoint": mapping, "engine": mapping, "simulation": mapping,
        "estimate": {"model": word, "hardware": word, "method": word, "inputs": {word: 1.0}, "predicted": {word: word},
                     "comparison": {word: {"measured": 1.0, "predicted": 2.0, "ratio": 0.5}}},
    }  # fmt: skip


@pytest.mark.parametrize("word", HOSTILE)
def test_hostile_strings_in_a_run_are_escaped(tmp_path, word):
    run = tmp_path / "run"
    write_jsonl(run / "requests.jsonl", hostile_rows(6, word))
    (run / "summary.json").write_text(json.dumps(hostile_run_summary(word)), encoding="utf-8")
    predicted = tmp_path / "predicted"
    predicted.mkdir()
    (predicted / "summary.json").write_text(json.dumps(hostile_run_summary(word, "simulate")), encoding="utf-8")
    text = build_report(run, tmp_path / "out", predicted).read_text(encoding="utf-8")
    assert_no_markup_from_files(text)
    assert str(escape(word)) in text  # shown, escaped
    assert {"summary", "overlay", "comparison", "errors"} <= set(__import__("re").findall(r'<section id="([a-z]+)"', text))


def test_hostile_directory_name_and_sweep_are_escaped(tmp_path):
    word = HOSTILE[0]
    sweep_dir = tmp_path / word  # a directory may be named like this; the page shows the path
    points = []
    for concurrency in (1, 2, 4):
        write_jsonl(sweep_dir / f"concurrency_{concurrency}" / "requests.jsonl", hostile_rows(4, HOSTILE[1]))
        point = hostile_run_summary(HOSTILE[2 + concurrency // 2])
        point.update(sweep_value=concurrency, output_tok_s=50.0 * concurrency)
        points.append(point)
    summary = {"schema": "speedlimit.sweep/1", "sweep": {"parameter": "concurrency", "values": [1, 2, 4], "knee_load": 2.0,
               "knee_output_tok_s": 100.0, "saturation_output_tok_s": 200.0}, "points": points,
               "endpoint": {word: HOSTILE[3], "model": HOSTILE[5]}, "engine": {HOSTILE[4]: word}}  # fmt: skip
    (sweep_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    text = build_report(sweep_dir, tmp_path / "out").read_text(encoding="utf-8")
    assert_no_markup_from_files(text)
    assert str(escape(word)) in text and str(escape(HOSTILE[3])) in text


@pytest.mark.parametrize("where", ["legacy", "sweep_value", "parameter"])
def test_hostile_sweep_values_are_a_one_line_error(tmp_path, where):
    """A load level must be a number: a string there (the issue's exploit) is refused before anything is written."""
    point = {"requests": 1, "completed": 1, "output_tok_s": 1.0}
    sweep = {"parameter": "concurrency", "values": [1]}
    if where == "legacy":
        point["concurrency"] = HOSTILE[0]
    elif where == "sweep_value":
        point["sweep_value"] = HOSTILE[0]
    else:
        sweep["parameter"] = HOSTILE[0]
    (tmp_path / "summary.json").write_text(json.dumps({"sweep": sweep, "points": [point]}), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "speedlimit.cli", "report", str(tmp_path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    assert not Path(tmp_path / "out" / "report.html").exists()
