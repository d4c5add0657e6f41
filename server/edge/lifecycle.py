"""The gRPC plumbing around rotation and scale-out: connection ageing and keepalive options,
a health service with a liveness entry and List, and server reflection under both v1 and v1alpha.

Health has three names. "" (the whole server) and nmt.v1.Translator turn NOT_SERVING as soon as
a shutdown starts, at the beginning of the lame-duck period: readiness checks, balancers and
clients that watch health move away while the replica still answers. LIVENESS stays SERVING
until the process exits (a draining replica is alive: a liveness probe must not kill it while it
finishes its work); only an engine failure turns it NOT_SERVING.
"""
from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2

from server.config import ServerConfig

LIVENESS = "liveness"  # health service name for liveness probes: SERVING while the process is alive and well
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_NEVER_MS = 2**31 - 1  # gRPC's own "infinite" for millisecond channel arguments


def server_options(cfg: ServerConfig) -> list[tuple[str, int]]:
    """Channel arguments of the gRPC server from the keepalive and connection-age settings.

    max_connection_age makes long-lived client connections end (GOAWAY, then the grace period for
    the calls still on them), so clients reconnect, re-resolve the name and spread over replicas
    added since. Keepalive finds peers that vanished without closing (a node lost, a NAT entry
    dropped); min_ping_interval bounds how often clients may ping.
    """
    opts = [
        ("grpc.keepalive_time_ms", cfg.keepalive_time_ms or _NEVER_MS),
        ("grpc.keepalive_timeout_ms", cfg.keepalive_timeout_ms),
        ("grpc.http2.min_ping_interval_without_data_ms", cfg.keepalive_min_ping_interval_ms),
        ("grpc.keepalive_permit_without_calls", int(cfg.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", 0),  # the server's own keepalive pings on idle connections
    ]
    if cfg.max_connection_age_ms > 0:
        opts.append(("grpc.max_connection_age_ms", cfg.max_connection_age_ms))
        opts.append(("grpc.max_connection_age_grace_ms", cfg.max_connection_age_grace_ms or _NEVER_MS))
    return opts


class Health(health.aio.HealthServicer):
    """grpc.health.v1.Health with List (grpcio-health-checking declares it in the proto and the stubs,
    but its servicer leaves it UNIMPLEMENTED) and separate readiness and liveness states."""

    def __init__(self, services: tuple[str, ...]):
        super().__init__()
        self.ready_services = services  # turned NOT_SERVING by not_ready(), at the start of a shutdown

    async def serving(self) -> None:
        for name in (*self.ready_services, LIVENESS):
            await self.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def not_ready(self) -> None:
        """Lame duck: readiness NOT_SERVING, liveness unchanged."""
        for name in self.ready_services:
            await self.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def List(self, request: health_pb2.HealthListRequest, context) -> health_pb2.HealthListResponse:
        statuses = dict(getattr(self, "_server_status", {}))
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=status) for name, status in statuses.items()})


def _v1_reflection_file() -> None:
    """Register grpc/reflection/v1/reflection.proto in the default descriptor pool.

    grpcio-reflection ships only the v1alpha protocol. v1 is the same protocol under another
    package name, message for message and field number for field number, so its descriptor is
    v1alpha's renamed: reflection then also describes the v1 service to clients that ask for it.
    """
    pool = descriptor_pool.Default()
    name = "grpc/reflection/v1/reflection.proto"
    try:
        pool.FindFileByName(name)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = "." + proto.package + ".", ".grpc.reflection.v1."
    proto.name, proto.package = name, "grpc.reflection.v1"
    proto.ClearField("options")
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old):]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old):]
            method.output_type = new + method.output_type[len(old):]
    pool.AddSerializedFile(proto.SerializeToString())


def enable_reflection(server: grpc.aio.Server, services: list[str]) -> None:
    """Server reflection as grpc.reflection.v1.ServerReflection (what grpcurl and current tools ask
    first) and grpc.reflection.v1alpha.ServerReflection (older tools), listing `services` and both."""
    _v1_reflection_file()
    names = [*services, REFLECTION_V1, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)  # v1alpha
    servicer = reflection.aio.ReflectionServicer(names)
    # The v1 messages are byte-for-byte the v1alpha ones, so the v1alpha servicer answers both.
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        REFLECTION_V1, {"ServerReflectionInfo": handler}),))
