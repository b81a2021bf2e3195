"""The calibrated answer as both search pages draw it (templates/_uncertainty.html.j2, issue 61 item 3), from
hand-written answers: the states a calibrated search may not reach on a small store (no set, answered, not
decided without a caveat) and no answer at all. No model, no browser: the rendered HTML, parsed."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Optional

import pytest

from dab_pipeline.results.page import ExampleHit, ExampleQuery, render_page, set_marks

pytest.importorskip("jinja2")

HITS = ["v3", "v1", "v4"]  # best first
RISK = {"max_risk": 0.2, "delta": 0.05, "threshold": 0.6, "answered_share_on_calibration": 0.3}
RISK["held_out"] = {"queries": 416, "videos": 30}


def answer(**extra) -> dict:
    """An uncertainty payload (dab_pipeline.search.uncertainty_payload's shape) with ``extra`` over its defaults."""
    return {"p_first": 0.42, "p_first_5": 0.77, "k": 5, **extra}


def with_set(**extra) -> dict:
    members = ["v3", "v1", "v9", "v7"]  # holds two of the hits, and two videos beyond them
    rows = [{"rank": r + 1, "video_id": v, "cost": float(r)} for r, v in enumerate(members)]
    return answer(coverage=0.9, set_scope="marginal", set=rows, **extra)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.words: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data) -> None:
        self.words.append(data)

    def having(self, attr: str, value: Optional[str] = None) -> list[dict]:
        return [a for _, a in self.elements if attr in a and (value is None or a[attr] == value)]

    def badges(self, cls: str) -> int:
        return sum(1 for tag, a in self.elements if tag == "span" and a.get("class") == cls)

    @property
    def text(self) -> str:
        return " ".join(" ".join(self.words).split())


