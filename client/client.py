"""A thin client for the nmt.v1 Translator service: sync and asyncio, with deadlines and retries.

    from client import TranslatorClient
    with TranslatorClient("localhost:50051") as c:
        print(c.translate(["A man is riding a bike."]).translations[0].hypotheses[0].text)
        for msg in c.translate_stream("Two dogs play in the snow."):
            print(msg.delta, end="", flush=True)
        data = c.translate_file("report.docx", Path("report.docx").read_bytes(), target_language="de",
                                timeout=600, progress=lambda m: print(m.segments_done, "/", m.segments_total))

Several replicas: a comma-separated target list, dns:///name:port or ipv4:a:p,b:p is balanced
round_robin over the healthy ones, with gRPC's retry policy and keepalive (client/balancing.py,
docs/deployment.md); `balancing=Balancing(...)` tunes it.

Unary calls are retried on UNAVAILABLE (server starting, restarting or
draining) with exponential back-off, and on RESOURCE_EXHAUSTED that carries a
google.rpc.RetryInfo (an API key's rate limit) after the wait the server gave,
within the call's deadline; streams are not retried once a message has arrived.

TLS: `ca_file` (PEM roots; `tls=True` alone uses the system's), `cert_file` +
`key_file` for mutual TLS, `server_name` when the certificate names another
host. `api_key` is sent as `authorization: Bearer KEY` on every call.
"""
from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator, Optional, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.balancing import Balancing, channel_args
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)
# A stream reset by a proxy before any message (CANCELLED, not by us) is as safe to retry as a refusal.
STREAM_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
STATUS_DETAILS = "grpc-status-details-bin"  # a google.rpc.Status (RetryInfo and the like)


def channel_credentials(ca_file: Optional[str] = None, cert_file: Optional[str] = None,
                        key_file: Optional[str] = None) -> grpc.ChannelCredentials:
    """TLS credentials: roots from `ca_file` (the system's without it); a client certificate (mutual TLS)
    from `cert_file` + `key_file`."""
    if bool(cert_file) != bool(key_file):
        raise ValueError("cert_file and key_file go together (a client certificate needs its key)")

    def read(path: Optional[str]) -> Optional[bytes]:
        return Path(path).read_bytes() if path else None
    return grpc.ssl_channel_credentials(root_certificates=read(ca_file), private_key=read(key_file),
                                        certificate_chain=read(cert_file))


def _channel_setup(tls: bool, ca_file: Optional[str], cert_file: Optional[str], key_file: Optional[str],
                   server_name: Optional[str]) -> tuple[Optional[grpc.ChannelCredentials], list]:
    """(credentials or None for plaintext, channel options)."""
    secure = tls or bool(ca_file or cert_file or key_file)
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return (channel_credentials(ca_file, cert_file, key_file) if secure else None), options


# A channel's own subchannel pool: its own TCP connection even to a target other channels reach.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
# TranslateFile's last message carries the translated file, up to the server's bound on a result (64 MiB,
# server/files/rpc.py MAX_RESULT_BYTES) and a few fields: past gRPC's default 4 MiB receive limit.
RECEIVE = [("grpc.max_receive_message_length", (64 << 20) + (64 << 10))]


def auth_metadata(api_key: Optional[str]) -> Optional[tuple]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else None


def retry_delay(err) -> Optional[float]:
    """The wait in a status's google.rpc.RetryInfo (seconds), or None when the status carries none."""
    try:
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:  # googleapis-common-protos absent: treat as no advice
        return None
    trailing = getattr(err, "trailing_metadata", None)
    for key, value in (trailing() if trailing else None) or ():
        if key == STATUS_DETAILS:
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.ToTimedelta().total_seconds()
    return None


def options(beam_size: int = 0, length_penalty: Optional[float] = None, temperature: float = 0.0, top_k: int = 0,
            top_p: float = 0.0, seed: Optional[int] = None, max_output_tokens: int = 0,
            num_hypotheses: int = 0, repetition_penalty: Optional[float] = None, no_repeat_ngram_size: int = 0,
            min_output_tokens: int = 0, no_unknown_token: bool = False, target_prefix: str = "",
            alternatives: int = 0) -> pb.DecodingOptions:
    o = pb.DecodingOptions(beam_size=beam_size, temperature=temperature, top_k=top_k, top_p=top_p,
                           max_output_tokens=max_output_tokens, num_hypotheses=num_hypotheses,
                           no_repeat_ngram_size=no_repeat_ngram_size, min_output_tokens=min_output_tokens,
                           no_unknown_token=no_unknown_token, target_prefix=target_prefix,
                           alternatives=alternatives)
    if length_penalty is not None:
        o.length_penalty = length_penalty
    if repetition_penalty is not None:
        o.repetition_penalty = repetition_penalty
    if seed is not None:
        o.seed = seed
    return o


