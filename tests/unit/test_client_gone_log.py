"""A client that goes away just before its unary answer is sent is not an ERROR in the log (issue 33):
grpc's asyncio server logs that race as an ERROR with a traceback on its cygrpc logger; the server's
logging turns exactly that message into one INFO line (server/observability/logs.py ClientGone), and
leaves every other record of that logger as it was."""
from __future__ import annotations

import io
import json
import logging

from server.observability import logs


def records(emit) -> list[dict]:
    stream = io.StringIO()
    logs.configure("json", "info", stream=stream)
    try:
        emit(logging.getLogger(logs.GRPC_CORE_LOGGER))
    finally:
        logs.shutdown()  # flushes the log writer into the stream
        logs.configure("json", "info")
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_the_client_gone_race_is_one_info_line():
    def emit(logger):
        try:
            raise RuntimeError('Failed "execute_batch": (SendInitialMetadataOperation, SendMessageOperation)')
        except RuntimeError:
            logger.exception("ExecuteBatchError raised in core by servicer method [/nmt.v1.Translator/Translate]")
    (record,) = records(emit)
    assert record["level"] == "INFO", record
    assert record["message"].startswith("the client went away before its answer was sent"), record
    assert "/nmt.v1.Translator/Translate" in record["message"]
    assert "Traceback" not in json.dumps(record)


def test_other_grpc_errors_stay_errors():
    def emit(logger):
        logger.error("Unexpected error in the completion queue")
    (record,) = records(emit)
    assert record["level"] == "ERROR" and record["message"] == "Unexpected error in the completion queue"