def _serve(u: Optional[dict], tmp_path: Path) -> str:
    """dab serve's page of one result answered ``u``, its hits marked as search_page.page_result marks them."""
    import jinja2

    in_set, rest = set_marks(u, HITS)
    hits = [
        {"rank": r + 1, "video_id": v, "cost": float(r), "thumb": None, "description": None, "in_set": v in in_set}
        for r, v in enumerate(HITS)
    ]
    result = {"query": "a red ball", "margin": 0.5, "abstain": False, "ms": 3.0, "unknown_words": [], "hits": hits}
    result.update(set_rest=rest, plot="", **({"uncertainty": u} if u is not None else {}))
    env = jinja2.Environment(  # as dab_pipeline.stages.serve.app builds it
        loader=jinja2.PackageLoader("dab_pipeline.results", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template("search.html.j2").render(
        title="dab search", q="a red ball", k=3, result=result, error=None, abstain=None, coverage="0.9",
        max_risk="0.2", calibrated=True, videos=10, index=False,
    )  # fmt: skip


def _examples(u: Optional[dict], tmp_path: Path) -> str:
    """dab search --html's page of one query answered ``u``."""
    q = ExampleQuery("a red ball", 0.5, [ExampleHit(r + 1, v, float(r)) for r, v in enumerate(HITS)])
    q.add_uncertainty(u)
    return render_page(tmp_path / "page.html", "dab search: 1 queries", [("run", "r")], [q]).read_text()


PAGES = pytest.mark.parametrize("render", [_serve, _examples], ids=["serve", "html"])


@PAGES
def test_marks_the_set_on_its_hits_and_lists_the_rest(render, tmp_path: Path) -> None:
    page = _parse(render(with_set(answered=False, risk=RISK), tmp_path))
    assert [a["data-video"] for a in page.having("data-in-set", "1")] == ["v3", "v1"]
    assert page.badges("set-badge") == 2 and page.text.count("in the 90 % set") == 2
    assert page.having("data-set-size", "4") and page.having("data-set-rest", "2")
    assert "v9, v7" in page.text  # the set's videos beyond the hits, best first
    assert page.having("data-unanswered", "1") and page.badges("unanswered-badge") == 1
    assert "not answered: P 0.42 < 0.600 (max risk 0.2, delta 0.05)" in page.text  # as dab search says it


@PAGES
@pytest.mark.parametrize("no_set", [{}, {"set": None}], ids=["set absent", "set None"])
def test_a_query_without_a_set_gets_no_set_marks(render, no_set: dict, tmp_path: Path) -> None:
    """A query no set is built for (every word unknown): its probabilities and decision, and no set anywhere."""
    page = _parse(render(answer(coverage=0.9, answered=False, risk=RISK, **no_set), tmp_path))
    assert page.having("data-p-first", "0.42") and not page.having("data-set-size")
    assert not page.having("data-in-set") and not page.having("data-set-rest") and "% set" not in page.text
    assert page.having("data-unanswered", "1") and page.badges("unanswered-badge") == 1


SHORTLIST = "scored over a shortlist of 5 videos, fewer than the 20 the calibrated probabilities read"
UNKNOWN = "every word of the query is unknown to the store's CLIP: these numbers describe no query"


@PAGES
def test_not_decided_says_why_once_and_marks_nothing_not_answered(render, tmp_path: Path) -> None:
    """A shortlist under k0: the numbers marked "~", never called calibrated, the caveat said once (not again after
    "not decided:")."""
    u = with_set(answered=None, risk=RISK, caveat=SHORTLIST, caveat_kind="shortlist", probabilities_hold=False)
    page = _parse(render(u, tmp_path))
    assert page.having("data-answered", "") and page.having("data-caveat", "1")
    assert "not calibrated here (a shortlist): P(the first hit is a match) ~0.42 · P(a match in the first 5) ~0.77" in (
        page.text
    )
    assert page.text.count(SHORTLIST) == 1 and "not decided: the probability comes from a shortlist" in page.text
    assert "calibrated: P(" not in page.text and "calibrated on average" not in page.text  # the set: not either
    assert "90 % conformal set, over a shortlist, not calibrated here" in page.text
    assert not page.having("data-unanswered") and page.badges("unanswered-badge") == 0
    assert "not answered" not in page.text
    # no caveat to give (a payload from before caveats): the shortlist reason
    page = _parse(render(answer(answered=None, risk=RISK), tmp_path))
    assert "not decided: the probability comes from a shortlist" in page.text and not page.having("data-unanswered")


@PAGES
def test_a_query_of_no_known_word_shows_no_numbers_and_says_so_once(render, tmp_path: Path) -> None:
    """dab search prints no numbers for it; the JSON keeps p_first for its older readers, the page shows none."""
    u = answer(answered=None, risk=RISK, caveat=UNKNOWN, caveat_kind="unknown_words", probabilities_hold=False)
    page = _parse(render(u, tmp_path))
    assert "0.42" not in page.text and "0.77" not in page.text and not page.having("data-p-first"), page.text
    assert "not calibrated here: every word of the query is unknown" in page.text
    assert page.text.count("unknown") == 1, page.text  # said once: "not decided" does not repeat it
    assert page.having("data-answered", "") and "not decided: " in page.text and "% set" not in page.text


@PAGES
def test_another_first_stage_marks_the_numbers_and_decides_nothing(render, tmp_path: Path) -> None:
    """A run calibrated through an index searched through another first stage: its numbers marked "~" with the
    reason said once, no set called calibrated, no decision (the CLI's words: cli/commands/calibrated_answers.py)."""
    why = "this run was calibrated through an index: search with --index idx --shortlist 20 --nprobe 8"
    u = answer(answered=None, risk=RISK, caveat=why, caveat_kind="first_stage", probabilities_hold=False)
    page = _parse(render(u, tmp_path))
    assert "not calibrated here (another first stage): P(the first hit is a match) ~0.42" in page.text, page.text
    assert page.text.count(why) == 1 and page.having("data-probabilities-hold", "0")
    assert "not decided: the first stage is not the one the run was calibrated through" in page.text
    assert not page.having("data-unanswered") and "calibrated: P(" not in page.text


@PAGES
def test_an_empty_set_is_called_empty(render, tmp_path: Path) -> None:
    page = _parse(render(answer(coverage=0.9, set_scope="marginal", set=[], caveat_kind=None), tmp_path))
    assert page.having("data-set-size", "0") and "an empty set" in page.text and "0 videos" not in page.text


@PAGES
def test_an_answered_query_is_not_marked_unanswered(render, tmp_path: Path) -> None:
    page = _parse(render(with_set(answered=True, risk=RISK), tmp_path))
    assert page.having("data-answered", "1") and not page.having("data-unanswered")
    assert (
        "answered: P 0.42 ≥ 0.600: the first hit is wrong at most 0.2 of the time, with probability 0.95" in page.text
    )
    assert "calibrated: P(the first hit is a match) 0.42 · P(a match in the first 5) 0.77" in page.text
    assert page.badges("unanswered-badge") == 0 and not page.having("data-caveat")


@PAGES
def test_no_answer_draws_no_calibrated_marks(render, tmp_path: Path) -> None:
    """A run without calibration.json: the hits as before, nothing calibrated said."""
    page = _parse(render(None, tmp_path))
    assert len(page.having("data-rank")) == 3
    assert not page.having("data-p-first") and not page.having("data-answered") and not page.having("data-in-set")
    assert "calibrated" not in page.text and not page.having("data-unanswered")


def test_set_marks_are_the_shown_members_and_the_rest_in_set_order() -> None:
    assert set_marks(with_set(), HITS) == ({"v3", "v1"}, ["v9", "v7"])
    assert set_marks(answer(set=None), HITS) == (set(), []) and set_marks(None, HITS) == (set(), [])


def _parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    return p


@PAGES
def test_no_threshold_is_said_as_dab_search_says_it(render, tmp_path: Path) -> None:
    """No threshold passed: the risk, its probability and what the per-video test counted, as the CLI prints them
    (the page said "no threshold keeps the risk at 0.2 on this calibration")."""
    page = _parse(render(with_set(answered=False, risk={**RISK, "threshold": None}), tmp_path))
    want = "not answered: no threshold holds the risk at 0.2 with probability 0.95 (held out: 416 queries of 30 videos)"
    assert want in page.text, page.text
    u = answer(answered=None, risk=RISK, caveat=UNKNOWN, caveat_kind="unknown_words", probabilities_hold=False)
    page = _parse(render(u, tmp_path))
    assert "not decided: no probability describes this query" in page.text and "nothing calibrated" not in page.text