SPLIT_MODES = {"on": pb.SPLIT_SENTENCES_ON, "off": pb.SPLIT_SENTENCES_OFF, "newlines": pb.SPLIT_SENTENCES_NEWLINES}


def split_mode(value: str | int) -> int:
    """"on" | "off" | "newlines" (or the enum value) -> pb.SplitSentences."""
    if isinstance(value, int):
        return value
    if value not in SPLIT_MODES:
        raise ValueError(f"split_sentences must be one of {sorted(SPLIT_MODES)} (got {value!r})")
    return SPLIT_MODES[value]


def _backoff(attempt: int, base: float) -> float:
    return base * (2 ** attempt) * (0.5 + random.random() / 2)


def _pause(err, attempt: int, base: float) -> Optional[float]:
    """Seconds to wait before retrying `err`, or None: not retried. A full queue's RESOURCE_EXHAUSTED
    carries no RetryInfo, so only a rate limit that says when is retried."""
    if err.code() in RETRYABLE:
        return _backoff(attempt, base)
    if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return retry_delay(err)
    return None


class _RetriedStream:
    """A TranslateStream call retried, with backoff, when it fails retryably before its first message
    (a proxy such as nginx turns a draining replica's refusal into a response gRPC's own retry
    policy may not retry). Once a message has arrived, an error is the caller's: nothing is sent twice.
    Iterates like the call and keeps its cancel()."""

    def __init__(self, start: Callable[[], Iterator], retries: int, backoff: float):
        self._start, self._retries, self._backoff = start, retries, backoff
        self._call, self._started, self._cancelled = start(), False, False

    def __iter__(self) -> "_RetriedStream":
        return self

    def __next__(self) -> pb.TranslateStreamResponse:
        attempt = 0
        while True:
            try:
                message = next(self._call)
                self._started = True
                return message
            except grpc.RpcError as err:
                if self._started or self._cancelled or attempt >= self._retries or err.code() not in STREAM_RETRYABLE:
                    raise
                time.sleep(_backoff(attempt, self._backoff))
                attempt += 1
                self._call = self._start()

    def cancel(self) -> bool:
        self._cancelled = True
        return self._call.cancel()

    def __getattr__(self, name):  # code(), details(), trailing_metadata() ... of the current attempt
        return getattr(self._call, name)


def file_request(filename: str, content: bytes, target_language: str, source_language: str,
                 glossary_id: str) -> pb.TranslateFileRequest:
    return pb.TranslateFileRequest(filename=filename, content=content, target_language=target_language,
                                   source_language=source_language, glossary_id=glossary_id)


def _content_of(last: Optional[pb.TranslateFileResponse]) -> bytes:
    if last is None or last.status != pb.FILE_STATUS_DONE:  # the server ends a call with a status, not this
        raise RuntimeError("TranslateFile ended without the translated file")
    return last.content


def _file_of(stream: Iterator[pb.TranslateFileResponse],
             progress: Optional[Callable[[pb.TranslateFileResponse], None]]) -> bytes:
    """The file from a TranslateFile stream read to its end; the call is cancelled if reading stops early
    (an exception in `progress`, an interrupt), which drops the server's job."""
    last = None
    try:
        for message in stream:
            if progress is not None:
                progress(message)
            last = message
    except BaseException:
        stream.cancel()
        raise
    return _content_of(last)


