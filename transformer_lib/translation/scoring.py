"""Corpus BLEU with sacreBLEU, and the signature that names its settings (hand-written).

``translate_and_score`` (in ``inference``) calls ``bleu`` for every score the package
reports: validation BLEU while training, ``evaluate``, the command line and the tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["bleu", "bleu_signature"]


def bleu(hypotheses: Sequence[str], pairs: Sequence[tuple[str, str]]) -> Any:
    """Corpus sacreBLEU (13a tokenization, cased) of hypotheses against the pairs' targets.

    Returns sacrebleu's ``BLEUScore``; ``bleu_signature()`` names the settings it used. One
    hypothesis per pair, in order (sacreBLEU would score the shorter list alone, silently).
    `pairs` holds (source, reference) pairs, as ``load_multi30k`` returns them: a list of
    reference strings is refused (a two-character reference would unpack into a "pair" and
    score 0 without a word of warning); for references alone pass ``[(r, r) for r in refs]``.
    """
    import sacrebleu

    if isinstance(hypotheses, (str, bytes)):  # iterating it would score each character
        raise ValueError("hypotheses must be a list of strings, got a "
                         f"{type(hypotheses).__name__}; pass [text] for one sentence")
    hypotheses, pairs = list(hypotheses), list(pairs)
    if not pairs:  # sacreBLEU fails with an IndexError
        raise ValueError("pairs is empty: BLEU needs at least one sentence pair to score")
    if len(hypotheses) != len(pairs):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(pairs)} sentence pairs: "
                         "there must be one per pair")
    for i, h in enumerate(hypotheses):
        if not isinstance(h, str):
            raise ValueError(f"hypotheses[{i}] must be a string, got {h!r:.60}")
    for i, p in enumerate(pairs):
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) != 2 \
                or not isinstance(p[1], str):
            raise ValueError(
                f"pairs[{i}] must be a (source, reference) pair with a string reference, "
                f"got {p!r:.60}; for references alone pass [(r, r) for r in references]")
    return sacrebleu.BLEU().corpus_score(hypotheses, [[t for _, t in pairs]])


def bleu_signature() -> str:
    """sacreBLEU's signature of ``bleu()``'s settings (one reference, 13a, cased, exp smoothing).

    sacrebleu only knows the number of references after scoring, so the signature is read off
    a metric with the same settings that has scored one sentence.
    """
    import sacrebleu

    metric = sacrebleu.BLEU()
    metric.corpus_score(["a"], [["a"]])
    return str(metric.get_signature())
