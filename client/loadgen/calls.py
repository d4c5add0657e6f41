"""gRPC plumbing: channels to one or several targets (TLS, API key) and one request -> one Sample.

The load generator calls the generated stubs directly rather than through
client.AsyncTranslatorClient: it must not retry (a retry hides the error and doubles the
load), and it needs per-call metadata. `grpc_stream` keeps the old client-based entry point
for benchmarks/serving_load.py.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Optional, Sequence

import grpc

from client.balancing import Balancing, channel_args
from client.client import OWN_CONNECTION, AsyncTranslatorClient
from client.client import options as decoding_options
from client.loadgen.measure import Sample
from client.loadgen.workload import Request
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc

StreamFn = Callable[[str], Awaitable[Sample]]


@dataclass
class Security:
    tls: bool = False  # TLS with the system's roots, even without --tls-ca
    ca: Optional[str] = None  # PEM roots to trust (a private CA, a self-signed server)
    cert: Optional[str] = None  # client certificate chain (mutual TLS)
    key: Optional[str] = None  # its private key
    server_name: Optional[str] = None  # expected name in the server certificate, when it differs from the host
    api_key: Optional[str] = None  # sent as `authorization: Bearer KEY`

    @property
    def uses_tls(self) -> bool:
        return bool(self.tls or self.ca or self.cert or self.key)


def credentials(sec: Security) -> Optional[grpc.ChannelCredentials]:
    if not sec.uses_tls:
        return None
    if bool(sec.cert) != bool(sec.key):
        raise ValueError("--tls-cert and --tls-key go together (mutual TLS needs both)")

    def read(path: Optional[str]) -> Optional[bytes]:
        return Path(path).read_bytes() if path else None
    return grpc.ssl_channel_credentials(root_certificates=read(sec.ca), private_key=read(sec.key),
                                        certificate_chain=read(sec.cert))


def metadata(sec: Security) -> Optional[tuple]:
    return (("authorization", f"Bearer {sec.api_key}"),) if sec.api_key else None


class Targets:
    """lb="split" (default): one channel per target (`connections` each); request i goes to channel i mod n. The split
    is exact per request and each target's share is reported. lb="round_robin": one channel over
    all targets with gRPC's round_robin policy and client-side health checking, as the client
    library balances (client/balancing.py; a dns:/// target works too), reported as one target.
    Neither retries: a retry hides the error and adds load."""

    def __init__(self, targets: Sequence[str], sec: Security = Security(), lb: str = "split", connections: int = 1):
        if not targets:
            raise ValueError("no target")
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if sec.server_name:
            options.append(("grpc.ssl_target_name_override", sec.server_name))
        creds = credentials(sec)
        if lb == "round_robin":
            target, lb_options = channel_args(",".join(targets), Balancing(lb="round_robin", retries=0))
            options += lb_options
            targets = [target]
        elif lb != "split":
            raise ValueError(f"lb must be split or round_robin (got {lb!r})")
        # `connections` > 1: that many channels per target, each its own TCP connection (a server with
        # several frontend processes gets them spread by the kernel); requests go round the channels.
        if connections > 1:
            options += OWN_CONNECTION
        self.names = [t for t in targets for _ in range(max(1, connections))]
        self.channels = [grpc.aio.secure_channel(t, creds, options) if creds else grpc.aio.insecure_channel(t, options)
                         for t in self.names]
        self.stubs = [pb_grpc.TranslatorStub(c) for c in self.channels]
        self.metadata = metadata(sec)

    async def wait_ready(self, timeout: float) -> None:
        """Fail fast with the target's name, rather than as thousands of UNAVAILABLE samples."""
        for name, ch in zip(self.names, self.channels):
            try:
                await asyncio.wait_for(ch.channel_ready(), timeout)
            except asyncio.TimeoutError:
                raise ConnectionError(f"target {name} not reachable within {timeout:.0f} s") from None

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels))

    async def execute(self, req: Request, timeout: Optional[float]) -> Sample:
        """Send one planned request; never raises for an RPC error (the code goes in the Sample)."""
        k = req.index % len(self.stubs)
        stub, entry = self.stubs[k], req.entry
        deadline = entry.timeout if entry.timeout is not None else timeout
        opts = decoding_options(**req.options)
        sample = Sample(None, [], 0.0, 0, rpc=entry.method, kind=entry.name, texts=len(req.texts),
                        target=self.names[k])
        t0 = time.perf_counter()
        try:
            if entry.rpc == "stream":
                call = stub.TranslateStream(pb.TranslateStreamRequest(model=entry.model, text=req.texts[0],
                                                                      options=opts),
                                            timeout=deadline, metadata=self.metadata)
                await _read_stream(call, sample, t0)
            else:
                resp = await stub.Translate(pb.TranslateRequest(model=entry.model, texts=req.texts, options=opts),
                                            timeout=deadline, metadata=self.metadata)
                sample.tokens = sum(t.output_tokens for t in resp.translations)
        except grpc.aio.AioRpcError as e:
            sample.code, sample.ttft, sample.gaps, sample.tokens = e.code().name, None, [], 0
        except (ValueError, TypeError):  # a request the client cannot even encode (a bad option in the mix)
            sample.code, sample.ttft, sample.gaps, sample.tokens = "CLIENT_ERROR", None, [], 0
        sample.total = time.perf_counter() - t0
        return sample


async def _read_stream(call, sample: Sample, t0: float) -> None:
    """TTFT = first message that carries tokens; gaps between such messages. Read to the end
    of the call (not just the final message) so the status, and with it any late error, counts."""
    last = None
    async for msg in call:
        now = time.perf_counter()
        if msg.token_ids:
            if last is None:
                sample.ttft = now - t0
            else:
                sample.gaps.append(now - last)
            last = now
        if msg.final:
            sample.tokens = msg.output_tokens
    if sample.ttft is None:  # nothing generated (an empty output): the first token is the end
        sample.ttft = time.perf_counter() - t0


def grpc_stream(client: AsyncTranslatorClient, **decoding) -> StreamFn:
    """text -> Sample over TranslateStream with an AsyncTranslatorClient; raises on an RPC error.
    The pre-package API, kept for benchmarks/serving_load.py."""
    async def stream(text: str) -> Sample:
        sample = Sample(None, [], 0.0, 0)
        t0 = time.perf_counter()
        await _read_stream(client.translate_stream(text, **decoding), sample, t0)
        sample.total = time.perf_counter() - t0
        return sample
    return stream
