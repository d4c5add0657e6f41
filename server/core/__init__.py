"""The engine core: what runs between admission and the model, and imports no grpc and no protobuf
(tests/system/test_deploy.py checks it).

request.py (the plain data that flows: jobs, decoding parameters, events), errors.py (error kinds with
a status name, mapped to the wire at the service edge only), scheduler.py (queues, admission into
slots, per-request bookkeeping, streaming and finishing; never logits), row_controls.py (what each row
needs from the token choice this step), engine.py (encoder passes, one decode step over every row,
the choice), chooser.py (token choice over all rows at once), runaway.py (the loop guard), loop.py
(schedule -> execute -> update on one thread per model). The slot cache and beam bookkeeping are
models/core/ (shared with the exporter's checks). It runs in the server's process, or in a core
process of its own (server/coreprocess/).
"""
