"""Alert messages: Block Kit payloads for incidents and the Slack channel each group routes to.

Messages hold aggregates only (rates, quantiles, counts, label names), never raw feature values. Slack's
limits are kept: at most 50 blocks, section text at most 3000 characters, header at most 150.

Every string that came from the logs or the config (versions, services, stages, fields, classes, groups,
segments, summaries, commands) is escaped with `esc` before it is placed in a text object (control characters
and bidirectional overrides removed, then Slack's entities), and mrkdwn objects are sent `verbatim`: only the
bold and code markup written here is formatting, and no value can become a mention (`<!channel>`, `<@U…>`),
a link (`<https://…|text>`) or an auto-linked channel name.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from rich.text import Text

from monitor.verdicts.evidence import gathered, parts

MAX_BLOCKS = 50
MAX_SECTION = 3000
MAX_HEADER = 150
MAX_FIELD = 2000
EMOJI = {"page": ":red_circle:", "warn": ":large_orange_circle:", "info": ":large_blue_circle:"}


def route(settings, labels: Mapping[str, str]) -> str:
    """The channel for a group with `labels` (severity included): the first matching route, else the
    default channel ('' without Slack settings)."""
    if settings is None:
        return ""
    for r in settings.routes:
        if all(str(labels.get(k, "")) == v for k, v in r.match.items()):
            return r.channel
    return settings.channel or ""


def plain(value: Any, limit: int | None = None) -> str:
    """`value` as text that reads as it is shown: control characters (a line break, a terminal escape) and
    bidirectional overrides (which show text in another order than it is read) removed, line breaks and
    tabs as spaces; cut to `limit` characters (an ellipsis last) when given."""
    text = _INVISIBLE.sub("", _BREAKS.sub(" ", str(value)))
    return text if limit is None else _cut(text, limit)


# C0 and C1 controls, DEL, the bidi embeddings, overrides and isolates (U+202A..U+202E, U+2066..U+2069)
# and the direction marks (U+200E, U+200F, U+061C), each of which reorders the text around it.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_BREAKS = re.compile("[\t\n\r\v\f\x85\u2028\u2029]")


def esc(value: Any) -> str:
    """`value` as text Slack shows literally (`plain`, then its control characters &, < and > as HTML
    entities: the only escaping Slack decodes, in mrkdwn and plain_text alike)."""
    return plain(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _labels(labels: Mapping[str, Any]) -> str:
    return " ".join(f"{esc(k)}={esc(v)}" for k, v in sorted(labels.items(), key=lambda kv: str(kv[0])))


def evidence_line(e: Mapping[str, Any]) -> str:
    """One evidence item (escaped mrkdwn), worded by `evidence.parts`: check, labels, value vs baseline
    with their unit, the change, n and 95% interval."""
    p = {k: esc(v) for k, v in parts(e).items()}
    line = f"• `{p['check']}` {p['labels']}".rstrip() + f": *{p['value']}*"
    if p["baseline"]:
        line += f" vs {p['baseline']}"
    detail = [x for x in (p["change"], p["n"], p["interval"]) if x]
    return line + (f" ({', '.join(detail)})" if detail else "")


def _when(value: Any) -> str:
    if value is None:
        return "-"
    ts = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return f"{ts:%Y-%m-%d %H:%M} UTC"


def render(incident: Mapping[str, Any], kind: str, action: str, settings, url: str | None = None) -> dict[str, Any]:
    """The outbox payload of one notification of `incident` (a dict of its columns, summary included):
    {text, blocks} for post / update, {text} for a thread reply; `url`: the incident's page (a "View
    incident" button, a link in a reply). Every value from the incident or the config is escaped (`esc`)."""
    summary = incident.get("summary") or {}
    alerts = summary.get("alerts", [])
    firing = [a for a in alerts if a["state"] == "firing" and not a.get("muted")]
    head = firing[0] if firing else (alerts[0] if alerts else None)
    order = {"ModelRegression": 0, "InputDrift": 1}
    if firing:
        head = min(firing, key=lambda a: order.get(a["labels"].get("alertname"), 2))
    notes = head["annotations"] if head else {}
    resolved = incident.get("status") == "resolved"
    service, version = incident.get("service", ""), incident.get("model_version")
    raw_verdict = str(incident.get("verdict") or "")
    verdict = esc(raw_verdict)
    estimated = " (estimated)" if notes.get("estimated") else ""
    explain = (settings.explain_command if settings is not None else "tailwatch explain {incident} --service {service}")
    explain = esc(explain.format(incident=incident.get("id"), service=service, model_version=version or ""))
    who = esc(service) + (f" model {esc(version)}" if version else "")
    since = incident.get("first_window_start") or incident.get("opened_at")
    # Why it resolved: fixed (healthy against the pre-incident baseline), rolled back, or no traffic.
    resolution = esc(summary.get("resolution") or "")
    if kind == "reply":
        if action == "resolve":
            took = incident["resolved_at"] - since if since and incident.get("resolved_at") else None
            text = f":white_check_mark: Resolved at {_when(incident.get('resolved_at'))}" + (
                f", {str(took).split('.')[0]} after its onset" if took else "") + (
                f" — {resolution}" if resolution else "") + f". Investigate: `{explain}`" + (
                f" or <{_link(url)}|the incident page>" if url else "")
        else:
            text = (f":repeat: Still firing since {_when(since)}: "
                    f"{esc(notes['summary']) if 'summary' in notes else verdict}")
        return {"text": _cut(text, MAX_SECTION)}

    mark = ":white_check_mark: RESOLVED" if resolved else EMOJI.get(summary.get("severity", "warn"), "")
    # Upper-cased before escaping: Slack decodes &lt; but not &LT;.
    # A slowdown of one segment says so first: `SLOWER for segment lang=de`.
    segment = (notes.get("attribution") or {}).get("segment")
    part = f" for segment {esc(segment)}" if segment and raw_verdict in ("slower", "both") else ""
    title = _cut(f"{mark} {esc(raw_verdict.upper())}{estimated}{part} — {who}".strip(), MAX_HEADER)
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}]
    # The summary is the notification's text; the sections below say each of its parts once.
    line = esc(notes.get("summary") or "") or verdict
    affected = sorted({_labels({k: v for k, v in (e.get("labels") or {}).items() if k in ("segment", "group", "class")})
                       for e in notes.get("evidence", []) if set(e.get("labels") or {}) & {"segment", "group", "class"}},
                      key=lambda a: (a != _labels({"segment": segment}), a))  # the verdict's segment first
    fields = [f"*Severity*\n{esc(summary.get('severity', '-'))}",
              f"*Since*\n{_when(since)}",
              f"*Affects*\n{who}" + (f" — {', '.join(affected[:5])}" if affected else " — all traffic"),
              f"*Window*\n{_when(notes.get('window_start'))} → {_when(notes.get('window_end'))[11:]}"]
    if notes.get("rollback_to"):
        fields.append(f"*Rollback to*\n`{esc(notes['rollback_to'])}` (accepted)")
    if resolved:
        fields.append(f"*Resolved*\n{_when(incident.get('resolved_at'))}" + (f" — {resolution}" if resolution else ""))
    blocks.append({"type": "section", "fields": [_mrkdwn(_cut(f, MAX_FIELD)) for f in fields[:10]]})
    # One ranked list: the evidence with the signals, inputs and quality the attribution names, each once.
    evidence = gathered(notes)
    if evidence:
        blocks.append(_section("*Evidence* (strongest first)\n" + "\n".join(evidence_line(e) for e in evidence[:8])))
    # Where the increase sits, when total latency rose (else the shares split noise); stages without any omitted.
    stages = {s: share for s, share in ((notes.get("attribution") or {}).get("stages") or {}).items() if share > 0}
    if stages and any(e["check"] == "latency" and (e.get("labels") or {}).get("stage") == "total"
                      and "quantile" in (e.get("labels") or {}) and e.get("status") == "breach" for e in evidence):
        q = esc(notes["attribution"].get("quantile", "p95"))
        blocks.append(_section(f"*Where the {q} latency increase sits*\n" + "\n".join(
            f"• stage `{esc(s)}`: {share:.0%}" for s, share in sorted(stages.items(), key=lambda kv: -kv[1])[:6])))
    length = (notes.get("attribution") or {}).get("length")
    if length:
        blocks.append(_section({"inputs": "Inputs got longer; latency per input length held: the service is not "
                                           "slower for the same input.",
                                "service": "Latency rose within input-length buckets: the service got slower.",
                                "unknown": "Input lengths shifted too; no per-length latency to separate them."}
                               [length]))
    changed = notes.get("what_changed") or []
    if changed:
        blocks.append(_section("*What changed*\n" + "\n".join(f"• {esc(c['text'])}" for c in changed[:5])))
    steps = notes.get("next_steps") or []
    if steps:
        blocks.append(_section("*Next steps*\n" + "\n".join(f"{i}. {esc(s)}" for i, s in enumerate(steps[:6], 1))))
    others = [a for a in alerts if a is not head]
    if others:
        blocks.append(_section("*Other alerts in this incident*\n" + "\n".join(
            f"• {esc(a['labels'].get('alertname'))} [{esc(a['state'])}{', ' + esc(a['muted']) if a.get('muted') else ''}]: "
            f"{esc(a['annotations'].get('summary', ''))}" for a in others[:10])))
    if url:
        blocks.append({"type": "actions", "elements": [{"type": "button", "url": url, "action_id": "view_incident",
                                                         "text": {"type": "plain_text", "text": "View incident"}}]})
    blocks.append({"type": "context", "elements": [_mrkdwn(_cut(
        f"Investigate: `{explain}` · incident {esc(incident.get('id'))} rev {esc(incident.get('revision'))}",
        MAX_SECTION))]})
    state = ("RESOLVED" + (f" ({resolution})" if resolution else "") + ": ") if resolved else ""
    text = _cut(f"{state}{verdict}{estimated} — {who}: {line}", MAX_SECTION)
    return {"text": text, "blocks": blocks[:MAX_BLOCKS]}


