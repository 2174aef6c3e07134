"""`laneway bench counts`: the default's miss against a model's own count, near each edge."""

from __future__ import annotations

from pathlib import Path

from support.chat_model import ModelFiles, chat_request, user

from laneway.bench.counts.run import render, run_bench
from laneway.tokens import HuggingFaceTokenizer, default_tokenizer


def test_the_default_against_itself_misses_nothing() -> None:
    report = run_bench(default_tokenizer(), default_tokenizer(), [256], 20, 0, "test")
    assert {row.corpus for row in report.rows} >= {"source", "synthetic"}
    for row in report.rows:
        assert (row.largest_miss, row.misrouted, row.past_cap) == (0, 0.0, 0.0), row
    assert report.short_chat_framing[0] == report.short_chat_framing[1]


def test_a_model_with_a_template_is_measured_on_both_sides_of_each_edge(
    model_files: ModelFiles, tmp_path: Path
) -> None:
    ours = HuggingFaceTokenizer(model_files.tokenizer, model_files.config)
    cl100k = default_tokenizer()
    report = run_bench(ours, cl100k, [64, 128], 20, 1, "test")
    assert [row.edge for row in report.rows][:1] == [64]
    assert {row.edge for row in report.rows} == {64, 128}
    hello = chat_request(user("Hello"))
    assert report.short_chat_framing == (hello.count(cl100k), hello.count(ours))
    # The test tokenizer knows eleven words: on real text it is far from cl100k_base, so
    # prompts near an edge land on the other side of it.
    assert any(row.misrouted > 0 for row in report.rows if row.corpus == "source")
    lines = render(report)
    assert any("misrouted" in line for line in lines)
    assert str(model_files.config) in lines[0]
