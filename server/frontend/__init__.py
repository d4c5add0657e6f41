"""The frontend process's own work between the edge and the engine: server.py (TranslationServer: the
process assembled, its start and drain), admission.py (languages, limits, plans, submission),
hosted.py (a served model's tokenizer, checks and engine), language_id.py (source detection),
detok.py (incremental detokenisation), model_imports.py (Hugging Face models imported at start),
extra.py and pool.py (`--frontends N`: one extra frontend process, and the primary's pool of them),
cores/ (the frontend's side of the engine core processes)."""