def _link(url: str) -> str:
    # A URL inside <...|...>: escaped as any text (Slack decodes &amp; there too); its own | would end it early.
    return esc(url).replace("|", "%7C")


def _mrkdwn(text: str) -> dict[str, Any]:
    # verbatim: Slack leaves plain text as it is (no auto-linked URLs or channel names, no parsed @mentions).
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(_cut(text, MAX_SECTION))}


# Slack's emoji of the messages written here, as a terminal shows them.
TERMINAL_EMOJI = {":red_circle:": ("●", "red"), ":large_orange_circle:": ("●", "dark_orange"),
                  ":large_blue_circle:": ("●", "blue"), ":white_check_mark:": ("✔", "green"), ":repeat:": ("↻", "")}
_MARKUP = re.compile(r"(\*[^*\n]+\*|`[^`\n]+`|:[a-z_]+:)")


def terminal(message: Mapping[str, Any]) -> Text:
    """A rendered message as a terminal shows it: the mrkdwn bold and code as styles, the emoji as
    symbols, Slack's entities decoded; every value stays text (nothing from the logs is read as markup)."""
    out = Text()
    for block in message.get("blocks") or [{"type": "section", "text": {"text": message.get("text", "")}}]:
        objects = ([block["text"]] if isinstance(block.get("text"), dict) else []) + block.get("elements", [])
        lines = [f"[{o['text']['text']}] {o['url']}" if o.get("type") == "button" else o["text"] for o in objects]
        lines += [f["text"].replace("\n", ": ", 1) for f in block.get("fields", [])]
        for line in lines:
            base = "bold" if block["type"] == "header" else "dim" if block["type"] == "context" else ""
            for piece in _MARKUP.split(line):
                if piece in TERMINAL_EMOJI:
                    out.append(TERMINAL_EMOJI[piece][0], TERMINAL_EMOJI[piece][1])
                elif len(piece) > 2 and piece[0] == piece[-1] == "*":
                    out.append(html.unescape(piece[1:-1]), f"{base} bold".strip())
                elif len(piece) > 2 and piece[0] == piece[-1] == "`":
                    out.append(html.unescape(piece[1:-1]), f"{base} cyan".strip())
                else:
                    out.append(html.unescape(piece), base)
            out.append("\n")
    out.rstrip()
    return out
