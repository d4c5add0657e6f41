"""Finished sentences -> the text's translation, whole (unary) or in order (streaming).

Both paths put the same text in the same place: a unit's translation is
`unit.finish(tokenizer.decode(ids))`, and the literal parts between units are copied.
The streaming path releases text strictly in document order: the sentence at the
cursor streams as it decodes, a later sentence that finishes first waits for
everything before it, and a unit with placeholders or inline tags to restore is sent
whole once finished (its final text is not known before). So the deltas concatenated
equal the unary text.
"""
from __future__ import annotations

from dataclasses import dataclass

from models.core.tokenizer import SubwordTokenizer
from server.frontend.detok import IncrementalDetokenizer
from server.texts.plan import Plan, Unit
from server.core.request import FinishEvent, FinishReason, Timing

# A document's finish reason is the most serious of its sentences'.
_SEVERITY = [FinishReason.EOS, FinishReason.LENGTH, FinishReason.RUNAWAY, FinishReason.CANCELLED]


@dataclass
class DocumentHypothesis:
    text: str
    score: float  # sum over sentences
    token_ids: list[int]


@dataclass
class TextResult:
    hypotheses: list[DocumentHypothesis]
    reason: FinishReason
    input_tokens: int
    output_tokens: int
    timing: Timing
    sentences: int


def merged_timing(events: list[FinishEvent]) -> Timing:
    if not events:
        t = Timing()
        t.scheduled = t.first_token = t.finished = t.arrival
        return t
    firsts = [e.timing.first_token for e in events if e.timing.first_token is not None]
    return Timing(arrival=min(e.timing.arrival for e in events),
                  scheduled=max((e.timing.scheduled or e.timing.arrival) for e in events),
                  first_token=min(firsts) if firsts else None,
                  finished=max((e.timing.finished or e.timing.arrival) for e in events))


def merged_reason(events: list[FinishEvent]) -> FinishReason:
    return max((e.reason for e in events), key=_SEVERITY.index, default=FinishReason.EOS)


def assemble(plan: Plan, events: list[FinishEvent], tok: SubwordTokenizer) -> TextResult:
    """Unit i's result is events[i]. Hypothesis k of the document takes hypothesis k of every
    sentence (a sentence with fewer takes its last)."""
    n_hyp = max((len(e.hypotheses) for e in events), default=1)
    hyps = []
    for k in range(n_hyp):
        chosen = [e.hypotheses[min(k, len(e.hypotheses) - 1)] for e in events]
        text = plan.render([tok.decode(h.tokens) for h in chosen])
        hyps.append(DocumentHypothesis(text, sum(h.score for h in chosen),
                                       [i for h in chosen for i in h.tokens]))
    return _result(hyps, events)


def _result(hyps: list[DocumentHypothesis], events: list[FinishEvent]) -> TextResult:
    """The document's totals over its sentences' results (output tokens: the best hypotheses')."""
    return TextResult(hyps, merged_reason(events), sum(e.input_tokens for e in events),
                          sum(len(e.hypotheses[0].tokens) for e in events), merged_timing(events),
                          len(events))


class TextStream:
    """Feed it each unit's tokens and finish as they come, in any order; it returns the text
    that may be sent now, in document order."""

    def __init__(self, plan: Plan, tok: SubwordTokenizer):
        self.plan, self.tok = plan, tok
        self.units: list[Unit] = plan.units
        n = len(self.units)
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.fed = [0] * n  # ids of each unit already given to its detokenizer
        self.detoks = [IncrementalDetokenizer(tok) for _ in range(n)]
        self.events: list[FinishEvent | None] = [None] * n
        self.cursor, self.unit_at_cursor = 0, 0
        self.released: list[int] = []  # token ids whose text has been returned since the last take

    @property
    def done(self) -> bool:
        return self.cursor == len(self.plan.parts)

    def ready(self) -> str:
        """The text before the first unit (the whole document when there is no unit)."""
        return self._advance()

    def tokens(self, i: int, token_ids: list[int]) -> str:
        self.ids[i].extend(token_ids)
        return self._advance()

    def finished(self, i: int, event: FinishEvent) -> str:
        self.events[i] = event
        self.ids[i] = list(event.hypotheses[0].tokens)  # authoritative (beam sends tokens only at the end)
        return self._advance()

    def take_released(self) -> list[int]:
        out, self.released = self.released, []
        return out

    def result(self) -> TextResult:
        return _result([], [e for e in self.events if e is not None])

    def _advance(self) -> str:
        out = []
        parts = self.plan.parts
        while self.cursor < len(parts):
            part = parts[self.cursor]
            if isinstance(part, str):
                out.append(part)
                self.cursor += 1
                continue
            i, event = self.unit_at_cursor, self.events[self.unit_at_cursor]
            if part.restore is None:  # streams live
                new = self.ids[i][self.fed[i]:]
                self.fed[i] = len(self.ids[i])
                self.released += new
                if new:
                    out.append(self.detoks[i].push(new))
                if event is None:
                    break
                out.append(self.detoks[i].finish())
            else:  # sent whole once its placeholders are back
                if event is None:
                    break
                self.released += self.ids[i]
                out.append(part.finish(self.tok.decode(self.ids[i])))
            self.cursor += 1
            self.unit_at_cursor += 1
        return "".join(out)
