"""The dashboard's stylesheet colours a state by its group, never by a list of states (issue 25).

tests/test_layers.py scans the dashboard's scripts for state groups typed in (two state names in one
expression); this extends that scan to app.css: a selector list naming two or more states
(`.state.RUNNING, .state.STOPPING`), or two rules giving two states the same declarations, is a group
written out again, which drifts when core/states.py changes (the workflow graph's `.node.RUNNING`
was busy while STOPPING, in the same ACTIVE group, was not). The page renders each state with the
groups it is in (`data-group`, from GET /v1/states), and the stylesheet styles those."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from fencepost.core import states
from fencepost.core.states import Status

STATIC = Path(__file__).resolve().parent.parent / "scheduler" / "api" / "static"
CSS = STATIC / "app.css"

_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")
_NAME = re.compile(r"[.#]([A-Za-z_][\w-]*)|=\s*[\"']?([\w-]+)[\"']?\s*[i]?\]")
_GROUP_SELECTOR = re.compile(r"\[data-group~=\s*[\"']?([\w-]+)[\"']?\s*\]")


def _rules(text: str) -> list[tuple[int, str, str]]:
    """(line, selector list, declarations) of each innermost rule of a stylesheet, comments removed
    (line numbers kept: a comment is replaced by its own line breaks)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    out = []
    for m in _RULE.finditer(text):
        selectors = m.group(1).strip()
        start = m.start(1) + len(m.group(1)) - len(m.group(1).lstrip())
        out.append((text.count("\n", 0, start) + 1, selectors, m.group(2)))
    return out


def _states_named(selectors: str) -> list[str]:
    """The state names a selector list names, as a class, an id or an attribute's value."""
    names = {s.value for s in Status}
    found = [a or b for a, b in _NAME.findall(selectors)]
    return sorted({n for n in found if n in names})


def _declarations(block: str) -> tuple[str, ...]:
    return tuple(sorted(" ".join(d.split()) for d in block.split(";") if d.strip()))


def restated_groups_in_css(text: str) -> list[str]:
    """State groups written out in a stylesheet: a rule whose selector list names two or more states,
    and rules that each name one state in the same selector (the state put aside) with the same
    declarations. One state alone (`.state.SUCCEEDED`) is a state, not a group."""
    out = []
    alone: dict[tuple[str, tuple[str, ...]], list[tuple[int, str]]] = {}
    for line, selectors, block in _rules(text):
        named = _states_named(selectors)
        if len(named) >= 2:
            out.append(f"line {line}: {selectors!r} names {', '.join(named)}")
        elif named:
            shape = re.sub(rf"\b{named[0]}\b", "*", " ".join(selectors.split()))
            alone.setdefault((shape, _declarations(block)), []).append((line, named[0]))
    for (shape, _), hits in alone.items():
        if len({s for _, s in hits}) >= 2:
            out.append(f"lines {', '.join(str(n) for n, _ in hits)}: {shape!r} gives "
                       f"{', '.join(s for _, s in hits)} the same style")
    return out


def test_the_dashboard_stylesheet_colours_groups_not_lists_of_states() -> None:
    bad = restated_groups_in_css(CSS.read_text())
    assert not bad, f"state groups typed into app.css (style [data-group~=NAME], a group of core/states.py): {bad}"


def test_a_group_typed_into_the_stylesheet_is_found_and_one_state_is_not() -> None:
    assert restated_groups_in_css(".state.RUNNING, .state.STOPPING { background: var(--busy); }")
    assert restated_groups_in_css("svg .node.PAUSED,\nsvg .node.STOPPED { fill: var(--held); }")
    assert restated_groups_in_css('[data-state="FAILED"], [data-state=TIMED_OUT] { color: red; }')
    assert restated_groups_in_css(".state.RUNNING { background: var(--busy); }\n"
                                  ".state.STOPPING { background:  var(--busy) }")
    assert restated_groups_in_css("@media (prefers-color-scheme: dark) {\n"
                                  "  .state.FAILED, .state.TIMED_OUT { background: #7a271a; }\n}")
    assert not restated_groups_in_css(".state.SUCCEEDED { background: var(--ok); }\n"
                                      ".state.CANCELLED { background: var(--idle); }\n"
                                      "svg .node.SUCCEEDED { fill: var(--ok); }\n"
                                      '.state[data-group~="ACTIVE"] { background: var(--busy); }\n'
                                      "/* .state.RUNNING, .state.STOPPING: a comment */ .runs { margin: 0; }")


def test_a_planted_group_in_the_real_stylesheet_is_found_on_its_line() -> None:
    text = CSS.read_text() + ".state.RUNNING, .state.STOPPING { background: var(--busy); }\n"
    assert restated_groups_in_css(text) == [
        f"line {text.count(chr(10))}: '.state.RUNNING, .state.STOPPING' names RUNNING, STOPPING"]


def test_the_groups_the_stylesheet_colours_are_groups_of_the_states_table_and_disjoint() -> None:
    """A renamed group would leave its states uncoloured, and a state in two coloured groups would take
    whichever rule comes last: each group app.css names is in core/states.GROUPS, no two overlap."""
    named = set(_GROUP_SELECTOR.findall(CSS.read_text()))
    assert named, "app.css colours no state group"
    assert named <= set(states.GROUPS), f"groups app.css names that core/states.py has not: {named - set(states.GROUPS)}"
    for a, b in itertools.combinations(sorted(named), 2):
        assert not states.GROUPS[a] & states.GROUPS[b], f"{a} and {b} share {sorted(states.GROUPS[a] & states.GROUPS[b])}"


def test_every_state_the_page_colours_carries_its_groups() -> None:
    """The page renders a state (`state ...` spans, the workflow graph's `node ...` boxes) with
    data-group from the served groups, which the stylesheet's group rules select."""
    script = (STATIC / "app.js").read_text()
    drawn = [m.start() for m in re.finditer(r"class: [`\"](?:state|node) ", script)]
    assert drawn, "app.js draws no state"
    for at in drawn:
        line = script[at:script.index("\n", at)]  # the element's attributes, written on one line
        assert '"data-group": groupsOf(' in line, f"app.js line {script.count(chr(10), 0, at) + 1} draws a state " \
                                                 f"without its groups: {line[:80]!r}"
    assert "GROUPS = g.groups" in script, "app.js keeps no groups from GET /v1/states"
