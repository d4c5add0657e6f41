"""Glossaries: terms a translation must use (DeepL's glossary API, v2 and v3, and inline entries).

    entries.py   parsing and validation of TSV/CSV entries (DeepL's rules), the glossary languages
    store.py     the durable store: SQLite, per tenant (API key id), bounded in count and size
    matching.py  where a dictionary's source terms occur in a sentence (word boundaries, longest
                 first, casing) and the target terms' token sequences a job must produce

The decoding side lives in the engine core: server/core/terms.py (the per-row bookkeeping the scheduler
keeps for those terms, token ids only) and server/core/term_placement.py (a term never begun, written
where the model found it likeliest).

The HTTP endpoints are server/edge/http/glossaries.py; docs/glossaries.md says what decoding does with
the terms and why, with the measurements.
"""