class TranslatorClient:
    def __init__(self, target: str = "localhost:50051", timeout: Optional[float] = 30.0, retries: int = 3,
                 backoff: float = 0.1, channel: Optional[grpc.Channel] = None, *, tls: bool = False,
                 ca_file: Optional[str] = None, cert_file: Optional[str] = None, key_file: Optional[str] = None,
                 server_name: Optional[str] = None, api_key: Optional[str] = None,
                 balancing: Optional[Balancing] = None):
        creds, opts = _channel_setup(tls, ca_file, cert_file, key_file, server_name)
        # several replicas, gRPC's retry policy (as many retries as `retries` unless `balancing` says), keepalive
        target, lb_opts = channel_args(target, balancing or Balancing(retries=retries))
        opts = [*opts, *lb_opts, *RECEIVE]
        self.metadata = auth_metadata(api_key)
        self.channel = channel or (grpc.secure_channel(target, creds, opts) if creds
                                   else grpc.insecure_channel(target, opts))
        self.stub = pb_grpc.TranslatorStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.timeout, self.retries, self.backoff = timeout, retries, backoff

    def __enter__(self) -> "TranslatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method, request, timeout: Optional[float]):
        timeout = self.timeout if timeout is None else timeout
        end = None if timeout is None else time.monotonic() + timeout
        for attempt in range(self.retries + 1):
            remaining = None if end is None else max(end - time.monotonic(), 0.0)
            try:
                return method(request, timeout=remaining, metadata=self.metadata)
            except grpc.RpcError as e:
                pause = _pause(e, attempt, self.backoff)
                if pause is None or attempt == self.retries or \
                        (end is not None and time.monotonic() + pause >= end):
                    raise
                time.sleep(pause)

    def translate(self, texts: Sequence[str], model: str = "", timeout: Optional[float] = None,
                  return_scores: bool = False, return_tokens: bool = False, source_language: str = "",
                  target_language: str = "", split_sentences: str | int = "on", mime_type: str = "",
                  background: bool = False, **decoding) -> pb.TranslateResponse:
        req = pb.TranslateRequest(model=model, texts=list(texts), options=options(**decoding),
                                  return_scores=return_scores, return_tokens=return_tokens,
                                  source_language=source_language, target_language=target_language,
                                  split_sentences=split_mode(split_sentences), mime_type=mime_type,
                                  priority=pb.PRIORITY_BACKGROUND if background else pb.PRIORITY_INTERACTIVE)
        return self._call(self.stub.Translate, req, timeout)

    def translate_stream(self, text: str, model: str = "", timeout: Optional[float] = None,
                         source_language: str = "", target_language: str = "", split_sentences: str | int = "on",
                         mime_type: str = "", **decoding) -> Iterator[pb.TranslateStreamResponse]:
        req = pb.TranslateStreamRequest(model=model, text=text, options=options(**decoding),
                                        source_language=source_language, target_language=target_language,
                                        split_sentences=split_mode(split_sentences), mime_type=mime_type)
        deadline = self.timeout if timeout is None else timeout
        return _RetriedStream(lambda: self.stub.TranslateStream(req, timeout=deadline, metadata=self.metadata),
                              self.retries, self.backoff)

    def translate_file(self, filename: str, content: bytes, target_language: str = "", source_language: str = "",
                       glossary_id: str = "", timeout: Optional[float] = None,
                       progress: Optional[Callable[[pb.TranslateFileResponse], None]] = None) -> bytes:
        """The translated file (TranslateFile: the server reads, translates and rebuilds it; `filename`'s
        extension names the format). `progress(message)` sees every message, the last (status DONE, with the
        file) included. `timeout` bounds the whole translation. Retried like translate_stream: only when it
        fails before the first message."""
        req = file_request(filename, content, target_language, source_language, glossary_id)
        deadline = self.timeout if timeout is None else timeout
        stream = _RetriedStream(lambda: self.stub.TranslateFile(req, timeout=deadline, metadata=self.metadata),
                                self.retries, self.backoff)
        return _file_of(stream, progress)

    def embed(self, texts: Sequence[str], model: str = "", normalize: bool = False,
              timeout: Optional[float] = None) -> pb.EmbedResponse:
        return self._call(self.stub.Embed, pb.EmbedRequest(model=model, texts=list(texts), normalize=normalize),
                          timeout)

    def list_models(self, timeout: Optional[float] = None) -> pb.ListModelsResponse:
        return self._call(self.stub.ListModels, pb.ListModelsRequest(), timeout)

    def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        """SERVING / NOT_SERVING / SERVICE_UNKNOWN."""
        resp = self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout,
                                      metadata=self.metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


class AsyncTranslatorClient:
    """The same calls on grpc.aio, for asyncio services and load generators."""

    def __init__(self, target: str = "localhost:50051", timeout: Optional[float] = 30.0, retries: int = 3,
                 backoff: float = 0.1, *, tls: bool = False, ca_file: Optional[str] = None,
                 cert_file: Optional[str] = None, key_file: Optional[str] = None, server_name: Optional[str] = None,
                 api_key: Optional[str] = None, balancing: Optional[Balancing] = None, own_connection: bool = False):
        """`own_connection`: a TCP connection of this client's own, not the one gRPC would share with every
        other channel to the target in this process (to spread load over a server's frontend processes)."""
        creds, opts = _channel_setup(tls, ca_file, cert_file, key_file, server_name)
        target, lb_opts = channel_args(target, balancing or Balancing(retries=retries))
        opts = [*opts, *lb_opts, *RECEIVE, *OWN_CONNECTION * own_connection]
        self.metadata = auth_metadata(api_key)
        self.channel = (grpc.aio.secure_channel(target, creds, opts) if creds
                        else grpc.aio.insecure_channel(target, opts))
        self.stub = pb_grpc.TranslatorStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.timeout, self.retries, self.backoff = timeout, retries, backoff

    async def __aenter__(self) -> "AsyncTranslatorClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, method, request, timeout: Optional[float]):
        timeout = self.timeout if timeout is None else timeout
        end = None if timeout is None else time.monotonic() + timeout
        for attempt in range(self.retries + 1):
            remaining = None if end is None else max(end - time.monotonic(), 0.0)
            try:
                return await method(request, timeout=remaining, metadata=self.metadata)
            except grpc.aio.AioRpcError as e:
                pause = _pause(e, attempt, self.backoff)
                if pause is None or attempt == self.retries or \
                        (end is not None and time.monotonic() + pause >= end):
                    raise
                await asyncio.sleep(pause)

    async def translate(self, texts: Sequence[str], model: str = "", timeout: Optional[float] = None,
                        return_scores: bool = False, return_tokens: bool = False, source_language: str = "",
                  target_language: str = "", split_sentences: str | int = "on", mime_type: str = "",
                  background: bool = False, **decoding) -> pb.TranslateResponse:
        req = pb.TranslateRequest(model=model, texts=list(texts), options=options(**decoding),
                                  return_scores=return_scores, return_tokens=return_tokens,
                                  source_language=source_language, target_language=target_language,
                                  split_sentences=split_mode(split_sentences), mime_type=mime_type,
                                  priority=pb.PRIORITY_BACKGROUND if background else pb.PRIORITY_INTERACTIVE)
        return await self._call(self.stub.Translate, req, timeout)

    def translate_stream(self, text: str, model: str = "", timeout: Optional[float] = None,
                         source_language: str = "", target_language: str = "", split_sentences: str | int = "on",
                         mime_type: str = "", **decoding) -> AsyncIterator[pb.TranslateStreamResponse]:
        req = pb.TranslateStreamRequest(model=model, text=text, options=options(**decoding),
                                        source_language=source_language, target_language=target_language,
                                        split_sentences=split_mode(split_sentences), mime_type=mime_type)
        return self.stub.TranslateStream(req, timeout=self.timeout if timeout is None else timeout,
                                         metadata=self.metadata)

    async def translate_file(self, filename: str, content: bytes, target_language: str = "",
                             source_language: str = "", glossary_id: str = "", timeout: Optional[float] = None,
                             progress: Optional[Callable[[pb.TranslateFileResponse], None]] = None) -> bytes:
        """As TranslatorClient.translate_file (not retried)."""
        req = file_request(filename, content, target_language, source_language, glossary_id)
        call = self.stub.TranslateFile(req, timeout=self.timeout if timeout is None else timeout,
                                       metadata=self.metadata)
        last = None
        async for message in call:
            if progress is not None:
                progress(message)
            last = message
        return _content_of(last)

    async def embed(self, texts: Sequence[str], model: str = "", normalize: bool = False,
                    timeout: Optional[float] = None) -> pb.EmbedResponse:
        return await self._call(self.stub.Embed, pb.EmbedRequest(model=model, texts=list(texts),
                                                                 normalize=normalize), timeout)

    async def list_models(self, timeout: Optional[float] = None) -> pb.ListModelsResponse:
        return await self._call(self.stub.ListModels, pb.ListModelsRequest(), timeout)

    async def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        resp = await self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout,
                                            metadata=self.metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
